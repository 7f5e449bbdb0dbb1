-- What a success proves is dated when its call was sent (docs/rotation.md, "Evidence is dated
-- when its call was sent"): the send time of the latest-sent call that succeeded, so that a
-- failure whose write lands after it is judged against it, on every server.
ALTER TABLE usage_stats ADD COLUMN last_success_sent_at INTEGER;
UPDATE usage_stats SET last_success_sent_at = last_success_at;
