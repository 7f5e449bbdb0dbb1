//! The alerts that are states rather than requests (docs/operations.md, "Alerts"): every second
//! the server looks at its profiles and its writers, and raises an event when an account starts
//! to need a re-login or enters the disabled lane, when every account of a provider starts to
//! cool (for every model or for one; the others may be disabled), when the audit queue sheds
//! rows and when a database write starts failing; every `BUDGET_EVERY`, while an agent is past a
//! rule's share of one of its limits. At its start the
//! server raises what is already so: an account that entered the disabled lane while no server
//! ran is not missed, and the fleet's gate keeps a restart from repeating an alert within the
//! rule's interval.

use crate::alerts::{Alerts, Event};
use crate::audit::Audit;
use crate::book::Book;
use crate::config::AlertKind;
use crate::engine::{Clock, Millis, ProfileId, ProfileType, Reason};
use crate::settings::Live;
use crate::status::Status;
use crate::store::Store;
use serde_json::json;
use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

const EVERY: Duration = Duration::from_secs(1);
const BUDGET_EVERY: Duration = Duration::from_secs(5);

/// What the server watches, and what it saw last.
pub struct Watch {
    pub book: Arc<Book>,
    pub audit: Audit,
    pub alerts: Arc<Alerts>,
    pub store: Arc<dyn Store>,
    pub settings: Live,
    pub clock: Arc<dyn Clock>,
}

/// The states of the last look.
#[derive(Default)]
struct Seen {
    relogin: HashSet<ProfileId>,
    disabled: HashSet<ProfileId>,
    cooling: HashSet<String>,
    shed: u64,
    failing: bool,
}

impl Watch {
    /// Looks every second until `tasks` is cancelled.
    pub fn start(self, tasks: CancellationToken) {
        tokio::spawn(tasks.run_until_cancelled_owned(self.run()));
    }

    async fn run(self) {
        let mut seen = Seen::default();
        let mut tick = tokio::time::interval(EVERY);
        let mut budget_at = tokio::time::Instant::now();
        loop {
            tick.tick().await;
            // Without rules, nothing is looked at; rules added by a reload then hear of the
            // states already there, as at start.
            if !self.alerts.any() {
                seen = Seen::default();
                continue;
            }
            let now = self.clock.now();
            let (now_seen, events) = self.look(now);
            for event in changes(&seen, events) {
                self.alerts.raise(event);
            }
            seen = now_seen;
            if budget_at.elapsed() >= BUDGET_EVERY && self.alerts.wanted(AlertKind::Budget) {
                budget_at = tokio::time::Instant::now();
                self.budgets(now).await;
            }
        }
    }

    /// The states now, with the event each would raise if it is new.
    fn look(&self, now: Millis) -> (Seen, Vec<(Key, Event)>) {
        let mut seen = Seen::default();
        let mut events = Vec::new();
        let roster = self.book.roster();
        let mut providers: BTreeMap<&str, (usize, usize, Option<Millis>)> = BTreeMap::new();
        for v in roster.views.values().filter(|v| v.enabled) {
            let status = Status::of(v, now);
            let provider = providers.entry(v.id.provider()).or_default();
            provider.0 += 1;
            match &status {
                Status::Disabled { reason, until } => {
                    provider.1 += 1;
                    let relogin = *reason == Reason::AuthPermanent && v.kind == ProfileType::OAuth;
                    let (kind, summary) = match relogin {
                        true => (
                            AlertKind::NeedsRelogin,
                            format!("{} needs re-login: the provider refused its tokens", v.id),
                        ),
                        false => (
                            AlertKind::Disabled,
                            format!("{} entered the disabled lane: {}", v.id, status.display(now)),
                        ),
                    };
                    let until = until.and_then(chrono::DateTime::from_timestamp_millis).map(|t| t.to_rfc3339());
                    let details = json!({"profile": v.id.to_string(), "provider": v.id.provider(), "reason": reason, "until": until});
                    let key = match relogin {
                        true => Key::Relogin(v.id.clone()),
                        false => Key::Disabled(v.id.clone()),
                    };
                    events.push((key, Event { kind, subject: v.id.to_string(), summary, details, share: None }));
                }
                Status::Cooling { until, .. } => {
                    provider.1 += 1;
                    provider.2 = Some(provider.2.map_or(*until, |u| u.min(*until)));
                }
                _ => {}
            }
        }
        for (provider, (enabled, blocked, cooling_until)) in providers {
            if let Some(until) = cooling_until.filter(|_| blocked == enabled) {
                let back = chrono::DateTime::from_timestamp_millis(until).map(|t| t.to_rfc3339());
                let summary = format!("every account of {provider} is cooling or disabled ({enabled} in all)");
                let details = json!({"provider": provider, "profiles": enabled, "first_back_at": back});
                let event =
                    Event { kind: AlertKind::ProviderCooling, subject: provider.into(), summary, details, share: None };
                events.push((Key::Cooling(provider.into()), event));
            }
        }
        for (key, _) in &events {
            match key {
                Key::Relogin(id) => seen.relogin.insert(id.clone()),
                Key::Disabled(id) => seen.disabled.insert(id.clone()),
                Key::Cooling(p) => seen.cooling.insert(p.clone()),
                _ => true,
            };
        }
        let health = self.audit.health();
        seen.shed = health.dropped_requests + health.dropped_attempts;
        seen.failing = health.failing || self.book.writer_state().0;
        events.push((Key::Shed(seen.shed), shed_event(&health)));
        let summary = "a write to the database is failing: the writers retry it (rows wait in memory)".to_string();
        let details =
            json!({"audit_writer_failing": health.failing, "stats_writer_failing": self.book.writer_state().0});
        let failing =
            Event { kind: AlertKind::DatabaseFailing, subject: "database".into(), summary, details, share: None };
        events.push((Key::Failing(seen.failing), failing));
        (seen, events)
    }

    /// A `budget` event for each agent's limit used past the lowest share a rule names.
    async fn budgets(&self, now: Millis) {
        let settings = self.settings.get();
        let config = &settings.config;
        let lowest = config
            .alerts
            .iter()
            .filter(|r| r.on.contains(&AlertKind::Budget))
            .map(|r| r.budget_share)
            .fold(f64::INFINITY, f64::min);
        for ((agent, limit), share) in crate::limits::used(self.store.as_ref(), config, now).await {
            if share >= lowest {
                self.alerts.raise(Event {
                    kind: AlertKind::Budget,
                    subject: format!("{agent}/{limit}"),
                    summary: format!("agent {agent} has used {:.0}% of its {limit}", share * 100.0),
                    details: json!({"agent": agent, "limit": limit, "used_share": share}),
                    share: Some(share),
                });
            }
        }
    }
}

/// What an event is about, to compare one look with the last.
enum Key {
    Relogin(ProfileId),
    Disabled(ProfileId),
    Cooling(String),
    /// The rows shed since start.
    Shed(u64),
    /// Whether a write fails.
    Failing(bool),
}

/// The events of states that were not there at the last look.
fn changes(before: &Seen, events: Vec<(Key, Event)>) -> Vec<Event> {
    events
        .into_iter()
        .filter(|(key, _)| match key {
            Key::Relogin(id) => !before.relogin.contains(id),
            Key::Disabled(id) => !before.disabled.contains(id),
            Key::Cooling(p) => !before.cooling.contains(p),
            Key::Shed(n) => *n > before.shed,
            Key::Failing(f) => *f && !before.failing,
        })
        .map(|(_, event)| event)
        .collect()
}

fn shed_event(health: &crate::audit::Health) -> Event {
    Event {
        kind: AlertKind::AuditShed,
        subject: "audit".into(),
        summary: format!(
            "the audit queue was full: {} request and {} attempt rows shed since start",
            health.dropped_requests, health.dropped_attempts
        ),
        details: json!({
            "dropped_requests": health.dropped_requests,
            "dropped_attempts": health.dropped_attempts,
            "queue_capacity": health.capacity,
        }),
        share: None,
    }
}
