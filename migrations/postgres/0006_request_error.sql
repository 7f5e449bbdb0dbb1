-- rota's own message for a request it answered with an error of its own: a refusal after the
-- agent was authenticated (an unknown model, a malformed body, a pin it cannot serve; those
-- requests now get a row, with attempts 0), the aggregated error of an exhausted walk, a
-- timeout. At most 500 characters, as attempts.error.
ALTER TABLE requests ADD COLUMN error TEXT CHECK (error IS NULL OR length(error) <= 500);
