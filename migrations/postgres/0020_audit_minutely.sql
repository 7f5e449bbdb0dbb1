-- Attempts and requests counted per minute, added to by the audit writer in the transaction
-- that inserts them, as usage_hourly is: GET /api/v1/usage/series counts its buckets here
-- instead of grouping every attempt and request of its range (5 million attempts over 90 days:
-- some 15,000 rows a day here against 35,000 attempts and 28,000 requests).
CREATE TABLE audit_minutely (
    minute    BIGINT NOT NULL,                     -- start of the minute, Unix ms
    kind      TEXT NOT NULL,                       -- 'attempt' or 'request'
    provider  TEXT NOT NULL,                       -- an attempt's provider; '' for a request
    outcome   TEXT NOT NULL,                       -- attempts: success, failure, skipped; requests: served, failed, refused
    reason    TEXT NOT NULL,                       -- an attempt's reason; '' for none and for a request
    n         BIGINT NOT NULL,
    PRIMARY KEY (minute, kind, provider, outcome, reason)
);

INSERT INTO audit_minutely (minute, kind, provider, outcome, reason, n)
SELECT started_at - started_at % 60000, 'attempt', provider, outcome, coalesce(reason, ''), count(*)
FROM attempts GROUP BY 1, 3, 4, 5;

INSERT INTO audit_minutely (minute, kind, provider, outcome, reason, n)
SELECT started_at - started_at % 60000, 'request', '',
       CASE WHEN attempts = 0 THEN 'refused' WHEN status >= 200 AND status < 300 THEN 'served' ELSE 'failed' END,
       '', count(*)
FROM requests GROUP BY 1, 4;
