//! Alerts that reach people (docs/operations.md, "Alerts"). Events are raised on the request
//! path and by the server's watch (crate::server::alerting) without waiting: each `[[alerts]]`
//! rule listening for the event's kind puts one alert in the database's outbox, at most one per
//! rule, subject and `min_interval` across every server sharing the database (`alert_gates`).
//! A sender claims due alerts for a while, so that one server of a fleet posts each; a failed
//! post is tried again after 1 s, doubling up to `RETRY_MAX`, for `GIVE_UP` at most; every
//! attempt is an `alert_deliveries` row. An alert the database cannot take yet (it is failing,
//! which may be the very event) waits in memory and is offered again every second.

use crate::config::{AlertFormat, AlertKind, AlertRule};
use crate::engine::{Clock, Millis};
use crate::settings::Live;
use crate::store::{AlertDelivery, AlertNext, NewAlert, OutboxAlert, Store, StoreError};
use secrecy::ExposeSecret;
use serde_json::{Value, json};
use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::{Notify, mpsc};
use tokio_util::sync::CancellationToken;

/// The header holding `sha256=` and the hex HMAC-SHA256 of the body under the rule's key.
pub const SIGNATURE_HEADER: &str = "x-rota-signature";
/// The header holding the alert's id: the same on every attempt, for a receiver to drop repeats.
pub const ID_HEADER: &str = "x-rota-alert-id";

/// The longest pause between two attempts to deliver an alert.
const RETRY_MAX: Duration = Duration::from_secs(30);
/// An alert not delivered this long after it was raised is given up (`state = 'failed'`).
const GIVE_UP: Duration = Duration::from_secs(24 * 3600);
/// How long a server's claim on the alerts it sends lasts: longer than a post may take.
const CLAIM: Duration = Duration::from_secs(60);
/// A post's limit.
const POST_TIMEOUT: Duration = Duration::from_secs(10);
/// Alerts claimed at once.
const BATCH: i64 = 16;
/// Events waiting to be matched with the rules, and alerts waiting for the database: beyond
/// these, new ones are dropped and logged.
const QUEUE: usize = 1024;

/// Something operators are told of.
#[derive(Clone, Debug)]
pub struct Event {
    pub kind: AlertKind,
    /// What it is about (a profile id, a provider, an agent's limit): the interval is per rule
    /// and subject.
    pub subject: String,
    /// One line for people.
    pub summary: String,
    pub details: Value,
    /// `budget`: the share of the limit used, which each rule compares with its `budget_share`.
    pub share: Option<f64>,
}

/// The handle events are raised through.
pub struct Alerts {
    settings: Live,
    events: mpsc::Sender<Event>,
    store: Arc<dyn Store>,
    clock: Arc<dyn Clock>,
    /// Wakes the sender.
    raised: Arc<Notify>,
}

impl Alerts {
    /// The handle, and the tasks that raise and send alerts until `tasks` is cancelled.
    pub fn start(
        settings: Live,
        store: Arc<dyn Store>,
        clock: Arc<dyn Clock>,
        tasks: CancellationToken,
    ) -> Arc<Alerts> {
        let (events, receiver) = mpsc::channel(QUEUE);
        let raised = Arc::new(Notify::new());
        let instance = uuid::Uuid::new_v4().to_string();
        let raiser = Raiser {
            settings: settings.clone(),
            store: store.clone(),
            clock: clock.clone(),
            last: HashMap::new(),
            offered: HashMap::new(),
            waiting: VecDeque::new(),
            raised: raised.clone(),
        };
        tokio::spawn(tasks.clone().run_until_cancelled_owned(raiser.run(receiver)));
        let sender = Sender {
            settings: settings.clone(),
            store: store.clone(),
            clock: clock.clone(),
            instance,
            http: OnceHttp::default(),
        };
        tokio::spawn(tasks.run_until_cancelled_owned(sender.run(raised.clone())));
        Arc::new(Alerts { settings, events, store, clock, raised })
    }

    /// Whether any rule is configured.
    pub fn any(&self) -> bool {
        !self.settings.get().config.alerts.is_empty()
    }

    /// Whether a rule listens for `kind`.
    pub fn wanted(&self, kind: AlertKind) -> bool {
        self.settings.get().config.alerts.iter().any(|r| r.on.contains(&kind))
    }

    /// Puts a test alert of the rule named `rule` in the outbox and wakes the sender: no
    /// interval or cap holds it back, and its delivery rows tell whether the receiver took it.
    /// The alert's id; `None` when no rule has that name.
    pub async fn test(&self, rule: &str, by: &str) -> Result<Option<String>, StoreError> {
        let settings = self.settings.get();
        let Some(rule) = settings.config.alerts.iter().find(|r| r.name == rule) else { return Ok(None) };
        let now = self.clock.now();
        let id = uuid::Uuid::now_v7().to_string();
        let event = Event {
            kind: AlertKind::Test,
            subject: "test".into(),
            summary: format!("a test of the alert rule {}, sent by {by}", rule.name),
            details: json!({"sent_by": by}),
            share: None,
        };
        let alert = NewAlert {
            body: body(rule, &event, &id, now),
            id: id.clone(),
            rule: rule.name.clone(),
            kind: event.kind.as_str().into(),
            subject: event.subject,
            raised_at: now,
        };
        // The gate lets it through unless a test of the rule is dated later (a clock that
        // stepped back).
        let queued = self.store.raise_alert(&alert, now).await?;
        self.raised.notify_one();
        Ok(queued.then_some(id))
    }

    /// Raises `event` without waiting; dropped (and logged) when the queue is full.
    pub fn raise(&self, event: Event) {
        if let Err(mpsc::error::TrySendError::Full(e)) = self.events.try_send(event) {
            tracing::warn!(kind = e.kind.as_str(), subject = %e.subject, "alert dropped: too many are waiting");
        }
    }
}

/// Matches events with the rules and puts the alerts in the outbox.
struct Raiser {
    settings: Live,
    store: Arc<dyn Store>,
    clock: Arc<dyn Clock>,
    /// When this server last offered an alert per rule and subject: the database's gate is
    /// asked once per interval at most.
    last: HashMap<(String, String), Millis>,
    /// Per rule, when its current interval began and how many alerts this server offered in it
    /// (`cap`).
    offered: HashMap<String, (Millis, u32)>,
    /// Alerts the database did not take yet, with their gates.
    waiting: VecDeque<(NewAlert, Millis)>,
    raised: Arc<Notify>,
}

impl Raiser {
    async fn run(mut self, mut events: mpsc::Receiver<Event>) {
        let mut tick = tokio::time::interval(Duration::from_secs(1));
        loop {
            tokio::select! {
                event = events.recv() => match event {
                    Some(event) => self.match_rules(event).await,
                    None => return,
                },
                _ = tick.tick() => {
                    self.forget_old();
                    self.offer_waiting().await
                }
            }
        }
    }

    async fn match_rules(&mut self, event: Event) {
        let now = self.clock.now();
        let settings = self.settings.get();
        for rule in settings.config.alerts.iter().filter(|r| applies(r, &event)) {
            let interval = rule.min_interval.as_millis() as Millis;
            let key = (rule.name.clone(), event.subject.clone());
            if self.last.get(&key).is_some_and(|at| now - at < interval && now >= *at) {
                continue;
            }
            let (since, n) = self.offered.entry(rule.name.clone()).or_insert((now, 0));
            if now - *since >= interval || now < *since {
                (*since, *n) = (now, 0);
            }
            if *n >= rule.cap {
                if *n == rule.cap {
                    tracing::warn!(rule = %rule.name, cap = rule.cap, "alerts past the rule's cap are dropped until its interval ends");
                    *n += 1;
                }
                continue;
            }
            *n += 1;
            self.last.insert(key, now);
            let id = uuid::Uuid::now_v7().to_string();
            let alert = NewAlert {
                body: body(rule, &event, &id, now),
                id,
                rule: rule.name.clone(),
                kind: event.kind.as_str().into(),
                subject: event.subject.clone(),
                raised_at: now,
            };
            self.waiting.push_back((alert, now - interval));
            if self.waiting.len() > QUEUE {
                let (dropped, _) = self.waiting.pop_front().expect("the queue is not empty");
                tracing::warn!(rule = %dropped.rule, subject = %dropped.subject, "alert dropped: the database has not taken alerts for long");
            }
        }
        self.offer_waiting().await;
    }

    /// Forgets the subjects whose every rule's interval is over, so that `last` holds what the
    /// current intervals need and no more.
    fn forget_old(&mut self) {
        let now = self.clock.now();
        let settings = self.settings.get();
        let longest = settings.config.alerts.iter().map(|r| r.min_interval.as_millis() as Millis).max().unwrap_or(0);
        self.last.retain(|_, at| now - *at < longest && now >= *at);
        self.offered.retain(|_, (since, _)| now - *since < longest && now >= *since);
    }

    /// Offers the waiting alerts to the database in order; stops at the first it cannot take.
    async fn offer_waiting(&mut self) {
        let mut any = false;
        while let Some((alert, gate_after)) = self.waiting.front() {
            match tokio::time::timeout(crate::store::TIMEOUT, self.store.raise_alert(alert, *gate_after)).await {
                Ok(Ok(queued)) => {
                    any |= queued;
                    self.waiting.pop_front();
                }
                Ok(Err(e)) => {
                    tracing::warn!(error = %e, "an alert waits: the database did not take it; trying again in a second");
                    break;
                }
                Err(_) => {
                    tracing::warn!("an alert waits: the database did not answer; trying again in a second");
                    break;
                }
            }
        }
        if any {
            self.raised.notify_one();
        }
    }
}

/// Whether `rule` sends `event`: it listens for its kind, and a budget event is over its share.
fn applies(rule: &AlertRule, event: &Event) -> bool {
    rule.on.contains(&event.kind) && event.share.is_none_or(|share| share >= rule.budget_share)
}

/// The bytes posted for `event` under `rule` (docs/operations.md, "Alerts").
fn body(rule: &AlertRule, event: &Event, id: &str, now: Millis) -> String {
    let at = chrono::DateTime::from_timestamp_millis(now).unwrap_or_default().to_rfc3339();
    match rule.format {
        AlertFormat::Json => json!({
            "id": id,
            "rule": rule.name,
            "kind": event.kind.as_str(),
            "subject": event.subject,
            "summary": event.summary,
            "raised_at": at,
            "details": event.details,
        })
        .to_string(),
        AlertFormat::Slack => json!({
            "text": format!("rota · {}: {}", slack_text(&rule.name), slack_text(&event.summary)),
            "unfurl_links": false,
            "unfurl_media": false,
        })
        .to_string(),
    }
}

/// Text as Slack shows it literally: `&`, `<` and `>` escaped, so that no `<!channel>`, mention or
/// link is made of it.
fn slack_text(text: &str) -> String {
    text.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;")
}

/// Claims due alerts and posts them.
struct Sender {
    settings: Live,
    store: Arc<dyn Store>,
    clock: Arc<dyn Clock>,
    instance: String,
    http: OnceHttp,
}

impl Sender {
    async fn run(self, raised: Arc<Notify>) {
        loop {
            let _ = tokio::time::timeout(Duration::from_secs(1), raised.notified()).await;
            // A server without rules sends nothing: the outbox is left to those that have them.
            if self.settings.get().config.alerts.is_empty() {
                continue;
            }
            let now = self.clock.now();
            let until = now + CLAIM.as_millis() as Millis;
            let claimed = match self.store.claim_alerts(&self.instance, now, until, BATCH).await {
                Ok(claimed) => claimed,
                Err(e) => {
                    tracing::warn!(error = %e, "claiming alerts to send failed; trying again in a second");
                    continue;
                }
            };
            futures_util::future::join_all(claimed.iter().map(|a| self.deliver(a))).await;
        }
    }

    /// One attempt, recorded with what becomes of the alert.
    async fn deliver(&self, alert: &OutboxAlert) {
        let at = self.clock.now();
        let started = Instant::now();
        let rule = self.settings.get().config.alerts.iter().find(|r| r.name == alert.rule).cloned();
        let (status, error) = match &rule {
            None => (None, Some("no rule of this name is configured any more".to_string())),
            Some(rule) => match self.post(rule, alert).await {
                Ok(status) if (200..300).contains(&status) => (Some(status as i64), None),
                Ok(status) => (Some(status as i64), Some(format!("the receiver answered HTTP {status}"))),
                Err(why) => (None, Some(why)),
            },
        };
        let next = match &error {
            None => AlertNext::Delivered,
            Some(_) if rule.is_none() || at - alert.raised_at >= GIVE_UP.as_millis() as Millis => AlertNext::Failed,
            Some(_) => AlertNext::Retry(at + retry_after(alert.attempts).as_millis() as Millis),
        };
        if let Some(why) = &error {
            tracing::warn!(rule = %alert.rule, alert = %alert.id, attempt = alert.attempts + 1, "alert not delivered: {why}");
        }
        let delivery = AlertDelivery {
            alert_id: alert.id.clone(),
            instance: self.instance.clone(),
            at,
            duration_ms: started.elapsed().as_millis() as i64,
            status,
            error,
        };
        if let Err(e) = self.store.alert_attempted(&delivery, next).await {
            tracing::warn!(error = %e, alert = %alert.id, "recording an alert's delivery failed; its claim runs out and it is sent again");
        }
    }

    /// Posts the alert; the receiver's status, or why there was none (never the URL: a Slack
    /// URL is a secret).
    async fn post(&self, rule: &AlertRule, alert: &OutboxAlert) -> Result<u16, String> {
        let url = rule.url().ok_or("the webhook's URL variable is unset")?;
        let mut request = self
            .http
            .client()
            .post(url)
            .header("content-type", "application/json")
            .header(ID_HEADER, &alert.id)
            .body(alert.body.clone());
        if rule.format == AlertFormat::Json {
            let key = rule.secret().ok_or("the signing key's variable is unset")?;
            request = request.header(SIGNATURE_HEADER, sign(key.expose_secret().as_bytes(), alert.body.as_bytes()));
        }
        match request.send().await {
            Ok(response) => Ok(response.status().as_u16()),
            Err(e) => Err(format!("no answer: {}", e.without_url())),
        }
    }
}

/// `sha256=` and the hex HMAC-SHA256 of `body` under `key`.
pub fn sign(key: &[u8], body: &[u8]) -> String {
    let tag = ring::hmac::sign(&ring::hmac::Key::new(ring::hmac::HMAC_SHA256, key), body);
    let hex: String = tag.as_ref().iter().map(|b| format!("{b:02x}")).collect();
    format!("sha256={hex}")
}

/// The pause after the `attempts`-th failed attempt (0 = the first): 1 s, doubling, up to
/// `RETRY_MAX`.
fn retry_after(attempts: i64) -> Duration {
    Duration::from_secs(1u64 << attempts.clamp(0, 10)).min(RETRY_MAX)
}

/// The webhooks' HTTP client (crate::http), built on first use.
#[derive(Default)]
struct OnceHttp(std::sync::OnceLock<reqwest::Client>);

impl OnceHttp {
    fn client(&self) -> &reqwest::Client {
        self.0.get_or_init(|| crate::http::own_client(Duration::from_secs(5), POST_TIMEOUT))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_pauses_double_from_a_second_to_half_a_minute() {
        let pauses: Vec<u64> = (0..8).map(|n| retry_after(n).as_secs()).collect();
        assert_eq!(pauses, [1, 2, 4, 8, 16, 30, 30, 30]);
    }

    #[test]
    fn the_signature_is_the_hmac_sha256_of_the_body() {
        // RFC 4231, test case 2.
        assert_eq!(
            sign(b"Jefe", b"what do ya want for nothing?"),
            "sha256=5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"
        );
    }

    fn rule(on: &[AlertKind], share: f64) -> AlertRule {
        let text = format!(
            "name = \"r\"\non = {:?}\nurl = \"http://127.0.0.1:9/\"\nsecret_env = \"K\"\nbudget_share = {share}",
            on.iter().map(|k| k.as_str()).collect::<Vec<_>>()
        );
        toml_rule(&text)
    }

    fn toml_rule(text: &str) -> AlertRule {
        use figment::providers::Format;
        figment::Figment::from(figment::providers::Toml::string(text)).extract().expect("a valid rule")
    }

    fn event(kind: AlertKind, share: Option<f64>) -> Event {
        Event { kind, subject: "s".into(), summary: "x".into(), details: json!({}), share }
    }

    #[test]
    fn a_rule_sends_the_kinds_it_names_and_budgets_over_its_share() {
        let r = rule(&[AlertKind::Budget, AlertKind::Paid], 0.8);
        assert!(applies(&r, &event(AlertKind::Paid, None)));
        assert!(!applies(&r, &event(AlertKind::Fallback, None)));
        assert!(applies(&r, &event(AlertKind::Budget, Some(0.8))));
        assert!(!applies(&r, &event(AlertKind::Budget, Some(0.79))));
        assert_eq!(r.min_interval, Duration::from_secs(900), "the default interval is 15 minutes");
    }

    #[test]
    fn a_slack_body_is_its_text_and_a_json_body_names_rule_kind_and_subject() {
        let slack = toml_rule("name = \"s\"\non = [\"paid\"]\nurl = \"http://127.0.0.1:9/\"\nformat = \"slack\"");
        let e = event(AlertKind::Paid, None);
        let b: Value = serde_json::from_str(&body(&slack, &e, "i", 0)).unwrap();
        assert_eq!(b, json!({"text": "rota · s: x", "unfurl_links": false, "unfurl_media": false}));
        let hostile = Event { summary: "<!channel> <http://evil.example|click> <@U1> & co".into(), ..e.clone() };
        let b: Value = serde_json::from_str(&body(&slack, &hostile, "i", 0)).unwrap();
        assert_eq!(b["text"], "rota · s: &lt;!channel&gt; &lt;http://evil.example|click&gt; &lt;@U1&gt; &amp; co");
        let b: Value = serde_json::from_str(&body(&rule(&[AlertKind::Paid], 0.8), &e, "i", 0)).unwrap();
        assert_eq!(
            b,
            json!({"id": "i", "rule": "r", "kind": "paid", "subject": "s", "summary": "x",
                   "raised_at": "1970-01-01T00:00:00+00:00", "details": {}})
        );
    }
}
