-- Every change made through the admin API or the console (docs/operations.md, "Admin actions"):
-- who (an agent's name or a person's email, with their role), what, on which target, and the
-- values before and after, as JSON.
CREATE TABLE admin_actions (
    id           TEXT NOT NULL PRIMARY KEY,        -- UUIDv7: in time order
    at           INTEGER NOT NULL,                 -- Unix ms
    actor        TEXT NOT NULL,
    actor_kind   TEXT NOT NULL CHECK (actor_kind IN ('agent', 'person')),
    role         TEXT NOT NULL CHECK (role IN ('viewer', 'operator', 'admin')),
    action       TEXT NOT NULL,                    -- e.g. profile.disable, agent.create
    target       TEXT,                             -- a profile id, an agent or provider name
    value_before TEXT,                             -- JSON; NULL when it did not exist
    value_after  TEXT                              -- JSON; NULL when it no longer exists
);
CREATE INDEX admin_actions_at ON admin_actions (at);
