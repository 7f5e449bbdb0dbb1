//! The alerts' outbox (docs/operations.md, "Alerts"): the gate that lets a rule raise one alert
//! per subject and interval across the fleet, the claims that let one server send each, and
//! the delivery attempts.

use super::{Affected, Backend, Driver, Sql, Value};
use crate::engine::Millis;
use crate::store::{AlertDelivery, AlertNext, AlertRecord, NewAlert, OutboxAlert, StoreError};
use sqlx::{ColumnIndex, Encode, Executor, Row, Type};

/// What a pending alert nobody holds a claim on, due at `$1`, satisfies.
const DUE: &str = "state = 'pending' AND next_at <= $1 AND (claimed_until IS NULL OR claimed_until < $1)";

impl<S, DB> Sql<'_, S>
where
    S: Backend<Db = DB>,
    DB: Driver,
    for<'c> &'c mut DB::Connection: Executor<'c, Database = DB>,
    for<'n> &'n str: ColumnIndex<DB::Row> + Encode<'n, DB> + Type<DB>,
    for<'n> Option<&'n str>: Encode<'n, DB>,
    usize: ColumnIndex<DB::Row>,
    i64: Value<DB>,
    String: Value<DB>,
    Option<i64>: Value<DB>,
    Option<String>: Value<DB>,
{
    /// The gate and the outbox row in one transaction: the gate's row moves to `raised_at` only
    /// when it was last moved at or before `gate_after` (or never), and the alert is queued
    /// only when it moved.
    pub(super) async fn raise_alert(&self, a: &NewAlert, gate_after: Millis) -> Result<bool, StoreError> {
        let mut tx = self.store.write_tx().await?;
        let opened = sqlx::query(
            "INSERT INTO alert_gates (rule, subject, fired_at) VALUES ($1, $2, $3)
             ON CONFLICT (rule, subject) DO UPDATE SET fired_at = excluded.fired_at
             WHERE alert_gates.fired_at <= $4",
        )
        .bind(a.rule.as_str())
        .bind(a.subject.as_str())
        .bind(a.raised_at)
        .bind(gate_after)
        .execute(&mut *tx)
        .await?
        .rows_affected()
            == 1;
        if opened {
            sqlx::query(
                "INSERT INTO alert_outbox (id, rule, kind, subject, body, raised_at, state, attempts, next_at)
                 VALUES ($1, $2, $3, $4, $5, $6, 'pending', 0, $6)",
            )
            .bind(a.id.as_str())
            .bind(a.rule.as_str())
            .bind(a.kind.as_str())
            .bind(a.subject.as_str())
            .bind(a.body.as_str())
            .bind(a.raised_at)
            .execute(&mut *tx)
            .await?;
        }
        tx.commit().await?;
        Ok(opened)
    }

    /// A read without a transaction first: the writers' turn is taken only when something is
    /// due. The claim repeats the conditions on the rows it updates, so a row another server
    /// claimed meanwhile is not taken.
    pub(super) async fn claim_alerts(
        &self,
        instance: &str,
        now: Millis,
        until: Millis,
        limit: i64,
    ) -> Result<Vec<OutboxAlert>, StoreError> {
        let due = sqlx::query(sqlx::AssertSqlSafe(format!("SELECT id FROM alert_outbox WHERE {DUE} LIMIT 1")))
            .bind(now)
            .fetch_optional(self.store.pool())
            .await?;
        if due.is_none() {
            return Ok(Vec::new());
        }
        let mut tx = self.store.write_tx().await?;
        let rows = sqlx::query(sqlx::AssertSqlSafe(format!(
            "UPDATE alert_outbox SET claimed_by = $2, claimed_until = $3
             WHERE id IN (SELECT id FROM alert_outbox WHERE {DUE} ORDER BY next_at, id LIMIT $4) AND {DUE}
             RETURNING id, rule, body, raised_at, attempts"
        )))
        .bind(now)
        .bind(instance)
        .bind(until)
        .bind(limit)
        .fetch_all(&mut *tx)
        .await?;
        tx.commit().await?;
        rows.iter()
            .map(|r| {
                Ok(OutboxAlert {
                    id: r.try_get("id")?,
                    rule: r.try_get("rule")?,
                    body: r.try_get("body")?,
                    raised_at: r.try_get("raised_at")?,
                    attempts: r.try_get("attempts")?,
                })
            })
            .collect()
    }

    /// The delivery row, numbered after those before it, and the alert's new state. A retry
    /// is scheduled only by the server that still holds the claim; a delivery ends the alert
    /// whoever holds it.
    pub(super) async fn alert_attempted(&self, d: &AlertDelivery, next: AlertNext) -> Result<(), StoreError> {
        let mut tx = self.store.write_tx().await?;
        sqlx::query(
            "INSERT INTO alert_deliveries (alert_id, attempt, instance, at, duration_ms, status, error)
             VALUES ($1, (SELECT count(*) FROM alert_deliveries WHERE alert_id = $1) + 1, $2, $3, $4, $5, $6)",
        )
        .bind(d.alert_id.as_str())
        .bind(d.instance.as_str())
        .bind(d.at)
        .bind(d.duration_ms)
        .bind(d.status)
        .bind(d.error.clone())
        .execute(&mut *tx)
        .await?;
        let (state, next_at, delivered_at) = match next {
            AlertNext::Delivered => ("delivered", d.at, Some(d.at)),
            AlertNext::Retry(at) => ("pending", at, None),
            AlertNext::Failed => ("failed", d.at, None),
        };
        sqlx::query(
            "UPDATE alert_outbox SET state = $2, attempts = attempts + 1, next_at = $3, delivered_at = $4,
                 claimed_by = NULL, claimed_until = NULL
             WHERE id = $1 AND state = 'pending' AND (claimed_by = $5 OR $2 = 'delivered')",
        )
        .bind(d.alert_id.as_str())
        .bind(state)
        .bind(next_at)
        .bind(delivered_at)
        .bind(d.instance.as_str())
        .execute(&mut *tx)
        .await?;
        tx.commit().await?;
        Ok(())
    }

    /// The newest `limit` alerts, newest first, each with its delivery attempts in order.
    pub(super) async fn recent_alerts(&self, limit: i64) -> Result<Vec<AlertRecord>, StoreError> {
        let mut conn = self.store.read_tx().await?;
        let mut alerts = Vec::new();
        for r in sqlx::query(
            "SELECT id, rule, kind, subject, body, raised_at, state, attempts, delivered_at FROM alert_outbox
             ORDER BY raised_at DESC, id DESC LIMIT $1",
        )
        .bind(limit)
        .fetch_all(&mut *conn)
        .await?
        {
            alerts.push(AlertRecord {
                id: r.try_get("id")?,
                rule: r.try_get("rule")?,
                kind: r.try_get("kind")?,
                subject: r.try_get("subject")?,
                body: r.try_get("body")?,
                raised_at: r.try_get("raised_at")?,
                state: r.try_get("state")?,
                attempts: r.try_get("attempts")?,
                delivered_at: r.try_get("delivered_at")?,
                deliveries: Vec::new(),
            });
        }
        let Some(oldest) = alerts.last().map(|a| (a.raised_at, a.id.clone())) else { return Ok(alerts) };
        let by_id: std::collections::HashMap<String, usize> =
            alerts.iter().enumerate().map(|(i, a)| (a.id.clone(), i)).collect();
        for r in sqlx::query(
            "SELECT d.alert_id, d.instance, d.at, d.duration_ms, d.status, d.error FROM alert_deliveries d
             JOIN alert_outbox o ON o.id = d.alert_id
             WHERE o.raised_at > $1 OR (o.raised_at = $1 AND o.id >= $2) ORDER BY d.alert_id, d.attempt",
        )
        .bind(oldest.0)
        .bind(oldest.1.as_str())
        .fetch_all(&mut *conn)
        .await?
        {
            let id: String = r.try_get("alert_id")?;
            let Some(&i) = by_id.get(&id) else { continue }; // raised after the first read
            alerts[i].deliveries.push(AlertDelivery {
                alert_id: id,
                instance: r.try_get("instance")?,
                at: r.try_get("at")?,
                duration_ms: r.try_get("duration_ms")?,
                status: r.try_get("status")?,
                error: r.try_get("error")?,
            });
        }
        Ok(alerts)
    }

    /// The delivered and given-up alerts raised before `before`, with their delivery rows (the
    /// foreign key's cascade), and the gates last moved before `gates_before`; how many alerts.
    pub(super) async fn prune_alerts(&self, before: Millis, gates_before: Millis) -> Result<u64, StoreError> {
        let mut tx = self.store.write_tx().await?;
        let gone = sqlx::query("DELETE FROM alert_outbox WHERE state <> 'pending' AND raised_at < $1")
            .bind(before)
            .execute(&mut *tx)
            .await?
            .rows_affected();
        sqlx::query("DELETE FROM alert_gates WHERE fired_at < $1").bind(gates_before).execute(&mut *tx).await?;
        tx.commit().await?;
        Ok(gone)
    }
}
