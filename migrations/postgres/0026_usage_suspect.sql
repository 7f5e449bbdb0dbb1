-- Token counts an upstream reports are held to 0..=100,000,000 each (docs/schema.md,
-- `usage_suspect`): a row whose counts had to be is flagged, and rows stored before are repaired
-- the same way, with the roll-ups they fed held to 10^15.
ALTER TABLE attempts ADD COLUMN usage_suspect BOOLEAN NOT NULL DEFAULT FALSE;
ALTER TABLE requests ADD COLUMN usage_suspect BOOLEAN NOT NULL DEFAULT FALSE;
UPDATE attempts SET usage_suspect = TRUE,
    tokens_in = LEAST(GREATEST(tokens_in, 0), 100000000), tokens_out = LEAST(GREATEST(tokens_out, 0), 100000000),
    cost = NULL
WHERE tokens_in NOT BETWEEN 0 AND 100000000 OR tokens_out NOT BETWEEN 0 AND 100000000;
UPDATE requests SET usage_suspect = TRUE,
    tokens_in = LEAST(GREATEST(tokens_in, 0), 100000000), tokens_out = LEAST(GREATEST(tokens_out, 0), 100000000),
    cost = NULL
WHERE tokens_in NOT BETWEEN 0 AND 100000000 OR tokens_out NOT BETWEEN 0 AND 100000000;
UPDATE usage_hourly SET tokens_in = LEAST(GREATEST(tokens_in, 0), 1000000000000000),
    tokens_out = LEAST(GREATEST(tokens_out, 0), 1000000000000000)
WHERE tokens_in NOT BETWEEN 0 AND 1000000000000000 OR tokens_out NOT BETWEEN 0 AND 1000000000000000;
UPDATE usage_profile_daily SET tokens_in = LEAST(GREATEST(tokens_in, 0), 1000000000000000),
    tokens_out = LEAST(GREATEST(tokens_out, 0), 1000000000000000)
WHERE tokens_in NOT BETWEEN 0 AND 1000000000000000 OR tokens_out NOT BETWEEN 0 AND 1000000000000000;
UPDATE usage_daily SET tokens_in = LEAST(GREATEST(tokens_in, 0), 1000000000000000),
    tokens_out = LEAST(GREATEST(tokens_out, 0), 1000000000000000)
WHERE tokens_in NOT BETWEEN 0 AND 1000000000000000 OR tokens_out NOT BETWEEN 0 AND 1000000000000000;
UPDATE agent_usage SET tokens = LEAST(GREATEST(tokens, 0), 1000000000000000)
WHERE tokens NOT BETWEEN 0 AND 1000000000000000;
