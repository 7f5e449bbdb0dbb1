-- An OAuth profile belongs to the account that logged in, named by its OpenID subject
-- (`<issuer> <sub>`): logging in again updates that profile even when the email changed, and
-- another account that claims the same email cannot take it over. NULL: a profile logged in
-- before this column existed (its next login records the subject), or a provider without one.
-- The same change as migrations/sqlite/0007_oauth_subject.sql.
ALTER TABLE profiles ADD COLUMN oauth_subject TEXT;
CREATE UNIQUE INDEX profiles_oauth_subject ON profiles (provider, oauth_subject) WHERE oauth_subject IS NOT NULL;
