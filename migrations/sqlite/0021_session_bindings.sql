-- Session bindings (docs/scale.md, "Sessions"): the profile each conversation sticks to, per
-- provider, shared by every server of a fleet. Written when a session first lands and when it
-- moves (the later binding wins), its last use refreshed at most every 10 minutes; bindings
-- idle for 6 hours, and the oldest beyond 1,000,000, are deleted by the upkeep. A binding made
-- or moved takes the change feed's next position (`seq`), so that every server follows it.
CREATE TABLE session_bindings (
    session     TEXT NOT NULL,                    -- as sent, or sha256:<hex> when over 128 bytes
    provider    TEXT NOT NULL,
    profile_id  TEXT NOT NULL,
    bound_at    INTEGER NOT NULL,                 -- Unix ms: when it landed on this profile
    seen_at     INTEGER NOT NULL,                 -- Unix ms: its last use, as written
    seq         INTEGER NOT NULL DEFAULT 0,       -- the change feed's position of the binding
    PRIMARY KEY (session, provider)
);
CREATE INDEX session_bindings_seq ON session_bindings (seq);
CREATE INDEX session_bindings_seen ON session_bindings (seen_at);

CREATE TRIGGER session_bindings_bound AFTER INSERT ON session_bindings BEGIN
    UPDATE change_seq SET n = n + 1;
    UPDATE session_bindings SET seq = (SELECT n FROM change_seq)
        WHERE session = NEW.session AND provider = NEW.provider;
END;
CREATE TRIGGER session_bindings_moved AFTER UPDATE OF profile_id ON session_bindings
    WHEN OLD.profile_id IS NOT NEW.profile_id BEGIN
    UPDATE change_seq SET n = n + 1;
    UPDATE session_bindings SET seq = (SELECT n FROM change_seq)
        WHERE session = NEW.session AND provider = NEW.provider;
END;
