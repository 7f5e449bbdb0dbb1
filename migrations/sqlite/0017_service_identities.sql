-- no-transaction
-- Service identities (docs/providers.md): a profile may be an OAuth client that rota exchanges
-- for access tokens itself (`client_credentials`, its secret sealed as `client_secret`), or a
-- Google service account whose JSON key signs the assertion rota exchanges (`service_account`,
-- the key sealed as `service_account_key`).
-- SQLite cannot change a CHECK in place, so `profiles` and `secrets` are rebuilt as SQLite's
-- "12-step" procedure prescribes: foreign keys off (dropping a table must not cascade),
-- `legacy_alter_table` on (the rename must not rewrite the views and triggers naming them),
-- one transaction, then the indexes and triggers again and a foreign key check.
PRAGMA foreign_keys = OFF;
PRAGMA legacy_alter_table = ON;
BEGIN;

CREATE TABLE profiles_new (
    id          TEXT PRIMARY KEY,                  -- provider:name
    provider    TEXT NOT NULL,
    name        TEXT NOT NULL,
    type        TEXT NOT NULL CHECK (type IN ('oauth', 'token', 'api_key', 'client_credentials', 'service_account')),
    source      TEXT NOT NULL CHECK (source IN ('stored', 'config')),
    enabled     INTEGER NOT NULL DEFAULT 1 CHECK (enabled IN (0, 1)),
    email       TEXT,
    expires_at  INTEGER,                           -- when the credential stops working
    created_at  INTEGER NOT NULL,
    updated_at  INTEGER NOT NULL,
    oauth_subject TEXT
);
INSERT INTO profiles_new (id, provider, name, type, source, enabled, email, expires_at, created_at, updated_at, oauth_subject)
    SELECT id, provider, name, type, source, enabled, email, expires_at, created_at, updated_at, oauth_subject FROM profiles;
DROP TABLE profiles;
ALTER TABLE profiles_new RENAME TO profiles;
CREATE INDEX profiles_provider ON profiles (provider);
CREATE UNIQUE INDEX profiles_oauth_subject ON profiles (provider, oauth_subject) WHERE oauth_subject IS NOT NULL;
CREATE TRIGGER profiles_insert_feed AFTER INSERT ON profiles BEGIN
    UPDATE change_seq SET n = n + 1;
    DELETE FROM changes WHERE kind = 'profile' AND key = NEW.id;
    INSERT INTO changes (kind, key, seq) VALUES ('profile', NEW.id, (SELECT n FROM change_seq));
END;
CREATE TRIGGER profiles_update_feed AFTER UPDATE ON profiles BEGIN
    UPDATE change_seq SET n = n + 1;
    DELETE FROM changes WHERE kind = 'profile' AND key = NEW.id;
    INSERT INTO changes (kind, key, seq) VALUES ('profile', NEW.id, (SELECT n FROM change_seq));
END;
CREATE TRIGGER profiles_delete_feed AFTER DELETE ON profiles BEGIN
    UPDATE change_seq SET n = n + 1;
    DELETE FROM changes WHERE kind = 'profile' AND key = OLD.id;
    INSERT INTO changes (kind, key, seq) VALUES ('profile', OLD.id, (SELECT n FROM change_seq));
END;

CREATE TABLE secrets_new (
    profile_id  TEXT NOT NULL REFERENCES profiles (id) ON DELETE CASCADE,
    field       TEXT NOT NULL CHECK (field IN ('api_key', 'token', 'access_token', 'refresh_token', 'client_secret', 'service_account_key')),
    key_id      TEXT NOT NULL,
    nonce       BLOB NOT NULL,
    ciphertext  BLOB NOT NULL,
    updated_at  INTEGER NOT NULL,
    PRIMARY KEY (profile_id, field)
);
INSERT INTO secrets_new (profile_id, field, key_id, nonce, ciphertext, updated_at)
    SELECT profile_id, field, key_id, nonce, ciphertext, updated_at FROM secrets;
DROP TABLE secrets;
ALTER TABLE secrets_new RENAME TO secrets;
CREATE TRIGGER secrets_insert_feed AFTER INSERT ON secrets BEGIN
    UPDATE change_seq SET n = n + 1;
    DELETE FROM changes WHERE kind = 'profile' AND key = NEW.profile_id;
    INSERT INTO changes (kind, key, seq) VALUES ('profile', NEW.profile_id, (SELECT n FROM change_seq));
END;
CREATE TRIGGER secrets_update_feed AFTER UPDATE ON secrets BEGIN
    UPDATE change_seq SET n = n + 1;
    DELETE FROM changes WHERE kind = 'profile' AND key = NEW.profile_id;
    INSERT INTO changes (kind, key, seq) VALUES ('profile', NEW.profile_id, (SELECT n FROM change_seq));
END;
CREATE TRIGGER secrets_delete_feed AFTER DELETE ON secrets BEGIN
    UPDATE change_seq SET n = n + 1;
    DELETE FROM changes WHERE kind = 'profile' AND key = OLD.profile_id;
    INSERT INTO changes (kind, key, seq) VALUES ('profile', OLD.profile_id, (SELECT n FROM change_seq));
END;

COMMIT;
PRAGMA legacy_alter_table = OFF;
PRAGMA foreign_keys = ON;
