//! Session bindings (docs/scale.md, "Sessions"): which profile each session sticks to, shared
//! by the fleet. The change feed carries each binding made or moved (`feed.rs`).

use super::{Affected, Backend, Driver, Sql, Value};
use crate::engine::Millis;
use crate::store::{SessionBinding, StoreError};
use sqlx::{ColumnIndex, Encode, Executor, Type};

impl<S, DB> Sql<'_, S>
where
    S: Backend<Db = DB>,
    DB: Driver,
    for<'c> &'c mut DB::Connection: Executor<'c, Database = DB>,
    for<'n> &'n str: ColumnIndex<DB::Row> + Encode<'n, DB> + Type<DB>,
    usize: ColumnIndex<DB::Row>,
    i64: Value<DB>,
    String: Value<DB>,
{
    /// Writes a binding unless the stored one is later (then it only lives longer when it is
    /// the same); its last use only ever moves forward.
    pub(super) async fn bind_session(tx: &mut sqlx::Transaction<'_, DB>, b: &SessionBinding) -> Result<(), StoreError> {
        sqlx::query(
            "INSERT INTO session_bindings (session, provider, profile_id, bound_at, seen_at) VALUES ($1, $2, $3, $4, $5)
             ON CONFLICT (session, provider) DO UPDATE SET profile_id = excluded.profile_id,
                 bound_at = excluded.bound_at,
                 seen_at = CASE WHEN excluded.seen_at > session_bindings.seen_at
                     THEN excluded.seen_at ELSE session_bindings.seen_at END
             WHERE session_bindings.bound_at <= excluded.bound_at",
        )
        .bind(b.session.as_str())
        .bind(b.profile.provider())
        .bind(b.profile.as_str())
        .bind(b.bound_at)
        .bind(b.seen_at)
        .execute(&mut **tx)
        .await?;
        Ok(())
    }

    pub(super) async fn session_bindings(
        &self,
        session: &str,
        since: Millis,
    ) -> Result<Vec<SessionBinding>, StoreError> {
        let rows: Vec<(String, i64, i64)> = sqlx::query_as(
            "SELECT profile_id, bound_at, seen_at FROM session_bindings WHERE session = $1 AND seen_at >= $2",
        )
        .bind(session)
        .bind(since)
        .fetch_all(self.store.pool())
        .await?;
        Ok(rows
            .into_iter()
            .filter_map(|(profile, bound_at, seen_at)| {
                Some(SessionBinding { session: session.to_string(), profile: profile.parse().ok()?, bound_at, seen_at })
            })
            .collect())
    }

    /// One batch of the idle bindings, or of the oldest beyond `keep`; how many went.
    pub(super) async fn prune_sessions(
        &self,
        idle_before: Millis,
        keep: usize,
        batch: usize,
    ) -> Result<u64, StoreError> {
        let newest_beyond: Option<i64> =
            sqlx::query_scalar("SELECT seen_at FROM session_bindings ORDER BY seen_at DESC LIMIT 1 OFFSET $1")
                .bind(keep as i64)
                .fetch_optional(self.store.pool())
                .await?;
        let before = newest_beyond.map_or(idle_before, |o| idle_before.max(o + 1));
        let mut tx = self.store.write_tx().await?;
        let gone = sqlx::query(
            "DELETE FROM session_bindings WHERE (session, provider) IN
                 (SELECT session, provider FROM session_bindings WHERE seen_at < $1 LIMIT $2)",
        )
        .bind(before)
        .bind(batch as i64)
        .execute(&mut *tx)
        .await?
        .rows_affected();
        tx.commit().await?;
        Ok(gone)
    }
}
