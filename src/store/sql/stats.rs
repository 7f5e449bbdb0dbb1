//! Usage stats: each profile's row, its cooldown windows and quotas, the models' cooldowns, and
//! the write that replays changes on the rows as stored (`apply`).

use super::{Backend, Driver, Sql, Value, corrupt};
use crate::engine::quota::{Quota, Window};
use crate::engine::{
    Change, Cooldown, CooldownPolicy, Disabled, Millis, ModelChange, ModelCooldown, ProfileId, Reason, UsageStats,
};
use crate::store::{Applied, SessionBinding, StoreError};
use serde_json::{Value as Json, json};
use sqlx::{ColumnIndex, Encode, Executor, Row, Type};
use std::collections::{BTreeMap, HashMap};

/// The columns of a profile's stats row, with their SQL types: the fields of each JSON object
/// the batch writes bind as `$1` (`Writes`).
const STATS: &[(&str, &str)] = &[
    ("profile_id", "TEXT"),
    ("last_used", "BIGINT"),
    ("last_success_at", "BIGINT"),
    ("cooldown_until", "BIGINT"),
    ("cooldown_reason", "TEXT"),
    ("cooldown_model", "TEXT"),
    ("disabled_until", "BIGINT"),
    ("disabled_reason", "TEXT"),
    ("error_count", "BIGINT"),
    ("failure_counts", "TEXT"),
    ("last_failure_at", "BIGINT"),
    ("window_opened_at", "BIGINT"),
    ("success_count", "BIGINT"),
    ("failure_total", "BIGINT"),
    ("billing_step", "BIGINT"),
    ("cleared_at", "BIGINT"),
    ("last_success_sent_at", "BIGINT"),
];

/// A cooldown window's row.
const WINDOWS: &[(&str, &str)] = &[
    ("profile_id", "TEXT"),
    ("model", "TEXT"),
    ("cooldown_until", "BIGINT"),
    ("cooldown_reason", "TEXT"),
    ("step", "BIGINT"),
    ("opened_at", "BIGINT"),
];

/// A quota's row.
const QUOTAS: &[(&str, &str)] = &[
    ("profile_id", "TEXT"),
    ("model", "TEXT"),
    ("quota_remaining_requests", "BIGINT"),
    ("quota_limit_requests", "BIGINT"),
    ("quota_reset_at", "BIGINT"),
    ("quota_remaining_tokens", "BIGINT"),
    ("quota_limit_tokens", "BIGINT"),
    ("quota_tokens_reset_at", "BIGINT"),
    ("quota_seen_at", "BIGINT"),
    ("quota_plan_left", "BIGINT"),
    ("quota_plan_reset_at", "BIGINT"),
];

/// The statements that write many profiles' stats at once, each taking its rows as one JSON
/// array of objects bound as `$1`: one statement a table for a whole batch, where one a profile
/// kept a stats batch (and the change feed's counter, which it holds to its commit) waiting on
/// a round trip to the database for each profile (docs/scale.md, "Capacity on PostgreSQL").
pub(super) struct Writes {
    /// Updates the rows of profiles that have one.
    update: String,
    /// Inserts or updates the rows, unless the profile is gone.
    upsert: String,
    /// Deletes the cooldown windows of the profiles in the JSON array of ids in `$1`.
    clear_windows: String,
    add_windows: String,
    /// Inserts or updates quotas, unless the stored one was seen later.
    quotas: String,
}

fn names(cols: &[(&str, &str)]) -> String {
    cols.iter().map(|(n, _)| *n).collect::<Vec<_>>().join(", ")
}

impl Writes {
    /// `rows`: the SQL (a `FROM` item named `r`) that turns the JSON array in `$1` into rows of
    /// the given columns; `ids`: the SQL that turns a JSON array of ids into rows.
    pub(super) fn new(rows: impl Fn(&[(&str, &str)]) -> String, ids: &str) -> Writes {
        let set = |cols: &[(&str, &str)], from: &str| {
            cols[1..].iter().map(|(n, _)| format!("{n} = {from}.{n}")).collect::<Vec<_>>().join(", ")
        };
        let insert = |table: &str, cols: &[(&str, &str)]| {
            format!(
                "INSERT INTO {table} ({}) SELECT {} FROM {} WHERE EXISTS (SELECT 1 FROM profiles WHERE id = r.profile_id)",
                names(cols),
                cols.iter().map(|(n, _)| format!("r.{n}")).collect::<Vec<_>>().join(", "),
                rows(cols)
            )
        };
        Writes {
            update: format!(
                "UPDATE usage_stats SET {} FROM {} WHERE usage_stats.profile_id = r.profile_id",
                set(STATS, "r"),
                rows(STATS)
            ),
            upsert: format!(
                "{} ON CONFLICT (profile_id) DO UPDATE SET {}",
                insert("usage_stats", STATS),
                set(STATS, "excluded")
            ),
            clear_windows: format!("DELETE FROM profile_cooldowns WHERE profile_id IN ({ids})"),
            add_windows: insert("profile_cooldowns", WINDOWS),
            quotas: format!(
                "{} ON CONFLICT (profile_id, model) DO UPDATE SET {} WHERE excluded.quota_seen_at >= profile_quota.quota_seen_at",
                insert("profile_quota", QUOTAS),
                set(&QUOTAS[1..], "excluded")
            ),
        }
    }
}

fn stats_row(id: &ProfileId, s: &UsageStats) -> Json {
    let head = s.cooldowns.iter().max_by_key(|c| (c.until, c.model.is_none()));
    json!({
        "profile_id": id.as_str(),
        "last_used": s.last_used,
        "last_success_at": s.last_success_at,
        "cooldown_until": head.map(|c| c.until),
        "cooldown_reason": head.map(|c| c.reason.as_str()),
        "cooldown_model": head.and_then(|c| c.model.as_deref()),
        "disabled_until": s.disabled.as_ref().and_then(|d| d.until),
        "disabled_reason": s.disabled.as_ref().map(|d| d.reason.as_str()),
        "error_count": s.error_count,
        "failure_counts": serde_json::to_string(&s.failure_counts).expect("reason counts serialize"),
        "last_failure_at": s.last_failure_at,
        "window_opened_at": s.window_opened_at,
        "success_count": s.success_count,
        "failure_total": s.failure_total,
        "billing_step": s.billing_step,
        "cleared_at": s.cleared_at,
        "last_success_sent_at": s.last_success_sent_at,
    })
}

fn window_row(id: &ProfileId, c: &Cooldown) -> Json {
    json!({
        "profile_id": id.as_str(),
        "model": c.model,
        "cooldown_until": c.until,
        "cooldown_reason": c.reason.as_str(),
        "step": c.step,
        "opened_at": c.opened_at,
    })
}

fn quota_row(id: &ProfileId, q: &Quota) -> Json {
    let window = |w: Option<Window>| (w.map(|w| w.remaining), w.and_then(|w| w.limit), w.and_then(|w| w.reset_at));
    let (requests, tokens, plan) = (window(q.requests), window(q.tokens), window(q.plan));
    json!({
        "profile_id": id.as_str(),
        "model": q.model,
        "quota_remaining_requests": requests.0,
        "quota_limit_requests": requests.1,
        "quota_reset_at": requests.2,
        "quota_remaining_tokens": tokens.0,
        "quota_limit_tokens": tokens.1,
        "quota_tokens_reset_at": tokens.2,
        "quota_seen_at": q.seen_at,
        "quota_plan_left": plan.0,
        "quota_plan_reset_at": plan.2,
    })
}

/// The columns of `usage_stats` that `stats_from_row` reads: not `cooldown_*`, the head of
/// `profile_cooldowns` kept for SQL readers (sqlx copies each value of a row out of SQLite and
/// frees it: start-up reads a row for each profile).
pub(super) const STATS_COLUMNS: &str = "profile_id, last_used, last_success_at, last_success_sent_at, \
     disabled_until, disabled_reason, error_count, failure_counts, last_failure_at, window_opened_at, \
     success_count, failure_total, billing_step, cleared_at";

/// A `usage_stats` row: the columns of `STATS_COLUMNS`, in its order (a JSON array of them
/// reads into it too).
#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct StatsRow {
    profile_id: String,
    last_used: Option<Millis>,
    last_success_at: Option<Millis>,
    last_success_sent_at: Option<Millis>,
    disabled_until: Option<Millis>,
    disabled_reason: Option<String>,
    error_count: i64,
    failure_counts: String,
    last_failure_at: Option<Millis>,
    window_opened_at: Option<Millis>,
    success_count: i64,
    failure_total: i64,
    billing_step: i64,
    cleared_at: Option<Millis>,
}

impl StatsRow {
    /// The profile's id, as stored, and its stats (without cooldowns and quotas, which are
    /// rows of their own).
    pub(super) fn stats(self) -> Result<(String, UsageStats), StoreError> {
        let reason = |raw: String| raw.parse::<Reason>().map_err(|e| corrupt("usage_stats", e));
        let disabled =
            self.disabled_reason.map(reason).transpose()?.map(|reason| Disabled { until: self.disabled_until, reason });
        let failure_counts: BTreeMap<Reason, u32> =
            serde_json::from_str(&self.failure_counts).map_err(|e| corrupt("usage_stats", e))?;
        let stats = UsageStats {
            last_used: self.last_used,
            last_success_at: self.last_success_at,
            last_success_sent_at: self.last_success_sent_at,
            cooldowns: Vec::new(),
            disabled,
            error_count: self.error_count as u32,
            failure_counts,
            last_failure_at: self.last_failure_at,
            window_opened_at: self.window_opened_at,
            success_count: self.success_count as u64,
            failure_total: self.failure_total as u64,
            billing_step: self.billing_step as u32,
            cleared_at: self.cleared_at,
            quotas: Vec::new(),
        };
        Ok((self.profile_id, stats))
    }
}

/// The statements that read many profiles' stats at once (`load_many`), given the SQL that
/// turns the JSON array of ids in `$1` into rows of the engine's.
pub(super) fn statements(ids: &str) -> [String; 3] {
    [
        format!("SELECT {STATS_COLUMNS} FROM usage_stats WHERE profile_id IN ({ids})"),
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
    /// Writes profiles' stats rows with their cooldown windows and quotas, in one statement a
    /// table, leaving out profiles that are gone (a removal raced the write). Each row: the
    /// profile, its row as this transaction read it when it did (`apply`; then the row is
    /// updated in place, and the windows and quotas that did not change are not written again),
    /// and its stats. `usage_stats.cooldown_*` show the window that ends last. (Most batches
    /// only move `last_used` and the success counts: rewriting every window and quota of every
    /// profile, each row firing its change-feed trigger, was most of the stats writer's work
    /// with many profiles.) A profile twice: its last row wins.
    pub(super) async fn write_stats(
        conn: &mut DB::Connection,
        rows: &[(&ProfileId, Option<&UsageStats>, &UsageStats)],
    ) -> Result<(), StoreError> {
        let w = &S::texts().writes;
        let mut last: HashMap<&ProfileId, usize> = HashMap::with_capacity(rows.len());
        for (i, (id, _, _)) in rows.iter().enumerate() {
            last.insert(id, i);
        }
        let (mut updated, mut upserted, mut windows, mut quotas) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
        let mut cleared: Vec<&str> = Vec::new();
        for (i, (id, before, s)) in rows.iter().enumerate() {
            if last[id] != i {
                continue;
            }
            if before.is_some() { &mut updated } else { &mut upserted }.push(stats_row(id, s));
            if before.is_none_or(|b| b.cooldowns != s.cooldowns) {
                cleared.push(id.as_str());
                windows.extend(s.cooldowns.iter().map(|c| window_row(id, c)));
            }
            quotas.extend(
                s.quotas.iter().filter(|q| before.is_none_or(|b| !b.quotas.contains(q))).map(|q| quota_row(id, q)),
            );
        }
        Self::write_rows(conn, w.update.as_str(), &updated).await?;
        Self::write_rows(conn, w.upsert.as_str(), &upserted).await?;
        if !cleared.is_empty() {
            let ids = serde_json::to_string(&cleared).expect("ids serialize");
            sqlx::query(w.clear_windows.as_str()).bind(ids).execute(&mut *conn).await?;
        }
        Self::write_rows(conn, w.add_windows.as_str(), &windows).await?;
        Self::write_rows(conn, w.quotas.as_str(), &quotas).await
    }

    async fn write_rows(conn: &mut DB::Connection, sql: &'static str, rows: &[Json]) -> Result<(), StoreError> {
        if !rows.is_empty() {
            let rows = serde_json::to_string(rows).expect("rows serialize");
            sqlx::query(sql).bind(rows).execute(&mut *conn).await?;
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

    /// A row of `STATS_COLUMNS`, read by name.
    pub(super) fn stats_from_row(row: &DB::Row) -> Result<(String, UsageStats), StoreError> {
        StatsRow {
            profile_id: row.try_get("profile_id")?,
            last_used: row.try_get("last_used")?,
            last_success_at: row.try_get("last_success_at")?,
            last_success_sent_at: row.try_get("last_success_sent_at")?,
            disabled_until: row.try_get("disabled_until")?,
            disabled_reason: row.try_get("disabled_reason")?,
            error_count: row.try_get("error_count")?,
            failure_counts: row.try_get("failure_counts")?,
            last_failure_at: row.try_get("last_failure_at")?,
            window_opened_at: row.try_get("window_opened_at")?,
            success_count: row.try_get("success_count")?,
            failure_total: row.try_get("failure_total")?,
            billing_step: row.try_get("billing_step")?,
            cleared_at: row.try_get("cleared_at")?,
        }
        .stats()
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
                let (id, stats) = Self::stats_from_row(&row)?;
                out.insert(id.parse().map_err(|e| corrupt("usage_stats", e))?, stats);
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
        let rows: Vec<_> = batch.iter().map(|(id, s)| (id, None, s)).collect();
        Self::write_stats(&mut tx, &rows).await?;
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
        let mut rows = Vec::with_capacity(stats.len());
        for (id, changes) in stats {
            let Some(before) = stored.remove(id) else { continue };
            let mut s = before.clone();
            for c in changes {
                s.apply(c, policy);
            }
            rows.push((id, before, s));
        }
        Self::write_stats(&mut tx, &rows.iter().map(|(id, b, s)| (*id, Some(b), s)).collect::<Vec<_>>()).await?;
        out.stats = rows.into_iter().map(|(id, _, s)| (id.clone(), s)).collect();
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

    pub(super) async fn stats_of(
        &self,
        ids: &[ProfileId],
    ) -> Result<(i64, Vec<(ProfileId, Option<UsageStats>)>), StoreError> {
        let mut tx = self.store.read_tx().await?;
        let head = Self::head(&mut tx).await?;
        let mut stored = Self::load_many(&mut tx, &ids.iter().collect::<Vec<_>>()).await?;
        tx.commit().await?;
        Ok((head, ids.iter().map(|id| (id.clone(), stored.remove(id))).collect()))
    }

    pub(super) async fn model_cooldowns(&self) -> Result<(i64, HashMap<(String, String), ModelCooldown>), StoreError> {
        let mut tx = self.store.read_tx().await?;
        let head = Self::head(&mut tx).await?;
        let mut out = HashMap::new();
        for row in sqlx::query("SELECT * FROM model_cooldowns").fetch_all(&mut *tx).await? {
            out.insert((row.try_get("provider")?, row.try_get("model")?), Self::model_cooldown_from_row(&row)?);
        }
        tx.commit().await?;
        Ok((head, out))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{Value, json};

    /// A JSON array of the columns reads into the fields of the same names: a row read by name
    /// and the same values read by place give the same stats.
    #[test]
    fn the_stats_columns_are_in_the_order_of_a_stats_row() {
        let names: Vec<&str> = STATS_COLUMNS.split(',').map(str::trim).collect();
        let value = |(i, name): (usize, &&str)| match *name {
            "profile_id" => json!("p:k"),
            "disabled_reason" => json!("billing"),
            "failure_counts" => json!(r#"{"rate_limit": 3}"#),
            _ => json!(1000 + i as i64),
        };
        let by_name: serde_json::Map<String, Value> =
            names.iter().enumerate().map(|c| (c.1.to_string(), value(c))).collect();
        let by_place: Vec<Value> = names.iter().enumerate().map(value).collect();
        let by_name: StatsRow = serde_json::from_value(Value::Object(by_name)).unwrap();
        let by_place: StatsRow = serde_json::from_value(Value::Array(by_place)).unwrap();
        let (by_name, by_place) = (by_name.stats().unwrap(), by_place.stats().unwrap());
        assert_eq!(by_name, by_place);
        assert_eq!(by_name.1.last_used, Some(1001));
        assert_eq!(by_name.1.cleared_at, Some(1000 + names.len() as i64 - 1));
    }
}
