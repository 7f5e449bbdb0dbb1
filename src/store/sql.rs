//! The SQL both stores run. SQLite and PostgreSQL read the same statements (numbered `$N`
//! parameters, `coalesce`, `IS DISTINCT FROM`, `CASE` sums cast to `BIGINT`), so one text,
//! instantiated for each driver by `sql_store!`, keeps the two from drifting apart. What differs
//! (opening, the write lock, the change feed's wake-up) lives in `sqlite.rs` and `postgres.rs`.

use super::StoreError;
use crate::engine::Millis;
use std::collections::{BTreeMap, BTreeSet};

pub(super) fn now() -> Millis {
    chrono::Utc::now().timestamp_millis()
}

pub(super) fn corrupt(table: &'static str, detail: impl ToString) -> StoreError {
    StoreError::Corrupt { table, detail: detail.to_string() }
}

/// Whether a pooled connection may be handed out: one left inside a transaction (its commit
/// failed on an I/O error, and so did the rollback) would refuse every later `BEGIN` and keep
/// the write lock, so it is closed and a fresh connection opened instead.
pub(super) fn usable<C: sqlx::Connection>(conn: &C) -> bool {
    let ok = !conn.is_in_transaction();
    if !ok {
        tracing::warn!("a database connection was left inside a failed transaction; reconnecting");
    }
    ok
}

/// A profile's stats row, inserted (or updated when it exists) unless the profile is gone.
pub(super) const STATS_UPSERT: &str = "INSERT INTO usage_stats (profile_id, last_used, last_success_at, cooldown_until,
         cooldown_reason, cooldown_model, disabled_until, disabled_reason, error_count, failure_counts, last_failure_at,
         window_opened_at, success_count, failure_total, billing_step, cleared_at, last_success_sent_at)
     SELECT $1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $18 WHERE EXISTS (SELECT 1 FROM profiles WHERE id = $17)
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
pub(super) const STATS_UPDATE: &str =
    "UPDATE usage_stats SET last_used = $2, last_success_at = $3, cooldown_until = $4,
         cooldown_reason = $5, cooldown_model = $6, disabled_until = $7, disabled_reason = $8, error_count = $9,
         failure_counts = $10, last_failure_at = $11, window_opened_at = $12, success_count = $13,
         failure_total = $14, billing_step = $15, cleared_at = $16, last_success_sent_at = $18
     WHERE profile_id = $1 AND profile_id = $17";

/// The statements that read many profiles' stats at once (`load_many`), given the SQL that
/// turns the JSON array of ids in `$1` into rows of the engine's.
pub(super) fn stats_of(ids: &str) -> [String; 3] {
    [
        format!("SELECT * FROM usage_stats WHERE profile_id IN ({ids})"),
        format!(
            "SELECT profile_id, model, cooldown_until, cooldown_reason, step, opened_at FROM profile_cooldowns
             WHERE profile_id IN ({ids})"
        ),
        format!("SELECT * FROM profile_quota WHERE profile_id IN ({ids})"),
    ]
}

/// Implements `Store` for `$store`, a struct with a `pool: sqlx::Pool<$db>` and three methods
/// that begin transactions: `write_tx` (one that may change the shared state, serialized with
/// every other such writer), `audit_tx` (one that only appends audit rows) and `read_tx` (reads
/// that must see one committed state, not a write landing between two of them), a
/// `description` and a `wake_channel`, and `MIGRATOR`, `ATTEMPTS`, `REQUESTS`, `STATS_OF`,
/// `COOLDOWNS_OF` and `QUOTAS_OF` statics in scope.
macro_rules! sql_store {
    ($store:ty, $db:ty, $row:ty, $conn:ty) => {
        /// Writes a profile's stats row and its cooldown windows, unless the profile is gone (a removal
        /// raced the write). `usage_stats.cooldown_*` show the window that ends last. `before`: the
        /// row as this transaction read it, when it did (`apply`): then the row is updated in place,
        /// and the cooldown windows and quotas that did not change are not written again. (Most
        /// batches only move `last_used` and the success counts: rewriting every window and quota
        /// of every profile, each row firing its change-feed trigger, was most of the stats
        /// writer's work with many profiles.)
        async fn upsert_stats(
            tx: &mut sqlx::Transaction<'_, $db>,
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
                return upsert_quotas(tx, id, before, s).await;
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
            upsert_quotas(tx, id, before, s).await
        }

        /// Writes a profile's quotas, but those `before` (the row as read) already held.
        async fn upsert_quotas(
            tx: &mut sqlx::Transaction<'_, $db>,
            id: &ProfileId,
            before: Option<&UsageStats>,
            s: &UsageStats,
        ) -> Result<(), StoreError> {
            for q in s.quotas.iter().filter(|q| before.is_none_or(|b| !b.quotas.contains(q))) {
                let window = |w: Option<Window>| (w.map(|w| w.remaining), w.and_then(|w| w.limit), w.and_then(|w| w.reset_at));
                let (requests, tokens) = (window(q.requests), window(q.tokens));
                sqlx::query(
                    "INSERT INTO profile_quota (profile_id, model, quota_remaining_requests, quota_limit_requests,
                         quota_reset_at, quota_remaining_tokens, quota_limit_tokens, quota_tokens_reset_at, quota_seen_at)
                     SELECT $1, $2, $3, $4, $5, $6, $7, $8, $9 WHERE EXISTS (SELECT 1 FROM profiles WHERE id = $10)
                     ON CONFLICT (profile_id, model) DO UPDATE SET
                         quota_remaining_requests = excluded.quota_remaining_requests,
                         quota_limit_requests = excluded.quota_limit_requests, quota_reset_at = excluded.quota_reset_at,
                         quota_remaining_tokens = excluded.quota_remaining_tokens,
                         quota_limit_tokens = excluded.quota_limit_tokens,
                         quota_tokens_reset_at = excluded.quota_tokens_reset_at, quota_seen_at = excluded.quota_seen_at
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
                .execute(&mut **tx)
                .await?;
            }
            Ok(())
        }

        fn quota_from_row(row: &$row) -> Result<Quota, StoreError> {
            let window = |remaining: &str, limit: &str, reset: &str| -> Result<Option<Window>, StoreError> {
                let remaining: Option<i64> = row.try_get(remaining)?;
                Ok(match remaining {
                    Some(remaining) => Some(Window { remaining, limit: row.try_get(limit)?, reset_at: row.try_get(reset)? }),
                    None => None,
                })
            };
            Ok(Quota {
                model: row.try_get("model")?,
                requests: window("quota_remaining_requests", "quota_limit_requests", "quota_reset_at")?,
                tokens: window("quota_remaining_tokens", "quota_limit_tokens", "quota_tokens_reset_at")?,
                seen_at: row.try_get("quota_seen_at")?,
            })
        }

        fn sealed_row(row: &$row) -> Result<Sealed, StoreError> {
            let field: String = row.try_get("field")?;
            Ok(Sealed {
                field: SecretField::parse(&field).ok_or_else(|| corrupt("secrets", format!("unknown field {field}")))?,
                key_id: row.try_get("key_id")?,
                nonce: row.try_get("nonce")?,
                ciphertext: row.try_get("ciphertext")?,
            })
        }

        /// Replaces every secret of a profile with `secrets`.
        async fn replace_secrets(
            tx: &mut sqlx::Transaction<'_, $db>,
            id: &ProfileId,
            secrets: &[Sealed],
            now: Millis,
        ) -> Result<(), StoreError> {
            sqlx::query("DELETE FROM secrets WHERE profile_id = $1").bind(id.as_str()).execute(&mut **tx).await?;
            for s in secrets {
                sqlx::query(
                    "INSERT INTO secrets (profile_id, field, key_id, nonce, ciphertext, updated_at) VALUES ($1, $2, $3, $4, $5, $6)",
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

        async fn insert_profile(
            tx: &mut sqlx::Transaction<'_, $db>,
            p: &StoredProfile,
            secrets: &[Sealed],
        ) -> Result<(), StoreError> {
            let inserted = sqlx::query(
                "INSERT INTO profiles (id, provider, name, type, source, enabled, email, expires_at, created_at, updated_at, oauth_subject)
                 VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11) ON CONFLICT (id) DO NOTHING",
            )
            .bind(p.id.as_str())
            .bind(p.id.provider())
            .bind(p.id.name())
            .bind(p.kind.as_str())
            .bind(p.origin.as_str())
            .bind(p.enabled)
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
            replace_secrets(tx, &p.id, secrets, p.created_at).await?;
            sqlx::query("INSERT INTO usage_stats (profile_id) VALUES ($1)").bind(p.id.as_str()).execute(&mut **tx).await?;
            Ok(())
        }

        fn agent_from_row(row: &$row) -> Result<Agent, StoreError> {
            Ok(Agent {
                id: row.try_get("id")?,
                name: row.try_get("name")?,
                admin: row.try_get("admin")?,
                created_at: row.try_get("created_at")?,
                revoked_at: row.try_get("revoked_at")?,
                limits: Limits {
                    requests_per_minute: row.try_get("requests_per_minute")?,
                    tokens_per_day: row.try_get("tokens_per_day")?,
                    cost_per_day: row.try_get("cost_per_day")?,
                },
            })
        }

        fn reason(row: &$row, col: &str) -> Result<Option<Reason>, StoreError> {
            let raw: Option<String> = row.try_get(col)?;
            raw.map(|r| r.parse().map_err(|e| corrupt("usage_stats", e))).transpose()
        }

        fn stats_from_row(row: &$row) -> Result<UsageStats, StoreError> {
            let disabled = reason(row, "disabled_reason")?
                .map(|reason| Disabled { until: row.try_get("disabled_until").ok().flatten(), reason });
            let counts: String = row.try_get("failure_counts")?;
            let failure_counts: BTreeMap<Reason, u32> = serde_json::from_str(&counts).map_err(|e| corrupt("usage_stats", e))?;
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

        fn window_from_row(row: &$row) -> Result<Cooldown, StoreError> {
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
        async fn load_many(conn: &mut $conn, ids: &[&ProfileId]) -> Result<HashMap<ProfileId, UsageStats>, StoreError> {
            let mut out: HashMap<ProfileId, UsageStats> = HashMap::with_capacity(ids.len());
            for chunk in ids.chunks(500) {
                let list = serde_json::to_string(&chunk.iter().map(|id| id.as_str()).collect::<Vec<_>>())
                    .expect("ids serialize");
                for row in sqlx::query(&**STATS_OF).bind(&list).fetch_all(&mut *conn).await? {
                    let id: String = row.try_get("profile_id")?;
                    let id = id.parse().map_err(|e| corrupt("usage_stats", e))?;
                    out.insert(id, stats_from_row(&row)?);
                }
                for row in sqlx::query(&**COOLDOWNS_OF).bind(&list).fetch_all(&mut *conn).await? {
                    let id: String = row.try_get("profile_id")?;
                    let id: ProfileId = id.parse().map_err(|e| corrupt("profile_cooldowns", e))?;
                    if let Some(s) = out.get_mut(&id) {
                        s.cooldowns.push(window_from_row(&row)?);
                    }
                }
                for row in sqlx::query(&**QUOTAS_OF).bind(&list).fetch_all(&mut *conn).await? {
                    let id: String = row.try_get("profile_id")?;
                    let id: ProfileId = id.parse().map_err(|e| corrupt("profile_quota", e))?;
                    if let Some(s) = out.get_mut(&id) {
                        s.quotas.push(quota_from_row(&row)?);
                    }
                }
            }
            Ok(out)
        }

        fn model_cooldown_from_row(row: &$row) -> Result<ModelCooldown, StoreError> {
            Ok(ModelCooldown {
                until: row.try_get("cooldown_until")?,
                error_count: row.try_get::<i64, _>("error_count")? as u32,
                last_failure_at: row.try_get("last_failure_at")?,
            })
        }

        async fn upsert_model_cooldown(
            conn: &mut $conn,
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

        async fn feed_head(conn: &mut $conn) -> Result<i64, StoreError> {
            Ok(sqlx::query_scalar("SELECT n FROM change_seq").fetch_one(&mut *conn).await?)
        }

        /// `AND column = value` for each filter given: only those, so that each can seek its index
        /// (a `($n IS NULL OR column = $n)` term can use none: the listing scanned and sorted
        /// every attempt).
        fn push_equal(qb: &mut sqlx::QueryBuilder<$db>, filters: &[(&str, &Option<String>)]) {
            for (column, value) in filters {
                if let Some(v) = value {
                    qb.push(format_args!(" AND {column} = ")).push_bind(v.clone());
                }
            }
        }

        /// An audit listing's own filters: agent, request id (`id`: the table's column), time.
        fn push_filters(qb: &mut sqlx::QueryBuilder<$db>, q: &AuditQuery, id: &str) {
            push_equal(qb, &[("agent", &q.agent), (id, &q.request_id)]);
            if let Some(since) = q.since {
                qb.push(" AND started_at >= ").push_bind(since);
            }
            if let Some(until) = q.until {
                qb.push(" AND started_at < ").push_bind(until);
            }
        }

        #[async_trait]
        impl Store for $store {
            fn describe(&self) -> String {
                self.description.clone()
            }

            fn known_migrations(&self) -> usize {
                MIGRATOR.iter().count()
            }

            async fn applied_migrations(&self) -> Result<i64, StoreError> {
                Ok(sqlx::query_scalar("SELECT COUNT(*) FROM _sqlx_migrations WHERE success").fetch_one(&self.pool).await?)
            }

            async fn close(&self) {
                self.pool.close().await;
            }

            fn wake(&self) -> Option<tokio::sync::watch::Receiver<u64>> {
                self.wake_channel()
            }

            async fn checkpoint(&self, truncate: bool) -> Result<bool, StoreError> {
                self.checkpoint_wal(truncate).await
            }

            fn wal_bytes(&self) -> Option<u64> {
                self.wal_size()
            }

            fn write_failed(&self, e: &StoreError) {
                self.write_error(e)
            }

            async fn write_turn(&self) -> Option<tokio::sync::OwnedMutexGuard<()>> {
                self.turn().await
            }

            fn free_bytes(&self) -> Option<u64> {
                self.free_space()
            }

            fn checkpoint_hold(&self) -> Option<std::time::Duration> {
                self.longest_hold()
            }

            async fn claim_refresh(
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
                .execute(&self.pool)
                .await?;
                Ok(done.rows_affected() == 1)
            }

            async fn release_refresh(&self, id: &ProfileId, holder: &str) -> Result<(), StoreError> {
                sqlx::query("DELETE FROM refresh_claims WHERE profile_id = $1 AND holder = $2")
                    .bind(id.as_str())
                    .bind(holder)
                    .execute(&self.pool)
                    .await?;
                Ok(())
            }

            async fn snapshot(&self) -> Result<Snapshot, StoreError> {
                // One read transaction: a refresh committing between two of these reads must
                // not give a roster with the old expiry and the new tokens.
                let mut conn = self.read_tx().await?;
                let mut snap = Snapshot::default();
                for row in sqlx::query(
                    "SELECT id, type, source, enabled, email, expires_at, created_at, oauth_subject FROM profiles ORDER BY created_at, id",
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
                    let sealed = sealed_row(&row)?;
                    snap.secrets.entry(id.parse().map_err(|e| corrupt("secrets", e))?).or_default().push(sealed);
                }
                for row in sqlx::query("SELECT * FROM usage_stats").fetch_all(&mut *conn).await? {
                    let id: String = row.try_get("profile_id")?;
                    snap.stats.insert(id.parse().map_err(|e| corrupt("usage_stats", e))?, stats_from_row(&row)?);
                }
                for row in sqlx::query(
                    "SELECT profile_id, model, cooldown_until, cooldown_reason, step, opened_at FROM profile_cooldowns",
                )
                .fetch_all(&mut *conn)
                .await?
                {
                    let id: String = row.try_get("profile_id")?;
                    let id: ProfileId = id.parse().map_err(|e| corrupt("profile_cooldowns", e))?;
                    snap.stats.entry(id).or_default().cooldowns.push(window_from_row(&row)?);
                }
                for row in sqlx::query("SELECT * FROM profile_quota").fetch_all(&mut *conn).await? {
                    let id: String = row.try_get("profile_id")?;
                    let id: ProfileId = id.parse().map_err(|e| corrupt("profile_quota", e))?;
                    snap.stats.entry(id).or_default().quotas.push(quota_from_row(&row)?);
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
                        .insert((row.try_get("provider")?, row.try_get("model")?), model_cooldown_from_row(&row)?);
                }
                conn.commit().await?;
                Ok(snap)
            }

            async fn secret_key_ids(&self) -> Result<Vec<String>, StoreError> {
                Ok(sqlx::query_scalar("SELECT DISTINCT key_id FROM secrets ORDER BY key_id").fetch_all(&self.pool).await?)
            }

            async fn add_profile(&self, p: &StoredProfile, secrets: &[Sealed]) -> Result<(), StoreError> {
                let mut tx = self.write_tx().await?;
                insert_profile(&mut tx, p, secrets).await?;
                tx.commit().await?;
                Ok(())
            }

            async fn import(
                &self,
                profiles: &[(StoredProfile, Vec<Sealed>, UsageStats)],
                orders: &BTreeMap<String, Vec<ProfileId>>,
            ) -> Result<(), StoreError> {
                let mut tx = self.write_tx().await?;
                for (p, secrets, stats) in profiles {
                    insert_profile(&mut tx, p, secrets).await?;
                    upsert_stats(&mut tx, &p.id, None, stats).await?;
                }
                for (provider, ids) in orders {
                    sqlx::query(
                        "INSERT INTO profile_order (provider, profile_ids, updated_at) VALUES ($1, $2, $3)
                         ON CONFLICT (provider) DO UPDATE SET profile_ids = excluded.profile_ids, updated_at = excluded.updated_at",
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

            async fn sync_config_profiles(&self, profiles: &[StoredProfile]) -> Result<(), StoreError> {
                let mut tx = self.write_tx().await?;
                for p in profiles {
                    sqlx::query(
                        "INSERT INTO profiles (id, provider, name, type, source, enabled, expires_at, created_at, updated_at)
                         VALUES ($1, $2, $3, $4, 'config', TRUE, $5, $6, $7)
                         ON CONFLICT (id) DO UPDATE SET type = excluded.type, expires_at = excluded.expires_at,
                             updated_at = excluded.updated_at
                         WHERE profiles.source = 'config' AND (profiles.type, profiles.expires_at) IS DISTINCT FROM (excluded.type, excluded.expires_at)",
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

            async fn remove_profile(&self, id: &ProfileId) -> Result<(), StoreError> {
                let mut tx = self.write_tx().await?;
                let done = sqlx::query("DELETE FROM profiles WHERE id = $1").bind(id.as_str()).execute(&mut *tx).await?;
                if done.rows_affected() == 0 {
                    return Err(StoreError::NotFound(id.clone()));
                }
                tx.commit().await?;
                Ok(())
            }

            async fn set_enabled(&self, id: &ProfileId, enabled: bool) -> Result<(), StoreError> {
                let mut tx = self.write_tx().await?;
                let done = sqlx::query("UPDATE profiles SET enabled = $1, updated_at = $2 WHERE id = $3")
                    .bind(enabled)
                    .bind(now())
                    .bind(id.as_str())
                    .execute(&mut *tx)
                    .await?;
                if done.rows_affected() == 0 {
                    return Err(StoreError::NotFound(id.clone()));
                }
                tx.commit().await?;
                Ok(())
            }

            #[tracing::instrument(skip_all, level = "debug", fields(profiles = batch.len()))]
            async fn save_stats(&self, batch: &[(ProfileId, UsageStats)]) -> Result<(), StoreError> {
                let mut tx = self.write_tx().await?;
                for (id, s) in batch {
                    upsert_stats(&mut tx, id, None, s).await?;
                }
                tx.commit().await?;
                Ok(())
            }

            async fn save_model_cooldowns(&self, batch: &[((String, String), ModelCooldown)]) -> Result<(), StoreError> {
                let mut tx = self.write_tx().await?;
                for (key, mc) in batch {
                    upsert_model_cooldown(&mut tx, key, mc).await?;
                }
                tx.commit().await?;
                Ok(())
            }

            #[tracing::instrument(skip_all, level = "debug", fields(profiles = stats.len(), models = models.len()))]
            async fn apply(
                &self,
                stats: &[(ProfileId, Vec<Change>)],
                models: &[((String, String), Vec<ModelChange>)],
                policy: &CooldownPolicy,
            ) -> Result<Applied, StoreError> {
                let mut tx = self.write_tx().await?;
                let before = feed_head(&mut tx).await?;
                let mut out = Applied::default();
                let ids: Vec<&ProfileId> = stats.iter().map(|(id, _)| id).collect();
                let mut stored = load_many(&mut tx, &ids).await?;
                for (id, changes) in stats {
                    let Some(before) = stored.remove(id) else { continue };
                    let mut s = before.clone();
                    for c in changes {
                        s.apply(c, policy);
                    }
                    upsert_stats(&mut tx, id, Some(&before), &s).await?;
                    out.stats.push((id.clone(), s));
                }
                for (key, changes) in models {
                    let row = sqlx::query("SELECT * FROM model_cooldowns WHERE provider = $1 AND model = $2")
                        .bind(&key.0)
                        .bind(&key.1)
                        .fetch_optional(&mut *tx)
                        .await?;
                    let mut mc = row.as_ref().map(model_cooldown_from_row).transpose()?;
                    for c in changes {
                        mc = ModelCooldown::apply(mc.as_ref(), c, policy);
                    }
                    if let Some(mc) = mc {
                        upsert_model_cooldown(&mut tx, key, &mc).await?;
                        out.models.push((key.clone(), mc));
                    }
                }
                out.feed = (before, feed_head(&mut tx).await?);
                tx.commit().await?;
                Ok(out)
            }

            async fn changes_after(&self, seq: i64) -> Result<Vec<FeedEntry>, StoreError> {
                let rows: Vec<(String, String, i64)> =
                    sqlx::query_as("SELECT kind, key, seq FROM changes WHERE seq > $1 ORDER BY seq LIMIT 10000")
                        .bind(seq)
                        .fetch_all(&self.pool)
                        .await?;
                Ok(rows.into_iter().map(|(kind, key, seq)| FeedEntry { kind, key, seq }).collect())
            }

            async fn feed_head(&self, kind: Option<&str>) -> Result<i64, StoreError> {
                let mut conn = self.pool.acquire().await?;
                match kind {
                    None => feed_head(&mut conn).await,
                    Some(kind) => Ok(sqlx::query_scalar("SELECT coalesce(max(seq), 0) FROM changes WHERE kind = $1")
                        .bind(kind)
                        .fetch_one(&mut *conn)
                        .await?),
                }
            }

            async fn stats_of(&self, ids: &[ProfileId]) -> Result<Vec<(ProfileId, Option<UsageStats>)>, StoreError> {
                let mut conn = self.pool.acquire().await?;
                let mut stored = load_many(&mut conn, &ids.iter().collect::<Vec<_>>()).await?;
                Ok(ids.iter().map(|id| (id.clone(), stored.remove(id))).collect())
            }

            async fn model_cooldowns(&self) -> Result<HashMap<(String, String), ModelCooldown>, StoreError> {
                let mut out = HashMap::new();
                for row in sqlx::query("SELECT * FROM model_cooldowns").fetch_all(&self.pool).await? {
                    out.insert((row.try_get("provider")?, row.try_get("model")?), model_cooldown_from_row(&row)?);
                }
                Ok(out)
            }

            async fn set_order(&self, provider: &str, ids: Option<&[ProfileId]>) -> Result<(), StoreError> {
                let mut tx = self.write_tx().await?;
                match ids {
                    Some(ids) => {
                        let json = serde_json::to_string(ids).expect("profile ids serialize");
                        sqlx::query(
                            "INSERT INTO profile_order (provider, profile_ids, updated_at) VALUES ($1, $2, $3)
                             ON CONFLICT (provider) DO UPDATE SET profile_ids = excluded.profile_ids, updated_at = excluded.updated_at",
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

            async fn create_agent(
                &self,
                name: &str,
                key_digest: &str,
                admin: bool,
                limits: &Limits,
                now: Millis,
            ) -> Result<Agent, StoreError> {
                let mut tx = self.write_tx().await?;
                let row = sqlx::query(
                    "INSERT INTO agents (id, name, key_digest, admin, created_at, requests_per_minute, tokens_per_day,
                         cost_per_day) VALUES ($1, $2, $3, $4, $5, $6, $7, $8)
                     ON CONFLICT (name) DO UPDATE SET key_digest = excluded.key_digest, admin = excluded.admin,
                         created_at = excluded.created_at, revoked_at = NULL,
                         requests_per_minute = excluded.requests_per_minute, tokens_per_day = excluded.tokens_per_day,
                         cost_per_day = excluded.cost_per_day
                     WHERE agents.revoked_at IS NOT NULL
                     RETURNING id, name, admin, created_at, revoked_at, requests_per_minute, tokens_per_day, cost_per_day",
                )
                .bind(uuid::Uuid::new_v4().to_string())
                .bind(name)
                .bind(key_digest)
                .bind(admin)
                .bind(now)
                .bind(limits.requests_per_minute)
                .bind(limits.tokens_per_day)
                .bind(limits.cost_per_day)
                .fetch_optional(&mut *tx)
                .await?;
                let Some(row) = row else { return Err(StoreError::AgentExists(name.to_string())) };
                let agent = agent_from_row(&row)?;
                tx.commit().await?;
                Ok(agent)
            }

            async fn agents(&self) -> Result<Vec<Agent>, StoreError> {
                let rows = sqlx::query(sqlx::AssertSqlSafe(format!("SELECT {AGENT_COLUMNS} FROM agents ORDER BY name")))
                    .fetch_all(&self.pool)
                    .await?;
                rows.iter().map(agent_from_row).collect()
            }

            async fn active_agents(&self) -> Result<Vec<(String, Agent)>, StoreError> {
                let rows = sqlx::query(sqlx::AssertSqlSafe(format!(
                    "SELECT key_digest, {AGENT_COLUMNS} FROM agents WHERE revoked_at IS NULL"
                )))
                .fetch_all(&self.pool)
                .await?;
                rows.iter().map(|r| Ok((r.try_get("key_digest")?, agent_from_row(r)?))).collect()
            }

            async fn all_agents(&self) -> Result<Vec<(String, Agent)>, StoreError> {
                let rows =
                    sqlx::query(sqlx::AssertSqlSafe(format!("SELECT key_digest, {AGENT_COLUMNS} FROM agents ORDER BY name")))
                    .fetch_all(&self.pool)
                    .await?;
                rows.iter().map(|r| Ok((r.try_get("key_digest")?, agent_from_row(r)?))).collect()
            }

            async fn copy_agents(&self, agents: &[(String, Agent)]) -> Result<(), StoreError> {
                let mut tx = self.write_tx().await?;
                for (digest, a) in agents {
                    sqlx::query(
                        "INSERT INTO agents (id, name, key_digest, admin, created_at, revoked_at, requests_per_minute,
                             tokens_per_day, cost_per_day) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)",
                    )
                    .bind(&a.id)
                    .bind(&a.name)
                    .bind(digest)
                    .bind(a.admin)
                    .bind(a.created_at)
                    .bind(a.revoked_at)
                    .bind(a.limits.requests_per_minute)
                    .bind(a.limits.tokens_per_day)
                    .bind(a.limits.cost_per_day)
                    .execute(&mut *tx)
                    .await?;
                }
                tx.commit().await?;
                Ok(())
            }

            async fn revoke_agent(&self, name: &str, now: Millis) -> Result<(), StoreError> {
                let mut tx = self.write_tx().await?;
                let done = sqlx::query("UPDATE agents SET revoked_at = $1 WHERE name = $2 AND revoked_at IS NULL")
                    .bind(now)
                    .bind(name)
                    .execute(&mut *tx)
                    .await?;
                if done.rows_affected() == 0 {
                    return Err(StoreError::NoAgent(name.to_string()));
                }
                tx.commit().await?;
                Ok(())
            }

            async fn set_agent_limits(&self, name: &str, patch: &LimitsPatch) -> Result<Agent, StoreError> {
                let mut tx = self.write_tx().await?;
                let row = sqlx::query(sqlx::AssertSqlSafe(format!(
                    "UPDATE agents SET
                         requests_per_minute = CASE WHEN $2 THEN $3 ELSE requests_per_minute END,
                         tokens_per_day = CASE WHEN $4 THEN $5 ELSE tokens_per_day END,
                         cost_per_day = CASE WHEN $6 THEN $7 ELSE cost_per_day END
                     WHERE name = $1 AND revoked_at IS NULL
                     RETURNING {AGENT_COLUMNS}"
                )))
                .bind(name)
                .bind(patch.requests_per_minute.is_some())
                .bind(patch.requests_per_minute.flatten())
                .bind(patch.tokens_per_day.is_some())
                .bind(patch.tokens_per_day.flatten())
                .bind(patch.cost_per_day.is_some())
                .bind(patch.cost_per_day.flatten())
                .fetch_optional(&mut *tx)
                .await?;
                let Some(row) = row else { return Err(StoreError::NoAgent(name.to_string())) };
                let agent = agent_from_row(&row)?;
                tx.commit().await?;
                Ok(agent)
            }

            async fn claim_requests(
                &self,
                agent: &str,
                minute: Millis,
                slots: i64,
                limit: i64,
            ) -> Result<Option<i64>, StoreError> {
                // One statement: the row of the minute is created with these slots, or takes them
                // while they fit under the limit. Concurrent servers wait on the row (its lock, or
                // SQLite's write lock) and each sees the others' claims, so together they claim at
                // most `limit`.
                let mut tx = self.audit_tx().await?;
                let count: Option<i64> = sqlx::query_scalar(
                    "INSERT INTO agent_usage (agent, period, period_start, requests) VALUES ($1, 'minute', $2, $3)
                     ON CONFLICT (agent, period, period_start) DO UPDATE SET requests = agent_usage.requests + $3
                     WHERE agent_usage.requests + $3 <= $4
                     RETURNING requests",
                )
                .bind(agent)
                .bind(minute)
                .bind(slots.clamp(1, limit.max(1)))
                .bind(limit)
                .fetch_optional(&mut *tx)
                .await?;
                tx.commit().await?;
                Ok(count)
            }

            async fn agent_usage(
                &self,
                agent: Option<&str>,
                minute: Millis,
                day: Millis,
            ) -> Result<HashMap<String, AgentUsage>, StoreError> {
                let rows = sqlx::query(
                    "SELECT agent, period, requests, tokens, cost FROM agent_usage
                     WHERE ((period = 'minute' AND period_start = $1) OR (period = 'day' AND period_start = $2))
                       AND ($3 IS NULL OR agent = $3)",
                )
                .bind(minute)
                .bind(day)
                .bind(agent)
                .fetch_all(&self.pool)
                .await?;
                let mut out: HashMap<String, AgentUsage> = HashMap::new();
                for r in &rows {
                    let use_ = out.entry(r.try_get("agent")?).or_default();
                    if r.try_get::<String, _>("period")? == "minute" {
                        use_.requests_this_minute = r.try_get("requests")?;
                    } else {
                        use_.tokens_today = r.try_get("tokens")?;
                        use_.cost_today = r.try_get("cost")?;
                    }
                }
                Ok(out)
            }

            async fn prune_agent_usage(&self, minutes_before: Millis, days_before: Option<Millis>) -> Result<u64, StoreError> {
                let mut tx = self.audit_tx().await?;
                let gone = sqlx::query(
                    "DELETE FROM agent_usage WHERE (period = 'minute' AND period_start < $1)
                        OR (period = 'day' AND period_start < $2)",
                )
                .bind(minutes_before)
                .bind(days_before.unwrap_or(Millis::MIN))
                .execute(&mut *tx)
                .await?
                .rows_affected();
                tx.commit().await?;
                Ok(gone)
            }

            async fn login_profile(&self, provider: &str, subject: &str) -> Result<Option<ProfileId>, StoreError> {
                let id: Option<String> = sqlx::query_scalar("SELECT id FROM profiles WHERE provider = $1 AND oauth_subject = $2")
                    .bind(provider)
                    .bind(subject)
                    .fetch_optional(&self.pool)
                    .await?;
                id.map(|id| id.parse().map_err(|e| corrupt("profiles", e))).transpose()
            }

            async fn save_login(&self, p: &StoredProfile, secrets: &[Sealed]) -> Result<bool, StoreError> {
                let mut tx = self.write_tx().await?;
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
                        insert_profile(&mut tx, p, secrets).await?;
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
                        replace_secrets(&mut tx, &p.id, secrets, p.created_at).await?;
                        false
                    }
                    Some(_) => return Err(StoreError::Duplicate(p.id.clone())),
                };
                tx.commit().await?;
                Ok(created)
            }

            async fn swap_tokens(
                &self,
                id: &ProfileId,
                expected: Option<&[u8]>,
                secrets: &[Sealed],
                expires_at: Option<Millis>,
            ) -> Result<bool, StoreError> {
                let mut tx = self.write_tx().await?;
                let current: Option<Vec<u8>> =
                    sqlx::query_scalar("SELECT nonce FROM secrets WHERE profile_id = $1 AND field = 'refresh_token'")
                        .bind(id.as_str())
                        .fetch_optional(&mut *tx)
                        .await?;
                if current.as_deref() != expected {
                    return Ok(false);
                }
                let now = chrono::Utc::now().timestamp_millis();
                replace_secrets(&mut tx, id, secrets, now).await?;
                sqlx::query("UPDATE profiles SET expires_at = $1, updated_at = $2 WHERE id = $3")
                    .bind(expires_at)
                    .bind(now)
                    .bind(id.as_str())
                    .execute(&mut *tx)
                    .await?;
                tx.commit().await?;
                Ok(true)
            }

            async fn reseal_all(&self, rows: &[(ProfileId, Sealed)]) -> Result<(), StoreError> {
                let mut tx = self.write_tx().await?;
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
                        "UPDATE secrets SET key_id = $1, nonce = $2, ciphertext = $3, updated_at = $4 WHERE profile_id = $5 AND field = $6",
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

            async fn profile_secrets(&self, id: &ProfileId) -> Result<(Vec<Sealed>, Option<Millis>), StoreError> {
                let mut tx = self.read_tx().await?; // the expiry and the tokens of one refresh
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
                    out.push(sealed_row(&r)?);
                }
                Ok((out, expires))
            }

            async fn attempts(&self, q: &AuditQuery) -> Result<Vec<AttemptRecord>, StoreError> {
                let mut qb = sqlx::QueryBuilder::new(
                    "SELECT request_id, seq, kind, agent, provider, model, profile_id, started_at, duration_ms, ttfb_ms,
                            http_status, outcome, reason, retry_after_ms, cooldown_until, error, tokens_in, tokens_out,
                            cost
                     FROM attempts WHERE TRUE",
                );
                push_filters(&mut qb, q, "request_id");
                push_equal(&mut qb, &attempt_filters(q));
                if let Some((t, id, seq)) = &q.after {
                    // The plain bound first: the row comparison alone seeks no index.
                    qb.push(" AND started_at <= ").push_bind(*t);
                    qb.push(" AND (started_at, request_id, seq) < (").push_bind(*t).push(", ").push_bind(id.clone());
                    qb.push(", ").push_bind(*seq).push(")");
                }
                qb.push(" ORDER BY started_at DESC, request_id DESC, seq DESC LIMIT ").push_bind(i64::from(q.limit));
                Ok(qb.build_query_as::<AttemptRecord>().fetch_all(&self.pool).await?)
            }

            async fn requests(&self, q: &AuditQuery) -> Result<Vec<RequestRecord>, StoreError> {
                let mut qb = sqlx::QueryBuilder::new(
                    "SELECT id, agent, api, requested_model, served_model, served_profile, status, attempts, started_at,
                            duration_ms, stream, tokens_in, tokens_out, error, cost
                     FROM requests r WHERE TRUE",
                );
                push_filters(&mut qb, q, "id");
                if let Some((t, id, _)) = &q.after {
                    qb.push(" AND started_at <= ").push_bind(*t);
                    qb.push(" AND (started_at, id) < (").push_bind(*t).push(", ").push_bind(id.clone()).push(")");
                }
                let of_attempts = attempt_filters(q);
                if of_attempts.iter().any(|(_, v)| v.is_some()) {
                    // Few matching attempts: the requests are looked up from them (each filter has
                    // its index). Many: the requests are walked newest first, each one's attempts
                    // looked up by request id, and the page fills fast. (Either way alone took
                    // seconds at millions of rows: walking every request for a value no attempt
                    // has, or gathering and sorting hundreds of thousands of matches.)
                    let mut count = sqlx::QueryBuilder::new("SELECT count(*) FROM (SELECT 1 FROM attempts WHERE TRUE");
                    push_equal(&mut count, &of_attempts);
                    count.push(" LIMIT ").push_bind(SELECTIVE).push(") n");
                    let matching: i64 = count.build_query_scalar().fetch_one(&self.pool).await?;
                    if matching < SELECTIVE {
                        qb.push(" AND id IN (SELECT request_id FROM attempts WHERE TRUE");
                        push_equal(&mut qb, &of_attempts);
                        qb.push(")");
                    } else {
                        // Kept as `($n IS NULL OR …)` on purpose: so written, the planner looks
                        // the request's attempts up by request id; with a plain
                        // `a.profile_id = $n` it walked the filter's index instead.
                        qb.push(" AND EXISTS (SELECT 1 FROM attempts a WHERE a.request_id = r.id");
                        for (column, value) in of_attempts {
                            qb.push(" AND (").push_bind(value.clone());
                            qb.push(format_args!(" IS NULL OR a.{column} = ")).push_bind(value.clone()).push(")");
                        }
                        qb.push(")");
                    }
                }
                qb.push(" ORDER BY started_at DESC, id DESC LIMIT ").push_bind(i64::from(q.limit));
                Ok(qb.build_query_as::<RequestRecord>().fetch_all(&self.pool).await?)
            }

            async fn usage(&self, since: Millis, until: Millis) -> Result<Vec<ProfileUsage>, StoreError> {
                // Whole hours from usage_hourly, the partial ones at either end from attempts.
                let (first, last) = whole_hours(since, until);
                let rows = sqlx::query_as::<_, ProfileUsage>(
                    "SELECT profile_id, CAST(sum(attempts) AS BIGINT) AS attempts,
                            CAST(sum(successes) AS BIGINT) AS successes, CAST(sum(failures) AS BIGINT) AS failures,
                            CAST(sum(tokens_in) AS BIGINT) AS tokens_in, CAST(sum(tokens_out) AS BIGINT) AS tokens_out
                     FROM (
                         SELECT profile_id, attempts, successes, failures, tokens_in, tokens_out
                         FROM usage_hourly WHERE hour >= $3 AND hour < $4
                         UNION ALL
                         SELECT profile_id, 1, CASE WHEN outcome = 'success' THEN 1 ELSE 0 END,
                                CASE WHEN outcome = 'failure' THEN 1 ELSE 0 END, coalesce(tokens_in, 0),
                                coalesce(tokens_out, 0)
                         FROM attempts
                         WHERE profile_id IS NOT NULL
                           AND ((started_at >= $1 AND started_at < $3) OR (started_at >= $4 AND started_at < $2))
                     ) u
                     GROUP BY profile_id ORDER BY profile_id",
                )
                .bind(since)
                .bind(until)
                .bind(first)
                .bind(last)
                .fetch_all(&self.pool)
                .await?;
                Ok(rows)
            }

            async fn usage_series(&self, since: Millis, until: Millis, step: Millis) -> Result<SeriesRows, StoreError> {
                // One pass over the range of attempts_listing (started_at first) and one over
                // requests_started; the buckets are grouped in the database.
                let attempts = sqlx::query_as::<_, (i64, String, String, Option<String>, i64)>(
                    "SELECT CAST((started_at - $1) / $3 AS BIGINT) AS bucket, provider, outcome, reason,
                            CAST(count(*) AS BIGINT) AS n
                     FROM attempts WHERE started_at >= $1 AND started_at < $2
                     GROUP BY 1, 2, 3, 4 ORDER BY 1, 2, 3, 4",
                )
                .bind(since)
                .bind(until)
                .bind(step)
                .fetch_all(&self.pool)
                .await?;
                let requests = sqlx::query_as::<_, (i64, String, i64)>(
                    "SELECT CAST((started_at - $1) / $3 AS BIGINT) AS bucket,
                            CASE WHEN attempts = 0 THEN 'refused'
                                 WHEN status >= 200 AND status < 300 THEN 'served'
                                 ELSE 'failed' END AS outcome,
                            CAST(count(*) AS BIGINT) AS n
                     FROM requests WHERE started_at >= $1 AND started_at < $2
                     GROUP BY 1, 2 ORDER BY 1, 2",
                )
                .bind(since)
                .bind(until)
                .bind(step)
                .fetch_all(&self.pool)
                .await?;
                Ok(SeriesRows { attempts, requests })
            }

            async fn failure_windows(
                &self,
                (far, near): (Millis, Millis),
                since: Millis,
                until: Millis,
            ) -> Result<Vec<FailureWindow>, StoreError> {
                // The failures from `near` on through attempts_outcome (outcome, started_at); the
                // disabling ones from `far` to `near` through attempts_reason (reason,
                // started_at); each one's next success through attempts_profile (profile_id,
                // started_at), walked in order and stopped at the first (a cooling profile is
                // rarely called). Sorted by the caller.
                Ok(sqlx::query_as::<_, FailureWindow>(
                    "SELECT w.profile_id, w.started_at, w.duration_ms, w.reason, w.cooldown_until,
                            (SELECT s.started_at FROM attempts s
                             WHERE s.profile_id = w.profile_id AND s.started_at > w.started_at
                               AND s.started_at < CASE WHEN w.cooldown_until IS NULL OR w.cooldown_until > $4
                                                       THEN $4 ELSE w.cooldown_until END
                               AND s.outcome = 'success'
                             ORDER BY s.started_at LIMIT 1) AS next_success
                     FROM (
                         SELECT profile_id, started_at, duration_ms, reason, cooldown_until FROM attempts
                         WHERE outcome = 'failure' AND started_at >= $2 AND started_at < $4 AND profile_id IS NOT NULL
                           AND (cooldown_until > $3 OR (cooldown_until IS NULL AND reason = 'auth_permanent'))
                         UNION ALL
                         SELECT profile_id, started_at, duration_ms, reason, cooldown_until FROM attempts
                         WHERE reason IN ('billing', 'auth_permanent') AND started_at >= $1 AND started_at < $2
                           AND started_at < $4 AND outcome = 'failure' AND profile_id IS NOT NULL
                           AND (cooldown_until > $3 OR (cooldown_until IS NULL AND reason = 'auth_permanent'))
                     ) w",
                )
                .bind(far)
                .bind(near)
                .bind(since)
                .bind(until)
                .fetch_all(&self.pool)
                .await?)
            }

            #[tracing::instrument(skip_all, level = "debug", fields(requests = requests.len(), attempts = attempts.len()))]
            async fn insert_audit(&self, requests: &[RequestRecord], attempts: &[AttemptRecord]) -> Result<(), StoreError> {
                // Multi-row INSERTs of 64, 8 or 1 rows (`shaped`): few statements a batch, since each
                // is a round trip to the SQLite worker thread, and only three SQL texts a table, each
                // parsed once and kept in the connection's statement cache. (A text per batch size
                // was parsed anew for every batch: a third of the audit's cost at low load.)
                // `ON CONFLICT DO NOTHING`: a retried batch whose first commit did land (an I/O
                // error after the commit record was written) adds nothing twice.
                let mut tx = self.audit_tx().await?;
                let mut hourly = Hourly::default();
                for chunk in shaped(attempts) {
                    let mut q = sqlx::query(ATTEMPTS.sql(chunk.len()));
                    for a in chunk {
                        q = q
                            .bind(&a.request_id)
                            .bind(a.seq)
                            .bind(&a.kind)
                            .bind(&a.agent)
                            .bind(&a.provider)
                            .bind(&a.model)
                            .bind(&a.profile_id)
                            .bind(a.started_at)
                            .bind(a.duration_ms)
                            .bind(a.ttfb_ms)
                            .bind(a.http_status)
                            .bind(&a.outcome)
                            .bind(&a.reason)
                            .bind(a.retry_after_ms)
                            .bind(a.cooldown_until)
                            .bind(&a.error)
                            .bind(a.tokens_in)
                            .bind(a.tokens_out)
                            .bind(a.cost);
                    }
                    let inserted = q.execute(&mut *tx).await?.rows_affected();
                    hourly.add(chunk, inserted);
                }
                for ((hour, profile), [n, ok, failed, tin, tout]) in &hourly.sums {
                    sqlx::query(
                        "INSERT INTO usage_hourly (hour, profile_id, attempts, successes, failures, tokens_in, tokens_out)
                         VALUES ($1, $2, $3, $4, $5, $6, $7)
                         ON CONFLICT (hour, profile_id) DO UPDATE SET
                             attempts = usage_hourly.attempts + excluded.attempts,
                             successes = usage_hourly.successes + excluded.successes,
                             failures = usage_hourly.failures + excluded.failures,
                             tokens_in = usage_hourly.tokens_in + excluded.tokens_in,
                             tokens_out = usage_hourly.tokens_out + excluded.tokens_out",
                    )
                    .bind(hour)
                    .bind(profile)
                    .bind(n)
                    .bind(ok)
                    .bind(failed)
                    .bind(tin)
                    .bind(tout)
                    .execute(&mut *tx)
                    .await?;
                }
                for (hour, profile) in &hourly.recount {
                    sqlx::query(
                        "INSERT INTO usage_hourly (hour, profile_id, attempts, successes, failures, tokens_in, tokens_out)
                         SELECT $1, profile_id, count(*), sum(CASE WHEN outcome = 'success' THEN 1 ELSE 0 END),
                                sum(CASE WHEN outcome = 'failure' THEN 1 ELSE 0 END), coalesce(sum(tokens_in), 0),
                                coalesce(sum(tokens_out), 0)
                         FROM attempts WHERE started_at >= $1 AND started_at < $1 + 3600000 AND profile_id = $2
                         GROUP BY profile_id
                         ON CONFLICT (hour, profile_id) DO UPDATE SET attempts = excluded.attempts,
                             successes = excluded.successes, failures = excluded.failures,
                             tokens_in = excluded.tokens_in, tokens_out = excluded.tokens_out",
                    )
                    .bind(hour)
                    .bind(profile)
                    .execute(&mut *tx)
                    .await?;
                }
                let mut inserted: HashSet<String> = HashSet::new();
                for chunk in shaped(requests) {
                    let mut q = sqlx::query_scalar::<_, String>(REQUESTS.sql(chunk.len()));
                    for r in chunk {
                        q = q
                            .bind(&r.id)
                            .bind(&r.agent)
                            .bind(&r.api)
                            .bind(&r.requested_model)
                            .bind(&r.served_model)
                            .bind(&r.served_profile)
                            .bind(r.status)
                            .bind(r.attempts)
                            .bind(r.started_at)
                            .bind(r.duration_ms)
                            .bind(r.stream)
                            .bind(r.tokens_in)
                            .bind(r.tokens_out)
                            .bind(&r.error)
                            .bind(r.cost);
                    }
                    inserted.extend(q.fetch_all(&mut *tx).await?);
                }
                // Each agent's day (`agent_usage`) takes the tokens and cost of its requests
                // written now (not those of a retried batch's rows that had landed).
                let days = agent_days(requests.iter().filter(|r| inserted.contains(&r.id)));
                for ((agent, day), (tokens, cost)) in &days {
                    sqlx::query(
                        "INSERT INTO agent_usage (agent, period, period_start, tokens, cost) VALUES ($1, 'day', $2, $3, $4)
                         ON CONFLICT (agent, period, period_start) DO UPDATE SET
                             tokens = agent_usage.tokens + excluded.tokens, cost = agent_usage.cost + excluded.cost",
                    )
                    .bind(*agent)
                    .bind(day)
                    .bind(tokens)
                    .bind(cost)
                    .execute(&mut *tx)
                    .await?;
                }
                tx.commit().await?;
                Ok(())
            }

            async fn ping(&self) -> Result<(), StoreError> {
                let mut conn = self.pool.acquire().await?;
                sqlx::query("SELECT 1").execute(&mut *conn).await?;
                Ok(())
            }

            async fn newest_audit(&self) -> Result<Option<Millis>, StoreError> {
                let mut conn = self.pool.acquire().await?;
                Ok(sqlx::query_scalar("SELECT max(started_at) FROM requests").fetch_one(&mut *conn).await?)
            }

            async fn prune_audit(&self, before: Millis, batch: usize) -> Result<Pruned, StoreError> {
                let mut tx = self.audit_tx().await?;
                // The batch ends at the `batch`-th oldest attempt (all of its millisecond go too).
                let last: Option<i64> = sqlx::query_scalar(
                    "SELECT started_at FROM attempts WHERE started_at < $1 ORDER BY started_at LIMIT 1 OFFSET $2",
                )
                .bind(before)
                .bind(batch as i64 - 1)
                .fetch_optional(&mut *tx)
                .await?;
                let upto = last.unwrap_or(before - 1);
                let gone = sqlx::query(
                    "DELETE FROM attempts WHERE started_at <= $1 AND started_at < $2
                     RETURNING started_at, agent, provider, model, profile_id, outcome, tokens_in, tokens_out",
                )
                .bind(upto)
                .bind(before)
                .fetch_all(&mut *tx)
                .await?;
                // The hours whose attempts are all gone now (usage_daily keeps their sums).
                sqlx::query("DELETE FROM usage_hourly WHERE hour + 3600000 <= $1")
                    .bind((upto + 1).min(before))
                    .execute(&mut *tx)
                    .await?;
                let mut days: BTreeMap<(String, String, String, String, String), [i64; 5]> = BTreeMap::new();
                for r in &gone {
                    let day = chrono::DateTime::from_timestamp_millis(r.try_get("started_at")?)
                        .map(|t| t.format("%Y-%m-%d").to_string())
                        .unwrap_or_default();
                    let text = |c: &str| -> Result<String, sqlx::Error> {
                        Ok(r.try_get::<Option<String>, _>(c)?.unwrap_or_default())
                    };
                    let key = (day, text("agent")?, text("provider")?, text("model")?, text("profile_id")?);
                    let outcome: String = r.try_get("outcome")?;
                    count_attempt(days.entry(key).or_default(), &outcome, r.try_get("tokens_in")?, r.try_get("tokens_out")?);
                }
                for ((day, agent, provider, model, profile), [n, ok, failed, tin, tout]) in &days {
                    sqlx::query(
                        "INSERT INTO usage_daily (day, agent, provider, model, profile_id, attempts, successes, failures,
                             tokens_in, tokens_out) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)
                         ON CONFLICT (day, agent, provider, model, profile_id) DO UPDATE SET
                             attempts = usage_daily.attempts + excluded.attempts,
                             successes = usage_daily.successes + excluded.successes,
                             failures = usage_daily.failures + excluded.failures,
                             tokens_in = usage_daily.tokens_in + excluded.tokens_in,
                             tokens_out = usage_daily.tokens_out + excluded.tokens_out",
                    )
                    .bind(day)
                    .bind(agent)
                    .bind(provider)
                    .bind(model)
                    .bind(profile)
                    .bind(n)
                    .bind(ok)
                    .bind(failed)
                    .bind(tin)
                    .bind(tout)
                    .execute(&mut *tx)
                    .await?;
                }
                let requests = sqlx::query("DELETE FROM requests WHERE started_at <= $1 AND started_at < $2")
                    .bind(upto)
                    .bind(before)
                    .execute(&mut *tx)
                    .await?
                    .rows_affected();
                tx.commit().await?;
                Ok(Pruned { attempts: gone.len() as u64, requests, more: last.is_some() })
            }
        }
    };
}

pub(crate) use sql_store;

const HOUR: Millis = 3_600_000;

/// The columns `agent_from_row` reads.
pub(super) const AGENT_COLUMNS: &str =
    "id, name, admin, created_at, revoked_at, requests_per_minute, tokens_per_day, cost_per_day";

/// The tokens (in and out) and cost of requests, summed per agent and UTC day (its start).
pub(super) fn agent_days<'a>(
    requests: impl Iterator<Item = &'a crate::store::RequestRecord>,
) -> BTreeMap<(&'a str, Millis), (i64, f64)> {
    let mut days: BTreeMap<(&str, Millis), (i64, f64)> = BTreeMap::new();
    for r in requests {
        let Some(agent) = r.agent.as_deref() else { continue };
        let sums = days.entry((agent, crate::agents::day_start(r.started_at))).or_default();
        sums.0 += r.tokens_in.unwrap_or(0) + r.tokens_out.unwrap_or(0);
        sums.1 += r.cost.unwrap_or(0.0);
    }
    days
}

/// Fewer matching attempts than this, and a requests listing filtered on attempts looks its
/// requests up from them; more, and it walks the requests (see `requests`).
pub(super) const SELECTIVE: i64 = 5_000;

/// The filters of an audit query on attempt columns: profile, provider, model, reason, outcome.
pub(super) fn attempt_filters(q: &super::AuditQuery) -> [(&'static str, &Option<String>); 5] {
    [
        ("profile_id", &q.profile),
        ("provider", &q.provider),
        ("model", &q.model),
        ("reason", &q.reason),
        ("outcome", &q.outcome),
    ]
}

/// The whole hours in `[since, until)`, as `[first, last)`: empty (`first == last == until`)
/// when there is none.
pub(super) fn whole_hours(since: Millis, until: Millis) -> (Millis, Millis) {
    let first = (since + HOUR - 1).div_euclid(HOUR) * HOUR;
    let last = until.div_euclid(HOUR) * HOUR;
    if first < last { (first, last) } else { (until, until) }
}

/// An audit batch's attempts summed per hour and profile, for `usage_hourly`.
#[derive(Default)]
pub(super) struct Hourly<'a> {
    /// Attempts, successes, failures, tokens in and out of the rows that were inserted.
    pub sums: BTreeMap<(Millis, &'a str), [i64; 5]>,
    /// Hours to count again from `attempts`: a chunk only some of whose rows were new.
    pub recount: BTreeSet<(Millis, &'a str)>,
}

impl<'a> Hourly<'a> {
    /// A chunk of attempts of which `inserted` were new. None: a retried batch whose first
    /// commit did land (`ON CONFLICT DO NOTHING`), already counted; all: added; some (which
    /// ones is not known): their hours are counted again from the table.
    pub fn add(&mut self, chunk: &'a [crate::store::AttemptRecord], inserted: u64) {
        if inserted == 0 {
            return;
        }
        for a in chunk {
            let Some(profile) = a.profile_id.as_deref() else { continue };
            let key = (a.started_at.div_euclid(HOUR) * HOUR, profile);
            if inserted < chunk.len() as u64 {
                self.recount.insert(key);
                continue;
            }
            count_attempt(self.sums.entry(key).or_default(), &a.outcome, a.tokens_in, a.tokens_out);
        }
    }
}

/// Adds one attempt to a roll-up's attempts, successes, failures, tokens in and out.
pub(super) fn count_attempt(sums: &mut [i64; 5], outcome: &str, tokens_in: Option<i64>, tokens_out: Option<i64>) {
    sums[0] += 1;
    sums[1] += i64::from(outcome == "success");
    sums[2] += i64::from(outcome == "failure");
    sums[3] += tokens_in.unwrap_or(0);
    sums[4] += tokens_out.unwrap_or(0);
}

/// The row counts of the audit's multi-row INSERTs, largest first.
const SHAPES: [usize; 3] = [64, 8, 1];

/// `rows` cut into chunks whose lengths are among [`SHAPES`], the largest that fits first.
pub(super) fn shaped<T>(mut rows: &[T]) -> impl Iterator<Item = &[T]> {
    std::iter::from_fn(move || {
        let n = SHAPES.into_iter().find(|&n| rows.len() >= n)?;
        let (chunk, rest) = rows.split_at(n);
        rows = rest;
        Some(chunk)
    })
}

/// `INSERT INTO {table} VALUES (…), … ON CONFLICT DO NOTHING`, one text per shape.
pub(super) struct Shapes([String; SHAPES.len()]);

impl Shapes {
    /// The attempts table's INSERTs; `numbered`: `$N` parameters, else `?`.
    pub(super) fn attempts(numbered: bool) -> Shapes {
        Shapes::new(
            "attempts (request_id, seq, kind, agent, provider, model, profile_id, started_at, duration_ms, ttfb_ms,
             http_status, outcome, reason, retry_after_ms, cooldown_until, error, tokens_in, tokens_out, cost)",
            19,
            numbered,
        )
    }

    /// The requests table's INSERTs.
    pub(super) fn requests(numbered: bool) -> Shapes {
        Shapes::new(
            "requests (id, agent, api, requested_model, served_model, served_profile, status, attempts, started_at,
             duration_ms, stream, tokens_in, tokens_out, error, cost)",
            15,
            numbered,
        )
        .returning("id")
    }

    fn new(table: &str, columns: usize, numbered: bool) -> Shapes {
        Shapes(SHAPES.map(|rows| {
            let values: Vec<String> = (0..rows)
                .map(|r| {
                    let row: Vec<String> = (1..=columns)
                        .map(|c| if numbered { format!("${}", r * columns + c) } else { "?".to_string() })
                        .collect();
                    format!("({})", row.join(", "))
                })
                .collect();
            format!("INSERT INTO {table} VALUES {} ON CONFLICT DO NOTHING", values.join(", "))
        }))
    }

    /// The same INSERTs answering with `column` of each row they inserted.
    fn returning(self, column: &str) -> Shapes {
        Shapes(self.0.map(|sql| format!("{sql} RETURNING {column}")))
    }

    pub(super) fn sql(&self, rows: usize) -> &str {
        &self.0[SHAPES.iter().position(|&n| n == rows).expect("a chunk of shaped()")]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn batches_are_cut_into_the_prepared_shapes() {
        let rows: Vec<usize> = (0..147).collect();
        let lens: Vec<usize> = shaped(&rows).map(<[usize]>::len).collect();
        assert_eq!(lens, [64, 64, 8, 8, 1, 1, 1]);
        assert_eq!(shaped(&rows).flatten().copied().collect::<Vec<_>>(), rows);
        assert_eq!(shaped::<usize>(&[]).count(), 0);
        let s = Shapes::new("t (a, b)", 2, true);
        assert_eq!(s.sql(1), "INSERT INTO t (a, b) VALUES ($1, $2) ON CONFLICT DO NOTHING");
        assert!(s.sql(8).ends_with("($15, $16) ON CONFLICT DO NOTHING"));
        assert!(s.sql(64).contains("($127, $128)"));
        assert!(Shapes::new("t (a, b)", 2, false).sql(8).ends_with("(?, ?), (?, ?) ON CONFLICT DO NOTHING"));
    }

    #[test]
    fn a_window_splits_into_its_whole_hours_and_the_parts_at_its_ends() {
        let h = HOUR;
        assert_eq!(whole_hours(0, 3 * h), (0, 3 * h));
        assert_eq!(whole_hours(1, 3 * h - 1), (h, 2 * h));
        assert_eq!(whole_hours(h + 5, 2 * h - 5), (2 * h - 5, 2 * h - 5), "no whole hour");
        assert_eq!(whole_hours(h + 5, 2 * h), (2 * h, 2 * h), "no whole hour, ending on one");
        assert_eq!(whole_hours(-h - 1, 0), (-h, 0));
    }
}
