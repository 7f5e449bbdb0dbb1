-- Rotate before the 429: what the provider's latest answer said of a profile's remaining quota
-- for one model (OpenAI `x-ratelimit-*`, Anthropic `anthropic-ratelimit-*`). A profile whose
-- remaining requests (tokens) are at `rotation.quota_floor` (`quota_tokens_floor`) goes after
-- the profiles with quota until the reset; no failure is counted and no window is opened.
-- Written with the profile's usage_stats row, whose change feed entry carries it.
CREATE TABLE profile_quota (
    profile_id                TEXT NOT NULL REFERENCES profiles (id) ON DELETE CASCADE,
    model                     TEXT NOT NULL,
    quota_remaining_requests  INTEGER,
    quota_limit_requests      INTEGER,
    quota_reset_at            INTEGER,             -- when the requests window resets
    quota_remaining_tokens    INTEGER,             -- the token limit with the least left
    quota_limit_tokens        INTEGER,
    quota_tokens_reset_at     INTEGER,
    quota_seen_at             INTEGER NOT NULL,    -- when the answer that reported it arrived
    PRIMARY KEY (profile_id, model)
);
