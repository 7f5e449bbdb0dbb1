-- Session bindings (docs/scale.md, "Sessions"): the profile each conversation sticks to, per
-- provider, shared by every server of a fleet. Written when a session first lands and when it
-- moves (the later binding wins), its last use refreshed at most every 10 minutes; bindings
-- idle for 6 hours, and the oldest beyond 1,000,000, are deleted by the upkeep. A binding made
-- or moved takes the change feed's next position (`seq`) and notifies `rota_changes`.
CREATE TABLE session_bindings (
    session     TEXT NOT NULL,
    provider    TEXT NOT NULL,
    profile_id  TEXT NOT NULL,
    bound_at    BIGINT NOT NULL,
    seen_at     BIGINT NOT NULL,
    seq         BIGINT NOT NULL DEFAULT 0,
    PRIMARY KEY (session, provider)
);
CREATE INDEX session_bindings_seq ON session_bindings (seq);
CREATE INDEX session_bindings_seen ON session_bindings (seen_at);

CREATE FUNCTION rota_binding_feed() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'UPDATE' AND OLD.profile_id = NEW.profile_id THEN
        NEW.seq := OLD.seq;
        RETURN NEW;
    END IF;
    UPDATE change_seq SET n = n + 1 RETURNING n INTO NEW.seq;
    PERFORM pg_notify('rota_changes', '');
    RETURN NEW;
END
$$;
CREATE TRIGGER session_bindings_feed BEFORE INSERT OR UPDATE ON session_bindings
    FOR EACH ROW EXECUTE FUNCTION rota_binding_feed();
