-- Who made a change, verified (docs/operations.md, "Admin actions"): a person is their identity
-- provider's subject (`issuer sub`) with the verified email beside it in `actor_email`, and the
-- CLI's changes are rows too (`actor_kind = 'cli'`, the OS user as `actor`).
ALTER TABLE admin_actions DROP CONSTRAINT admin_actions_actor_kind_check;
ALTER TABLE admin_actions ADD CONSTRAINT admin_actions_actor_kind_check
    CHECK (actor_kind IN ('agent', 'person', 'cli'));
ALTER TABLE admin_actions ADD COLUMN actor_email TEXT;
