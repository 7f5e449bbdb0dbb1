-- Budgets and limits per agent (docs/config.md, `[agents.NAME]`): the limits set through the
-- admin API (a key set in the config file wins over the stored value), NULL = no limit.
ALTER TABLE agents ADD COLUMN requests_per_minute BIGINT CHECK (requests_per_minute IS NULL OR requests_per_minute >= 1);
ALTER TABLE agents ADD COLUMN tokens_per_day BIGINT CHECK (tokens_per_day IS NULL OR tokens_per_day >= 1);
ALTER TABLE agents ADD COLUMN cost_per_day DOUBLE PRECISION CHECK (cost_per_day IS NULL OR cost_per_day > 0);

-- The counters the limits are checked against, shared by every server on the database. A
-- `minute` row counts the requests admitted in one clock-aligned minute (only for agents with
-- `requests_per_minute`, incremented before the first attempt); a `day` row holds the tokens
-- and cost of one UTC day's requests, added by the audit writer with the requests' rows.
CREATE TABLE agent_usage (
    agent TEXT NOT NULL,
    period TEXT NOT NULL CHECK (period IN ('minute', 'day')),
    period_start BIGINT NOT NULL,
    requests BIGINT NOT NULL DEFAULT 0,
    tokens BIGINT NOT NULL DEFAULT 0,
    cost DOUBLE PRECISION NOT NULL DEFAULT 0,
    PRIMARY KEY (agent, period, period_start)
);
-- Pruning by age, and the admin API's listing of one minute and one day.
CREATE INDEX agent_usage_period ON agent_usage (period, period_start);
