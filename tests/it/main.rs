//! The integration tests, in one binary (one link of the crate and its dependencies, one
//! compile of `support`). Each module is one area; `cargo test --test it <module>::` runs one.

mod support;

mod abuse;
mod admin;
mod agents;
mod alerts;
mod audit;
mod backup;
mod classification_samples;
mod cli;
mod clock;
mod dashboards;
mod deploy;
mod doors;
mod faults;
mod files;
mod first_contact;
mod fleet;
mod gateway;
mod hostile;
mod identities;
mod layers;
mod leases;
mod limits;
mod partitions;
mod people;
mod presets;
mod quota;
mod reload;
mod schema;
mod sessions;
mod spans;
mod store;
mod thinking;
mod translation;
