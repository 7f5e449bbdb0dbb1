//! OAuth: logins matched to their profile by account, the compare-and-swap of refreshed tokens,
//! and the claims that let one instance of a fleet refresh a token (docs/scale.md, "One refresh
//! per token").

use super::{Affected, Backend, Driver, Sql, Value, corrupt};
use crate::engine::{Millis, ProfileId};
use crate::secrets::Sealed;
use crate::store::{StoreError, StoredProfile};
use sqlx::{ColumnIndex, Encode, Executor, Type};

impl<S, DB> Sql<'_, S>
where
    S: Backend<Db = DB>,
    DB: Driver,
    for<'c> &'c mut DB::Connection: Executor<'c, Database = DB>,
    for<'n> &'n str: ColumnIndex<DB::Row> + Encode<'n, DB> + Type<DB>,
    for<'n> Option<&'n str>: Encode<'n, DB>,
    usize: ColumnIndex<DB::Row>,
    bool: Value<DB>,
    i64: Value<DB>,
    f64: Value<DB>,
    String: Value<DB>,
    Vec<u8>: Value<DB>,
    Option<i64>: Value<DB>,
    Option<f64>: Value<DB>,
    Option<String>: Value<DB>,
{
    pub(super) async fn claim_refresh(
        &self,
        id: &ProfileId,
        holder: &str,
        now: Millis,
        until: Millis,
    ) -> Result<bool, StoreError> {
        let done = sqlx::query(
            "INSERT INTO refresh_claims (profile_id, holder, expires_at)
             SELECT $1, $2, $3 WHERE EXISTS (SELECT 1 FROM profiles WHERE id = $1)
             ON CONFLICT (profile_id) DO UPDATE SET holder = excluded.holder, expires_at = excluded.expires_at
             WHERE refresh_claims.expires_at <= $4 OR refresh_claims.holder = $2",
        )
        .bind(id.as_str())
        .bind(holder)
        .bind(until)
        .bind(now)
        .execute(self.store.pool())
        .await?;
        Ok(done.rows_affected() == 1)
    }

    pub(super) async fn release_refresh(&self, id: &ProfileId, holder: &str) -> Result<(), StoreError> {
        sqlx::query("DELETE FROM refresh_claims WHERE profile_id = $1 AND holder = $2")
            .bind(id.as_str())
            .bind(holder)
            .execute(self.store.pool())
            .await?;
        Ok(())
    }

    pub(super) async fn login_profile(&self, provider: &str, subject: &str) -> Result<Option<ProfileId>, StoreError> {
        let id: Option<String> =
            sqlx::query_scalar("SELECT id FROM profiles WHERE provider = $1 AND oauth_subject = $2")
                .bind(provider)
                .bind(subject)
                .fetch_optional(self.store.pool())
                .await?;
        id.map(|id| id.parse().map_err(|e| corrupt("profiles", e))).transpose()
    }

    pub(super) async fn save_login(&self, p: &StoredProfile, secrets: &[Sealed]) -> Result<bool, StoreError> {
        let mut tx = self.store.write_tx().await?;
        if let Some(subject) = &p.oauth_subject {
            let holder: Option<String> =
                sqlx::query_scalar("SELECT id FROM profiles WHERE provider = $1 AND oauth_subject = $2")
                    .bind(p.id.provider())
                    .bind(subject)
                    .fetch_optional(&mut *tx)
                    .await?;
            if holder.is_some_and(|h| h != p.id.as_str()) {
                return Err(StoreError::OtherAccount(p.id.clone()));
            }
        }
        let row: Option<(String, Option<String>)> =
            sqlx::query_as("SELECT type, oauth_subject FROM profiles WHERE id = $1")
                .bind(p.id.as_str())
                .fetch_optional(&mut *tx)
                .await?;
        let created = match row {
            None => {
                Self::insert_profile(&mut tx, p, secrets).await?;
                true
            }
            Some((kind, stored)) if kind == "oauth" => {
                if stored.is_some() && stored != p.oauth_subject {
                    return Err(StoreError::OtherAccount(p.id.clone()));
                }
                sqlx::query(
                    "UPDATE profiles SET email = $1, expires_at = $2, enabled = TRUE, updated_at = $3,
                         oauth_subject = coalesce($4, oauth_subject) WHERE id = $5",
                )
                .bind(&p.email)
                .bind(p.expires_at)
                .bind(p.created_at)
                .bind(&p.oauth_subject)
                .bind(p.id.as_str())
                .execute(&mut *tx)
                .await?;
                Self::replace_secrets(&mut tx, &p.id, secrets, p.created_at).await?;
                false
            }
            Some(_) => return Err(StoreError::Duplicate(p.id.clone())),
        };
        tx.commit().await?;
        Ok(created)
    }

    pub(super) async fn swap_tokens(
        &self,
        id: &ProfileId,
        expected: Option<&[u8]>,
        secrets: &[Sealed],
        expires_at: Option<Millis>,
    ) -> Result<bool, StoreError> {
        let mut tx = self.store.write_tx().await?;
        let current: Option<Vec<u8>> = sqlx::query_scalar(
            // The field whose nonce versions the tokens (`SecretField::versions_tokens`).
            "SELECT nonce FROM secrets WHERE profile_id = $1
             AND field IN ('refresh_token', 'client_secret', 'service_account_key')",
        )
        .bind(id.as_str())
        .fetch_optional(&mut *tx)
        .await?;
        if current.as_deref() != expected {
            return Ok(false);
        }
        let now = chrono::Utc::now().timestamp_millis();
        Self::replace_secrets(&mut tx, id, secrets, now).await?;
        sqlx::query("UPDATE profiles SET expires_at = $1, updated_at = $2 WHERE id = $3")
            .bind(expires_at)
            .bind(now)
            .bind(id.as_str())
            .execute(&mut *tx)
            .await?;
        tx.commit().await?;
        Ok(true)
    }
}
