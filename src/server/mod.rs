//! `rota serve`: opens the store, unlocks the secrets, loads the profile book and serves HTTP
//! until SIGTERM or Ctrl-C, then flushes every pending write.

pub mod alerting;
pub mod app;
pub mod reload;
pub mod upkeep;

use crate::access::AgentCache;
use crate::api::ApiState;
use crate::api::oauth::Logins;
use crate::api::session::Sessions;
use crate::audit::Audit;
use crate::book::Book;
use crate::config::Config;
use crate::engine::{Clock, SteadyClock};
use crate::gateway::Gateway;
use crate::gateway::upstream::Upstream;
use crate::leases::Leases;
use crate::refresh::Refresher;
use crate::secrets::resolve_key;
use crate::server::app::AppState;
use crate::settings::Settings;
use crate::walk::Runtime;
use anyhow::{Context, Result};
use std::sync::Arc;
use std::time::Duration;

/// A ready gateway: store opened, secrets unlocked, profiles loaded, writers running.
pub struct App {
    pub state: AppState,
    pub book: Arc<Book>,
    pub audit: Audit,
}

impl App {
    /// `watched`: the config file to reload on change (docs/api.md), if the config came from one.
    /// The server's clock is checked against the stored evidence unless `trust_clock`
    /// (`rota serve --trust-clock`; docs/rotation.md, "Time").
    pub async fn build(config: Config, watched: Option<std::path::PathBuf>, trust_clock: bool) -> Result<App> {
        let clock = Arc::new(SteadyClock::new());
        let check = (!trust_clock).then(|| clock.clone());
        App::build_checked(config, watched, clock, check).await
    }

    /// [`App::build`] on `clock` (tests move time on).
    pub async fn build_on(config: Config, watched: Option<std::path::PathBuf>, clock: Arc<dyn Clock>) -> Result<App> {
        App::build_checked(config, watched, clock, None).await
    }

    /// Builds the app on `clock`; `check`: that clock, to anchor to the newest stored row when
    /// the system clock is far from it.
    async fn build_checked(
        config: Config,
        watched: Option<std::path::PathBuf>,
        clock: Arc<dyn Clock>,
        check: Option<Arc<SteadyClock>>,
    ) -> Result<App> {
        // The HTTP client reads and parses the system's CA certificates (a tenth of start-up's
        // instructions with 2,000 profiles): built on a blocking thread while the database opens
        // and the profiles load (docs/performance.md, "What profiling changed").
        let upstream = tokio::task::spawn_blocking({
            let timeouts = config.timeouts.clone();
            move || Upstream::new(&timeouts)
        });
        let target = crate::store::DatabaseTarget::of(&config)?;
        let store = crate::store::open(&target).await.with_context(|| format!("opening database {target}"))?;
        let (key, origin) =
            resolve_key(&crate::store::key_anchor(&config)?, &store.secret_key_ids().await?, config.secrets.keyring)?;
        tracing::info!(key_id = key.id(), from = %origin, database = %target, "master key ready");
        if let Some(steady) = check
            && let Some(gap) = steady.anchor(store.newest_audit().await?)
        {
            tracing::warn!(
                system_minus_newest_row_ms = gap,
                "the system clock is far from the newest stored row: rota runs from that row's time, prunes \
                 nothing and says so in /healthz until the system clock agrees (within 5 minutes) or \
                 `rota serve --trust-clock` confirms it (docs/rotation.md, \"Time\")"
            );
        }
        let key = Arc::new(key);
        let audit = Audit::start(store.clone(), config.audit.queue);
        let (sender, live) = crate::settings::channel(Settings::new(config));
        let book = Arc::new(Book::load(store.clone(), live.clone(), key.clone(), clock.now()).await?);
        book.sweep_every(std::time::Duration::from_secs(1), clock.clone());
        let upstream = upstream.await.context("building the upstream HTTP client")?;
        let refresher = Arc::new(Refresher::new(book.clone(), store.clone(), key.clone(), clock.clone()));
        let runtime = Arc::new(Runtime::new(
            live.clone(),
            book.clone(),
            store.clone(),
            audit.clone(),
            clock.clone(),
            refresher.clone(),
        ));
        // The background tasks end when the runtime is dropped.
        refresher.sweep(live.clone(), runtime.tasks());
        crate::server::upkeep::start(store.clone(), live.clone(), clock.clone(), runtime.tasks());
        let watch = alerting::Watch {
            book: book.clone(),
            audit: audit.clone(),
            alerts: runtime.alerts.clone(),
            store: store.clone(),
            settings: live.clone(),
            clock: clock.clone(),
        };
        watch.start(runtime.tasks());
        if let Some(path) = watched {
            crate::server::reload::watch(path, sender, runtime.tasks());
        }
        let leases = Leases::start(clock, runtime.tasks());
        let agents = AgentCache::load(store.clone()).await?;
        let (sessions, logins) = (Arc::new(Sessions::default()), Arc::new(Logins::default()));
        let limits_budget = live.get().config.limits.bodies_in_flight_mb << 20;
        let gateway = Gateway {
            runtime: runtime.clone(),
            upstream: upstream.clone(),
            agents: agents.clone(),
            store: store.clone(),
            bodies: Arc::new(crate::gateway::bodies::Bodies::new(limits_budget)),
            signed: Arc::default(),
        };
        let sso = Arc::default();
        let api = ApiState { runtime, upstream, agents, leases, store, key, sessions, logins, sso };
        let state = AppState { gateway, api };
        Ok(App { state, book, audit })
    }

    /// Serves until `shutdown` completes. Then: no new connection is accepted; requests in
    /// flight have `server.shutdown_grace` to finish; then requests still waiting on an upstream
    /// are answered 503 and streams still open are cut with the in-band error (both audited
    /// `cancelled`), and what still runs `CUT_WAIT` later is abandoned.
    /// Last, pending stats and audit writes get `FLUSH_WAIT` to reach the database; the audit
    /// rows left are shed and counted (`Audit::give_up`), and the totals logged.
    pub async fn serve(
        self,
        listener: tokio::net::TcpListener,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) -> Result<()> {
        let runtime = self.state.api.runtime.clone();
        let leases = self.state.api.leases.clone();
        let server = runtime.settings().config.server.clone();
        let limit = Arc::new(tokio::sync::Semaphore::new(server.max_connections));
        let graceful = hyper_util::server::graceful::GracefulShutdown::new();
        let mut http = hyper::server::conn::http1::Builder::new();
        http.timer(hyper_util::rt::TokioTimer::new()).header_read_timeout(server.header_timeout);
        let service = hyper_util::service::TowerToHyperService::new(crate::server::app::router(self.state));
        tokio::pin!(shutdown);
        loop {
            // A connection over `server.max_connections` waits in the kernel's accept queue.
            let permit = tokio::select! {
                biased;
                _ = &mut shutdown => break,
                p = limit.clone().acquire_owned() => p.expect("the semaphore is never closed"),
            };
            let (tcp, peer) = tokio::select! {
                biased;
                _ = &mut shutdown => break,
                accepted = listener.accept() => match accepted {
                    Ok(accepted) => accepted,
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
            let svc = service.clone();
            let with_peer = hyper::service::service_fn(move |mut req: hyper::Request<hyper::body::Incoming>| {
                req.extensions_mut().insert(crate::middleware::Peer(peer));
                hyper::service::Service::call(&svc, req)
            });
            let conn = graceful.watch(http.serve_connection(hyper_util::rt::TokioIo::new(tcp), with_peer));
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
            tracing::warn!(
                connections = open(&limit),
                "shutdown grace over: answering the requests still waiting and cutting open streams"
            );
            runtime.stopping.cancel();
            if tokio::time::timeout(CUT_WAIT, &mut finished).await.is_err() {
                tracing::error!(connections = open(&limit), "abandoning requests still running");
            }
        }
        leases.expire(runtime.clock.now(), true);
        let (book, audit) = (self.book.flush(), self.audit.flush());
        if tokio::time::timeout(FLUSH_WAIT, async { tokio::join!(book, audit) }).await.is_err() {
            let queued = self.audit.health().queued;
            let health = self.audit.give_up();
            let (_, stats) = self.book.writer_state();
            tracing::error!(
                audit_rows = queued - health.queued,
                dropped_requests = health.dropped_requests,
                dropped_attempts = health.dropped_attempts,
                stats_profiles = stats,
                "the database did not take the last writes in time: the audit rows still queued are shed \
                 (counted in dropped_requests and dropped_attempts since start), the stats changes are lost"
            );
        }
        Ok(())
    }
}

/// How long requests still running after the grace may take to end once streams are cut.
const CUT_WAIT: Duration = Duration::from_secs(3);
/// How long the last stats and audit writes may take at shutdown.
const FLUSH_WAIT: Duration = Duration::from_secs(10);

pub async fn run(
    config: Config,
    file: Option<std::path::PathBuf>,
    listen: Option<String>,
    trust_clock: bool,
) -> Result<()> {
    let also = if listen.is_some() { "" } else { " (or change server.listen)" };
    let addr = listen.unwrap_or_else(|| config.server.listen.clone());
    raise_file_limit(config.server.max_connections);
    // Bound first: a port already taken stops the start before the database is opened.
    let listener = bind(&addr, also).await?;
    let app = App::build(config, file, trust_clock).await?;
    let local = listener.local_addr()?;
    let signal = shutdown_signal();
    println!("rota listening on http://{local}");
    tracing::info!(%local, "serving");
    app.serve(listener, signal).await?;
    tracing::info!("stopped");
    Ok(())
}

/// Listens on `addr`; the error says why not in words and how to pick another address
/// (`--listen`, then `also`).
pub async fn bind(addr: &str, also: &str) -> Result<tokio::net::TcpListener> {
    use std::io::ErrorKind;
    tokio::net::TcpListener::bind(addr).await.map_err(|e| {
        let host = addr.rsplit_once(':').map_or("127.0.0.1", |(h, _)| h);
        let host = if host.is_empty() { "127.0.0.1" } else { host };
        let why = match e.kind() {
            ErrorKind::AddrInUse => "address already in use",
            ErrorKind::AddrNotAvailable => "no network interface of this machine has that address",
            ErrorKind::PermissionDenied => "permission denied (ports below 1024 need privileges)",
            _ => {
                return anyhow::anyhow!(
                    "cannot listen on {addr}: {e}; give --listen an address as HOST:PORT, e.g. 127.0.0.1:8080{also}"
                );
            }
        };
        anyhow::anyhow!("cannot listen on {addr}: {why}; pick another with --listen {host}:PORT{also}")
    })
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

/// Resolves at SIGTERM or Ctrl-C. The handlers are installed when this is called, not when it is
/// first awaited: call it before saying rota listens, so that a signal sent as soon as it does
/// (a supervisor stopping what it just started) still drains instead of killing the process.
#[cfg(unix)]
pub fn shutdown_signal() -> impl Future<Output = ()> {
    use tokio::signal::unix::{Signal, SignalKind, signal};
    let (term, int) = (signal(SignalKind::terminate()), signal(SignalKind::interrupt()));
    let first = |s: std::io::Result<Signal>| async move {
        match s {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    async move {
        tokio::select! {
            _ = first(term) => {},
            _ = first(int) => {},
        }
    }
}

#[cfg(not(unix))]
pub fn shutdown_signal() -> impl Future<Output = ()> {
    async {
        let _ = tokio::signal::ctrl_c().await;
    }
}
