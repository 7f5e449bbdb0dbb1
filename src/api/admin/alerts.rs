//! `/api/v1/alerts`: the `[[alerts]]` rules (never their URLs' paths or secrets), the recent
//! alerts with their delivery attempts, and a test send per rule (docs/operations.md, "Alerts").

use crate::api::{Admin, ApiError, ApiState, Viewer};
use crate::config::{AlertFormat, AlertKind, AlertRule};
use crate::engine::Millis;
use crate::store::AlertRecord;
use axum::Json;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use serde::Serialize;
use utoipa::ToSchema;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

pub fn routes() -> OpenApiRouter<ApiState> {
    OpenApiRouter::new().routes(routes!(alerts)).routes(routes!(test_rule))
}

/// How many recent alerts `GET /api/v1/alerts` lists.
const RECENT: i64 = 50;

#[derive(Serialize, ToSchema)]
pub struct AlertsView {
    pub rules: Vec<RuleInfo>,
    /// The newest alerts first, at most 50.
    pub alerts: Vec<AlertInfo>,
}

/// A rule as the console shows it: where it posts is only a scheme and host, since a webhook's
/// path often is its secret (Slack's).
#[derive(Serialize, ToSchema)]
pub struct RuleInfo {
    pub name: String,
    /// The events it sends.
    pub on: Vec<String>,
    /// `json` or `slack`.
    pub format: String,
    /// `https://host` of its webhook; `None` when `url_env` names a variable that is not set.
    pub destination: Option<String>,
    /// The variable its URL is read from, when it is given by one.
    pub url_env: Option<String>,
    /// Its bodies carry `x-rota-signature` (a `json` rule whose `secret_env` is set).
    pub signed: bool,
    /// At most one alert per subject in this many seconds.
    pub min_interval_secs: u64,
    /// At most this many alerts per interval from one server.
    pub cap: u32,
}

impl RuleInfo {
    fn of(rule: &AlertRule) -> RuleInfo {
        RuleInfo {
            name: rule.name.clone(),
            on: rule.on.iter().map(|k| k.as_str().to_string()).collect(),
            format: match rule.format {
                AlertFormat::Json => "json",
                AlertFormat::Slack => "slack",
            }
            .into(),
            destination: rule.url().as_deref().and_then(origin),
            url_env: rule.url_env.clone(),
            signed: rule.format == AlertFormat::Json && rule.secret().is_some(),
            min_interval_secs: rule.min_interval.as_secs(),
            cap: rule.cap,
        }
    }
}

/// `scheme://host[:port]` of a URL: no user, path or query.
fn origin(url: &str) -> Option<String> {
    let url = reqwest::Url::parse(url).ok()?;
    let host = url.host_str()?;
    Some(match url.port() {
        Some(port) => format!("{}://{host}:{port}", url.scheme()),
        None => format!("{}://{host}", url.scheme()),
    })
}

/// One attempt to deliver an alert.
#[derive(Serialize, ToSchema)]
pub struct DeliveryInfo {
    /// When it started (Unix ms).
    pub at: Millis,
    pub duration_ms: i64,
    /// The receiver's HTTP status; `None` when it did not answer.
    pub status: Option<i64>,
    /// Why it was not delivered; `None` when it was.
    pub error: Option<String>,
}

#[derive(Serialize, ToSchema)]
pub struct AlertInfo {
    pub id: String,
    pub rule: String,
    /// The event (`test` for a test send).
    pub kind: String,
    pub subject: String,
    /// The line posted (a `json` body's `summary`, a Slack body's `text`).
    pub summary: String,
    /// When it was raised (Unix ms).
    pub raised_at: Millis,
    /// `pending`, `delivered` or `failed`.
    pub state: String,
    pub delivered_at: Option<Millis>,
    pub deliveries: Vec<DeliveryInfo>,
}

impl AlertInfo {
    fn of(a: AlertRecord) -> AlertInfo {
        let body: serde_json::Value = serde_json::from_str(&a.body).unwrap_or_default();
        let summary = body.get("summary").or_else(|| body.get("text")).and_then(|v| v.as_str()).unwrap_or_default();
        AlertInfo {
            summary: summary.to_string(),
            id: a.id,
            rule: a.rule,
            kind: a.kind,
            subject: a.subject,
            raised_at: a.raised_at,
            state: a.state,
            delivered_at: a.delivered_at,
            deliveries: a
                .deliveries
                .into_iter()
                .map(|d| DeliveryInfo { at: d.at, duration_ms: d.duration_ms, status: d.status, error: d.error })
                .collect(),
        }
    }
}

/// Alert rules and recent alerts
#[utoipa::path(get, path = "/api/v1/alerts", tag = "admin",
    responses((status = 200, body = AlertsView), (status = 401, body = crate::api::ErrorBody), (status = 403, body = crate::api::ErrorBody)))]
async fn alerts(State(state): State<ApiState>, _: Viewer) -> Result<Json<AlertsView>, ApiError> {
    let rules = state.runtime.settings().config.alerts.iter().map(RuleInfo::of).collect();
    let alerts = state.store.recent_alerts(RECENT).await?.into_iter().map(AlertInfo::of).collect();
    Ok(Json(AlertsView { rules, alerts }))
}

#[derive(Serialize, ToSchema)]
pub struct TestSent {
    /// The test alert's id: its row in `GET /api/v1/alerts` tells whether it was delivered.
    pub id: String,
}

/// Send a test alert through a rule
#[utoipa::path(post, path = "/api/v1/alerts/{rule}/test", tag = "admin", params(("rule" = String, Path, description = "the rule's name")),
    responses((status = 202, body = TestSent), (status = 401, body = crate::api::ErrorBody), (status = 403, body = crate::api::ErrorBody),
        (status = 404, body = crate::api::ErrorBody), (status = 409, body = crate::api::ErrorBody)))]
async fn test_rule(
    State(state): State<ApiState>,
    Admin(actor): Admin,
    Path(rule): Path<String>,
) -> Result<(StatusCode, Json<TestSent>), ApiError> {
    if !state.runtime.settings().config.alerts.iter().any(|r| r.name == rule) {
        return Err(ApiError::NotFound(format!("no alert rule is named `{}`", rule.escape_default())));
    }
    let by = actor.email.clone().unwrap_or_else(|| actor.name.clone());
    let Some(id) = state.runtime.alerts.test(&rule, &by).await? else {
        return Err(ApiError::Conflict("a later test of this rule is on record (has the clock stepped back?)".into()));
    };
    tracing::info!(rule = %rule, "test alert sent through the admin API");
    state
        .record(
            &actor,
            "alert.test",
            Some(&rule),
            (None, Some(serde_json::json!({"id": id, "kind": AlertKind::Test.as_str()}))),
        )
        .await?;
    Ok((StatusCode::ACCEPTED, Json(TestSent { id })))
}
