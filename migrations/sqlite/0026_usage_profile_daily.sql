-- usage_hourly summed per UTC day, added to by the audit writer in the same transaction:
-- GET /api/v1/usage reads whole days here, whole hours at the ends from usage_hourly and the
-- partial hours from attempts (5 million attempts over 90 days: 30 days grouped 141,000 rows of
-- usage_hourly by profile, 87 ms; 6,000 here).
CREATE TABLE usage_profile_daily (
    day         INTEGER NOT NULL,                  -- start of the UTC day, Unix ms
    profile_id  TEXT NOT NULL,
    attempts    INTEGER NOT NULL,
    successes   INTEGER NOT NULL,
    failures    INTEGER NOT NULL,
    tokens_in   INTEGER NOT NULL,
    tokens_out  INTEGER NOT NULL,
    PRIMARY KEY (day, profile_id)
) WITHOUT ROWID;

INSERT INTO usage_profile_daily (day, profile_id, attempts, successes, failures, tokens_in, tokens_out)
SELECT hour - hour % 86400000, profile_id, sum(attempts), sum(successes), sum(failures), sum(tokens_in),
       sum(tokens_out)
FROM usage_hourly GROUP BY 1, 2;
