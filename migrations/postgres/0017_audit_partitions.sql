-- The audit trail partitioned by UTC day (docs/audit.md, "Partitions on PostgreSQL"):
-- `requests` and `attempts` by `started_at`, `usage_hourly` by `hour`, each day its own
-- partition (`<table>_pYYYYMMDD`), and a default partition (`<table>_default`) for a row of a
-- day that has none yet, moved into that day's partition when it is created. Retention drops a
-- whole day's partitions in one statement each instead of deleting its rows one by one.
--
-- A database whose audit tables are empty is partitioned here; one that already holds audit
-- rows is partitioned by `rota migrate` (`rota_partition_audit`), which copies them.

-- Whether the audit trail is partitioned.
CREATE FUNCTION rota_audit_partitioned() RETURNS boolean LANGUAGE sql STABLE AS $$
    SELECT EXISTS (SELECT 1 FROM pg_partitioned_table WHERE partrelid = to_regclass('attempts'))
$$;

-- The partition key of each partitioned audit table.
CREATE FUNCTION rota_audit_column(tbl text) RETURNS text LANGUAGE sql IMMUTABLE AS $$
    SELECT CASE tbl WHEN 'usage_hourly' THEN 'hour' ELSE 'started_at' END
$$;

-- The start of the UTC day of `ms` (Unix ms), and the name of `tbl`'s partition of that day.
CREATE FUNCTION rota_day(ms bigint) RETURNS bigint LANGUAGE sql IMMUTABLE AS $$
    SELECT ms - ((ms % 86400000) + 86400000) % 86400000
$$;
CREATE FUNCTION rota_day_partition(tbl text, day_ms bigint) RETURNS text LANGUAGE sql IMMUTABLE AS $$
    SELECT tbl || '_p' || to_char(to_timestamp(day_ms / 1000) AT TIME ZONE 'UTC', 'YYYYMMDD')
$$;

-- Makes `tbl`'s partition of the day that starts at `day_ms`, unless it exists: the rows of
-- that day waiting in the default partition move into it, and it is attached without holding
-- up the writers of the other days (its range is checked by a constraint, not a scan). True
-- when it made one.
CREATE FUNCTION rota_audit_day(tbl text, day_ms bigint) RETURNS boolean LANGUAGE plpgsql AS $$
DECLARE
    part text := rota_day_partition(tbl, day_ms);
    col  text := rota_audit_column(tbl);
    upto bigint := day_ms + 86400000;
BEGIN
    IF to_regclass(quote_ident(part)) IS NOT NULL THEN
        RETURN false;
    END IF;
    EXECUTE format('CREATE TABLE %I (LIKE %I INCLUDING DEFAULTS INCLUDING CONSTRAINTS)', part, tbl);
    EXECUTE format('ALTER TABLE %I ADD CONSTRAINT %I CHECK (%I >= %s AND %I < %s)',
                   part, part || '_day', col, day_ms, col, upto);
    EXECUTE format('WITH moved AS (DELETE FROM %I WHERE %I >= $1 AND %I < $2 RETURNING *) INSERT INTO %I SELECT * FROM moved',
                   tbl || '_default', col, col, part) USING day_ms, upto;
    EXECUTE format('ALTER TABLE %I ATTACH PARTITION %I FOR VALUES FROM (%s) TO (%s)', tbl, part, day_ms, upto);
    EXECUTE format('ALTER TABLE %I DROP CONSTRAINT %I', part, part || '_day');
    RETURN true;
END
$$;

-- The upkeep's part (every `audit.prune_every`, and at start): the partitions of the days from
-- yesterday to a week ahead of `now_ms`, and of every day that has rows in a default
-- partition, which empties those. How many partitions it made; none on a trail that is not
-- partitioned.
CREATE FUNCTION rota_audit_upkeep(now_ms bigint) RETURNS integer LANGUAGE plpgsql AS $$
DECLARE
    tbl  text;
    d    bigint;
    made integer := 0;
BEGIN
    IF NOT rota_audit_partitioned() THEN
        RETURN 0;
    END IF;
    FOREACH tbl IN ARRAY ARRAY['requests', 'attempts', 'usage_hourly'] LOOP
        FOR d IN SELECT generate_series(rota_day(now_ms) - 86400000, rota_day(now_ms) + 7 * 86400000, 86400000) LOOP
            made := made + rota_audit_day(tbl, d)::integer;
        END LOOP;
        FOR d IN EXECUTE format('SELECT DISTINCT rota_day(%I) FROM %I', rota_audit_column(tbl), tbl || '_default') LOOP
            made := made + rota_audit_day(tbl, d)::integer;
        END LOOP;
    END LOOP;
    RETURN made;
END
$$;

-- Partitions an audit trail that is not: each table is copied into a partitioned one with a
-- partition per day its rows cover, which takes its name, primary key (with the partition key
-- added) and indices; the views, which name the tables they read, are made again on the new
-- ones. One transaction, with the three tables locked: the servers' audit writes wait for it.
-- The rows copied; -1 when the trail was partitioned already.
CREATE FUNCTION rota_partition_audit() RETURNS bigint LANGUAGE plpgsql AS $$
DECLARE
    tbl     text;
    col     text;
    pk      text;
    defs    text[];
    def     text;
    d       bigint;
    n       bigint;
    copied  bigint := 0;
    v       record;
    views   jsonb := '[]';
    left_   jsonb;
    made    boolean;
BEGIN
    IF rota_audit_partitioned() THEN
        RETURN -1;
    END IF;
    LOCK TABLE requests, attempts, usage_hourly IN ACCESS EXCLUSIVE MODE;
    FOR v IN SELECT c.relname, pg_get_viewdef(c.oid) AS def FROM pg_class c
             WHERE c.relkind = 'v' AND c.relnamespace = to_regnamespace(current_schema()) ORDER BY c.oid LOOP
        views := views || jsonb_build_object('name', v.relname, 'def', v.def);
    END LOOP;
    FOR v IN SELECT value ->> 'name' AS name FROM jsonb_array_elements(views) LOOP
        EXECUTE format('DROP VIEW IF EXISTS %I CASCADE', v.name);
    END LOOP;
    FOREACH tbl IN ARRAY ARRAY['requests', 'attempts', 'usage_hourly'] LOOP
        col := rota_audit_column(tbl);
        SELECT string_agg(quote_ident(a.attname), ', ' ORDER BY k.ord) INTO pk
            FROM pg_index i CROSS JOIN unnest(i.indkey) WITH ORDINALITY AS k(attnum, ord)
            JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = k.attnum
            WHERE i.indrelid = to_regclass(tbl) AND i.indisprimary;
        IF NOT (string_to_array(pk, ', ') @> ARRAY[quote_ident(col)]) THEN
            pk := pk || ', ' || quote_ident(col);
        END IF;
        defs := ARRAY(SELECT pg_get_indexdef(indexrelid) FROM pg_index
                      WHERE indrelid = to_regclass(tbl) AND NOT indisprimary ORDER BY indexrelid);
        EXECUTE format('CREATE TABLE %I (LIKE %I INCLUDING DEFAULTS INCLUDING CONSTRAINTS) PARTITION BY RANGE (%I)',
                       tbl || '_partitioned', tbl, col);
        EXECUTE format('CREATE TABLE %I PARTITION OF %I DEFAULT', tbl || '_default', tbl || '_partitioned');
        FOR d IN EXECUTE format('SELECT DISTINCT rota_day(%I) FROM %I', col, tbl) LOOP
            EXECUTE format('CREATE TABLE %I PARTITION OF %I FOR VALUES FROM (%s) TO (%s)',
                           rota_day_partition(tbl, d), tbl || '_partitioned', d, d + 86400000);
        END LOOP;
        EXECUTE format('INSERT INTO %I SELECT * FROM %I', tbl || '_partitioned', tbl);
        GET DIAGNOSTICS n = ROW_COUNT;
        copied := copied + n;
        EXECUTE format('DROP TABLE %I', tbl);
        EXECUTE format('ALTER TABLE %I RENAME TO %I', tbl || '_partitioned', tbl);
        EXECUTE format('ALTER TABLE %I ADD PRIMARY KEY (%s)', tbl, pk);
        FOREACH def IN ARRAY defs LOOP
            EXECUTE def;
        END LOOP;
    END LOOP;
    -- The views again, each once the views it reads are back.
    LOOP
        left_ := '[]';
        made := false;
        FOR v IN SELECT value ->> 'name' AS name, value ->> 'def' AS def FROM jsonb_array_elements(views) LOOP
            BEGIN
                EXECUTE format('CREATE VIEW %I AS %s', v.name, v.def);
                made := true;
            EXCEPTION WHEN undefined_table THEN
                left_ := left_ || jsonb_build_object('name', v.name, 'def', v.def);
            END;
        END LOOP;
        EXIT WHEN jsonb_array_length(left_) = 0;
        IF NOT made THEN
            RAISE EXCEPTION 'the audit views could not be made again: %', left_;
        END IF;
        views := left_;
    END LOOP;
    PERFORM rota_audit_upkeep((extract(epoch FROM now()) * 1000)::bigint);
    RETURN copied;
END
$$;

DO $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM requests) AND NOT EXISTS (SELECT 1 FROM attempts)
       AND NOT EXISTS (SELECT 1 FROM usage_hourly) THEN
        PERFORM rota_partition_audit();
    END IF;
END
$$;
