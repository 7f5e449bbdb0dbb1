-- What the usage series reads (docs/performance.md, "Audit at scale"): see the SQLite
-- migration 0022_series_reads.sql. On a partitioned audit trail the index is made on every
-- day's partition.
DROP INDEX attempts_profile;
CREATE INDEX attempts_profile ON attempts (profile_id, started_at, outcome);

CREATE OR REPLACE VIEW utc_days AS
SELECT to_char(now() AT TIME ZONE 'UTC', 'YYYY-MM-DD')                     AS today,
       to_char((now() AT TIME ZONE 'UTC') - INTERVAL '1 day', 'YYYY-MM-DD') AS yesterday,
       (extract(epoch FROM date_trunc('day', now() AT TIME ZONE 'UTC')) * 1000)::bigint AS today_start,
       (extract(epoch FROM date_trunc('day', now() AT TIME ZONE 'UTC') - INTERVAL '1 day') * 1000)::bigint
           AS yesterday_start;
