//! Profiles: their rows, the roster read whole at start (`snapshot`), the profiles declared in
//! the config file, imports, and the providers' explicit orders.

use super::stats::StatsRow;
use super::{Affected, Backend, Driver, Sql, Value, corrupt, now};
use crate::engine::{ProfileId, UsageStats};
use crate::secrets::Sealed;
use crate::store::{Origin, ProfileFlag, Snapshot, StoreError, StoredProfile};
use sqlx::{ColumnIndex, Encode, Executor, Row, Type};
use std::collections::BTreeMap;

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
    pub(super) async fn insert_profile(
        tx: &mut sqlx::Transaction<'_, DB>,
        p: &StoredProfile,
        secrets: &[Sealed],
    ) -> Result<(), StoreError> {
        let inserted = sqlx::query(
            "INSERT INTO profiles (id, provider, name, type, source, enabled, paid, email, expires_at, created_at,
                 updated_at, oauth_subject)
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12) ON CONFLICT (id) DO NOTHING",
        )
        .bind(p.id.as_str())
        .bind(p.id.provider())
        .bind(p.id.name())
        .bind(p.kind.as_str())
        .bind(p.origin.as_str())
        .bind(p.enabled)
        .bind(p.paid)
        .bind(&p.email)
        .bind(p.expires_at)
        .bind(p.created_at)
        .bind(p.created_at)
        .bind(&p.oauth_subject)
        .execute(&mut **tx)
        .await?;
        if inserted.rows_affected() == 0 {
            return Err(StoreError::Duplicate(p.id.clone()));
        }
        Self::replace_secrets(tx, &p.id, secrets, p.created_at).await?;
        sqlx::query("INSERT INTO usage_stats (profile_id) VALUES ($1)").bind(p.id.as_str()).execute(&mut **tx).await?;
        Ok(())
    }

    pub(super) async fn snapshot(&self) -> Result<Snapshot, StoreError> {
        // One read transaction: a refresh committing between two of these reads must
        // not give a roster with the old expiry and the new tokens.
        let mut conn = self.store.read_tx().await?;
        let mut snap = Snapshot { head: Self::head(&mut conn).await?, ..Snapshot::default() };
        for row in sqlx::query(
            "SELECT id, type, source, enabled, paid, email, expires_at, created_at, oauth_subject FROM profiles
             ORDER BY created_at, id",
        )
        .fetch_all(&mut *conn)
        .await?
        {
            let id: String = row.try_get("id")?;
            let kind: String = row.try_get("type")?;
            let source: String = row.try_get("source")?;
            snap.profiles.push(StoredProfile {
                id: id.parse().map_err(|e| corrupt("profiles", e))?,
                kind: kind.parse().map_err(|e| corrupt("profiles", e))?,
                origin: if source == "config" { Origin::Config } else { Origin::Stored },
                enabled: row.try_get("enabled")?,
                paid: row.try_get("paid")?,
                email: row.try_get("email")?,
                expires_at: row.try_get("expires_at")?,
                created_at: row.try_get("created_at")?,
                oauth_subject: row.try_get("oauth_subject")?,
            });
        }
        for row in sqlx::query("SELECT profile_id, field, key_id, nonce, ciphertext FROM secrets")
            .fetch_all(&mut *conn)
            .await?
        {
            let id: String = row.try_get("profile_id")?;
            let sealed = Self::sealed_row(&row)?;
            snap.secrets.entry(id.parse().map_err(|e| corrupt("secrets", e))?).or_default().push(sealed);
        }
        let texts = S::texts();
        let stats: Vec<(String, UsageStats)> = match &texts.all_stats_json {
            Some(json) => {
                let text: String = sqlx::query_scalar(json.as_str()).fetch_one(&mut *conn).await?;
                let rows: Vec<StatsRow> = serde_json::from_str(&text).map_err(|e| corrupt("usage_stats", e))?;
                rows.into_iter().map(StatsRow::stats).collect::<Result<_, _>>()?
            }
            None => sqlx::query(texts.all_stats.as_str())
                .fetch_all(&mut *conn)
                .await?
                .iter()
                .map(Self::stats_from_row)
                .collect::<Result<_, _>>()?,
        };
        for (id, stats) in stats {
            snap.stats.insert(id.parse().map_err(|e| corrupt("usage_stats", e))?, stats);
        }
        for row in sqlx::query(
            "SELECT profile_id, model, cooldown_until, cooldown_reason, step, opened_at FROM profile_cooldowns",
        )
        .fetch_all(&mut *conn)
        .await?
        {
            let id: String = row.try_get("profile_id")?;
            let id: ProfileId = id.parse().map_err(|e| corrupt("profile_cooldowns", e))?;
            snap.stats.entry(id).or_default().cooldowns.push(Self::window_from_row(&row)?);
        }
        for row in sqlx::query("SELECT * FROM profile_quota").fetch_all(&mut *conn).await? {
            let id: String = row.try_get("profile_id")?;
            let id: ProfileId = id.parse().map_err(|e| corrupt("profile_quota", e))?;
            snap.stats.entry(id).or_default().quotas.push(Self::quota_from_row(&row)?);
        }
        for row in sqlx::query("SELECT provider, profile_ids FROM profile_order").fetch_all(&mut *conn).await? {
            let ids: String = row.try_get("profile_ids")?;
            let ids: Vec<ProfileId> = serde_json::from_str(&ids).map_err(|e| corrupt("profile_order", e))?;
            snap.orders.insert(row.try_get("provider")?, ids);
        }
        for row in
            sqlx::query("SELECT provider, model, cooldown_until, error_count, last_failure_at FROM model_cooldowns")
                .fetch_all(&mut *conn)
                .await?
        {
            snap.model_cooldowns
                .insert((row.try_get("provider")?, row.try_get("model")?), Self::model_cooldown_from_row(&row)?);
        }
        conn.commit().await?;
        Ok(snap)
    }

    pub(super) async fn add_profile(&self, p: &StoredProfile, secrets: &[Sealed]) -> Result<(), StoreError> {
        let mut tx = self.store.write_tx().await?;
        Self::insert_profile(&mut tx, p, secrets).await?;
        tx.commit().await?;
        Ok(())
    }

    pub(super) async fn import(
        &self,
        profiles: &[(StoredProfile, Vec<Sealed>, UsageStats)],
        orders: &BTreeMap<String, Vec<ProfileId>>,
    ) -> Result<(), StoreError> {
        let mut tx = self.store.write_tx().await?;
        for (p, secrets, _) in profiles {
            Self::insert_profile(&mut tx, p, secrets).await?;
        }
        let stats: Vec<_> = profiles.iter().map(|(p, _, stats)| (&p.id, None, stats)).collect();
        Self::write_stats(&mut tx, &stats).await?;
        for (provider, ids) in orders {
            sqlx::query(
                "INSERT INTO profile_order (provider, profile_ids, updated_at) VALUES ($1, $2, $3)
                 ON CONFLICT (provider) DO UPDATE SET profile_ids = excluded.profile_ids,
                     updated_at = excluded.updated_at",
            )
            .bind(provider)
            .bind(serde_json::to_string(ids).expect("profile ids serialize"))
            .bind(now())
            .execute(&mut *tx)
            .await?;
        }
        tx.commit().await?;
        Ok(())
    }

    pub(super) async fn sync_config_profiles(&self, profiles: &[StoredProfile]) -> Result<(), StoreError> {
        let mut tx = self.store.write_tx().await?;
        for p in profiles {
            sqlx::query(
                "INSERT INTO profiles (id, provider, name, type, source, enabled, expires_at, created_at, updated_at)
                 VALUES ($1, $2, $3, $4, 'config', TRUE, $5, $6, $7)
                 ON CONFLICT (id) DO UPDATE SET type = excluded.type, expires_at = excluded.expires_at,
                     updated_at = excluded.updated_at
                 WHERE profiles.source = 'config'
                     AND (profiles.type, profiles.expires_at) IS DISTINCT FROM (excluded.type, excluded.expires_at)",
            )
            .bind(p.id.as_str())
            .bind(p.id.provider())
            .bind(p.id.name())
            .bind(p.kind.as_str())
            .bind(p.expires_at)
            .bind(p.created_at)
            .bind(p.created_at)
            .execute(&mut *tx)
            .await?;
            sqlx::query("INSERT INTO usage_stats (profile_id) VALUES ($1) ON CONFLICT DO NOTHING")
                .bind(p.id.as_str())
                .execute(&mut *tx)
                .await?;
        }
        tx.commit().await?;
        Ok(())
    }

    pub(super) async fn remove_profile(&self, id: &ProfileId) -> Result<(), StoreError> {
        let mut tx = self.store.write_tx().await?;
        let done = sqlx::query("DELETE FROM profiles WHERE id = $1").bind(id.as_str()).execute(&mut *tx).await?;
        if done.rows_affected() == 0 {
            return Err(StoreError::NotFound(id.clone()));
        }
        tx.commit().await?;
        Ok(())
    }

    pub(super) async fn set_flag(&self, id: &ProfileId, flag: ProfileFlag, on: bool) -> Result<(), StoreError> {
        let mut tx = self.store.write_tx().await?;
        let sql = match flag {
            ProfileFlag::Enabled => "UPDATE profiles SET enabled = $1, updated_at = $2 WHERE id = $3",
            ProfileFlag::Paid => "UPDATE profiles SET paid = $1, updated_at = $2 WHERE id = $3",
        };
        let done = sqlx::query(sql).bind(on).bind(now()).bind(id.as_str()).execute(&mut *tx).await?;
        if done.rows_affected() == 0 {
            return Err(StoreError::NotFound(id.clone()));
        }
        tx.commit().await?;
        Ok(())
    }

    pub(super) async fn set_order(&self, provider: &str, ids: Option<&[ProfileId]>) -> Result<(), StoreError> {
        let mut tx = self.store.write_tx().await?;
        match ids {
            Some(ids) => {
                let json = serde_json::to_string(ids).expect("profile ids serialize");
                sqlx::query(
                    "INSERT INTO profile_order (provider, profile_ids, updated_at) VALUES ($1, $2, $3)
                     ON CONFLICT (provider) DO UPDATE SET profile_ids = excluded.profile_ids,
                         updated_at = excluded.updated_at",
                )
                .bind(provider)
                .bind(json)
                .bind(now())
                .execute(&mut *tx)
                .await?;
            }
            None => {
                sqlx::query("DELETE FROM profile_order WHERE provider = $1").bind(provider).execute(&mut *tx).await?;
            }
        }
        tx.commit().await?;
        Ok(())
    }
}
