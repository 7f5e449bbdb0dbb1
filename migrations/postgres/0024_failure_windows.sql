-- The failures that open a window on their profile (a cooldown, or auth_permanent's disabled
-- lane), each with the profile's first success inside the window, kept by the audit writer in
-- the same transaction as the attempts: the usage series' timeline reads a day's windows here
-- instead of searching attempts for each failure's next success (a day of 5 million attempts
-- over 90 days: 6,500 index searches, 30 ms; 2.5 ms here).
-- The backfill searches each failure's next success: 945,000 failures of 5 million attempts took
-- 42 s, past the connection's statement timeout.
SET LOCAL statement_timeout = 0;

CREATE TABLE failure_windows (
    request_id      TEXT NOT NULL,
    seq             BIGINT NOT NULL,
    profile_id      TEXT NOT NULL,
    started_at      BIGINT NOT NULL,
    duration_ms     BIGINT,
    reason          TEXT,
    cooldown_until  BIGINT,                       -- NULL: an auth_permanent failure's lane, until a success
    next_success    BIGINT,                       -- the profile's first success after started_at and before cooldown_until
    PRIMARY KEY (request_id, seq)
);
-- The timeline's windows by start, the long ones (billing, auth_permanent) by reason and start,
-- and the windows still open at a time, what a success may end (the writer's close): from the
-- failure's start to its end or its next success, both excluded. Few are open at any time,
-- whichever order the rows come in; a b-tree on profile and end read every later window of
-- the profile for a success written after them (a copy goes newest first).
CREATE INDEX failure_windows_started_at ON failure_windows (started_at);
CREATE INDEX failure_windows_lasting ON failure_windows (reason, started_at)
    WHERE reason IN ('billing', 'auth_permanent');
CREATE INDEX failure_windows_open ON failure_windows USING gist (int8range(started_at,
    greatest(started_at, least(coalesce(cooldown_until, 9223372036854775807), coalesce(next_success, 9223372036854775807))),
    '()'));

INSERT INTO failure_windows (request_id, seq, profile_id, started_at, duration_ms, reason, cooldown_until, next_success)
SELECT w.request_id, w.seq, w.profile_id, w.started_at, w.duration_ms, w.reason, w.cooldown_until,
       (SELECT s.started_at FROM attempts s
        WHERE s.profile_id = w.profile_id AND s.started_at > w.started_at
          AND s.started_at < coalesce(w.cooldown_until, 9223372036854775807) AND s.outcome = 'success'
        ORDER BY s.started_at LIMIT 1)
FROM attempts w
WHERE w.outcome = 'failure' AND w.profile_id IS NOT NULL
  AND (w.cooldown_until IS NOT NULL OR w.reason = 'auth_permanent');
