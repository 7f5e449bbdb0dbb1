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
        .layer(axum::middleware::map_response(nosniff))
        .with_state(state)
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
    let snapshot = Snapshot::of(engine.book.states(now), now, engine.audit.queue_depth());
    ([("content-type", "application/openmetrics-text; version=1.0.0; charset=utf-8")], engine.metrics.render(snapshot))
        .into_response()
}

async fn healthz(State(_): State<AppState>) -> Json<Value> {
    Json(json!({ "status": "ok", "version": env!("CARGO_PKG_VERSION") }))
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
        let audit = Audit::start(store.clone());
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
        if let Some(path) = watched {
            crate::reload::watch(path, Arc::downgrade(&engine));
        }
        let leases = Leases::start(Arc::downgrade(&engine));
        let agents = AgentCache::load(store.clone()).await?;
        let (sessions, logins) = (Arc::new(Sessions::default()), Arc::new(Logins::default()));
        let state = AppState { engine, agents, leases, store, key, sessions, logins };
        Ok(App { state, book, audit })
    }

    /// Serves until `shutdown` completes, lets in-flight requests finish, then flushes every
    /// pending stats and audit write.
    pub async fn serve(
        self,
        listener: tokio::net::TcpListener,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) -> Result<()> {
        let (leases, clock) = (self.state.leases.clone(), self.state.engine.clock.clone());
        // Small writes (a stream's events, a short answer) go out at once, not after Nagle's delay.
        let listener = axum::serve::ListenerExt::tap_io(listener, |tcp| {
            if let Err(e) = tcp.set_nodelay(true) {
                tracing::debug!(error = %e, "TCP_NODELAY not set");
            }
        });
        axum::serve(listener, router(self.state)).with_graceful_shutdown(shutdown).await?;
        leases.expire(clock.now(), true);
        self.book.flush().await;
        self.audit.flush().await;
        Ok(())
    }
}

pub async fn run(config: Config, file: Option<std::path::PathBuf>, listen: Option<String>) -> Result<()> {
    let addr = listen.unwrap_or_else(|| config.server.listen.clone());
    let app = App::build(config, file).await?;
    let listener = tokio::net::TcpListener::bind(&addr).await.with_context(|| format!("cannot listen on {addr}"))?;
    let local = listener.local_addr()?;
    println!("rota listening on http://{local}");
    tracing::info!(%local, "serving");
    app.serve(listener, shutdown_signal()).await?;
    tracing::info!("stopped; every pending write is flushed");
    Ok(())
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
