//! `rota migrate --from URL`: everything one database holds, copied into another (an SQLite
//! deployment moving to PostgreSQL, docs/scale.md). Secrets are copied sealed: the servers on the
//! new database need the same master key.

use super::{AuditQuery, Store, StoreError};
use crate::engine::Millis;

/// What a copy wrote.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Copied {
    pub profiles: usize,
    pub orders: usize,
    pub model_cooldowns: usize,
    pub agents: usize,
    pub requests: usize,
    pub attempts: usize,
    /// The ids of the keys that sealed the copied secrets.
    pub key_ids: Vec<String>,
}

#[derive(Debug, thiserror::Error)]
pub enum CopyError {
    #[error("the target database already holds {0}: copy only into an empty database")]
    NotEmpty(&'static str),
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// Audit rows per read and write.
const PAGE: u32 = 5_000;

/// Copies profiles (with their sealed secrets, stats and cooldown windows), orders, model
/// cooldowns, agents (revoked ones too) and the audit log from `from` into `to`, which must
/// hold none of them. The state goes in one transaction; the audit log follows page by page,
/// into its days' partitions on PostgreSQL.
pub async fn copy(from: &dyn Store, to: &dyn Store) -> Result<Copied, CopyError> {
    let everything = AuditQuery { limit: 1, ..Default::default() };
    let target = to.snapshot().await?;
    if !target.profiles.is_empty() {
        return Err(CopyError::NotEmpty("profiles"));
    }
    if !to.all_agents().await?.is_empty() {
        return Err(CopyError::NotEmpty("agents"));
    }
    if !to.requests(&everything).await?.is_empty() || !to.attempts(&everything).await?.is_empty() {
        return Err(CopyError::NotEmpty("audit rows"));
    }

    let mut source = from.snapshot().await?;
    let profiles: Vec<_> = source
        .profiles
        .iter()
        .map(|p| {
            let secrets = source.secrets.remove(&p.id).unwrap_or_default();
            (p.clone(), secrets, source.stats.remove(&p.id).unwrap_or_default())
        })
        .collect();
    to.import(&profiles, &source.orders).await?;
    let models: Vec<_> = source.model_cooldowns.into_iter().collect();
    to.save_model_cooldowns(&models).await?;
    let agents = from.all_agents().await?;
    to.copy_agents(&agents).await?;

    let mut copied = Copied {
        profiles: profiles.len(),
        orders: source.orders.len(),
        model_cooldowns: models.len(),
        agents: agents.len(),
        key_ids: from.secret_key_ids().await?,
        ..Default::default()
    };
    let mut after: Option<(Millis, String, i64)> = None;
    loop {
        let page = from.attempts(&AuditQuery { limit: PAGE, after: after.clone(), ..Default::default() }).await?;
        let Some(last) = page.last() else { break };
        after = Some((last.started_at, last.request_id.clone(), last.seq));
        to.insert_audit(&[], &page).await?;
        copied.attempts += page.len();
    }
    let mut after: Option<(Millis, String, i64)> = None;
    loop {
        let page = from.requests(&AuditQuery { limit: PAGE, after: after.clone(), ..Default::default() }).await?;
        let Some(last) = page.last() else { break };
        after = Some((last.started_at, last.id.clone(), 0));
        to.insert_audit(&page, &[]).await?;
        copied.requests += page.len();
    }
    // A partitioned trail took the copied days into its default partition: each its own now.
    to.audit_upkeep(chrono::Utc::now().timestamp_millis()).await?;
    Ok(copied)
}
