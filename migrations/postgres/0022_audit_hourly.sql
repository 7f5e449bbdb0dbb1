-- audit_minutely summed per hour, added to by the audit writer in the same transaction:
-- GET /api/v1/usage/series reads its buckets here when they are whole hours (5 million attempts
-- over 90 days: 30 days per hour read 480,000 rows of audit_minutely, and read 36,000 here).
CREATE TABLE audit_hourly (
    hour      BIGINT NOT NULL,                     -- start of the hour, Unix ms
    kind      TEXT NOT NULL,                       -- as in audit_minutely
    provider  TEXT NOT NULL,
    outcome   TEXT NOT NULL,
    reason    TEXT NOT NULL,
    n         BIGINT NOT NULL,
    PRIMARY KEY (hour, kind, provider, outcome, reason)
);

INSERT INTO audit_hourly (hour, kind, provider, outcome, reason, n)
SELECT minute - minute % 3600000, kind, provider, outcome, reason, sum(n)
FROM audit_minutely GROUP BY 1, 2, 3, 4, 5;
