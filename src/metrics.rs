//! Prometheus metrics at `/metrics`. Counters and histograms are fed from the same rows the
//! audit trail writes, so the two always agree; gauges are computed at each scrape.

use crate::config::NamedModels;
use crate::engine::{Millis, ProfileId};
use crate::status::Status;
use crate::store::{AttemptRow, RequestRow};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;
use std::collections::BTreeMap;
use std::sync::atomic::AtomicU64;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RequestLabels {
    agent: String,
    api: String,
    status: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct AttemptLabels {
    agent: String,
    provider: String,
    model: String,
    outcome: String,
    reason: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ProviderLabels {
    provider: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct StateLabels {
    provider: String,
    state: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ProfileLabels {
    profile: String,
}

pub struct Metrics {
    registry: Registry,
    requests: Family<RequestLabels, Counter>,
    attempts: Family<AttemptLabels, Counter>,
    failovers: Family<ProviderLabels, Counter>,
    upstream_latency: Family<ProviderLabels, Histogram>,
    overhead: Histogram,
    profiles: Family<StateLabels, Gauge>,
    cooldown_left: Family<ProfileLabels, Gauge>,
    audit_queue: Gauge,
    audit_dropped: Family<TableLabels, Counter>,
    write_failing: Family<WriterLabels, Gauge>,
    disabled: Family<DisabledLabels, Gauge>,
    limit_used: Family<LimitLabels, Gauge<f64, AtomicU64>>,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct TableLabels {
    table: String,
    /// `shed` (the queue was full, or shutdown gave up) or `invalid` (refused for its content).
    reason: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct WriterLabels {
    writer: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct DisabledLabels {
    provider: String,
    reason: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct LimitLabels {
    agent: String,
    limit: String,
}

/// What a scrape reports about the profiles and the writers at that moment.
pub struct Snapshot {
    /// `(provider, state)` → number of profiles (`usable`, `cooling`, `disabled`, `unusable`).
    pub profiles: Vec<((String, String), i64)>,
    /// Profile → seconds until its window ends (only profiles in a timed window).
    pub cooldown_left: Vec<(String, i64)>,
    /// `(provider, reason)` → profiles in the disabled lane for that reason.
    pub disabled: Vec<((String, String), i64)>,
    /// `(agent, limit)` → the share of the limit in force used in its window (1.0 = at it).
    pub limit_used: Vec<((String, String), f64)>,
    pub audit: crate::audit::Health,
    /// The stats writer's last write failed.
    pub stats_failing: bool,
}

impl Snapshot {
    /// Counts the profiles by provider and state, and the seconds left of each timed window.
    pub fn of(
        states: Vec<(ProfileId, Status)>,
        now: Millis,
        audit: crate::audit::Health,
        stats_failing: bool,
    ) -> Snapshot {
        let mut profiles: BTreeMap<(String, String), i64> = BTreeMap::new();
        let mut disabled: BTreeMap<(String, String), i64> = BTreeMap::new();
        let mut cooldown_left = Vec::new();
        for (id, status) in states {
            if let Status::Disabled { reason, .. } = &status {
                *disabled.entry((id.provider().to_string(), reason.as_str().to_string())).or_default() += 1;
            }
            let (state, until) = match status {
                Status::Usable => ("usable", None),
                Status::Cooling { until, .. } => ("cooling", Some(until)),
                Status::Disabled { until, .. } => ("disabled", until),
                Status::Unusable { .. } => ("unusable", None),
            };
            *profiles.entry((id.provider().to_string(), state.to_string())).or_default() += 1;
            if let Some(until) = until {
                cooldown_left.push((profile_label(&id), (until - now + 999) / 1000));
            }
        }
        Snapshot {
            profiles: profiles.into_iter().collect(),
            cooldown_left,
            disabled: disabled.into_iter().collect(),
            limit_used: Vec::new(),
            audit,
            stats_failing,
        }
    }
}

/// A profile as metrics name it. A profile whose name holds an email (`corp:alice@example.com`,
/// as OAuth logins name theirs) is shown as `<provider>:sha256-<first 12 hex digits of the
/// SHA-256 of its whole id>`, so that no email reaches a label; other ids are shown as they are.
/// `printf %s corp:alice@example.com | sha256sum | cut -c1-12` finds one's label.
pub fn profile_label(id: &ProfileId) -> String {
    if !id.name().contains('@') {
        return id.to_string();
    }
    use sha2::Digest as _;
    let digest = sha2::Sha256::digest(id.as_str().as_bytes());
    let hex: String = digest[..6].iter().map(|b| format!("{b:02x}")).collect();
    format!("{}:sha256-{hex}", id.provider())
}

/// Whether a scrape from `peer` may read `/metrics`: with `server.metrics_token_file` unset,
/// only over loopback (a client on this machine, naming a loopback host: no page a browser
/// loads elsewhere can rebind its name to it), and never through a proxy (a request carrying
/// `Forwarded`, `X-Forwarded-For` or `X-Real-IP` came from elsewhere, whatever its `Host`); else only with `Authorization: Bearer <the
/// file's token>` (compared as digests). A file that cannot be read or is empty refuses every
/// scrape.
pub fn scrape_allowed(
    server: &crate::config::Server,
    headers: &http::HeaderMap,
    peer: Option<std::net::IpAddr>,
) -> bool {
    let Some(file) = &server.metrics_token_file else {
        let host = headers.get(http::header::HOST).and_then(|h| h.to_str().ok()).unwrap_or_default();
        let proxied = ["forwarded", "x-forwarded-for", "x-real-ip"].iter().any(|h| headers.contains_key(*h));
        return peer.is_some_and(|ip| ip.is_loopback()) && loopback_host(host) && !proxied;
    };
    let want = match crate::config::read_token_file(file) {
        Ok(t) => t,
        Err(why) => {
            tracing::error!("server.metrics_token_file: {why}: /metrics refuses every scrape");
            return false;
        }
    };
    let presented = headers
        .get(http::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer ").or_else(|| v.strip_prefix("bearer ")))
        .map(str::trim);
    use sha2::Digest as _;
    presented.is_some_and(|p| sha2::Sha256::digest(p.as_bytes()) == sha2::Sha256::digest(want.as_bytes()))
}

/// Whether a `Host` header names this machine's loopback: `localhost`, `127.x.y.z` or `[::1]`,
/// with or without a port.
fn loopback_host(host: &str) -> bool {
    let name = match host.strip_prefix('[') {
        Some(v6) => v6.split(']').next().unwrap_or_default(),
        None => host.rsplit_once(':').map_or(host, |(h, _)| h),
    };
    name.eq_ignore_ascii_case("localhost") || name.parse::<std::net::IpAddr>().is_ok_and(|ip| ip.is_loopback())
}

impl Default for Metrics {
    fn default() -> Self {
        let mut registry = Registry::with_prefix("rota");
        let requests = Family::default();
        let attempts = Family::default();
        let failovers = Family::default();
        let upstream_latency = Family::<ProviderLabels, Histogram>::new_with_constructor(|| {
            Histogram::new(exponential_buckets(0.005, 2.0, 14))
        });
        let overhead = Histogram::new(exponential_buckets(0.00005, 2.0, 14));
        let profiles = Family::default();
        let cooldown_left = Family::default();
        let audit_queue = Gauge::default();
        let audit_dropped = Family::default();
        let write_failing = Family::default();
        let disabled = Family::default();
        let limit_used = Family::<LimitLabels, Gauge<f64, AtomicU64>>::default();
        registry.register(
            "profiles_disabled",
            "Profiles in the disabled lane, by provider and reason (auth_permanent: needs a new login or secret)",
            disabled.clone(),
        );
        registry.register(
            "agent_limit_used_ratio",
            "Share of each limit in force an agent used in its window (requests this minute, tokens or cost today)",
            limit_used.clone(),
        );
        registry.register("requests", "Requests answered, by agent, API and HTTP status", requests.clone());
        registry.register("attempts", "Upstream calls and skipped candidates, by outcome and reason", attempts.clone());
        registry.register(
            "failovers",
            "Requests served by another model than the first candidate, by serving provider",
            failovers.clone(),
        );
        registry.register(
            "upstream_latency_seconds",
            "Duration of upstream calls (non-streamed: whole answer; streamed: whole stream)",
            upstream_latency.clone(),
        );
        registry.register(
            "gateway_overhead_seconds",
            "Time of a non-streamed request spent in rota rather than upstream",
            overhead.clone(),
        );
        registry.register("profiles", "Profiles by provider and state", profiles.clone());
        registry.register(
            "profile_cooldown_seconds",
            "Seconds until a cooling or disabled profile's window ends",
            cooldown_left.clone(),
        );
        registry.register("audit_queue_depth", "Audit rows queued and not yet written", audit_queue.clone());
        registry.register(
            "audit_dropped",
            "Audit rows shed because the queue was full (audit.queue), by table",
            audit_dropped.clone(),
        );
        registry.register(
            "database_write_failing",
            "1 while the last write of this writer (audit, stats) failed and is being retried",
            write_failing.clone(),
        );
        Metrics {
            registry,
            requests,
            attempts,
            failovers,
            upstream_latency,
            overhead,
            profiles,
            cooldown_left,
            audit_queue,
            audit_dropped,
            write_failing,
            disabled,
            limit_used,
        }
    }
}

impl Metrics {
    /// `named`: the models the config names; any other model is labelled `other`, so that
    /// models a client invents add no series.
    pub fn observe_attempt(&self, row: &AttemptRow, named: &NamedModels) {
        let known = named.get(&row.provider).is_some_and(|m| m.contains(&row.model));
        let labels = AttemptLabels {
            agent: row.agent.clone().unwrap_or_default(),
            provider: row.provider.clone(),
            model: if known { row.model.clone() } else { "other".to_string() },
            outcome: row.outcome.as_str().to_string(),
            reason: row.reason.map_or(String::new(), |r| r.as_str().to_string()),
        };
        self.attempts.get_or_create(&labels).inc();
        if let Some(ms) = row.duration_ms.filter(|_| row.profile_id.is_some()) {
            self.upstream_latency
                .get_or_create(&ProviderLabels { provider: row.provider.clone() })
                .observe(ms as f64 / 1000.0);
        }
    }

    /// `first_candidate`: the `provider/model` of the request's first attempt or skip;
    /// `overhead_ms`: time outside upstream calls, for non-streamed requests.
    pub fn observe_request(&self, row: &RequestRow, first_candidate: Option<&str>, overhead_ms: Option<i64>) {
        let labels = RequestLabels {
            agent: row.agent.clone().unwrap_or_default(),
            api: row.api.to_string(),
            status: row.status.to_string(),
        };
        self.requests.get_or_create(&labels).inc();
        if let (Some(served), Some(first)) = (row.served_model.as_deref(), first_candidate)
            && served != first
        {
            let provider = served.split('/').next().unwrap_or(served).to_string();
            self.failovers.get_or_create(&ProviderLabels { provider }).inc();
        }
        if let Some(ms) = overhead_ms {
            self.overhead.observe(ms.max(0) as f64 / 1000.0);
        }
    }

    /// The exposition text (OpenMetrics), with the gauges set from `now`.
    pub fn render(&self, now: Snapshot) -> String {
        self.profiles.clear();
        for ((provider, state), n) in now.profiles {
            self.profiles.get_or_create(&StateLabels { provider, state }).set(n);
        }
        self.disabled.clear();
        for ((provider, reason), n) in now.disabled {
            self.disabled.get_or_create(&DisabledLabels { provider, reason }).set(n);
        }
        self.limit_used.clear();
        for ((agent, limit), used) in now.limit_used {
            self.limit_used.get_or_create(&LimitLabels { agent, limit }).set(used);
        }
        self.cooldown_left.clear();
        for (profile, secs) in now.cooldown_left {
            self.cooldown_left.get_or_create(&ProfileLabels { profile }).set(secs);
        }
        self.audit_queue.set(now.audit.queued as i64);
        let a = &now.audit;
        for (table, reason, dropped) in [
            ("requests", "shed", a.dropped_requests),
            ("attempts", "shed", a.dropped_attempts),
            ("requests", "invalid", a.invalid_requests),
            ("attempts", "invalid", a.invalid_attempts),
        ] {
            let counter = self.audit_dropped.get_or_create(&TableLabels { table: table.into(), reason: reason.into() });
            counter.inc_by(dropped.saturating_sub(counter.get()));
        }
        for (writer, failing) in [("audit", now.audit.failing), ("stats", now.stats_failing)] {
            self.write_failing.get_or_create(&WriterLabels { writer: writer.into() }).set(i64::from(failing));
        }
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &self.registry).expect("writing to a String cannot fail");
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::Reason;

    #[test]
    fn the_disabled_lane_is_counted_by_provider_and_reason_and_limits_are_shares() {
        let id = |s: &str| s.parse::<ProfileId>().unwrap();
        let disabled = |reason| Status::Disabled { until: None, reason };
        let states = vec![
            (id("corp:a@example.com"), disabled(Reason::AuthPermanent)),
            (id("corp:b"), disabled(Reason::AuthPermanent)),
            (id("corp:c"), disabled(Reason::Billing)),
            (id("openai:k"), Status::Usable),
        ];
        let mut snapshot = Snapshot::of(states, 0, Default::default(), false);
        snapshot.limit_used = vec![(("planner".into(), "cost_per_day".into()), 0.85)];
        let text = Metrics::default().render(snapshot);
        for line in [
            r#"rota_profiles_disabled{provider="corp",reason="auth_permanent"} 2"#,
            r#"rota_profiles_disabled{provider="corp",reason="billing"} 1"#,
            r#"rota_agent_limit_used_ratio{agent="planner",limit="cost_per_day"} 0.85"#,
        ] {
            assert!(text.lines().any(|l| l == line), "missing `{line}` in:\n{text}");
        }
        assert!(!text.contains(r#"rota_profiles_disabled{provider="openai""#), "{text}");
    }
}
