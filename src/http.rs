//! The HTTP client of rota's own calls: token and userinfo endpoints, alert webhooks, the trace
//! collector. Never the upstream's (crate::gateway::upstream has its own, pooled and tuned).

use std::time::Duration;

/// A client that never follows a redirect (an endpoint that redirects could send what rota
/// posts elsewhere), names rota in `user-agent`, and gives up on a connection after `connect`
/// and on a whole call after `total`. Building one reads the system's root certificates: build
/// it on first use where a server may never need it (docs/performance.md).
pub fn own_client(connect: Duration, total: Duration) -> reqwest::Client {
    let _ = rustls::crypto::ring::default_provider().install_default();
    reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .connect_timeout(connect)
        .timeout(total)
        .user_agent(concat!("rota/", env!("CARGO_PKG_VERSION")))
        .build()
        .expect("HTTP client configuration is static and valid")
}
