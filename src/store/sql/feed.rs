//! The change feed: the entities some writer changed, in order, each at its newest position
//! (docs/scale.md); the database's triggers write it.

use super::{Backend, Driver, Sql, Value};
use crate::store::{FeedEntry, StoreError};
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
    /// The feed's newest position.
    pub(super) async fn head(conn: &mut DB::Connection) -> Result<i64, StoreError> {
        Ok(sqlx::query_scalar("SELECT n FROM change_seq").fetch_one(&mut *conn).await?)
    }

    /// The entries after `seq`: the changed entities', and the session bindings made or moved
    /// (`SessionBinding::of_feed`), in one read.
    pub(super) async fn changes_after(&self, seq: i64) -> Result<Vec<FeedEntry>, StoreError> {
        let rows: Vec<(String, String, i64)> = sqlx::query_as(
            "SELECT kind, key, seq FROM changes WHERE seq > $1
             UNION ALL
             SELECT 'session', profile_id || ' ' || CAST(bound_at AS TEXT) || ' ' || session, seq
                 FROM session_bindings WHERE seq > $1
             ORDER BY seq LIMIT 10000",
        )
        .bind(seq)
        .fetch_all(self.store.pool())
        .await?;
        Ok(rows.into_iter().map(|(kind, key, seq)| FeedEntry { kind, key, seq }).collect())
    }

    pub(super) async fn feed_head(&self, kind: Option<&str>) -> Result<i64, StoreError> {
        let mut conn = self.store.pool().acquire().await?;
        match kind {
            None => Self::head(&mut conn).await,
            Some(kind) => Ok(sqlx::query_scalar("SELECT coalesce(max(seq), 0) FROM changes WHERE kind = $1")
                .bind(kind)
                .fetch_one(&mut *conn)
                .await?),
        }
    }
}
