//! Secrets: each profile's sealed API key or tokens, and their re-sealing under a new key
//! (`rota rotate-key`).

use super::{Affected, Backend, Driver, Sql, Value, corrupt};
use crate::engine::{Millis, ProfileId};
use crate::secrets::{Sealed, SecretField};
use crate::store::StoreError;
use sqlx::{ColumnIndex, Encode, Executor, Row, Type};

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
    pub(super) fn sealed_row(row: &DB::Row) -> Result<Sealed, StoreError> {
        let field: String = row.try_get("field")?;
        Ok(Sealed {
            field: SecretField::parse(&field).ok_or_else(|| corrupt("secrets", format!("unknown field {field}")))?,
            key_id: row.try_get("key_id")?,
            nonce: row.try_get("nonce")?,
            ciphertext: row.try_get("ciphertext")?,
        })
    }

    /// Replaces every secret of a profile with `secrets`.
    pub(super) async fn replace_secrets(
        tx: &mut sqlx::Transaction<'_, DB>,
        id: &ProfileId,
        secrets: &[Sealed],
        now: Millis,
    ) -> Result<(), StoreError> {
        sqlx::query("DELETE FROM secrets WHERE profile_id = $1").bind(id.as_str()).execute(&mut **tx).await?;
        for s in secrets {
            sqlx::query(
                "INSERT INTO secrets (profile_id, field, key_id, nonce, ciphertext, updated_at)
                 VALUES ($1, $2, $3, $4, $5, $6)",
            )
            .bind(id.as_str())
            .bind(s.field.as_str())
            .bind(&s.key_id)
            .bind(&s.nonce)
            .bind(&s.ciphertext)
            .bind(now)
            .execute(&mut **tx)
            .await?;
        }
        Ok(())
    }

    pub(super) async fn secret_key_ids(&self) -> Result<Vec<String>, StoreError> {
        Ok(sqlx::query_scalar("SELECT DISTINCT key_id FROM secrets ORDER BY key_id")
            .fetch_all(self.store.pool())
            .await?)
    }

    pub(super) async fn reseal_all(&self, rows: &[(ProfileId, Sealed)]) -> Result<(), StoreError> {
        let mut tx = self.store.write_tx().await?;
        let stored: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM secrets").fetch_one(&mut *tx).await?;
        if stored != rows.len() as i64 {
            return Err(corrupt(
                "secrets",
                format!("{stored} secrets stored, {} re-sealed: changed meanwhile", rows.len()),
            ));
        }
        let now = chrono::Utc::now().timestamp_millis();
        for (id, s) in rows {
            let done = sqlx::query(
                "UPDATE secrets SET key_id = $1, nonce = $2, ciphertext = $3, updated_at = $4
                 WHERE profile_id = $5 AND field = $6",
            )
            .bind(&s.key_id)
            .bind(&s.nonce)
            .bind(&s.ciphertext)
            .bind(now)
            .bind(id.as_str())
            .bind(s.field.as_str())
            .execute(&mut *tx)
            .await?;
            if done.rows_affected() != 1 {
                return Err(corrupt("secrets", format!("{id} {} is not stored", s.field.as_str())));
            }
        }
        tx.commit().await?;
        Ok(())
    }

    pub(super) async fn profile_secrets(&self, id: &ProfileId) -> Result<(Vec<Sealed>, Option<Millis>), StoreError> {
        let mut tx = self.store.read_tx().await?; // the expiry and the tokens of one refresh
        let expires: Option<Option<Millis>> = sqlx::query_scalar("SELECT expires_at FROM profiles WHERE id = $1")
            .bind(id.as_str())
            .fetch_optional(&mut *tx)
            .await?;
        let Some(expires) = expires else { return Err(StoreError::NotFound(id.clone())) };
        let rows = sqlx::query("SELECT field, key_id, nonce, ciphertext FROM secrets WHERE profile_id = $1")
            .bind(id.as_str())
            .fetch_all(&mut *tx)
            .await?;
        tx.commit().await?;
        let mut out = Vec::with_capacity(rows.len());
        for r in rows {
            out.push(Self::sealed_row(&r)?);
        }
        Ok((out, expires))
    }
}
