-- A ChatGPT plan's windows as the Codex backend reports them (`x-codex-{primary,secondary}-*`):
-- the share left of the window with the least left, in percent, and when it resets. A profile
-- at 0 % goes after the others until the reset, as for the request and token windows.
ALTER TABLE profile_quota ADD COLUMN quota_plan_left BIGINT;
ALTER TABLE profile_quota ADD COLUMN quota_plan_reset_at BIGINT;
