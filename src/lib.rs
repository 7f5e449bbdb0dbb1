#![forbid(unsafe_code)]
//! rota: an auth-profile rotation gateway for LLM providers.

pub mod access;
pub mod agents;
pub mod api;
pub mod audit;
pub mod behind;
pub mod book;
pub mod cli;
pub mod config;
pub use rota_engine as engine;
pub mod gateway;
pub mod keyring;
pub mod leases;
pub mod limits;
pub mod metrics;
pub mod middleware;
pub mod oauth;
pub mod prices;
pub mod profiles;
pub mod redact;
pub mod refresh;
pub mod secrets;
pub mod server;
pub mod settings;
pub mod status;
pub mod store;
pub mod walk;
pub mod watchdog;
pub mod web;
