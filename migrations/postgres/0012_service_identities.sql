-- Service identities (docs/providers.md): a profile may be an OAuth client that rota exchanges
-- for access tokens itself (`client_credentials`, its secret sealed as `client_secret`), or a
-- Google service account whose JSON key signs the assertion rota exchanges (`service_account`,
-- the key sealed as `service_account_key`).
ALTER TABLE profiles DROP CONSTRAINT profiles_type_check,
    ADD CONSTRAINT profiles_type_check CHECK (type IN ('oauth', 'token', 'api_key', 'client_credentials', 'service_account'));
ALTER TABLE secrets DROP CONSTRAINT secrets_field_check,
    ADD CONSTRAINT secrets_field_check
        CHECK (field IN ('api_key', 'token', 'access_token', 'refresh_token', 'client_secret', 'service_account_key'));
