//! What an answer's tokens cost: the list prices shipped in `prices.toml`, overridden by the
//! config's `[prices]`, and the cost of a token count to the micro-dollar (docs/audit.md, "Cost").
//! Where a price is not known, the cost is not known either: never a guess.

use figment::Figment;
use figment::providers::{Format, Toml};
use serde::{Deserialize, Deserializer};
use std::collections::BTreeMap;
use std::sync::LazyLock;

/// Prices in USD per million tokens.
#[derive(Clone, Copy, Debug, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Price {
    /// Prompt tokens neither read from nor written to a cache.
    #[serde(deserialize_with = "usd")]
    pub input: f64,
    #[serde(deserialize_with = "usd")]
    pub output: f64,
    /// Prompt tokens read from the provider's cache.
    #[serde(default, deserialize_with = "some_usd")]
    pub cached_input: Option<f64>,
    /// Prompt tokens written to the cache for 5 minutes (Anthropic).
    #[serde(default, deserialize_with = "some_usd")]
    pub cache_write: Option<f64>,
}

/// A price: a finite number, zero or more.
fn usd<'de, D: Deserializer<'de>>(d: D) -> Result<f64, D::Error> {
    let v = f64::deserialize(d)?;
    if v.is_finite() && v >= 0.0 {
        Ok(v)
    } else {
        Err(serde::de::Error::custom(format!(
            "invalid price `{v}`: a price is USD per million tokens, a finite number of 0 or more"
        )))
    }
}

fn some_usd<'de, D: Deserializer<'de>>(d: D) -> Result<Option<f64>, D::Error> {
    usd(d).map(Some)
}

/// The token counts of one answer as the upstream reported them (`None`: not reported).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Tokens {
    /// The whole prompt, cached and cache-written tokens included (`tokens_in`).
    pub input: Option<i64>,
    /// The completion, reasoning included (`tokens_out`).
    pub output: Option<i64>,
    /// Of the prompt, tokens read from the cache.
    pub cached: Option<i64>,
    /// Of the prompt, tokens written to the cache (Anthropic).
    pub cache_write: Option<i64>,
    /// Of those, tokens written for an hour (Anthropic's `ttl: "1h"`), which no price here covers.
    pub cache_write_1h: Option<i64>,
}

/// The most tokens one answer may count of each kind: far above any model's window, far below
/// what the audit's columns and the sums over them hold (docs/schema.md, `usage_suspect`).
pub const TOKENS_MAX: i64 = 100_000_000;

impl Tokens {
    /// These counts held to 0..=`TOKENS_MAX`, the cached and cache-written tokens to the prompt,
    /// and whether any had to be (the upstream's report is then not believed).
    pub fn clamped(self) -> (Tokens, bool) {
        let mut suspect = false;
        let mut hold = |n: Option<i64>, max: i64| {
            n.map(|n| {
                let held = n.clamp(0, max);
                suspect |= held != n;
                held
            })
        };
        let input = hold(self.input, TOKENS_MAX);
        let output = hold(self.output, TOKENS_MAX);
        let within = input.unwrap_or(TOKENS_MAX);
        let cached = hold(self.cached, within);
        let cache_write = hold(self.cache_write, within.saturating_sub(cached.unwrap_or(0)));
        let cache_write_1h = hold(self.cache_write_1h, cache_write.unwrap_or(within));
        (Tokens { input, output, cached, cache_write, cache_write_1h }, suspect)
    }

    /// These counts, with those `later` reports replacing them (a stream reports in parts).
    pub fn and(self, later: Tokens) -> Tokens {
        Tokens {
            input: later.input.or(self.input),
            output: later.output.or(self.output),
            cached: later.cached.or(self.cached),
            cache_write: later.cache_write.or(self.cache_write),
            cache_write_1h: later.cache_write_1h.or(self.cache_write_1h),
        }
    }
}

impl Price {
    /// What `tokens` cost in USD, rounded to the micro-dollar; `None` when the counts are unknown
    /// or inconsistent, or when a class of tokens that is not zero has no price.
    pub fn cost(&self, tokens: Tokens) -> Option<f64> {
        let (input, output) = (tokens.input?, tokens.output?);
        let (cached, written) = (tokens.cached.unwrap_or(0), tokens.cache_write.unwrap_or(0));
        if tokens.cache_write_1h.unwrap_or(0) != 0 {
            return None;
        }
        let plain = input.saturating_sub(cached).saturating_sub(written);
        // Price per million tokens × tokens = micro-dollars: in millionths of a micro-dollar, the
        // sum is exact (prices are taken to six decimals).
        let part = |n: i64, price: Option<f64>| -> Option<i128> {
            match (n, price) {
                (0, _) => Some(0),
                (n, _) if n < 0 => None,
                (n, Some(p)) => Some(i128::from(n) * (p * 1e6).round() as i128),
                (_, None) => None,
            }
        };
        let pico = part(plain, Some(self.input))?
            + part(cached, self.cached_input)?
            + part(written, self.cache_write)?
            + part(output, Some(self.output))?;
        let micro = (pico + 500_000) / 1_000_000;
        Some(micro as f64 / 1e6)
    }
}

/// The shipped list prices (`src/prices.toml`), by model name.
static SHIPPED: LazyLock<BTreeMap<String, Price>> = LazyLock::new(|| {
    Figment::from(Toml::string(include_str!("prices.toml"))).extract().expect("src/prices.toml is a price table")
});

/// The prices in force: the config's `[prices]` over the shipped table.
#[derive(Clone, Debug, Default)]
pub struct Prices {
    overrides: BTreeMap<String, Price>,
}

impl Prices {
    pub fn new(overrides: BTreeMap<String, Price>) -> Prices {
        Prices { overrides }
    }

    /// The price of `model` on `provider`: `[prices]."provider/model"`, then `[prices]."model"`,
    /// then the shipped `"model"`; at each step a dated name also takes its undated entry.
    pub fn price(&self, provider: &str, model: &str) -> Option<&Price> {
        let names = [Some(model), undated(model)];
        let names = || names.iter().flatten();
        // Without `[prices]` (the common case) a request's lookup allocates nothing.
        let configured = || {
            let by_provider = names().find_map(|name| self.overrides.get(&format!("{provider}/{name}")));
            by_provider.or_else(|| names().find_map(|name| self.overrides.get(*name)))
        };
        (!self.overrides.is_empty()).then(configured).flatten().or_else(|| names().find_map(|name| SHIPPED.get(*name)))
    }

    /// What `tokens` of `model` on `provider` cost (see `Price::cost`); `None` without a price.
    pub fn cost(&self, provider: &str, model: &str, tokens: Tokens) -> Option<f64> {
        self.price(provider, model)?.cost(tokens)
    }
}

/// `model` without a trailing date (`-20250929`, `-2025-04-14`), when it has one.
fn undated(model: &str) -> Option<&str> {
    // `d` stands for a digit.
    ["-dddddddd", "-dddd-dd-dd"].into_iter().find_map(|shape| {
        let at = model.len().checked_sub(shape.len()).filter(|&at| at > 0)?;
        let tail = &model.as_bytes()[at..];
        let dated = tail.iter().zip(shape.bytes()).all(|(&c, s)| if s == b'd' { c.is_ascii_digit() } else { c == s });
        // The tail is ASCII, so `at` is a character boundary.
        dated.then(|| &model[..at])
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tokens(input: i64, output: i64) -> Tokens {
        Tokens { input: Some(input), output: Some(output), ..Tokens::default() }
    }

    #[test]
    fn the_shipped_table_parses_and_prices_the_common_models() {
        assert!(SHIPPED.len() >= 20, "{}", SHIPPED.len());
        let p = Prices::default();
        for model in ["gpt-4.1", "gpt-4.1-mini", "gpt-4o", "gpt-4o-mini", "o3", "o4-mini", "claude-sonnet-4-5"] {
            assert!(p.price("any", model).is_some(), "{model}");
        }
        for model in ["claude-opus-4-1", "claude-haiku-4-5", "claude-3-5-haiku"] {
            assert!(p.price("anthropic", model).is_some_and(|p| p.cache_write.is_some()), "{model}");
        }
        assert_eq!(p.price("openai", "gpt-9"), None);
    }

    #[test]
    fn a_dated_name_takes_its_undated_entry_unless_it_has_its_own() {
        let p = Prices::default();
        assert_eq!(undated("claude-sonnet-4-5-20250929"), Some("claude-sonnet-4-5"));
        assert_eq!(undated("gpt-4.1-2025-04-14"), Some("gpt-4.1"));
        assert_eq!(undated("gpt-4.1"), None);
        assert_eq!(undated("o3"), None);
        assert_eq!(undated("-20250929"), None);
        assert_eq!(undated("gpt-4.1-2025-4-14"), None);
        assert_eq!(undated("x-2025a04-14"), None);
        assert_eq!(undated("modèle-20250929"), Some("modèle"));
        assert_eq!(undated("éééééé"), None);
        assert_eq!(p.price("anthropic", "claude-sonnet-4-5-20250929"), p.price("anthropic", "claude-sonnet-4-5"));
        assert_eq!(p.price("openai", "gpt-4.1-2025-04-14").map(|p| p.input), Some(2.0));
        assert_eq!(p.price("openai", "gpt-4o-2024-08-06").map(|p| p.input), Some(2.5));
        assert_eq!(p.price("openai", "gpt-4o-2024-05-13").map(|p| p.input), Some(5.0), "its own entry");
        assert_eq!(p.price("openai", "gpt-4.1-20250414x"), None);
    }

    #[test]
    fn the_config_overrides_by_provider_and_model_then_by_model_then_the_shipped_table() {
        let price = |input: f64| Price { input, output: 1.0, cached_input: None, cache_write: None };
        let p = Prices::new(BTreeMap::from([
            ("azure/gpt-4.1".to_string(), price(1.0)),
            ("gpt-4.1".to_string(), price(3.0)),
            ("local-llama".to_string(), price(0.0)),
        ]));
        let input = |provider: &str, model: &str| p.price(provider, model).map(|p| p.input);
        assert_eq!(input("azure", "gpt-4.1"), Some(1.0));
        assert_eq!(input("azure", "gpt-4.1-2025-04-14"), Some(1.0));
        assert_eq!(input("openai", "gpt-4.1"), Some(3.0));
        assert_eq!(input("openai", "gpt-4.1-mini"), Some(0.4), "shipped");
        assert_eq!(input("ollama", "local-llama"), Some(0.0));
        assert_eq!(p.cost("ollama", "local-llama", tokens(1000, 1000)), Some(0.001));
    }

    #[test]
    fn cost_is_price_times_tokens_to_the_micro_dollar() {
        let sonnet = *Prices::default().price("anthropic", "claude-sonnet-4-5").unwrap();
        // 1,000 plain × $3 + 2,000 read × $0.30 + 500 written × $3.75 + 300 out × $15, per million.
        let t = Tokens {
            input: Some(3500),
            output: Some(300),
            cached: Some(2000),
            cache_write: Some(500),
            ..Tokens::default()
        };
        assert_eq!(sonnet.cost(t), Some(0.009975));
        let mini = *Prices::default().price("openai", "gpt-4.1-mini").unwrap();
        // 3 × 0.40 + 2 × 1.60 = 4.4 micro-dollars: 4.
        assert_eq!(mini.cost(tokens(3, 2)), Some(0.000004));
        // 1 × 0.50 + 1 × 2.00 = 2.5 micro-dollars: half a micro-dollar rounds up, to 3.
        let half = Price { input: 0.5, output: 2.0, cached_input: None, cache_write: None };
        assert_eq!(half.cost(tokens(1, 1)), Some(0.000003));
        assert_eq!(half.cost(tokens(0, 0)), Some(0.0));
        let gpt41 = *Prices::default().price("openai", "gpt-4.1").unwrap();
        let cached = Tokens { cached: Some(1_000_000), ..tokens(1_500_000, 10_000) };
        assert_eq!(gpt41.cost(cached), Some(1.58), "500K × $2 + 1M × $0.50 + 10K × $8");
    }

    #[test]
    fn an_unknown_count_or_an_unpriced_class_of_tokens_costs_null() {
        let o3 = *Prices::default().price("openai", "o3").unwrap();
        assert_eq!(o3.cost(Tokens { input: Some(10), ..Tokens::default() }), None, "output unknown");
        assert_eq!(o3.cost(Tokens { output: Some(10), ..Tokens::default() }), None, "input unknown");
        assert_eq!(o3.cost(Tokens { cache_write: Some(5), ..tokens(10, 1) }), None, "no cache_write price");
        assert_eq!(o3.cost(Tokens { cached: Some(11), ..tokens(10, 1) }), None, "more cached than input");
        let no_cache = Price { input: 5.0, output: 15.0, cached_input: None, cache_write: None };
        assert_eq!(no_cache.cost(Tokens { cached: Some(4), ..tokens(10, 1) }), None, "no cached_input price");
        assert_eq!(no_cache.cost(Tokens { cached: Some(0), ..tokens(10, 1) }), Some(0.000065));
        let haiku = *Prices::default().price("anthropic", "claude-haiku-4-5").unwrap();
        let hour = Tokens { cache_write: Some(8), cache_write_1h: Some(8), ..tokens(10, 1) };
        assert_eq!(haiku.cost(hour), None, "one-hour cache writes have no price");
        assert_eq!(haiku.cost(Tokens { cache_write_1h: Some(0), ..hour }), Some(0.000017));
    }

    #[test]
    fn a_later_report_replaces_the_counts_it_carries() {
        let start = Tokens { input: Some(11), output: Some(1), cached: Some(5), ..Tokens::default() };
        let delta = Tokens { output: Some(40), ..Tokens::default() };
        assert_eq!(start.and(delta), Tokens { output: Some(40), ..start });
    }
}
