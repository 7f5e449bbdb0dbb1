-- The audit listings (GET /api/v1/attempts and /requests, the console's attempts tab) seek an
-- index for each filter and walk the listing's own order, instead of scanning every attempt
-- and sorting: at 5 million attempts, 0.6-10 s a page before, under 10 ms after
-- (docs/performance.md, "Audit at scale"). attempts_listing replaces attempts_started (its
-- prefix), so pruning and time ranges still seek it.
CREATE INDEX attempts_listing ON attempts (started_at, request_id, seq);
DROP INDEX attempts_started;
CREATE INDEX attempts_agent ON attempts (agent, started_at);
CREATE INDEX attempts_provider ON attempts (provider, started_at);
CREATE INDEX attempts_model ON attempts (model, started_at);
CREATE INDEX attempts_reason ON attempts (reason, started_at) WHERE reason IS NOT NULL;
CREATE INDEX attempts_outcome ON attempts (outcome, started_at);
