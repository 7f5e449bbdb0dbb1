-- The change feed's triggers fire once a statement, not once a row (docs/scale.md, "Capacity
-- on PostgreSQL"). A row trigger bumped `change_seq` for every row a statement wrote: a batch
-- of the stats writer that updated 256 profiles' rows in one statement took 91 ms, 1.7 ms of it
-- the update itself, all of it holding the counter. A statement trigger reads the keys of the
-- rows it wrote from its transition table (named `changed`), takes as many positions at once,
-- and moves each entity to one of them: the same entries, in one UPDATE and one INSERT.
-- TG_ARGV: the entity kind, and the SQL expression of a row that names it.
CREATE FUNCTION rota_feed_rows() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    keys   text[];
    head   bigint;
BEGIN
    EXECUTE format('SELECT array_agg(DISTINCT %s) FROM changed', TG_ARGV[1]) INTO keys;
    IF keys IS NULL THEN
        RETURN NULL;
    END IF;
    UPDATE change_seq SET n = n + cardinality(keys) RETURNING n INTO head;
    INSERT INTO changes (kind, key, seq)
        SELECT TG_ARGV[0], k, head - cardinality(keys) + i FROM unnest(keys) WITH ORDINALITY AS u (k, i)
        ON CONFLICT (kind, key) DO UPDATE SET seq = EXCLUDED.seq;
    PERFORM pg_notify('rota_changes', '');
    RETURN NULL;
END
$$;

DO $$
DECLARE
    t record;
BEGIN
    FOR t IN SELECT * FROM (VALUES
        ('profiles', 'profile', 'id'),
        ('secrets', 'profile', 'profile_id'),
        ('profile_order', 'order', 'provider'),
        ('agents', 'agent', 'name'),
        ('usage_stats', 'stats', 'profile_id'),
        ('profile_cooldowns', 'stats', 'profile_id'),
        ('model_cooldowns', 'model', $k$provider || '/' || model$k$)
    ) AS v (tab, kind, expr) LOOP
        EXECUTE format('DROP TRIGGER %I ON %I', t.tab || '_feed', t.tab);
        EXECUTE format('CREATE TRIGGER %I AFTER INSERT ON %I REFERENCING NEW TABLE AS changed
                        FOR EACH STATEMENT EXECUTE FUNCTION rota_feed_rows(%L, %L)',
                       t.tab || '_feed_insert', t.tab, t.kind, t.expr);
        EXECUTE format('CREATE TRIGGER %I AFTER UPDATE ON %I REFERENCING NEW TABLE AS changed
                        FOR EACH STATEMENT EXECUTE FUNCTION rota_feed_rows(%L, %L)',
                       t.tab || '_feed_update', t.tab, t.kind, t.expr);
        EXECUTE format('CREATE TRIGGER %I AFTER DELETE ON %I REFERENCING OLD TABLE AS changed
                        FOR EACH STATEMENT EXECUTE FUNCTION rota_feed_rows(%L, %L)',
                       t.tab || '_feed_delete', t.tab, t.kind, t.expr);
    END LOOP;
END
$$;

DROP FUNCTION rota_feed();
