-- A profile whose calls cost money, marked through the API, the CLI or the console (docs/schema.md,
-- `profiles.paid`): a request it serves raises the `paid` alert.
ALTER TABLE profiles ADD COLUMN paid BOOLEAN NOT NULL DEFAULT FALSE;
