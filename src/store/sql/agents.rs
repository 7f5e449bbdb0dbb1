//! Agents: their keys' digests and limits, and the counters the limits are held to (the
//! requests of a minute, the tokens and cost of a day).

use super::{Affected, Backend, Driver, Sql, Value};
use crate::agents::{Agent, Limits};
use crate::engine::Millis;
use crate::store::{AgentUsage, LimitsPatch, StoreError};
use sqlx::{ColumnIndex, Encode, Executor, Row, Type};
use std::collections::HashMap;

/// The columns `agent_from_row` reads.
const AGENT_COLUMNS: &str =
    "id, name, admin, created_at, revoked_at, requests_per_minute, tokens_per_day, cost_per_day, models";

/// The stored list of models, as its JSON text.
fn models_text(models: Option<&[String]>) -> Option<String> {
    models.map(|m| serde_json::to_string(m).expect("strings serialize"))
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
    fn agent_from_row(row: &DB::Row) -> Result<Agent, StoreError> {
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
            models: match row.try_get::<Option<String>, _>("models")? {
                Some(text) => Some(
                    serde_json::from_str(&text)
                        .map_err(|e| StoreError::Corrupt { table: "agents", detail: format!("models: {e}") })?,
                ),
                None => None,
            },
        })
    }

    pub(super) async fn create_agent(
        &self,
        name: &str,
        key_digest: &str,
        admin: bool,
        (limits, models): (&Limits, Option<&[String]>),
        now: Millis,
    ) -> Result<Agent, StoreError> {
        let mut tx = self.store.write_tx().await?;
        let row = sqlx::query(
            "INSERT INTO agents (id, name, key_digest, admin, created_at, requests_per_minute, tokens_per_day,
                 cost_per_day, models) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)
             ON CONFLICT (name) DO UPDATE SET key_digest = excluded.key_digest, admin = excluded.admin,
                 created_at = excluded.created_at, revoked_at = NULL,
                 requests_per_minute = excluded.requests_per_minute, tokens_per_day = excluded.tokens_per_day,
                 cost_per_day = excluded.cost_per_day, models = excluded.models
             WHERE agents.revoked_at IS NOT NULL
             RETURNING id, name, admin, created_at, revoked_at, requests_per_minute, tokens_per_day, cost_per_day,
                 models",
        )
        .bind(uuid::Uuid::new_v4().to_string())
        .bind(name)
        .bind(key_digest)
        .bind(admin)
        .bind(now)
        .bind(limits.requests_per_minute)
        .bind(limits.tokens_per_day)
        .bind(limits.cost_per_day)
        .bind(models_text(models))
        .fetch_optional(&mut *tx)
        .await?;
        let Some(row) = row else { return Err(StoreError::AgentExists(name.to_string())) };
        let agent = Self::agent_from_row(&row)?;
        tx.commit().await?;
        Ok(agent)
    }

    pub(super) async fn agents(&self) -> Result<Vec<Agent>, StoreError> {
        let rows = sqlx::query(sqlx::AssertSqlSafe(format!("SELECT {AGENT_COLUMNS} FROM agents ORDER BY name")))
            .fetch_all(self.store.pool())
            .await?;
        rows.iter().map(Self::agent_from_row).collect()
    }

    pub(super) async fn active_agents(&self) -> Result<Vec<(String, Agent)>, StoreError> {
        let rows = sqlx::query(sqlx::AssertSqlSafe(format!(
            "SELECT key_digest, {AGENT_COLUMNS} FROM agents WHERE revoked_at IS NULL"
        )))
        .fetch_all(self.store.pool())
        .await?;
        rows.iter().map(|r| Ok((r.try_get("key_digest")?, Self::agent_from_row(r)?))).collect()
    }

    pub(super) async fn all_agents(&self) -> Result<Vec<(String, Agent)>, StoreError> {
        let rows =
            sqlx::query(sqlx::AssertSqlSafe(format!("SELECT key_digest, {AGENT_COLUMNS} FROM agents ORDER BY name")))
                .fetch_all(self.store.pool())
                .await?;
        rows.iter().map(|r| Ok((r.try_get("key_digest")?, Self::agent_from_row(r)?))).collect()
    }

    pub(super) async fn copy_agents(&self, agents: &[(String, Agent)]) -> Result<(), StoreError> {
        let mut tx = self.store.write_tx().await?;
        for (digest, a) in agents {
            sqlx::query(
                "INSERT INTO agents (id, name, key_digest, admin, created_at, revoked_at, requests_per_minute,
                     tokens_per_day, cost_per_day, models) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)",
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
            .bind(models_text(a.models.as_deref()))
            .execute(&mut *tx)
            .await?;
        }
        tx.commit().await?;
        Ok(())
    }

    pub(super) async fn revoke_agent(&self, name: &str, now: Millis) -> Result<(), StoreError> {
        let mut tx = self.store.write_tx().await?;
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

    pub(super) async fn set_agent_limits(&self, name: &str, patch: &LimitsPatch) -> Result<Agent, StoreError> {
        let mut tx = self.store.write_tx().await?;
        let row = sqlx::query(sqlx::AssertSqlSafe(format!(
            "UPDATE agents SET
                 requests_per_minute = CASE WHEN $2 THEN $3 ELSE requests_per_minute END,
                 tokens_per_day = CASE WHEN $4 THEN $5 ELSE tokens_per_day END,
                 cost_per_day = CASE WHEN $6 THEN $7 ELSE cost_per_day END,
                 models = CASE WHEN $8 THEN $9 ELSE models END
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
        .bind(patch.models.is_some())
        .bind(models_text(patch.models.as_ref().and_then(Option::as_deref)))
        .fetch_optional(&mut *tx)
        .await?;
        let Some(row) = row else { return Err(StoreError::NoAgent(name.to_string())) };
        let agent = Self::agent_from_row(&row)?;
        tx.commit().await?;
        Ok(agent)
    }

    pub(super) async fn claim_requests(
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
        let mut tx = self.store.audit_tx().await?;
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

    pub(super) async fn agent_usage(
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
        .fetch_all(self.store.pool())
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

    pub(super) async fn prune_agent_usage(
        &self,
        minutes_before: Millis,
        days_before: Option<Millis>,
    ) -> Result<u64, StoreError> {
        let mut tx = self.store.audit_tx().await?;
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
}
