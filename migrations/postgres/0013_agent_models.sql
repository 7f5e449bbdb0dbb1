-- The models an agent may ask for (docs/config.md, `[agents.NAME] models`), as set through the
-- admin API or the CLI: a JSON array of names (aliases, virtual models, `provider/model`);
-- NULL = any. The config file's list wins over the stored one.
ALTER TABLE agents ADD COLUMN models TEXT;
