#![forbid(unsafe_code)]
//! rota: an auth-profile rotation gateway for LLM providers.

pub mod engine;
