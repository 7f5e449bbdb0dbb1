-- The change feed (docs/scale.md): every insert, update and delete of the shared state, by any
-- writer (a server, the CLI, another instance, an operator's own SQL), moves its entity to the
-- head of a monotonically increasing sequence. Each server polls the head and reloads what
-- changed. One row per entity: the table stays as small as the state it describes. (The
-- triggers delete and insert rather than INSERT OR REPLACE: an outer upsert's conflict policy
-- would override theirs.)
CREATE TABLE changes (
    kind  TEXT NOT NULL CHECK (kind IN ('profile', 'order', 'agent', 'stats', 'model')),
    key   TEXT NOT NULL,                          -- profile id, provider, agent name, provider/model
    seq   INTEGER NOT NULL,
    PRIMARY KEY (kind, key)
);
CREATE UNIQUE INDEX changes_seq ON changes (seq);

-- The head of the feed: only ever counts up (a deleted entry never hands its number back).
CREATE TABLE change_seq (
    id  INTEGER PRIMARY KEY CHECK (id = 1),
    n   INTEGER NOT NULL
);
INSERT INTO change_seq (id, n) VALUES (1, 0);

-- An admin clear's generation: failures from before it open no window when their write lands
-- after it.
ALTER TABLE usage_stats ADD COLUMN cleared_at INTEGER;

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
CREATE TRIGGER profile_order_insert_feed AFTER INSERT ON profile_order BEGIN
    UPDATE change_seq SET n = n + 1;
    DELETE FROM changes WHERE kind = 'order' AND key = NEW.provider;
    INSERT INTO changes (kind, key, seq) VALUES ('order', NEW.provider, (SELECT n FROM change_seq));
END;
CREATE TRIGGER profile_order_update_feed AFTER UPDATE ON profile_order BEGIN
    UPDATE change_seq SET n = n + 1;
    DELETE FROM changes WHERE kind = 'order' AND key = NEW.provider;
    INSERT INTO changes (kind, key, seq) VALUES ('order', NEW.provider, (SELECT n FROM change_seq));
END;
CREATE TRIGGER profile_order_delete_feed AFTER DELETE ON profile_order BEGIN
    UPDATE change_seq SET n = n + 1;
    DELETE FROM changes WHERE kind = 'order' AND key = OLD.provider;
    INSERT INTO changes (kind, key, seq) VALUES ('order', OLD.provider, (SELECT n FROM change_seq));
END;
CREATE TRIGGER agents_insert_feed AFTER INSERT ON agents BEGIN
    UPDATE change_seq SET n = n + 1;
    DELETE FROM changes WHERE kind = 'agent' AND key = NEW.name;
    INSERT INTO changes (kind, key, seq) VALUES ('agent', NEW.name, (SELECT n FROM change_seq));
END;
CREATE TRIGGER agents_update_feed AFTER UPDATE ON agents BEGIN
    UPDATE change_seq SET n = n + 1;
    DELETE FROM changes WHERE kind = 'agent' AND key = NEW.name;
    INSERT INTO changes (kind, key, seq) VALUES ('agent', NEW.name, (SELECT n FROM change_seq));
END;
CREATE TRIGGER agents_delete_feed AFTER DELETE ON agents BEGIN
    UPDATE change_seq SET n = n + 1;
    DELETE FROM changes WHERE kind = 'agent' AND key = OLD.name;
    INSERT INTO changes (kind, key, seq) VALUES ('agent', OLD.name, (SELECT n FROM change_seq));
END;
CREATE TRIGGER usage_stats_insert_feed AFTER INSERT ON usage_stats BEGIN
    UPDATE change_seq SET n = n + 1;
    DELETE FROM changes WHERE kind = 'stats' AND key = NEW.profile_id;
    INSERT INTO changes (kind, key, seq) VALUES ('stats', NEW.profile_id, (SELECT n FROM change_seq));
END;
CREATE TRIGGER usage_stats_update_feed AFTER UPDATE ON usage_stats BEGIN
    UPDATE change_seq SET n = n + 1;
    DELETE FROM changes WHERE kind = 'stats' AND key = NEW.profile_id;
    INSERT INTO changes (kind, key, seq) VALUES ('stats', NEW.profile_id, (SELECT n FROM change_seq));
END;
CREATE TRIGGER usage_stats_delete_feed AFTER DELETE ON usage_stats BEGIN
    UPDATE change_seq SET n = n + 1;
    DELETE FROM changes WHERE kind = 'stats' AND key = OLD.profile_id;
    INSERT INTO changes (kind, key, seq) VALUES ('stats', OLD.profile_id, (SELECT n FROM change_seq));
END;
CREATE TRIGGER profile_cooldowns_insert_feed AFTER INSERT ON profile_cooldowns BEGIN
    UPDATE change_seq SET n = n + 1;
    DELETE FROM changes WHERE kind = 'stats' AND key = NEW.profile_id;
    INSERT INTO changes (kind, key, seq) VALUES ('stats', NEW.profile_id, (SELECT n FROM change_seq));
END;
CREATE TRIGGER profile_cooldowns_update_feed AFTER UPDATE ON profile_cooldowns BEGIN
    UPDATE change_seq SET n = n + 1;
    DELETE FROM changes WHERE kind = 'stats' AND key = NEW.profile_id;
    INSERT INTO changes (kind, key, seq) VALUES ('stats', NEW.profile_id, (SELECT n FROM change_seq));
END;
CREATE TRIGGER profile_cooldowns_delete_feed AFTER DELETE ON profile_cooldowns BEGIN
    UPDATE change_seq SET n = n + 1;
    DELETE FROM changes WHERE kind = 'stats' AND key = OLD.profile_id;
    INSERT INTO changes (kind, key, seq) VALUES ('stats', OLD.profile_id, (SELECT n FROM change_seq));
END;
CREATE TRIGGER model_cooldowns_insert_feed AFTER INSERT ON model_cooldowns BEGIN
    UPDATE change_seq SET n = n + 1;
    DELETE FROM changes WHERE kind = 'model' AND key = NEW.provider || '/' || NEW.model;
    INSERT INTO changes (kind, key, seq) VALUES ('model', NEW.provider || '/' || NEW.model, (SELECT n FROM change_seq));
END;
CREATE TRIGGER model_cooldowns_update_feed AFTER UPDATE ON model_cooldowns BEGIN
    UPDATE change_seq SET n = n + 1;
    DELETE FROM changes WHERE kind = 'model' AND key = NEW.provider || '/' || NEW.model;
    INSERT INTO changes (kind, key, seq) VALUES ('model', NEW.provider || '/' || NEW.model, (SELECT n FROM change_seq));
END;
CREATE TRIGGER model_cooldowns_delete_feed AFTER DELETE ON model_cooldowns BEGIN
    UPDATE change_seq SET n = n + 1;
    DELETE FROM changes WHERE kind = 'model' AND key = OLD.provider || '/' || OLD.model;
    INSERT INTO changes (kind, key, seq) VALUES ('model', OLD.provider || '/' || OLD.model, (SELECT n FROM change_seq));
END;
