-- The cooldown lane as a set of windows (SPEC §3: two models cooling on one profile are two
-- windows; a healthy third model is not blocked). usage_stats.cooldown_* keep showing the window
-- that ends last; this table holds every one of them.
CREATE TABLE profile_cooldowns (
    profile_id       TEXT NOT NULL REFERENCES profiles (id) ON DELETE CASCADE,
    model            TEXT,                         -- NULL: every model of the profile
    cooldown_until   INTEGER NOT NULL,
    cooldown_reason  TEXT NOT NULL,
    step             INTEGER NOT NULL,             -- the window's ladder step (1: 1 min, 2: 5 min, …)
    opened_at        INTEGER NOT NULL              -- opened or last escalated (burst guard)
);
CREATE UNIQUE INDEX profile_cooldowns_scope ON profile_cooldowns (profile_id, ifnull(model, ''));

-- The one window each profile had: its step is the one the old ladder took from error_count.
INSERT INTO profile_cooldowns (profile_id, model, cooldown_until, cooldown_reason, step, opened_at)
SELECT profile_id, cooldown_model, cooldown_until, cooldown_reason, max(1, min(error_count, 4)),
       coalesce(window_opened_at, cooldown_until)
FROM usage_stats
WHERE cooldown_until IS NOT NULL AND cooldown_reason IS NOT NULL;

-- One row per window in force now: the disabled lane, and each cooldown window.
DROP VIEW profiles_cooling;
CREATE VIEW profiles_cooling AS
SELECT s.profile_id,
       p.provider,
       'disabled'          AS state,
       s.disabled_reason   AS reason,
       NULL                AS model,
       s.disabled_until    AS until,
       s.error_count
FROM usage_stats s
JOIN profiles p ON p.id = s.profile_id
WHERE s.disabled_reason IS NOT NULL
  AND (s.disabled_until IS NULL OR s.disabled_until > CAST(strftime('%s', 'now') AS INTEGER) * 1000)
UNION ALL
SELECT c.profile_id,
       p.provider,
       'cooling',
       c.cooldown_reason,
       c.model,
       c.cooldown_until,
       s.error_count
FROM profile_cooldowns c
JOIN profiles p ON p.id = c.profile_id
JOIN usage_stats s ON s.profile_id = c.profile_id
WHERE c.cooldown_until > CAST(strftime('%s', 'now') AS INTEGER) * 1000;
