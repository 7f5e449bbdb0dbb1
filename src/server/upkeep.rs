//! The server's upkeep, in the background: the SQLite write-ahead log kept small, PostgreSQL's
//! audit partitions made ahead, audit rows past `audit.retention` rolled up into `usage_daily`
//! and deleted (whole days dropped on PostgreSQL: docs/audit.md), the agents'
//! old usage counters and idle session bindings deleted, and a jump of the system clock logged (docs/rotation.md, "Time").

use crate::book::{SESSION_ROWS, SESSION_TTL};
use crate::engine::Clock;
use crate::settings::Live;
use crate::store::{Pruned, Store};
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

/// Rows deleted per transaction: short enough not to hold up the audit writer.
const PRUNE_BATCH: usize = 5_000;

/// Runs the three tasks until `tasks` is cancelled.
pub fn start(store: Arc<dyn Store>, settings: Live, clock: Arc<dyn Clock>, tasks: CancellationToken) {
    tokio::spawn(tasks.clone().run_until_cancelled_owned(checkpoints(store.clone(), settings.clone())));
    tokio::spawn(tasks.clone().run_until_cancelled_owned(jumps(clock.clone())));
    tokio::spawn(tasks.run_until_cancelled_owned(retention(store, settings, clock)));
}

/// How often the system clock is compared with the server's, and how far apart they may move
/// before it is logged.
const JUMP_EVERY: Duration = Duration::from_secs(5);
const JUMP: i64 = 1_000;

/// Logs each jump of the system clock: the server keeps its own time (`SteadyClock`), so a
/// jump changes no window and no retention, but the operator should know that the machine's
/// clock and the times rota writes now disagree, until rota restarts. A server whose clock is
/// anchored to the stored evidence (not trusted) takes the system's time once it agrees.
async fn jumps(clock: Arc<dyn Clock>) {
    let mut told = 0;
    loop {
        tokio::time::sleep(JUMP_EVERY).await;
        if !clock.trusted() {
            if clock.adopt() {
                tracing::warn!("the system clock agrees with rota's again: rota takes its time and prunes by it");
            }
            continue;
        }
        let drift = clock.drift();
        if (drift - told).abs() > JUMP {
            tracing::warn!(
                jump_ms = drift - told,
                system_minus_rota_ms = drift,
                "the system clock jumped; rota keeps its own time (cooldown windows and audit retention \
                 are unchanged) and takes the system's time again at its next start"
            );
            told = drift;
        }
    }
}

/// Every `database.checkpoint_every` the log is copied into the database beside the writers
/// and, once all of it is, started over in a moment of the writers' turn (`Store::checkpoint`),
/// so that under any load it holds about one period of writes; while it is over
/// `database.wal_limit_mb` (a long reader kept it from starting over) it is truncated as soon
/// as the reader is done.
async fn checkpoints(store: Arc<dyn Store>, settings: Live) {
    loop {
        let db = settings.get().config.database.clone();
        tokio::time::sleep(db.checkpoint_every).await;
        let over = store.wal_bytes().is_some_and(|b| b > db.wal_limit_mb << 20);
        match store.checkpoint(over).await {
            Ok(true) if over => tracing::info!("the write-ahead log is back under database.wal_limit_mb"),
            Ok(_) => {}
            Err(e) => tracing::warn!(error = %e, "checkpointing the write-ahead log failed"),
        }
    }
}

/// The agents' counters (`agent_usage`, crate::limits): minute rows once an hour old, day rows
/// with the audit log (`audit.retention`, never today's or yesterday's; kept when retention is
/// off).
async fn prune_agent_usage(store: &dyn Store, retention: Duration, now: i64) {
    use crate::agents::{DAY, day_start};
    let days_before =
        (!retention.is_zero()).then(|| day_start(now - retention.as_millis() as i64).min(day_start(now) - DAY));
    match store.prune_agent_usage(now - 3_600_000, days_before).await {
        Ok(0) => {}
        Ok(n) => tracing::debug!(rows = n, "old agent usage counters deleted"),
        Err(e) => tracing::warn!(error = %e, "pruning the agents' usage counters failed; trying again next time"),
    }
}

/// The alerts' outbox with the audit log: delivered and given-up alerts raised `retention` ago,
/// and the gates no rule's `min_interval` still needs.
async fn prune_alerts(store: &dyn Store, config: &crate::config::Config, retention: Duration, now: i64) {
    let longest = config.alerts.iter().map(|r| r.min_interval).max().unwrap_or_default();
    let before = now - retention.as_millis() as i64;
    match store.prune_alerts(before, before.min(now - longest.as_millis() as i64)).await {
        Ok(0) => {}
        Ok(n) => tracing::debug!(alerts = n, "old alerts deleted"),
        Err(e) => tracing::warn!(error = %e, "pruning old alerts failed; trying again next time"),
    }
}

/// The session bindings idle for `SESSION_TTL`, and the oldest beyond `SESSION_ROWS`
/// (docs/scale.md, "Sessions"), a batch at a time in the writers' turn.
async fn prune_sessions(store: &dyn Store, now: i64) {
    let mut gone = 0;
    loop {
        let turn = store.write_turn().await;
        let pruned = store.prune_sessions(now - SESSION_TTL, SESSION_ROWS, PRUNE_BATCH).await;
        drop(turn);
        match pruned {
            Ok(n) => {
                gone += n;
                if n < PRUNE_BATCH as u64 {
                    break;
                }
            }
            Err(e) => {
                tracing::warn!(error = %e, "pruning idle session bindings failed; trying again next time");
                break;
            }
        }
    }
    if gone > 0 {
        tracing::debug!(bindings = gone, "idle session bindings deleted");
    }
}

/// Where a prune stops: rows that started `retention` before the newest request go, and never a
/// row the clock alone would condemn. By rota's clock alone, a clock that is wrong at start (a
/// restart after a jump) would delete rows the true time keeps; the newest row bounds it. An
/// audit log whose newest row is older than the retention (an idle gateway, or such a clock) is
/// left alone until the next request, and said once.
async fn cutoff(store: &dyn Store, retention: Duration, now: i64) -> Option<i64> {
    static TOLD: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
    let newest = match store.newest_audit().await {
        Ok(newest) => newest?,
        Err(e) => {
            tracing::warn!(error = %e, "reading the newest audit row failed; pruning next time");
            return None;
        }
    };
    let retention = retention.as_millis() as i64;
    if now - newest > retention && !TOLD.swap(true, std::sync::atomic::Ordering::Relaxed) {
        tracing::warn!(
            newest_row_age_ms = now - newest,
            "the newest audit row is older than audit.retention by rota's clock (nothing served for that \
             long, or the clock is wrong): rows are kept until they are that much older than a newer one"
        );
    }
    Some(now.min(newest) - retention)
}

/// Shortly after start and then every `audit.prune_every`: rows older than `audit.retention`
/// (before the newest row: `cutoff`) go, in batches, each rolled up first.
async fn retention(store: Arc<dyn Store>, settings: Live, clock: Arc<dyn Clock>) {
    let mut wait = Duration::from_secs(1);
    loop {
        tokio::time::sleep(wait).await;
        let (audit, now) = (settings.get().config.audit.clone(), clock.now());
        wait = audit.prune_every;
        if !clock.trusted() {
            continue; // nothing is deleted by a time nobody vouches for (`jumps` adopts a good one)
        }
        prune_agent_usage(store.as_ref(), audit.retention, now).await;
        prune_sessions(store.as_ref(), now).await;
        match store.audit_upkeep(now).await {
            Ok(0) => {}
            Ok(n) => tracing::debug!(partitions = n, "audit partitions made"),
            Err(e) => {
                tracing::warn!(error = %e, "making the audit trail's day partitions failed; trying again next time")
            }
        }
        if audit.retention.is_zero() {
            continue;
        }
        prune_alerts(store.as_ref(), &settings.get().config, audit.retention, now).await;
        let Some(before) = cutoff(store.as_ref(), audit.retention, now).await else { continue };
        // Whole days first, a statement each (PostgreSQL's partitions); the rest row by row.
        match store.drop_audit_days(before).await {
            Ok(0) => {}
            Ok(n) => {
                tracing::info!(partitions = n, retention = ?audit.retention, "old audit days rolled up into usage_daily and dropped")
            }
            Err(e) => {
                tracing::warn!(error = %e, "dropping old audit days failed; trying again next time");
                continue;
            }
        }
        let mut total = Pruned::default();
        loop {
            // In the writers' turn: the audit and stats writers queue behind the batch rather
            // than poll for the file lock (`Store::write_turn`).
            let turn = store.write_turn().await;
            let pruned = store.prune_audit(before, PRUNE_BATCH).await;
            drop(turn);
            match pruned {
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
