-- Views for the questions operators ask most (docs/audit.md). All times are Unix milliseconds;
-- `day` is the UTC calendar day.

-- Attempts per profile and UTC day.
CREATE VIEW profile_daily_usage AS
SELECT profile_id,
       provider,
       date(started_at / 1000, 'unixepoch') AS day,
       COUNT(*)                                     AS attempts,
       SUM(outcome = 'success')                     AS successes,
       SUM(outcome = 'failure')                     AS failures,
       COALESCE(SUM(tokens_in), 0)                  AS tokens_in,
       COALESCE(SUM(tokens_out), 0)                 AS tokens_out
FROM attempts
WHERE profile_id IS NOT NULL
GROUP BY profile_id, provider, day;

-- Failed and skipped attempts by reason and provider.
CREATE VIEW failures_by_reason AS
SELECT reason,
       provider,
       COUNT(*)                    AS attempts,
       SUM(outcome = 'skipped')    AS skipped,
       MAX(started_at)             AS last_at
FROM attempts
WHERE outcome IN ('failure', 'skipped')
GROUP BY reason, provider;

-- Requests answered by another model than the first candidate of their chain.
CREATE VIEW fallback_requests AS
SELECT r.id,
       r.agent,
       r.requested_model,
       first.provider || '/' || first.model AS first_candidate,
       r.served_model,
       r.served_profile,
       r.attempts,
       r.started_at
FROM requests r
JOIN attempts first ON first.request_id = r.id AND first.seq = 1
WHERE r.served_model IS NOT NULL
  AND r.served_model <> first.provider || '/' || first.model;

-- Profiles in a cooldown or disabled window now (by the database's clock).
CREATE VIEW profiles_cooling AS
SELECT s.profile_id,
       p.provider,
       CASE WHEN s.disabled_reason IS NOT NULL
                 AND (s.disabled_until IS NULL OR s.disabled_until > CAST(strftime('%s', 'now') AS INTEGER) * 1000)
            THEN 'disabled' ELSE 'cooling' END                 AS state,
       COALESCE(s.disabled_reason, s.cooldown_reason)          AS reason,
       s.cooldown_model                                        AS model,
       CASE WHEN s.disabled_reason IS NOT NULL THEN s.disabled_until ELSE s.cooldown_until END AS until,
       s.error_count
FROM usage_stats s
JOIN profiles p ON p.id = s.profile_id
WHERE (s.disabled_reason IS NOT NULL
       AND (s.disabled_until IS NULL OR s.disabled_until > CAST(strftime('%s', 'now') AS INTEGER) * 1000))
   OR s.cooldown_until > CAST(strftime('%s', 'now') AS INTEGER) * 1000;
