-- A profile whose calls cost money, marked through the API, the CLI or the console (docs/schema.md,
-- `profiles.paid`): a request it serves raises the `paid` alert.
ALTER TABLE profiles ADD COLUMN paid INTEGER NOT NULL DEFAULT 0 CHECK (paid IN (0, 1));
