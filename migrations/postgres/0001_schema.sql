-- rota's schema on PostgreSQL: the same tables, columns and views as migrations/sqlite/ ends
-- with (docs/schema.md documents each column), in PostgreSQL's types: every time is Unix
-- milliseconds in a BIGINT, flags are BOOLEAN, sealed secrets BYTEA.

CREATE TABLE profiles (
    id          TEXT PRIMARY KEY,
    provider    TEXT NOT NULL,
    name        TEXT NOT NULL,
    type        TEXT NOT NULL CHECK (type IN ('oauth', 'token', 'api_key')),
    source      TEXT NOT NULL CHECK (source IN ('stored', 'config')),
    enabled     BOOLEAN NOT NULL DEFAULT TRUE,
    email       TEXT,
    expires_at  BIGINT,
    created_at  BIGINT NOT NULL,
    updated_at  BIGINT NOT NULL
);
CREATE INDEX profiles_provider ON profiles (provider);

CREATE TABLE secrets (
    profile_id  TEXT NOT NULL REFERENCES profiles (id) ON DELETE CASCADE,
    field       TEXT NOT NULL CHECK (field IN ('api_key', 'token', 'access_token', 'refresh_token')),
    key_id      TEXT NOT NULL,
    nonce       BYTEA NOT NULL,
    ciphertext  BYTEA NOT NULL,
    updated_at  BIGINT NOT NULL,
    PRIMARY KEY (profile_id, field)
);

CREATE TABLE usage_stats (
    profile_id        TEXT PRIMARY KEY REFERENCES profiles (id) ON DELETE CASCADE,
    last_used         BIGINT,
    last_success_at   BIGINT,
    cooldown_until    BIGINT,
    cooldown_reason   TEXT,
    cooldown_model    TEXT,
    disabled_until    BIGINT,
    disabled_reason   TEXT,
    error_count       BIGINT NOT NULL DEFAULT 0,
    failure_counts    TEXT NOT NULL DEFAULT '{}',
    last_failure_at   BIGINT,
    window_opened_at  BIGINT,
    success_count     BIGINT NOT NULL DEFAULT 0,
    failure_total     BIGINT NOT NULL DEFAULT 0,
    billing_step      BIGINT NOT NULL DEFAULT 0,
    cleared_at        BIGINT
);

CREATE TABLE profile_cooldowns (
    profile_id       TEXT NOT NULL REFERENCES profiles (id) ON DELETE CASCADE,
    model            TEXT,
    cooldown_until   BIGINT NOT NULL,
    cooldown_reason  TEXT NOT NULL,
    step             BIGINT NOT NULL,
    opened_at        BIGINT NOT NULL
);
CREATE UNIQUE INDEX profile_cooldowns_scope ON profile_cooldowns (profile_id, coalesce(model, ''));

CREATE TABLE profile_order (
    provider     TEXT PRIMARY KEY,
    profile_ids  TEXT NOT NULL,
    updated_at   BIGINT NOT NULL
);

CREATE TABLE model_cooldowns (
    provider         TEXT NOT NULL,
    model            TEXT NOT NULL,
    cooldown_until   BIGINT NOT NULL,
    error_count      BIGINT NOT NULL,
    last_failure_at  BIGINT NOT NULL,
    PRIMARY KEY (provider, model)
);

CREATE TABLE agents (
    id          TEXT PRIMARY KEY,
    name        TEXT NOT NULL UNIQUE,
    key_digest  TEXT NOT NULL UNIQUE,
    admin       BOOLEAN NOT NULL DEFAULT FALSE,
    created_at  BIGINT NOT NULL,
    revoked_at  BIGINT
);

CREATE TABLE requests (
    id               TEXT PRIMARY KEY,
    agent            TEXT,
    api              TEXT NOT NULL CHECK (api IN ('chat', 'responses', 'messages', 'lease')),
    requested_model  TEXT,
    served_model     TEXT,
    served_profile   TEXT,
    status           BIGINT,
    attempts         BIGINT NOT NULL DEFAULT 0,
    started_at       BIGINT NOT NULL,
    duration_ms      BIGINT,
    stream           BOOLEAN NOT NULL DEFAULT FALSE,
    tokens_in        BIGINT,
    tokens_out       BIGINT
);
CREATE INDEX requests_started ON requests (started_at);
CREATE INDEX requests_agent ON requests (agent, started_at);

CREATE TABLE attempts (
    request_id      TEXT NOT NULL,
    seq             BIGINT NOT NULL,
    kind            TEXT NOT NULL CHECK (kind IN ('primary', 'retry', 'rotate', 'fallback', 'probe', 'skipped')),
    agent           TEXT,
    provider        TEXT NOT NULL,
    model           TEXT NOT NULL,
    profile_id      TEXT,
    started_at      BIGINT NOT NULL,
    duration_ms     BIGINT,
    ttfb_ms         BIGINT,
    http_status     BIGINT,
    outcome         TEXT NOT NULL CHECK (outcome IN ('success', 'failure', 'skipped')),
    reason          TEXT,
    retry_after_ms  BIGINT,
    cooldown_until  BIGINT,
    error           TEXT CHECK (error IS NULL OR length(error) <= 500),
    tokens_in       BIGINT,
    tokens_out      BIGINT,
    PRIMARY KEY (request_id, seq)
);
CREATE INDEX attempts_started ON attempts (started_at);
CREATE INDEX attempts_profile ON attempts (profile_id, started_at);

-- The audit views of docs/audit.md, with the columns and values of SQLite's.
CREATE VIEW profile_daily_usage AS
SELECT profile_id,
       provider,
       to_char(to_timestamp(started_at / 1000) AT TIME ZONE 'UTC', 'YYYY-MM-DD') AS day,
       COUNT(*)                                                   AS attempts,
       SUM(CASE WHEN outcome = 'success' THEN 1 ELSE 0 END)       AS successes,
       SUM(CASE WHEN outcome = 'failure' THEN 1 ELSE 0 END)       AS failures,
       CAST(COALESCE(SUM(tokens_in), 0) AS BIGINT)                AS tokens_in,
       CAST(COALESCE(SUM(tokens_out), 0) AS BIGINT)               AS tokens_out
FROM attempts
WHERE profile_id IS NOT NULL
GROUP BY profile_id, provider, day;

CREATE VIEW failures_by_reason AS
SELECT reason,
       provider,
       COUNT(*)                                              AS attempts,
       SUM(CASE WHEN outcome = 'skipped' THEN 1 ELSE 0 END)  AS skipped,
       MAX(started_at)                                       AS last_at
FROM attempts
WHERE outcome IN ('failure', 'skipped')
GROUP BY reason, provider;

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

CREATE VIEW profiles_cooling AS
SELECT s.profile_id,
       p.provider,
       'disabled'          AS state,
       s.disabled_reason   AS reason,
       NULL::TEXT          AS model,
       s.disabled_until    AS until,
       s.error_count
FROM usage_stats s
JOIN profiles p ON p.id = s.profile_id
WHERE s.disabled_reason IS NOT NULL
  AND (s.disabled_until IS NULL OR s.disabled_until > CAST(extract(epoch FROM now()) * 1000 AS BIGINT))
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
WHERE c.cooldown_until > CAST(extract(epoch FROM now()) * 1000 AS BIGINT);

CREATE VIEW profile_failure_counts AS
SELECT s.profile_id, c.key AS reason, CAST(c.value AS BIGINT) AS failures
FROM usage_stats s, json_each_text(CAST(s.failure_counts AS JSON)) AS c;

CREATE VIEW model_cooldown_state AS
SELECT provider,
       model,
       cooldown_until,
       error_count,
       last_failure_at,
       CASE WHEN cooldown_until > CAST(extract(epoch FROM now()) * 1000 AS BIGINT) THEN 1 ELSE 0 END AS in_force
FROM model_cooldowns;

-- The change feed (docs/scale.md), as on SQLite: one row per entity, moved to the head of a
-- sequence that only counts up. Every write of the shared state bumps the one change_seq row,
-- whose lock it holds to its commit: entries become visible in the order of their numbers, so
-- a reader that has seen N has seen everything up to N. Each change notifies channel
-- `rota_changes` (delivered at commit) to wake the servers at once.
CREATE TABLE changes (
    kind  TEXT NOT NULL CHECK (kind IN ('profile', 'order', 'agent', 'stats', 'model')),
    key   TEXT NOT NULL,
    seq   BIGINT NOT NULL,
    PRIMARY KEY (kind, key)
);
CREATE UNIQUE INDEX changes_seq ON changes (seq);

CREATE TABLE change_seq (
    id  INTEGER PRIMARY KEY CHECK (id = 1),
    n   BIGINT NOT NULL
);
INSERT INTO change_seq (id, n) VALUES (1, 0);

-- TG_ARGV: the entity kind, and the column that names it (`provider/model`: both columns).
CREATE FUNCTION rota_feed() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    r       jsonb;
    entity  text;
    head    bigint;
BEGIN
    IF TG_OP = 'DELETE' THEN r := to_jsonb(OLD); ELSE r := to_jsonb(NEW); END IF;
    IF TG_ARGV[1] = 'provider/model' THEN
        entity := (r ->> 'provider') || '/' || (r ->> 'model');
    ELSE
        entity := r ->> TG_ARGV[1];
    END IF;
    UPDATE change_seq SET n = n + 1 RETURNING n INTO head;
    INSERT INTO changes (kind, key, seq) VALUES (TG_ARGV[0], entity, head)
        ON CONFLICT (kind, key) DO UPDATE SET seq = EXCLUDED.seq;
    PERFORM pg_notify('rota_changes', '');
    RETURN NULL;
END
$$;

CREATE TRIGGER profiles_feed AFTER INSERT OR UPDATE OR DELETE ON profiles
    FOR EACH ROW EXECUTE FUNCTION rota_feed('profile', 'id');
CREATE TRIGGER secrets_feed AFTER INSERT OR UPDATE OR DELETE ON secrets
    FOR EACH ROW EXECUTE FUNCTION rota_feed('profile', 'profile_id');
CREATE TRIGGER profile_order_feed AFTER INSERT OR UPDATE OR DELETE ON profile_order
    FOR EACH ROW EXECUTE FUNCTION rota_feed('order', 'provider');
CREATE TRIGGER agents_feed AFTER INSERT OR UPDATE OR DELETE ON agents
    FOR EACH ROW EXECUTE FUNCTION rota_feed('agent', 'name');
CREATE TRIGGER usage_stats_feed AFTER INSERT OR UPDATE OR DELETE ON usage_stats
    FOR EACH ROW EXECUTE FUNCTION rota_feed('stats', 'profile_id');
CREATE TRIGGER profile_cooldowns_feed AFTER INSERT OR UPDATE OR DELETE ON profile_cooldowns
    FOR EACH ROW EXECUTE FUNCTION rota_feed('stats', 'profile_id');
CREATE TRIGGER model_cooldowns_feed AFTER INSERT OR UPDATE OR DELETE ON model_cooldowns
    FOR EACH ROW EXECUTE FUNCTION rota_feed('model', 'provider/model');

-- One refresh per OAuth token, fleet-wide: the instance that holds a profile's claim calls the
-- identity provider; the others wait for its result (docs/scale.md).
CREATE TABLE refresh_claims (
    profile_id  TEXT PRIMARY KEY REFERENCES profiles (id) ON DELETE CASCADE,
    holder      TEXT NOT NULL,
    expires_at  BIGINT NOT NULL
);
