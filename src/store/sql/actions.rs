//! The admin actions: every change made through the admin API or the console, with who made it
//! (docs/operations.md, "Admin actions").

use super::{Backend, Driver, Sql, Value};
use crate::store::{AdminAction, StoreError};
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
    pub(super) async fn record_action(&self, a: &AdminAction) -> Result<(), StoreError> {
        let json = |v: &Option<serde_json::Value>| v.as_ref().map(|v| v.to_string());
        let mut tx = self.store.write_tx().await?;
        sqlx::query(
            "INSERT INTO admin_actions (id, at, actor, actor_kind, role, action, target, value_before, value_after, actor_email)
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)",
        )
        .bind(uuid::Uuid::now_v7().to_string())
        .bind(a.at)
        .bind(a.actor.as_str())
        .bind(a.actor_kind.as_str())
        .bind(a.role.as_str())
        .bind(a.action.as_str())
        .bind(a.target.as_deref())
        .bind(json(&a.before))
        .bind(json(&a.after))
        .bind(a.actor_email.as_deref())
        .execute(&mut *tx)
        .await?;
        tx.commit().await?;
        Ok(())
    }

    /// The newest `limit` actions, newest first.
    pub(super) async fn admin_actions(&self, limit: i64) -> Result<Vec<AdminAction>, StoreError> {
        let rows = sqlx::query(
            "SELECT at, actor, actor_email, actor_kind, role, action, target, value_before, value_after FROM admin_actions
             ORDER BY at DESC, id DESC LIMIT $1",
        )
        .bind(limit)
        .fetch_all(self.store.pool())
        .await?;
        let json = |text: Option<String>| text.and_then(|t| serde_json::from_str(&t).ok());
        rows.iter()
            .map(|r| {
                Ok(AdminAction {
                    at: r.try_get("at")?,
                    actor: r.try_get("actor")?,
                    actor_email: r.try_get("actor_email")?,
                    actor_kind: r.try_get("actor_kind")?,
                    role: r.try_get("role")?,
                    action: r.try_get("action")?,
                    target: r.try_get("target")?,
                    before: json(r.try_get("value_before")?),
                    after: json(r.try_get("value_after")?),
                })
            })
            .collect()
    }
}
