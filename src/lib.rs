#![forbid(unsafe_code)]
//! rota: an auth-profile rotation gateway for LLM providers.
//!
//! The modules by layer, lowest first (docs/architecture.md, "Layers"). A module imports only
//! from its own layer and the layers below it, and never in a cycle: `tests/it/layers.rs` reads
//! the `// layer:` lines below and checks both.

// layer: values — the engine's pure rules, and the values every part shares.
pub use rota_engine as engine;
pub mod agents;
pub mod http;
pub mod keyring;
pub mod prices;
pub mod redact;
pub mod status;

// layer: settings — the configuration, the settings in force, secrets, the providers' OAuth.
pub mod config;
pub mod oauth;
pub mod secrets;
pub mod settings;

// layer: storage — the store, the writers that batch into it, the alerts' outbox.
pub mod alerts;
pub mod audit;
pub mod behind;
pub mod limits;
pub mod store;
pub mod watchdog;

// layer: state — what the process holds in memory, kept in step with the store, and what it
// reports of itself (metrics, traces).
pub mod access;
pub mod book;
pub mod metrics;
pub mod profiles;
pub mod refresh;
pub mod telemetry;

// layer: requests — a request's walk over the chain, the gateway around it, the leases.
pub mod gateway;
pub mod leases;
pub mod middleware;
pub mod walk;

// layer: surfaces — the admin, lease and OAuth API, the console's pages.
pub mod api;
pub mod web;

// layer: process — the server and the command line.
pub mod cli;
pub mod server;
