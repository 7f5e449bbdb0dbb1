-- Token counts an upstream reports are held to 0..=100,000,000 each (docs/schema.md,
-- `usage_suspect`): a row whose counts had to be is flagged, and rows stored before are repaired
-- the same way, with the roll-ups they fed held to 10^15 (an overflowed sum there is a REAL).
ALTER TABLE attempts ADD COLUMN usage_suspect INTEGER NOT NULL DEFAULT 0 CHECK (usage_suspect IN (0, 1));
ALTER TABLE requests ADD COLUMN usage_suspect INTEGER NOT NULL DEFAULT 0 CHECK (usage_suspect IN (0, 1));
UPDATE attempts SET usage_suspect = 1,
    tokens_in = CASE WHEN tokens_in > 100000000 THEN 100000000 WHEN tokens_in < 0 THEN 0 ELSE tokens_in END,
    tokens_out = CASE WHEN tokens_out > 100000000 THEN 100000000 WHEN tokens_out < 0 THEN 0 ELSE tokens_out END,
    cost = NULL
WHERE tokens_in NOT BETWEEN 0 AND 100000000 OR tokens_out NOT BETWEEN 0 AND 100000000;
UPDATE requests SET usage_suspect = 1,
    tokens_in = CASE WHEN tokens_in > 100000000 THEN 100000000 WHEN tokens_in < 0 THEN 0 ELSE tokens_in END,
    tokens_out = CASE WHEN tokens_out > 100000000 THEN 100000000 WHEN tokens_out < 0 THEN 0 ELSE tokens_out END,
    cost = NULL
WHERE tokens_in NOT BETWEEN 0 AND 100000000 OR tokens_out NOT BETWEEN 0 AND 100000000;
UPDATE usage_hourly SET
    tokens_in = CAST(CASE WHEN tokens_in > 1e15 THEN 1000000000000000 WHEN tokens_in < 0 THEN 0 ELSE tokens_in END AS INTEGER),
    tokens_out = CAST(CASE WHEN tokens_out > 1e15 THEN 1000000000000000 WHEN tokens_out < 0 THEN 0 ELSE tokens_out END AS INTEGER)
WHERE tokens_in NOT BETWEEN 0 AND 1000000000000000 OR tokens_out NOT BETWEEN 0 AND 1000000000000000
   OR typeof(tokens_in) <> 'integer' OR typeof(tokens_out) <> 'integer';
UPDATE usage_profile_daily SET
    tokens_in = CAST(CASE WHEN tokens_in > 1e15 THEN 1000000000000000 WHEN tokens_in < 0 THEN 0 ELSE tokens_in END AS INTEGER),
    tokens_out = CAST(CASE WHEN tokens_out > 1e15 THEN 1000000000000000 WHEN tokens_out < 0 THEN 0 ELSE tokens_out END AS INTEGER)
WHERE tokens_in NOT BETWEEN 0 AND 1000000000000000 OR tokens_out NOT BETWEEN 0 AND 1000000000000000
   OR typeof(tokens_in) <> 'integer' OR typeof(tokens_out) <> 'integer';
UPDATE usage_daily SET
    tokens_in = CAST(CASE WHEN tokens_in > 1e15 THEN 1000000000000000 WHEN tokens_in < 0 THEN 0 ELSE tokens_in END AS INTEGER),
    tokens_out = CAST(CASE WHEN tokens_out > 1e15 THEN 1000000000000000 WHEN tokens_out < 0 THEN 0 ELSE tokens_out END AS INTEGER)
WHERE tokens_in NOT BETWEEN 0 AND 1000000000000000 OR tokens_out NOT BETWEEN 0 AND 1000000000000000
   OR typeof(tokens_in) <> 'integer' OR typeof(tokens_out) <> 'integer';
UPDATE agent_usage SET
    tokens = CAST(CASE WHEN tokens > 1e15 THEN 1000000000000000 WHEN tokens < 0 THEN 0 ELSE tokens END AS INTEGER)
WHERE tokens NOT BETWEEN 0 AND 1000000000000000 OR typeof(tokens) <> 'integer';
