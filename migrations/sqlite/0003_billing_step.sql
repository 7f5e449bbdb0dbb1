-- The billing lane's doubling step (billing failures since the last success). Unlike
-- error_count and failure_counts it survives the expiry of the windows: an out-of-credit account
-- that is never probed still climbs 1 h, 2 h, 4 h … 24 h (SPEC §3).
ALTER TABLE usage_stats ADD COLUMN billing_step INTEGER NOT NULL DEFAULT 0;
