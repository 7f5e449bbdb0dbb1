//! What every walk shares, the gateway's and the leases': the profile book, the audit
//! writer, metrics, the clock, the OAuth refresher and the settings in force. "Engine" means
//! only the pure rules (`rota::engine`); this is the runtime around them.

use super::{Attempt, Failed, Verdict, Walk};
use crate::alerts::Alerts;
use crate::audit::Audit;
use crate::book::{Book, Credential, SESSION_TTL};
use crate::config::Config;
use crate::engine::chain::{Candidate, ChainRequest, FallbackOverride};
use crate::engine::classify::Classified;
use crate::engine::{Clock, Millis, Reason};
use crate::limits::Limiter;
use crate::metrics::Metrics;
use crate::refresh::{Refresher, access_of};
use crate::settings::{Live, Settings};
use crate::store::Store;
use crate::watchdog::Watchdog;
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::{CancellationToken, DropGuard};

/// How long an answer waits for the window its failures opened to be written.
const DURABLE_WAIT: Duration = Duration::from_secs(2);

/// Everything a walk needs, shared by all requests and leases.
pub struct Runtime {
    settings: Live,
    pub book: Arc<Book>,
    /// The database, for what `/healthz` says of it.
    pub store: Arc<dyn Store>,
    pub audit: Audit,
    pub metrics: Arc<Metrics>,
    pub clock: Arc<dyn Clock>,
    pub refresher: Arc<Refresher>,
    /// Whether the database answers (`/healthz`, the limits).
    pub watchdog: Arc<Watchdog>,
    /// The agents' limits, admitted in memory.
    pub limits: Arc<Limiter>,
    /// Where events are raised for `[[alerts]]` (crate::alerts).
    pub alerts: Arc<Alerts>,
    /// Cancelled when the shutdown grace (`server.shutdown_grace`) is over: open streams end
    /// with the in-band error.
    pub stopping: CancellationToken,
    /// Cancels `tasks` when the runtime is dropped, so the background tasks end with it.
    _tasks: DropGuard,
    tasks: CancellationToken,
}

impl Runtime {
    pub fn new(
        settings: Live,
        book: Arc<Book>,
        store: Arc<dyn Store>,
        audit: Audit,
        clock: Arc<dyn Clock>,
        refresher: Arc<Refresher>,
    ) -> Runtime {
        let tasks = CancellationToken::new();
        let watchdog = Watchdog::start(store.clone(), tasks.clone());
        let alerts = Alerts::start(settings.clone(), store.clone(), clock.clone(), tasks.clone());
        Runtime {
            book,
            store: store.clone(),
            audit,
            metrics: Arc::new(Metrics::default()),
            clock,
            refresher,
            limits: Limiter::new(store.clone(), watchdog.clone()),
            alerts,
            watchdog,
            stopping: CancellationToken::new(),
            _tasks: tasks.clone().drop_guard(),
            tasks,
            settings,
        }
    }

    /// Cancelled when the runtime is dropped: what a background task ends on.
    pub fn tasks(&self) -> CancellationToken {
        self.tasks.clone()
    }

    /// A reader of the settings in force.
    pub fn live(&self) -> Live {
        self.settings.clone()
    }

    /// The attempt with a credential to call with: an OAuth token about to expire is refreshed
    /// first. A refresh that fails is the attempt's failure, recorded as such; the error holds
    /// what it led to and its message.
    pub async fn ready(
        &self,
        walk: &mut Walk,
        config: &Config,
        mut att: Attempt,
    ) -> Result<Attempt, (Verdict, String)> {
        match self.refresher.fresh(config, &att.pid, &att.cred).await {
            Ok(None) => Ok(att),
            Ok(Some(cred)) => {
                att.cred = cred;
                Ok(att)
            }
            Err(f) => {
                let now = self.now();
                let mut row = walk.trail.row(att.kind, &att.cand, Some(&att.pid), now);
                row.duration_ms = Some(0);
                let mut class =
                    Classified { reason: f.reason, hint: None, account_wide: true, message: f.message, claim: false };
                let failed = Failed { row, class: &mut class, status: None, may_retry: false, marks: true };
                let verdict = walk.failed(&self.book, config, att, failed, now);
                Err((verdict, class.message))
            }
        }
    }

    /// What a failed attempt leads to (docs/rotation.md), for the gateway and leases alike. An OAuth
    /// token the upstream refused (401) is refreshed first, and the same profile is then tried
    /// once more (`Retry` without backoff); a refresh token refused for good makes the failure
    /// `auth_permanent`. `failed.class` ends as recorded.
    pub async fn settle(&self, walk: &mut Walk, config: &Config, att: Attempt, failed: Failed<'_>) -> Verdict {
        if failed.class.reason == Reason::Auth
            && matches!(att.cred, Credential::OAuth { .. } | Credential::Client { .. })
            && walk.first_try(&att)
        {
            match self.refresher.refresh(config, &att.pid, access_of(&att.cred).as_deref()).await {
                Ok(_) => {
                    let Failed { row, class, status, .. } = failed;
                    walk.retry_same(att, row, class, status, "the access token was refreshed");
                    return Verdict::Retry(Duration::ZERO);
                }
                Err(r) if r.reason == Reason::AuthPermanent => {
                    (failed.class.reason, failed.class.message) = (r.reason, r.message)
                }
                Err(_) => {}
            }
        }
        walk.failed(&self.book, config, att, failed, self.now())
    }

    /// A request whose session this server cannot place (no binding here for its first
    /// candidate's provider, or its profile cannot serve now) asks the database for the
    /// session's bindings first: another server may have bound or moved it a moment ago, before
    /// the change feed brought it here (docs/scale.md, "Sessions").
    pub async fn recall_session(&self, walk: &Walk) {
        let (Some(session), Some(target)) = (walk.session(), walk.first_target()) else { return };
        let now = self.now();
        if self.book.knows_session(target, session, now) {
            return;
        }
        match self.store.session_bindings(session, now - SESSION_TTL).await {
            Ok(found) => self.book.adopt_sessions(found, now),
            Err(e) => {
                tracing::warn!(error = %e, "reading the session's binding failed; it may move to another profile")
            }
        }
    }

    /// The settings in force now.
    pub fn settings(&self) -> Arc<Settings> {
        self.settings.get()
    }

    pub fn now(&self) -> Millis {
        self.clock.now()
    }

    /// A window this request's failures opened, and a session it bound or moved, are written
    /// before the client hears the answer (all requests waiting share the writer's
    /// transactions), so a restart right after cannot forget what rota acted on, and the
    /// session's next turn finds its binding on any server. While the database fails, the answer waits `DURABLE_WAIT` at
    /// most: requests are served, and `/healthz` says the writer fails.
    pub async fn durable(&self, walk: &Walk) {
        if walk.marked() && !self.book.durable(DURABLE_WAIT).await {
            tracing::warn!(request_id = %walk.trail.request_id, "answering before the cooldown it caused is written: the database does not take writes");
        }
    }

    /// The candidates a request for `model` by `agent` walks through.
    pub fn chain(
        &self,
        config: &Config,
        agent: &crate::agents::Agent,
        model: Option<&str>,
        fallback_override: FallbackOverride,
    ) -> Result<Vec<Candidate>, crate::engine::chain::ChainError> {
        config.chain(&ChainRequest {
            model,
            agent_fallbacks: config.agents.get(&agent.name).and_then(|a| a.fallbacks.as_deref()),
            fallback_override,
            roll: fastrand::u64(..),
            failover: config.failover.enabled,
            allowed: config.agent_models(agent),
        })
    }
}
