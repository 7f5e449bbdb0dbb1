//! Who may call rota: the active agents by key digest, kept in memory and following the change
//! feed, and the key a request presents. The gateway and the API authenticate through it.

use crate::agents::Agent;
use crate::store::{Store, StoreError};
use axum::http::HeaderMap;
use parking_lot::RwLock;
use std::collections::HashMap;
use std::sync::Arc;

/// The active agents by key digest, in memory, so authenticating a known key never waits on the
/// database. A background task follows the change feed, so agents created or revoked with the
/// CLI or by another instance take effect on a running server within a second; a key it does
/// not know yet is looked up in the database at once (one read at a time, at most one each
/// `MISS_EVERY`), so a key works the moment `rota agents create` returns.
pub struct AgentCache {
    by_digest: RwLock<HashMap<String, Agent>>,
    store: Arc<dyn Store>,
    /// Held while a miss reads the database; when it last did.
    missed: tokio::sync::Mutex<Option<std::time::Instant>>,
}

/// How often an unknown key may make the database be read: a client sending made-up keys
/// costs at most one read of the agents this often.
const MISS_EVERY: std::time::Duration = std::time::Duration::from_millis(100);

impl AgentCache {
    /// Loads the active agents, and reloads them whenever the change feed says an agent was
    /// created or revoked (by this server, the CLI or another instance).
    pub async fn load(store: Arc<dyn Store>) -> Result<Arc<AgentCache>, StoreError> {
        let mut seen = store.feed_head(Some("agent")).await?;
        let cache = Arc::new(AgentCache {
            by_digest: RwLock::new(active(store.as_ref()).await?),
            store: store.clone(),
            missed: tokio::sync::Mutex::new(None),
        });
        let weak = Arc::downgrade(&cache);
        let mut wake = store.wake();
        tokio::spawn(async move {
            loop {
                tokio::select! {
                    _ = tokio::time::sleep(crate::book::FEED_EVERY) => {}
                    _ = crate::store::woken(&mut wake) => {}
                }
                let Some(cache) = weak.upgrade() else { return };
                let head = match store.feed_head(Some("agent")).await {
                    Ok(head) if head == seen => continue,
                    Ok(head) => head,
                    Err(e) => {
                        tracing::warn!(error = %e, "reading the change feed failed; keeping the agents");
                        continue;
                    }
                };
                match active(store.as_ref()).await {
                    Ok(fresh) => {
                        *cache.by_digest.write() = fresh;
                        seen = head;
                    }
                    Err(e) => tracing::warn!(error = %e, "reloading agents failed; keeping the last list"),
                }
            }
        });
        Ok(cache)
    }

    /// Reloads the agents now (after the admin API created or revoked one).
    pub async fn reload(&self, store: &dyn Store) -> Result<(), StoreError> {
        let fresh = active(store).await?;
        *self.by_digest.write() = fresh;
        Ok(())
    }

    /// True while `agent` (the same id) is active and an admin.
    pub fn is_active_admin(&self, agent: &Agent) -> bool {
        self.by_digest.read().values().any(|a| a.id == agent.id && a.admin)
    }

    /// The active agent whose key this is: from memory, else (a key created a moment ago) from
    /// the database.
    pub async fn find(&self, key: &str) -> Option<Agent> {
        let d = crate::agents::digest_of(key);
        if let Some(a) = self.by_digest.read().get(&d) {
            return Some(a.clone());
        }
        let mut last = self.missed.lock().await;
        // Another miss may have read the agents while this one waited.
        if let Some(a) = self.by_digest.read().get(&d) {
            return Some(a.clone());
        }
        if last.is_some_and(|at| at.elapsed() < MISS_EVERY) {
            return None;
        }
        *last = Some(std::time::Instant::now());
        match active(self.store.as_ref()).await {
            Ok(fresh) => {
                let found = fresh.get(&d).cloned();
                *self.by_digest.write() = fresh;
                found
            }
            Err(e) => {
                tracing::warn!(error = %e, "reading the agents for an unknown key failed");
                None
            }
        }
    }
}

async fn active(store: &dyn Store) -> Result<HashMap<String, Agent>, StoreError> {
    Ok(store.active_agents().await?.into_iter().collect())
}

/// The agent key: `Authorization: Bearer rk_…` or `x-api-key: rk_…`.
pub fn presented_key(headers: &HeaderMap) -> Option<&str> {
    let bearer = headers
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer ").or_else(|| v.strip_prefix("bearer ")));
    bearer.or_else(|| headers.get("x-api-key").and_then(|v| v.to_str().ok())).map(str::trim).filter(|k| !k.is_empty())
}
