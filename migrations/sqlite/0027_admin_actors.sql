-- Who made a change, verified (docs/operations.md, "Admin actions"): a person is their identity
-- provider's subject (`issuer sub`) with the verified email beside it in `actor_email`, and the
-- CLI's changes are rows too (`actor_kind = 'cli'`, the OS user as `actor`). SQLite cannot widen
-- a CHECK in place, so the table is rebuilt with its rows.
CREATE TABLE admin_actions_v2 (
    id           TEXT NOT NULL PRIMARY KEY,        -- UUIDv7: in time order
    at           INTEGER NOT NULL,                 -- Unix ms
    actor        TEXT NOT NULL,
    actor_kind   TEXT NOT NULL CHECK (actor_kind IN ('agent', 'person', 'cli')),
    role         TEXT NOT NULL CHECK (role IN ('viewer', 'operator', 'admin')),
    action       TEXT NOT NULL,                    -- e.g. profile.disable, agent.create
    target       TEXT,                             -- a profile id, an agent or provider name
    value_before TEXT,                             -- JSON; NULL when it did not exist
    value_after  TEXT,                             -- JSON; NULL when it no longer exists
    actor_email  TEXT                              -- a person's verified email, else NULL
);
INSERT INTO admin_actions_v2 (id, at, actor, actor_kind, role, action, target, value_before, value_after)
    SELECT id, at, actor, actor_kind, role, action, target, value_before, value_after FROM admin_actions;
DROP TABLE admin_actions;
ALTER TABLE admin_actions_v2 RENAME TO admin_actions;
CREATE INDEX admin_actions_at ON admin_actions (at);
