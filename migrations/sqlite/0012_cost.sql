-- What each attempt and request cost, in USD rounded to the micro-dollar: price per million
-- tokens (src/prices.toml, config [prices]) × tokens. NULL where no price is known, never a guess;
-- a request's cost is its serving attempt's.
ALTER TABLE attempts ADD COLUMN cost REAL;
ALTER TABLE requests ADD COLUMN cost REAL;

-- The cost of each agent's requests per UTC day. `cost` sums the known costs (NULL when none
-- is known), to the micro-dollar.
CREATE VIEW cost_daily_by_agent AS
SELECT date(started_at / 1000, 'unixepoch') AS day,
       agent,
       COUNT(*)                             AS requests,
       ROUND(SUM(cost) * 1000000) / 1000000 AS cost
FROM requests
GROUP BY day, agent;

-- The cost of each profile's attempts (the account that pays) per UTC day.
CREATE VIEW cost_daily_by_profile AS
SELECT date(started_at / 1000, 'unixepoch') AS day,
       provider,
       profile_id,
       COUNT(*)                             AS attempts,
       ROUND(SUM(cost) * 1000000) / 1000000 AS cost
FROM attempts
WHERE profile_id IS NOT NULL
GROUP BY day, provider, profile_id;

-- The database clock's UTC day and the day before, `YYYY-MM-DD`, for questions about them that
-- read the same on both engines (docs/audit.md).
CREATE VIEW utc_days AS
SELECT date('now') AS today, date('now', '-1 day') AS yesterday;
