//! `rota serve`: opens the store, unlocks the secrets, loads the profile book and serves HTTP
//! until SIGTERM or Ctrl-C, then flushes every pending write.

use crate::api::{self, leases::Leases, oauth::Logins};
use crate::audit::Audit;
use crate::book::Book;
use crate::config::Config;
use crate::engine::{Clock, SystemClock};
use crate::gateway::failover::{Engine, Settings};
use crate::gateway::upstream::Upstream;
use crate::gateway::{self, AgentCache};
use crate::metrics::Snapshot;
use crate::refresh::Refresher;
use crate::secrets::{MasterKey, resolve_key};
use crate::store::Store;
use crate::web::{self, Sessions};
use anyhow::{Context, Result};
use axum::extract::State;
use axum::routing::get;
use axum::{Json, Router};
use serde_json::{Value, json};
use std::sync::Arc;
use std::time::Duration;

/// What every handler shares; cheap to clone.
#[derive(Clone)]
pub struct AppState {
    pub engine: Arc<Engine>,
    pub agents: Arc<AgentCache>,
    pub leases: Arc<Leases>,
    pub store: Arc<dyn Store>,
    pub key: Arc<MasterKey>,
    pub sessions: Arc<Sessions>,
    pub logins: Arc<Logins>,
}

impl AppState {
    /// The request's console session, if it is live and its agent is still an active admin.
    pub fn session(&self, headers: &axum::http::HeaderMap) -> Option<crate::web::Session> {
        self.sessions.find(headers, self.engine.clock.now(), |a| self.agents.is_active_admin(a))
    }
}

pub fn router(state: AppState) -> Router {
    Router::new()
        .route("/healthz", get(healthz))
        .route("/metrics", get(metrics))
        .merge(gateway::router())
        .merge(api::router())
        .merge(web::router())
        .layer(axum::middleware::from_fn_with_state(state.clone(), body_deadline))
        .layer(axum::middleware::map_response(nosniff))
        .with_state(state)
}

/// A request body that has not arrived whole within `server.body_timeout` (a client that
/// trickles it, holding the connection) fails to read with `BodyTimeout`.
async fn body_deadline(
    State(state): State<AppState>,
    req: axum::extract::Request,
    next: axum::middleware::Next,
) -> axum::response::Response {
    use futures_util::StreamExt;
    if req.method() == http::Method::GET || req.method() == http::Method::HEAD {
        return next.run(req).await;
    }
    let limit = state.engine.settings().config.server.body_timeout;
    let deadline = tokio::time::Instant::now() + limit;
    let (parts, body) = req.into_parts();
    let timed = futures_util::stream::unfold(Some(body.into_data_stream()), move |stream| async move {
        let mut stream = stream?;
        match tokio::time::timeout_at(deadline, stream.next()).await {
            Ok(Some(chunk)) => Some((chunk, Some(stream))),
            Ok(None) => None,
            Err(_) => Some((Err(axum::Error::new(BodyTimeout(limit))), None)),
        }
    });
    next.run(axum::extract::Request::from_parts(parts, axum::body::Body::from_stream(timed))).await
}

/// The request body did not arrive within `server.body_timeout`.
#[derive(Debug, thiserror::Error)]
#[error("the request body did not arrive within {}s (server.body_timeout)", .0.as_secs_f64())]
pub struct BodyTimeout(pub Duration);

impl BodyTimeout {
    /// Whether reading a body failed because of its deadline.
    pub fn caused<'a>(e: &'a (dyn std::error::Error + 'static)) -> Option<&'a BodyTimeout> {
        let mut cur = Some(e);
        while let Some(e) = cur {
            if let Some(t) = e.downcast_ref::<BodyTimeout>() {
                return Some(t);
            }
            cur = e.source();
        }
        None
    }
}

/// Every answer says its content type is the one to use: a browser never sniffs an error
/// message or an upstream's text into HTML.
async fn nosniff(mut r: axum::response::Response) -> axum::response::Response {
    r.headers_mut().insert(http::header::X_CONTENT_TYPE_OPTIONS, http::HeaderValue::from_static("nosniff"));
    r
}

/// Prometheus exposition (OpenMetrics text); with `server.metrics_token_file`, only for its bearer token.
async fn metrics(State(state): State<AppState>, headers: http::HeaderMap) -> axum::response::Response {
    use axum::response::IntoResponse;
    let engine = &state.engine;
    if !crate::metrics::scrape_allowed(&engine.settings().config.server, &headers) {
        let challenge = [("www-authenticate", "Bearer realm=\"rota metrics\"")];
        return (http::StatusCode::UNAUTHORIZED, challenge, "a bearer token is needed (server.metrics_token_file)\n")
            .into_response();
    }
    let now = engine.clock.now();
    let snapshot = Snapshot::of(engine.book.states(now), now, engine.audit.health(), engine.book.writer_state().0);
    ([("content-type", "application/openmetrics-text; version=1.0.0; charset=utf-8")], engine.metrics.render(snapshot))
        .into_response()
}

/// Always 200 while rota serves (a load balancer keeps sending: requests are answered even
/// when the database fails); `status` is `degraded` while a writer fails or the audit queue is
/// over half full, with the details (docs/api.md).
async fn healthz(State(state): State<AppState>) -> Json<Value> {
    let audit = state.engine.audit.health();
    let (stats_failing, stats_waiting) = state.engine.book.writer_state();
    let degraded = audit.degraded() || stats_failing;
    Json(json!({
        "status": if degraded { "degraded" } else { "ok" },
        "version": env!("CARGO_PKG_VERSION"),
        "audit": {
            "queued": audit.queued,
            "capacity": audit.capacity,
            "dropped_requests": audit.dropped_requests,
            "dropped_attempts": audit.dropped_attempts,
            "failing": audit.failing,
        },
        "stats": { "failing": stats_failing, "waiting": stats_waiting },
    }))
}

/// A ready gateway: store opened, secrets unlocked, profiles loaded, writers running.
pub struct App {
    pub state: AppState,
    pub book: Arc<Book>,
    pub audit: Audit,
}

impl App {
    /// `watched`: the config file to reload on change (SPEC §8), if the config came from one.
    pub async fn build(config: Config, watched: Option<std::path::PathBuf>) -> Result<App> {
        let target = config.database()?;
        let store = crate::store::open(&target).await.with_context(|| format!("opening database {target}"))?;
        let (key, origin) = resolve_key(&config.key_anchor()?, &store.secret_key_ids().await?, config.secrets.keyring)?;
        tracing::info!(key_id = key.id(), from = %origin, database = %target, "master key ready");
        let clock: Arc<dyn Clock> = Arc::new(SystemClock);
        let key = Arc::new(key);
        let book = Arc::new(Book::load(store.clone(), &config, key.clone(), clock.now()).await?);
        book.sweep_every(std::time::Duration::from_secs(1), clock.clone());
        let audit = Audit::start(store.clone(), config.audit.queue);
        let upstream = Upstream::new(&config.timeouts);
        let refresher = Arc::new(Refresher::new(book.clone(), store.clone(), key.clone(), clock.clone()));
        let engine = Arc::new(Engine::new(
            Settings::new(config),
            book.clone(),
            upstream,
            audit.clone(),
            clock,
            refresher.clone(),
        ));
        let weak = Arc::downgrade(&engine);
        refresher.sweep(move || weak.upgrade().map(|e| e.settings()));
        crate::upkeep::start(store.clone(), Arc::downgrade(&engine));
        if let Some(path) = watched {
            crate::reload::watch(path, Arc::downgrade(&engine));
        }
        let leases = Leases::start(Arc::downgrade(&engine));
        let agents = AgentCache::load(store.clone()).await?;
        let (sessions, logins) = (Arc::new(Sessions::default()), Arc::new(Logins::default()));
        let state = AppState { engine, agents, leases, store, key, sessions, logins };
        Ok(App { state, book, audit })
    }

    /// Serves until `shutdown` completes. Then: no new connection is accepted; requests in
    /// flight have `server.shutdown_grace` to finish; streams still open are then cut with the
    /// in-band error (audited `cancelled`), and what still runs `CUT_WAIT` later is abandoned.
    /// Last, pending stats and audit writes get `FLUSH_WAIT` to reach the database; what is
    /// left is logged.
    pub async fn serve(
        self,
        listener: tokio::net::TcpListener,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) -> Result<()> {
        let engine = self.state.engine.clone();
        let leases = self.state.leases.clone();
        let server = engine.settings().config.server.clone();
        let limit = Arc::new(tokio::sync::Semaphore::new(server.max_connections));
        let graceful = hyper_util::server::graceful::GracefulShutdown::new();
        let mut http = hyper::server::conn::http1::Builder::new();
        http.timer(hyper_util::rt::TokioTimer::new()).header_read_timeout(server.header_timeout);
        let service = hyper_util::service::TowerToHyperService::new(router(self.state));
        tokio::pin!(shutdown);
        loop {
            // A connection over `server.max_connections` waits in the kernel's accept queue.
            let permit = tokio::select! {
                biased;
                _ = &mut shutdown => break,
                p = limit.clone().acquire_owned() => p.expect("the semaphore is never closed"),
            };
            let tcp = tokio::select! {
                biased;
                _ = &mut shutdown => break,
                accepted = listener.accept() => match accepted {
                    Ok((tcp, _)) => tcp,
                    Err(e) => {
                        // Out of file descriptors, say: accepting again at once would spin.
                        tracing::warn!(error = %e, "accepting a connection failed");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        continue;
                    }
                },
            };
            // Small writes (a stream's events, a short answer) go out at once, not after Nagle's delay.
            if let Err(e) = tcp.set_nodelay(true) {
                tracing::debug!(error = %e, "TCP_NODELAY not set");
            }
            let conn = graceful.watch(http.serve_connection(hyper_util::rt::TokioIo::new(tcp), service.clone()));
            tokio::spawn(async move {
                if let Err(e) = conn.await {
                    tracing::debug!(error = %e, "connection ended with an error");
                }
                drop(permit);
            });
        }
        drop(listener);
        let open = |limit: &tokio::sync::Semaphore| server.max_connections - limit.available_permits();
        tracing::info!(connections = open(&limit), grace = ?server.shutdown_grace, "shutting down: no new connections");
        let finished = graceful.shutdown();
        tokio::pin!(finished);
        if tokio::time::timeout(server.shutdown_grace, &mut finished).await.is_err() {
            tracing::warn!(connections = open(&limit), "shutdown grace over: cutting open streams");
            engine.stopping.cancel();
            if tokio::time::timeout(CUT_WAIT, &mut finished).await.is_err() {
                tracing::error!(connections = open(&limit), "abandoning requests still running");
            }
        }
        leases.expire(engine.clock.now(), true);
        let (book, audit) = (self.book.flush(), self.audit.flush());
        if tokio::time::timeout(FLUSH_WAIT, async { tokio::join!(book, audit) }).await.is_err() {
            let health = self.audit.health();
            let (_, stats) = self.book.writer_state();
            tracing::error!(
                audit_rows = health.queued,
                stats_profiles = stats,
                "the database did not take the last writes in time; they are lost"
            );
        }
        Ok(())
    }
}

/// How long requests still running after the grace may take to end once streams are cut.
const CUT_WAIT: Duration = Duration::from_secs(3);
/// How long the last stats and audit writes may take at shutdown.
const FLUSH_WAIT: Duration = Duration::from_secs(10);

pub async fn run(config: Config, file: Option<std::path::PathBuf>, listen: Option<String>) -> Result<()> {
    let addr = listen.unwrap_or_else(|| config.server.listen.clone());
    raise_file_limit(config.server.max_connections);
    let app = App::build(config, file).await?;
    let listener = tokio::net::TcpListener::bind(&addr).await.with_context(|| format!("cannot listen on {addr}"))?;
    let local = listener.local_addr()?;
    println!("rota listening on http://{local}");
    tracing::info!(%local, "serving");
    app.serve(listener, shutdown_signal()).await?;
    tracing::info!("stopped");
    Ok(())
}

/// Every connection is a file descriptor: the soft limit (often 1,024) goes up to the hard
/// one, so that `server.max_connections` (plus the database and upstream connections) fit.
fn raise_file_limit(connections: usize) {
    #[cfg(unix)]
    match rlimit::increase_nofile_limit(u64::MAX) {
        Ok(n) if n < connections as u64 + 256 => tracing::warn!(
            limit = n,
            "the open-file limit is below server.max_connections plus headroom: raise it (ulimit -n)"
        ),
        Ok(_) => {}
        Err(e) => tracing::warn!(error = %e, "the open-file limit could not be raised"),
    }
}

pub async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        _ = ctrl_c => {},
        _ = term => {},
    }
}
