-- Alerts (docs/operations.md, "Alerts"). `alert_gates`: when each rule last raised an alert for
-- each subject, shared by the fleet, so that a rule alerts once per `min_interval` and subject.
-- `alert_outbox`: every alert raised, until delivered (at least once; one instance of a fleet
-- claims each for a while). `alert_deliveries`: every attempt to deliver one.
CREATE TABLE alert_gates (
    rule     TEXT NOT NULL,
    subject  TEXT NOT NULL,
    fired_at INTEGER NOT NULL,                     -- Unix ms
    PRIMARY KEY (rule, subject)
);
CREATE TABLE alert_outbox (
    id            TEXT NOT NULL PRIMARY KEY,        -- UUIDv7, sent as X-Rota-Alert-Id
    rule          TEXT NOT NULL,
    kind          TEXT NOT NULL,
    subject       TEXT NOT NULL,
    body          TEXT NOT NULL,                    -- the bytes posted
    raised_at     INTEGER NOT NULL,                 -- Unix ms
    state         TEXT NOT NULL CHECK (state IN ('pending', 'delivered', 'failed')),
    attempts      INTEGER NOT NULL,
    next_at       INTEGER NOT NULL,                 -- Unix ms: not tried again before
    claimed_by    TEXT,                             -- the instance sending it
    claimed_until INTEGER,                          -- Unix ms: its claim ends
    delivered_at  INTEGER                           -- Unix ms
);
CREATE INDEX alert_outbox_due ON alert_outbox (state, next_at);
CREATE TABLE alert_deliveries (
    alert_id    TEXT NOT NULL REFERENCES alert_outbox (id) ON DELETE CASCADE,
    attempt     INTEGER NOT NULL,                   -- 1, 2, …
    instance    TEXT NOT NULL,
    at          INTEGER NOT NULL,                   -- Unix ms
    duration_ms INTEGER NOT NULL,
    status      INTEGER,                            -- the receiver's HTTP status; NULL: no answer
    error       TEXT,                               -- NULL when delivered
    PRIMARY KEY (alert_id, attempt)
);
