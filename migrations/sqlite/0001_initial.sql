-- rota's schema. Every time is Unix milliseconds. docs/schema.md documents each column.

CREATE TABLE profiles (
    id          TEXT PRIMARY KEY,                  -- provider:name
    provider    TEXT NOT NULL,
    name        TEXT NOT NULL,
    type        TEXT NOT NULL CHECK (type IN ('oauth', 'token', 'api_key')),
    source      TEXT NOT NULL CHECK (source IN ('stored', 'config')),
    enabled     INTEGER NOT NULL DEFAULT 1 CHECK (enabled IN (0, 1)),
    email       TEXT,
    expires_at  INTEGER,                           -- static tokens: when the token stops working
    created_at  INTEGER NOT NULL,
    updated_at  INTEGER NOT NULL
);
CREATE INDEX profiles_provider ON profiles (provider);

-- Secrets are sealed with XChaCha20-Poly1305; the associated data binds each ciphertext to
-- its profile, field and key id, so a row copied elsewhere does not decrypt.
CREATE TABLE secrets (
    profile_id  TEXT NOT NULL REFERENCES profiles (id) ON DELETE CASCADE,
    field       TEXT NOT NULL CHECK (field IN ('api_key', 'token', 'access_token', 'refresh_token')),
    key_id      TEXT NOT NULL,
    nonce       BLOB NOT NULL,
    ciphertext  BLOB NOT NULL,
    updated_at  INTEGER NOT NULL,
    PRIMARY KEY (profile_id, field)
);

CREATE TABLE usage_stats (
    profile_id        TEXT PRIMARY KEY REFERENCES profiles (id) ON DELETE CASCADE,
    last_used         INTEGER,
    last_success_at   INTEGER,
    cooldown_until    INTEGER,
    cooldown_reason   TEXT,
    cooldown_model    TEXT,                        -- NULL: every model
    disabled_until    INTEGER,                     -- NULL with a reason: until cleared
    disabled_reason   TEXT,
    error_count       INTEGER NOT NULL DEFAULT 0,
    failure_counts    TEXT NOT NULL DEFAULT '{}',  -- JSON object reason -> count
    last_failure_at   INTEGER,
    window_opened_at  INTEGER,
    success_count     INTEGER NOT NULL DEFAULT 0,
    failure_total     INTEGER NOT NULL DEFAULT 0
);

-- auth.order set through the CLI, API or web page; beats the config file's.
CREATE TABLE profile_order (
    provider     TEXT PRIMARY KEY,
    profile_ids  TEXT NOT NULL,                    -- JSON array of profile ids
    updated_at   INTEGER NOT NULL
);

-- model_not_found cools a model on a provider for every profile.
CREATE TABLE model_cooldowns (
    provider         TEXT NOT NULL,
    model            TEXT NOT NULL,
    cooldown_until   INTEGER NOT NULL,
    error_count      INTEGER NOT NULL,
    last_failure_at  INTEGER NOT NULL,
    PRIMARY KEY (provider, model)
);

CREATE TABLE agents (
    id          TEXT PRIMARY KEY,
    name        TEXT NOT NULL UNIQUE,
    key_digest  TEXT NOT NULL UNIQUE,              -- SHA-256 of the agent key; the key is never stored
    admin       INTEGER NOT NULL DEFAULT 0 CHECK (admin IN (0, 1)),
    created_at  INTEGER NOT NULL,
    revoked_at  INTEGER
);

CREATE TABLE requests (
    id               TEXT PRIMARY KEY,
    agent            TEXT,
    api              TEXT NOT NULL CHECK (api IN ('chat', 'responses', 'messages', 'lease')),
    requested_model  TEXT,
    served_model     TEXT,                         -- provider/model
    served_profile   TEXT,
    status           INTEGER,
    attempts         INTEGER NOT NULL DEFAULT 0,
    started_at       INTEGER NOT NULL,
    duration_ms      INTEGER,
    stream           INTEGER NOT NULL DEFAULT 0 CHECK (stream IN (0, 1)),
    tokens_in        INTEGER,
    tokens_out       INTEGER
);
CREATE INDEX requests_started ON requests (started_at);
CREATE INDEX requests_agent ON requests (agent, started_at);

CREATE TABLE attempts (
    request_id      TEXT NOT NULL,
    seq             INTEGER NOT NULL,
    kind            TEXT NOT NULL CHECK (kind IN ('primary', 'retry', 'rotate', 'fallback', 'probe', 'skipped')),
    agent           TEXT,
    provider        TEXT NOT NULL,
    model           TEXT NOT NULL,
    profile_id      TEXT,
    started_at      INTEGER NOT NULL,
    duration_ms     INTEGER,
    ttfb_ms         INTEGER,
    http_status     INTEGER,
    outcome         TEXT NOT NULL CHECK (outcome IN ('success', 'failure', 'skipped')),
    reason          TEXT,
    retry_after_ms  INTEGER,
    cooldown_until  INTEGER,                       -- the window this failure set
    error           TEXT CHECK (error IS NULL OR length(error) <= 500),
    tokens_in       INTEGER,
    tokens_out      INTEGER,
    PRIMARY KEY (request_id, seq)
);
CREATE INDEX attempts_started ON attempts (started_at);
CREATE INDEX attempts_profile ON attempts (profile_id, started_at);
