-- The daily roll-up of attempts that retention (`audit.retention`) deletes: usage history
-- outlives the raw rows. Columns that may be absent hold '' (a key of the upsert).
CREATE TABLE usage_daily (
    day         TEXT NOT NULL,              -- UTC, YYYY-MM-DD
    agent       TEXT NOT NULL DEFAULT '',
    provider    TEXT NOT NULL,
    model       TEXT NOT NULL,
    profile_id  TEXT NOT NULL DEFAULT '',   -- '' for skipped candidates without a profile
    attempts    INTEGER NOT NULL,
    successes   INTEGER NOT NULL,
    failures    INTEGER NOT NULL,
    tokens_in   INTEGER NOT NULL,
    tokens_out  INTEGER NOT NULL,
    PRIMARY KEY (day, agent, provider, model, profile_id)
);
