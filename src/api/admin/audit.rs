//! `/api/v1/usage`, `/api/v1/attempts` and `/api/v1/requests`: usage per profile and the audit log.

use super::{Params, profile_id};
use crate::api::{ApiError, ApiState, Viewer};
use crate::engine::{Millis, Reason, UsageStats};
use crate::status::{Status, time};
use crate::store::{AttemptRecord, AuditQuery, ProfileUsage, RequestRecord};
use axum::Json;
use axum::extract::State;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use utoipa::{IntoParams, ToSchema};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

pub fn routes() -> OpenApiRouter<ApiState> {
    OpenApiRouter::new().routes(routes!(usage)).routes(routes!(list_attempts)).routes(routes!(list_requests))
}

/// A time: RFC 3339 or Unix milliseconds.
pub(super) fn parse_time(raw: &str, what: &str) -> Result<Millis, ApiError> {
    let ms = match raw.parse::<Millis>() {
        Ok(ms) => ms,
        Err(_) => chrono::DateTime::parse_from_rfc3339(raw)
            .map(|t| t.timestamp_millis())
            .map_err(|_| ApiError::BadRequest(format!("{what} `{raw}` is neither RFC 3339 nor Unix milliseconds")))?,
    };
    // 1970 to 9999: every range and bucket computed from the time then stays far from overflow.
    if !(0..=TIME_MAX).contains(&ms) {
        return Err(ApiError::BadRequest(format!("{what} `{raw}` is out of range: from 1970 to 9999")));
    }
    Ok(ms)
}

/// 9999-12-31T23:59:59.999Z, the latest time a range may name.
const TIME_MAX: Millis = 253_402_300_799_999;

#[derive(Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct UsageParams {
    /// Start of the range (RFC 3339 or Unix ms); default 24 hours before `until`.
    pub since: Option<String>,
    /// End of the range, exclusive; default now.
    pub until: Option<String>,
}

#[derive(Serialize, ToSchema)]
pub struct UsageInfo {
    pub since: String,
    pub until: String,
    pub profiles: Vec<ProfileUsageInfo>,
}

#[derive(Serialize, ToSchema)]
pub struct ProfileUsageInfo {
    /// Attempts, successes, failures and tokens in the range, from the audit log.
    #[serde(flatten)]
    pub counts: ProfileUsage,
    /// The state now (absent for a profile removed since).
    pub status_text: Option<String>,
    /// usageStats now (absent for a profile removed since).
    #[schema(value_type = Option<Object>)]
    pub usage_stats: Option<UsageStats>,
}

/// Usage per profile
#[utoipa::path(get, path = "/api/v1/usage", tag = "admin", params(UsageParams),
    responses((status = 200, body = UsageInfo), (status = 400, body = crate::api::ErrorBody)))]
async fn usage(
    State(state): State<ApiState>,
    _: Viewer,
    Params(p): Params<UsageParams>,
) -> Result<Json<UsageInfo>, ApiError> {
    let now = state.runtime.clock.now();
    let until = p.until.as_deref().map(|u| parse_time(u, "until")).transpose()?.unwrap_or(now);
    let since = p.since.as_deref().map(|s| parse_time(s, "since")).transpose()?.unwrap_or(until - 86_400_000);
    if since >= until {
        return Err(ApiError::BadRequest("since must be before until".into()));
    }
    let counted = state.store.usage(since, until).await.map_err(ApiError::from)?;
    let roster = state.runtime.book.roster();
    let mut rows: BTreeMap<String, ProfileUsageInfo> = roster
        .views
        .iter()
        .map(|(id, v)| {
            let counts = ProfileUsage { profile_id: id.to_string(), ..Default::default() };
            let info = ProfileUsageInfo {
                counts,
                status_text: Some(Status::of(v, now).display(now)),
                usage_stats: Some(v.stats.clone()),
            };
            (id.to_string(), info)
        })
        .collect();
    for counts in counted {
        let removed = || ProfileUsageInfo { counts: ProfileUsage::default(), status_text: None, usage_stats: None };
        let id = counts.profile_id.clone();
        rows.entry(id).or_insert_with(removed).counts = counts;
    }
    Ok(Json(UsageInfo { since: time(since), until: time(until), profiles: rows.into_values().collect() }))
}

#[derive(Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct AuditParams {
    pub agent: Option<String>,
    pub request_id: Option<String>,
    /// A profile id (`provider:name`).
    pub profile: Option<String>,
    pub provider: Option<String>,
    /// The model as the provider knows it (`gpt-4.1`), or `provider/model`.
    pub model: Option<String>,
    /// A failure reason (docs/rotation.md), e.g. `rate_limit`.
    pub reason: Option<String>,
    /// `success`, `failure` or `skipped`.
    pub outcome: Option<String>,
    /// `started_at >= since` (RFC 3339 or Unix ms).
    pub since: Option<String>,
    /// `started_at < until` (RFC 3339 or Unix ms).
    pub until: Option<String>,
    /// Page size, 1 to 1000 (default 100).
    pub limit: Option<u32>,
    /// `next_cursor` of the previous page.
    pub cursor: Option<String>,
}

impl AuditParams {
    fn query(self) -> Result<AuditQuery, ApiError> {
        let limit = self.limit.unwrap_or(100);
        if !(1..=1000).contains(&limit) {
            return Err(ApiError::BadRequest(format!("limit {limit} is out of range (1 to 1000)")));
        }
        if let Some(p) = &self.profile {
            profile_id(p)?;
        }
        if let Some(r) = &self.reason {
            r.parse::<Reason>().map_err(|e| ApiError::BadRequest(e.to_string()))?;
        }
        if let Some(o) = self.outcome.as_deref().filter(|o| !matches!(*o, "success" | "failure" | "skipped")) {
            return Err(ApiError::BadRequest(format!("outcome `{o}` is not success, failure or skipped")));
        }
        let (mut provider, mut model) = (self.provider, self.model);
        if let Some((p, m)) = model.as_deref().and_then(crate::engine::chain::split_model_ref) {
            if provider.as_deref().is_some_and(|given| given != p) {
                return Err(ApiError::BadRequest(format!("model {p}/{m} contradicts provider {}", provider.unwrap())));
            }
            (provider, model) = (Some(p.to_string()), Some(m.to_string()));
        }
        let after = self
            .cursor
            .as_deref()
            .map(|c| {
                let mut parts = c.splitn(3, '.');
                let bad = || ApiError::BadRequest(format!("cursor `{c}` is not a next_cursor of this API"));
                let at = parts.next().and_then(|p| p.parse::<Millis>().ok()).ok_or_else(bad)?;
                let seq = parts.next().and_then(|p| p.parse::<i64>().ok()).ok_or_else(bad)?;
                let id = parts.next().filter(|p| !p.is_empty()).ok_or_else(bad)?;
                Ok::<_, ApiError>((at, id.to_string(), seq))
            })
            .transpose()?;
        Ok(AuditQuery {
            agent: self.agent,
            request_id: self.request_id,
            profile: self.profile,
            provider,
            model,
            reason: self.reason,
            outcome: self.outcome,
            since: self.since.as_deref().map(|s| parse_time(s, "since")).transpose()?,
            until: self.until.as_deref().map(|u| parse_time(u, "until")).transpose()?,
            after,
            // One more than asked, to tell whether a next page exists.
            limit: limit + 1,
        })
    }
}

#[derive(Serialize, ToSchema)]
pub struct AttemptPage {
    pub items: Vec<AttemptRecord>,
    /// Pass as `cursor` for the next (older) page; absent on the last page.
    pub next_cursor: Option<String>,
}

#[derive(Serialize, ToSchema)]
pub struct RequestPage {
    pub items: Vec<RequestRecord>,
    /// Pass as `cursor` for the next (older) page; absent on the last page.
    pub next_cursor: Option<String>,
}

pub(super) fn page<T>(mut rows: Vec<T>, limit: u32, key: impl Fn(&T) -> String) -> (Vec<T>, Option<String>) {
    if rows.len() as u32 > limit - 1 {
        rows.truncate(limit as usize - 1);
        let cursor = rows.last().map(key);
        return (rows, cursor);
    }
    (rows, None)
}

/// The attempts log, newest first
#[utoipa::path(get, path = "/api/v1/attempts", tag = "admin", params(AuditParams),
    responses((status = 200, body = AttemptPage), (status = 400, body = crate::api::ErrorBody)))]
async fn list_attempts(
    State(state): State<ApiState>,
    _: Viewer,
    Params(p): Params<AuditParams>,
) -> Result<Json<AttemptPage>, ApiError> {
    let q = p.query()?;
    state.runtime.audit.flush_within(std::time::Duration::from_secs(2)).await;
    let rows = state.store.attempts(&q).await.map_err(ApiError::from)?;
    let (items, next_cursor) = page(rows, q.limit, |r| format!("{}.{}.{}", r.started_at, r.seq, r.request_id));
    Ok(Json(AttemptPage { items, next_cursor }))
}

/// The requests log, newest first
///
/// The profile, provider, model, reason and outcome filters select requests with at least one
/// matching attempt.
#[utoipa::path(get, path = "/api/v1/requests", tag = "admin", params(AuditParams),
    responses((status = 200, body = RequestPage), (status = 400, body = crate::api::ErrorBody)))]
async fn list_requests(
    State(state): State<ApiState>,
    _: Viewer,
    Params(p): Params<AuditParams>,
) -> Result<Json<RequestPage>, ApiError> {
    let q = p.query()?;
    state.runtime.audit.flush_within(std::time::Duration::from_secs(2)).await;
    let rows = state.store.requests(&q).await.map_err(ApiError::from)?;
    let (items, next_cursor) = page(rows, q.limit, |r| format!("{}.0.{}", r.started_at, r.id));
    Ok(Json(RequestPage { items, next_cursor }))
}
