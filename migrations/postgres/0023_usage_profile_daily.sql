-- usage_hourly summed per UTC day, added to by the audit writer in the same transaction:
-- GET /api/v1/usage reads whole days here, whole hours at the ends from usage_hourly and the
-- partial hours from attempts (5 million attempts over 90 days: 30 days grouped 141,000 rows of
-- usage_hourly by profile, 87 ms; 6,000 here).
CREATE TABLE usage_profile_daily (
    day         BIGINT NOT NULL,                   -- start of the UTC day, Unix ms
    profile_id  TEXT NOT NULL,
    attempts    BIGINT NOT NULL,
    successes   BIGINT NOT NULL,
    failures    BIGINT NOT NULL,
    tokens_in   BIGINT NOT NULL,
    tokens_out  BIGINT NOT NULL,
    PRIMARY KEY (day, profile_id)
);

INSERT INTO usage_profile_daily (day, profile_id, attempts, successes, failures, tokens_in, tokens_out)
SELECT hour - hour % 86400000, profile_id, CAST(sum(attempts) AS BIGINT), CAST(sum(successes) AS BIGINT),
       CAST(sum(failures) AS BIGINT), CAST(sum(tokens_in) AS BIGINT), CAST(sum(tokens_out) AS BIGINT)
FROM usage_hourly GROUP BY 1, 2;
