//! The database's upkeep, in the background: the SQLite write-ahead log kept small, and audit
//! rows past `audit.retention` rolled up into `usage_daily` and deleted (docs/audit.md).

use crate::gateway::failover::Engine;
use crate::store::{Pruned, Store};
use std::sync::{Arc, Weak};
use std::time::Duration;

/// Rows deleted per transaction: short enough not to hold up the audit writer.
const PRUNE_BATCH: usize = 5_000;

/// Runs both tasks until the engine is dropped.
pub fn start(store: Arc<dyn Store>, engine: Weak<Engine>) {
    tokio::spawn(checkpoints(store.clone(), engine.clone()));
    tokio::spawn(retention(store, engine));
}

/// Every `database.checkpoint_every` the log is copied into the database beside the writers,
/// so that the next writer starts it over; while it is over `database.wal_limit_mb` (a long
/// reader kept it from starting over) it is truncated as soon as the reader is done.
async fn checkpoints(store: Arc<dyn Store>, engine: Weak<Engine>) {
    loop {
        let Some(db) = engine.upgrade().map(|e| e.settings().config.database.clone()) else { return };
        tokio::time::sleep(db.checkpoint_every).await;
        let over = store.wal_bytes().is_some_and(|b| b > db.wal_limit_mb << 20);
        match store.checkpoint(over).await {
            Ok(true) if over => tracing::info!("the write-ahead log is back under database.wal_limit_mb"),
            Ok(_) => {}
            Err(e) => tracing::warn!(error = %e, "checkpointing the write-ahead log failed"),
        }
    }
}

/// Shortly after start and then every `audit.prune_every`: rows older than `audit.retention`
/// go, in batches, each rolled up first.
async fn retention(store: Arc<dyn Store>, engine: Weak<Engine>) {
    let mut wait = Duration::from_secs(1);
    loop {
        tokio::time::sleep(wait).await;
        let Some((audit, now)) = engine.upgrade().map(|e| (e.settings().config.audit.clone(), e.clock.now())) else {
            return;
        };
        wait = audit.prune_every;
        if audit.retention.is_zero() {
            continue;
        }
        let before = now - audit.retention.as_millis() as i64;
        let mut total = Pruned::default();
        loop {
            match store.prune_audit(before, PRUNE_BATCH).await {
                Ok(p) => {
                    total.attempts += p.attempts;
                    total.requests += p.requests;
                    if !p.more {
                        break;
                    }
                    tokio::task::yield_now().await;
                }
                Err(e) => {
                    tracing::warn!(error = %e, "pruning old audit rows failed; trying again next time");
                    break;
                }
            }
        }
        if total.attempts + total.requests > 0 {
            tracing::info!(
                attempts = total.attempts,
                requests = total.requests,
                retention = ?audit.retention,
                "old audit rows rolled up into usage_daily and deleted"
            );
        }
    }
}
