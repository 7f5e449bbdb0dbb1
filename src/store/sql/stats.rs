//! Usage stats: each profile's row, its cooldown windows and quotas, the models' cooldowns, and
//! the write that replays changes on the rows as stored (`apply`).

use super::{Backend, Driver, Sql, Value, corrupt};
use crate::engine::quota::{Quota, Window};
use crate::engine::{
    Change, Cooldown, CooldownPolicy, Disabled, ModelChange, ModelCooldown, ProfileId, Reason, UsageStats,
};
use crate::store::{Applied, SessionBinding, StoreError};
use sqlx::{ColumnIndex, Encode, Executor, Row, Type};
use std::collections::{BTreeMap, HashMap};

/// A profile's stats row, inserted (or updated when it exists) unless the profile is gone.
const STATS_UPSERT: &str = "INSERT INTO usage_stats (profile_id, last_used, last_success_at, cooldown_until,
         cooldown_reason, cooldown_model, disabled_until, disabled_reason, error_count, failure_counts, last_failure_at,
         window_opened_at, success_count, failure_total, billing_step, cleared_at, last_success_sent_at)
     SELECT $1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $18
     WHERE EXISTS (SELECT 1 FROM profiles WHERE id = $17)
     ON CONFLICT (profile_id) DO UPDATE SET last_used = excluded.last_used,
         last_success_at = excluded.last_success_at, cooldown_until = excluded.cooldown_until,
         cooldown_reason = excluded.cooldown_reason, cooldown_model = excluded.cooldown_model,
         disabled_until = excluded.disabled_until, disabled_reason = excluded.disabled_reason,
         error_count = excluded.error_count, failure_counts = excluded.failure_counts,
         last_failure_at = excluded.last_failure_at, window_opened_at = excluded.window_opened_at,
         success_count = excluded.success_count, failure_total = excluded.failure_total,
         billing_step = excluded.billing_step, cleared_at = excluded.cleared_at,
         last_success_sent_at = excluded.last_success_sent_at";

/// The same row updated in place, when the write transaction read it: the same parameters
/// (`$17` is the profile id again, named so that PostgreSQL knows every parameter's type).
const STATS_UPDATE: &str = "UPDATE usage_stats SET last_used = $2, last_success_at = $3, cooldown_until = $4,
         cooldown_reason = $5, cooldown_model = $6, disabled_until = $7, disabled_reason = $8, error_count = $9,
         failure_counts = $10, last_failure_at = $11, window_opened_at = $12, success_count = $13,
         failure_total = $14, billing_step = $15, cleared_at = $16, last_success_sent_at = $18
     WHERE profile_id = $1 AND profile_id = $17";

/// The statements that read many profiles' stats at once (`load_many`), given the SQL that
/// turns the JSON array of ids in `$1` into rows of the engine's.
pub(super) fn statements(ids: &str) -> [String; 3] {
    [
        format!("SELECT * FROM usage_stats WHERE profile_id IN ({ids})"),
        format!(
            "SELECT profile_id, model, cooldown_until, cooldown_reason, step, opened_at FROM profile_cooldowns
             WHERE profile_id IN ({ids})"
        ),
        format!("SELECT * FROM profile_quota WHERE profile_id IN ({ids})"),
    ]
}

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
    /// Writes a profile's stats row and its cooldown windows, unless the profile is gone (a removal
    /// raced the write). `usage_stats.cooldown_*` show the window that ends last. `before`: the
    /// row as this transaction read it, when it did (`apply`): then the row is updated in place,
    /// and the cooldown windows and quotas that did not change are not written again. (Most
    /// batches only move `last_used` and the success counts: rewriting every window and quota
    /// of every profile, each row firing its change-feed trigger, was most of the stats
    /// writer's work with many profiles.)
    pub(super) async fn upsert_stats(
        tx: &mut sqlx::Transaction<'_, DB>,
        id: &ProfileId,
        before: Option<&UsageStats>,
        s: &UsageStats,
    ) -> Result<(), StoreError> {
        let counts = serde_json::to_string(&s.failure_counts).expect("reason counts serialize");
        let head = s.cooldowns.iter().max_by_key(|c| (c.until, c.model.is_none()));
        let sql = if before.is_some() { STATS_UPDATE } else { STATS_UPSERT };
        sqlx::query(sql)
            .bind(id.as_str())
            .bind(s.last_used)
            .bind(s.last_success_at)
            .bind(head.map(|c| c.until))
            .bind(head.map(|c| c.reason.as_str()))
            .bind(head.and_then(|c| c.model.as_deref()))
            .bind(s.disabled.as_ref().and_then(|d| d.until))
            .bind(s.disabled.as_ref().map(|d| d.reason.as_str()))
            .bind(s.error_count as i64)
            .bind(counts)
            .bind(s.last_failure_at)
            .bind(s.window_opened_at)
            .bind(s.success_count as i64)
            .bind(s.failure_total as i64)
            .bind(i64::from(s.billing_step))
            .bind(s.cleared_at)
            .bind(id.as_str())
            .bind(s.last_success_sent_at)
            .execute(&mut **tx)
            .await?;
        if before.is_some_and(|b| b.cooldowns == s.cooldowns) {
            return Self::upsert_quotas(tx, id, before, s).await;
        }
        sqlx::query("DELETE FROM profile_cooldowns WHERE profile_id = $1").bind(id.as_str()).execute(&mut **tx).await?;
        for c in &s.cooldowns {
            sqlx::query(
                "INSERT INTO profile_cooldowns (profile_id, model, cooldown_until, cooldown_reason, step, opened_at)
                 SELECT $1, $2, $3, $4, $5, $6 WHERE EXISTS (SELECT 1 FROM profiles WHERE id = $7)",
            )
            .bind(id.as_str())
            .bind(c.model.as_deref())
            .bind(c.until)
            .bind(c.reason.as_str())
            .bind(i64::from(c.step))
            .bind(c.opened_at)
            .bind(id.as_str())
            .execute(&mut **tx)
            .await?;
        }
        Self::upsert_quotas(tx, id, before, s).await
    }

    /// Writes a profile's quotas, but those `before` (the row as read) already held.
    async fn upsert_quotas(
        tx: &mut sqlx::Transaction<'_, DB>,
        id: &ProfileId,
        before: Option<&UsageStats>,
        s: &UsageStats,
    ) -> Result<(), StoreError> {
        for q in s.quotas.iter().filter(|q| before.is_none_or(|b| !b.quotas.contains(q))) {
            let window =
                |w: Option<Window>| (w.map(|w| w.remaining), w.and_then(|w| w.limit), w.and_then(|w| w.reset_at));
            let (requests, tokens, plan) = (window(q.requests), window(q.tokens), window(q.plan));
            sqlx::query(
                "INSERT INTO profile_quota (profile_id, model, quota_remaining_requests, quota_limit_requests,
                     quota_reset_at, quota_remaining_tokens, quota_limit_tokens, quota_tokens_reset_at, quota_seen_at,
                     quota_plan_left, quota_plan_reset_at)
                 SELECT $1, $2, $3, $4, $5, $6, $7, $8, $9, $11, $12 WHERE EXISTS (SELECT 1 FROM profiles WHERE id = $10)
                 ON CONFLICT (profile_id, model) DO UPDATE SET
                     quota_remaining_requests = excluded.quota_remaining_requests,
                     quota_limit_requests = excluded.quota_limit_requests, quota_reset_at = excluded.quota_reset_at,
                     quota_remaining_tokens = excluded.quota_remaining_tokens,
                     quota_limit_tokens = excluded.quota_limit_tokens,
                     quota_tokens_reset_at = excluded.quota_tokens_reset_at, quota_seen_at = excluded.quota_seen_at,
                     quota_plan_left = excluded.quota_plan_left, quota_plan_reset_at = excluded.quota_plan_reset_at
                 WHERE excluded.quota_seen_at >= profile_quota.quota_seen_at",
            )
            .bind(id.as_str())
            .bind(&q.model)
            .bind(requests.0)
            .bind(requests.1)
            .bind(requests.2)
            .bind(tokens.0)
            .bind(tokens.1)
            .bind(tokens.2)
            .bind(q.seen_at)
            .bind(id.as_str())
            .bind(plan.0)
            .bind(plan.2)
            .execute(&mut **tx)
            .await?;
        }
        Ok(())
    }

    pub(super) fn quota_from_row(row: &DB::Row) -> Result<Quota, StoreError> {
        let window = |remaining: &str, limit: &str, reset: &str| -> Result<Option<Window>, StoreError> {
            let remaining: Option<i64> = row.try_get(remaining)?;
            Ok(match remaining {
                Some(remaining) => {
                    Some(Window { remaining, limit: row.try_get(limit)?, reset_at: row.try_get(reset)? })
                }
                None => None,
            })
        };
        Ok(Quota {
            model: row.try_get("model")?,
            requests: window("quota_remaining_requests", "quota_limit_requests", "quota_reset_at")?,
            tokens: window("quota_remaining_tokens", "quota_limit_tokens", "quota_tokens_reset_at")?,
            plan: row
                .try_get::<Option<i64>, _>("quota_plan_left")?
                .map(|remaining| -> Result<Window, StoreError> {
                    Ok(Window { remaining, limit: Some(100), reset_at: row.try_get("quota_plan_reset_at")? })
                })
                .transpose()?,
            seen_at: row.try_get("quota_seen_at")?,
        })
    }

    fn reason(row: &DB::Row, col: &str) -> Result<Option<Reason>, StoreError> {
        let raw: Option<String> = row.try_get(col)?;
        raw.map(|r| r.parse().map_err(|e| corrupt("usage_stats", e))).transpose()
    }

    pub(super) fn stats_from_row(row: &DB::Row) -> Result<UsageStats, StoreError> {
        let disabled = Self::reason(row, "disabled_reason")?
            .map(|reason| Disabled { until: row.try_get("disabled_until").ok().flatten(), reason });
        let counts: String = row.try_get("failure_counts")?;
        let failure_counts: BTreeMap<Reason, u32> =
            serde_json::from_str(&counts).map_err(|e| corrupt("usage_stats", e))?;
        Ok(UsageStats {
            last_used: row.try_get("last_used")?,
            last_success_at: row.try_get("last_success_at")?,
            last_success_sent_at: row.try_get("last_success_sent_at")?,
            cooldowns: Vec::new(),
            disabled,
            error_count: row.try_get::<i64, _>("error_count")? as u32,
            failure_counts,
            last_failure_at: row.try_get("last_failure_at")?,
            window_opened_at: row.try_get("window_opened_at")?,
            success_count: row.try_get::<i64, _>("success_count")? as u64,
            failure_total: row.try_get::<i64, _>("failure_total")? as u64,
            billing_step: row.try_get::<i64, _>("billing_step")? as u32,
            cleared_at: row.try_get("cleared_at")?,
            quotas: Vec::new(),
        })
    }

    pub(super) fn window_from_row(row: &DB::Row) -> Result<Cooldown, StoreError> {
        let reason: String = row.try_get("cooldown_reason")?;
        Ok(Cooldown {
            until: row.try_get("cooldown_until")?,
            reason: reason.parse().map_err(|e| corrupt("profile_cooldowns", e))?,
            model: row.try_get("model")?,
            step: row.try_get::<i64, _>("step")?.clamp(1, u32::MAX as i64) as u32,
            opened_at: row.try_get("opened_at")?,
        })
    }

    /// The stats as stored of many profiles, with their cooldown windows and quotas: three
    /// statements for up to 500 profiles, instead of three for each (a batch of the stats
    /// writer touches thousands of profiles when there are as many). Profiles without a
    /// row are not in the map.
    async fn load_many(
        conn: &mut DB::Connection,
        ids: &[&ProfileId],
    ) -> Result<HashMap<ProfileId, UsageStats>, StoreError> {
        let [stats, cooldowns, quotas] = &S::texts().stats_of;
        let mut out: HashMap<ProfileId, UsageStats> = HashMap::with_capacity(ids.len());
        for chunk in ids.chunks(500) {
            let list =
                serde_json::to_string(&chunk.iter().map(|id| id.as_str()).collect::<Vec<_>>()).expect("ids serialize");
            for row in sqlx::query(stats.as_str()).bind(&list).fetch_all(&mut *conn).await? {
                let id: String = row.try_get("profile_id")?;
                let id = id.parse().map_err(|e| corrupt("usage_stats", e))?;
                out.insert(id, Self::stats_from_row(&row)?);
            }
            for row in sqlx::query(cooldowns.as_str()).bind(&list).fetch_all(&mut *conn).await? {
                let id: String = row.try_get("profile_id")?;
                let id: ProfileId = id.parse().map_err(|e| corrupt("profile_cooldowns", e))?;
                if let Some(s) = out.get_mut(&id) {
                    s.cooldowns.push(Self::window_from_row(&row)?);
                }
            }
            for row in sqlx::query(quotas.as_str()).bind(&list).fetch_all(&mut *conn).await? {
                let id: String = row.try_get("profile_id")?;
                let id: ProfileId = id.parse().map_err(|e| corrupt("profile_quota", e))?;
                if let Some(s) = out.get_mut(&id) {
                    s.quotas.push(Self::quota_from_row(&row)?);
                }
            }
        }
        Ok(out)
    }

    pub(super) fn model_cooldown_from_row(row: &DB::Row) -> Result<ModelCooldown, StoreError> {
        Ok(ModelCooldown {
            until: row.try_get("cooldown_until")?,
            error_count: row.try_get::<i64, _>("error_count")? as u32,
            last_failure_at: row.try_get("last_failure_at")?,
        })
    }

    async fn upsert_model_cooldown(
        conn: &mut DB::Connection,
        (provider, model): &(String, String),
        mc: &ModelCooldown,
    ) -> Result<(), StoreError> {
        sqlx::query(
            "INSERT INTO model_cooldowns (provider, model, cooldown_until, error_count, last_failure_at)
             VALUES ($1, $2, $3, $4, $5)
             ON CONFLICT (provider, model) DO UPDATE SET cooldown_until = excluded.cooldown_until,
                 error_count = excluded.error_count, last_failure_at = excluded.last_failure_at",
        )
        .bind(provider)
        .bind(model)
        .bind(mc.until)
        .bind(mc.error_count as i64)
        .bind(mc.last_failure_at)
        .execute(&mut *conn)
        .await?;
        Ok(())
    }

    pub(super) async fn save_stats(&self, batch: &[(ProfileId, UsageStats)]) -> Result<(), StoreError> {
        let mut tx = self.store.write_tx().await?;
        for (id, s) in batch {
            Self::upsert_stats(&mut tx, id, None, s).await?;
        }
        tx.commit().await?;
        Ok(())
    }

    pub(super) async fn save_model_cooldowns(
        &self,
        batch: &[((String, String), ModelCooldown)],
    ) -> Result<(), StoreError> {
        let mut tx = self.store.write_tx().await?;
        for (key, mc) in batch {
            Self::upsert_model_cooldown(&mut tx, key, mc).await?;
        }
        tx.commit().await?;
        Ok(())
    }

    pub(super) async fn apply(
        &self,
        stats: &[(ProfileId, Vec<Change>)],
        models: &[((String, String), Vec<ModelChange>)],
        sessions: &[SessionBinding],
        policy: &CooldownPolicy,
    ) -> Result<Applied, StoreError> {
        let mut tx = self.store.write_tx().await?;
        let before = Self::head(&mut tx).await?;
        let mut out = Applied::default();
        let ids: Vec<&ProfileId> = stats.iter().map(|(id, _)| id).collect();
        let mut stored = Self::load_many(&mut tx, &ids).await?;
        for (id, changes) in stats {
            let Some(before) = stored.remove(id) else { continue };
            let mut s = before.clone();
            for c in changes {
                s.apply(c, policy);
            }
            Self::upsert_stats(&mut tx, id, Some(&before), &s).await?;
            out.stats.push((id.clone(), s));
        }
        for (key, changes) in models {
            let row = sqlx::query("SELECT * FROM model_cooldowns WHERE provider = $1 AND model = $2")
                .bind(&key.0)
                .bind(&key.1)
                .fetch_optional(&mut *tx)
                .await?;
            let mut mc = row.as_ref().map(Self::model_cooldown_from_row).transpose()?;
            for c in changes {
                mc = ModelCooldown::apply(mc.as_ref(), c, policy);
            }
            if let Some(mc) = mc {
                Self::upsert_model_cooldown(&mut tx, key, &mc).await?;
                out.models.push((key.clone(), mc));
            }
        }
        for b in sessions {
            Self::bind_session(&mut tx, b).await?;
        }
        out.feed = (before, Self::head(&mut tx).await?);
        tx.commit().await?;
        Ok(out)
    }

    pub(super) async fn stats_of(&self, ids: &[ProfileId]) -> Result<Vec<(ProfileId, Option<UsageStats>)>, StoreError> {
        let mut conn = self.store.pool().acquire().await?;
        let mut stored = Self::load_many(&mut conn, &ids.iter().collect::<Vec<_>>()).await?;
        Ok(ids.iter().map(|id| (id.clone(), stored.remove(id))).collect())
    }

    pub(super) async fn model_cooldowns(&self) -> Result<HashMap<(String, String), ModelCooldown>, StoreError> {
        let mut out = HashMap::new();
        for row in sqlx::query("SELECT * FROM model_cooldowns").fetch_all(self.store.pool()).await? {
            out.insert((row.try_get("provider")?, row.try_get("model")?), Self::model_cooldown_from_row(&row)?);
        }
        Ok(out)
    }
}
