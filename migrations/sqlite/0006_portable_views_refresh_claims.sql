-- Two audit views whose SQL differs between SQLite and PostgreSQL, so that the queries of
-- docs/audit.md read the same on both engines.
CREATE VIEW profile_failure_counts AS
SELECT s.profile_id, c.key AS reason, CAST(c.value AS INTEGER) AS failures
FROM usage_stats s, json_each(s.failure_counts) AS c;

CREATE VIEW model_cooldown_state AS
SELECT provider,
       model,
       cooldown_until,
       error_count,
       last_failure_at,
       CASE WHEN cooldown_until > CAST(strftime('%s', 'now') AS INTEGER) * 1000 THEN 1 ELSE 0 END AS in_force
FROM model_cooldowns;

-- One refresh per OAuth token, fleet-wide: the instance that holds a profile's claim calls the
-- identity provider; the others wait for its result (docs/scale.md).
CREATE TABLE refresh_claims (
    profile_id  TEXT PRIMARY KEY REFERENCES profiles (id) ON DELETE CASCADE,
    holder      TEXT NOT NULL,
    expires_at  INTEGER NOT NULL
);
