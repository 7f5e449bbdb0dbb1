//! Durations as the config file and the `ROTA_*` variables write them (docs/config.md,
//! "Durations"): `"60s"`, `"5m"`, `"1h30m"` (humantime syntax), or a number of seconds.

use serde::{Deserialize, Deserializer};
use std::time::Duration;

/// For `#[serde(deserialize_with = "…")]`. The error quotes the text and shows how to write it.
pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Raw {
        Secs(u64),
        Text(String),
    }
    match Raw::deserialize(d)? {
        Raw::Secs(s) => Ok(Duration::from_secs(s)),
        Raw::Text(t) => humantime::parse_duration(t.trim()).map_err(|e| {
            serde::de::Error::custom(format!("invalid duration `{t}` ({e}); write e.g. \"90s\", \"5m\" or \"1h\""))
        }),
    }
}
