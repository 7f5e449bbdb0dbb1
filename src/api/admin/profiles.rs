//! `/api/v1/profiles`: list, add, show, change (`paid`), remove, enable, disable and clear profiles.

use super::{Params, profile_id};
use crate::api::{Actor, Admin, ApiError, ApiState, Body, Operator, Viewer};
use crate::book::{Credential, Roster};
use crate::config::Config;
use crate::engine::{Millis, ProfileId, ProfileType, Reason, UsageStats};
use crate::profiles::{self as rules, Changes};
use crate::status::{QuotaInfo, Status, time};
use crate::store::{Origin, StoredProfile};
use axum::Json;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

pub fn routes() -> OpenApiRouter<ApiState> {
    OpenApiRouter::new()
        .routes(routes!(list_profiles, add_profile))
        .routes(routes!(get_profile, patch_profile, remove_profile))
        .routes(routes!(enable_profile))
        .routes(routes!(disable_profile))
        .routes(routes!(clear_profile))
}

/// A profile as the admin sees it: never its secret.
#[derive(Serialize, ToSchema)]
pub struct ProfileInfo {
    pub id: String,
    pub provider: String,
    pub name: String,
    /// `api_key`, `token`, `oauth` or `client_credentials`.
    #[serde(rename = "type")]
    pub kind: String,
    /// `stored` (added through the API, CLI, web page or an import) or `config` (declared in the config file).
    pub source: String,
    /// `false` after an admin disabled it.
    pub enabled: bool,
    /// Each call costs money: a request it serves raises the `paid` alert (set with `PATCH`, or
    /// `paid = true` in the config file).
    pub paid: bool,
    /// The account's email (OAuth profiles).
    pub email: Option<String>,
    /// When a static token stops working, or an OAuth access token expires (RFC 3339).
    pub expires_at: Option<String>,
    /// The state now: `{"state": "usable"}`, `{"state": "cooling", "until", "reason", "model"}`,
    /// `{"state": "disabled", "until", "reason"}` or `{"state": "unusable", "why"}` (times in Unix ms).
    #[schema(value_type = Object)]
    pub status: Status,
    /// The state in words.
    pub status_text: String,
    /// What the provider's answers last said of the remaining quota, per model
    /// (`profile_quota`), and whether that orders the profile after the others now.
    pub quota: Vec<QuotaInfo>,
    /// usageStats (docs/schema.md, `usage_stats`).
    #[schema(value_type = Object)]
    pub usage_stats: UsageStats,
}

pub(super) fn info(config: &Config, roster: &Roster, id: &ProfileId, now: Millis) -> Option<ProfileInfo> {
    let v = roster.views.get(id)?;
    let status = Status::of(v, now);
    Some(ProfileInfo {
        id: id.to_string(),
        provider: id.provider().to_string(),
        name: id.name().to_string(),
        kind: v.kind.to_string(),
        source: if config.auth.profiles.contains_key(id) { Origin::Config } else { Origin::Stored }.as_str().into(),
        enabled: v.enabled,
        paid: roster.is_paid(config, id),
        email: roster.emails.get(id).cloned(),
        expires_at: v.expires_at.map(time),
        status_text: match &status {
            Status::Disabled { reason: Reason::AuthPermanent, .. } if v.kind == ProfileType::OAuth => {
                "needs re-login: the provider refused its tokens (log in again)".into()
            }
            other => other.display(now),
        },
        status,
        quota: QuotaInfo::of(&v.stats, config.rotation.floor(), now),
        usage_stats: v.stats.clone(),
    })
}

pub(super) fn one(state: &ApiState, id: &ProfileId) -> Result<Json<ProfileInfo>, ApiError> {
    let config = state.runtime.settings();
    let roster = state.runtime.book.roster();
    info(&config.config, &roster, id, state.runtime.clock.now())
        .map(Json)
        .ok_or_else(|| ApiError::NotFound(format!("profile {id} does not exist")))
}

#[derive(Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct ProfileFilter {
    /// Only this provider's profiles.
    pub provider: Option<String>,
}

/// List profiles
#[utoipa::path(get, path = "/api/v1/profiles", tag = "admin", params(ProfileFilter),
    responses((status = 200, body = Vec<ProfileInfo>), (status = 401, body = crate::api::ErrorBody), (status = 403, body = crate::api::ErrorBody)))]
async fn list_profiles(
    State(state): State<ApiState>,
    _: Viewer,
    Params(f): Params<ProfileFilter>,
) -> Json<Vec<ProfileInfo>> {
    let settings = state.runtime.settings();
    let roster = state.runtime.book.roster();
    let now = state.runtime.clock.now();
    let mut ids: Vec<&ProfileId> =
        roster.views.keys().filter(|id| f.provider.as_deref().is_none_or(|p| id.provider() == p)).collect();
    ids.sort();
    Json(ids.into_iter().filter_map(|id| info(&settings.config, &roster, id, now)).collect())
}

#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct NewProfileRequest {
    pub provider: String,
    /// The label: the profile id becomes `provider:name`.
    pub name: String,
    /// `api_key` (default), `token`, or `client_credentials` (an OAuth client: `name` is its
    /// client id, `secret` its client secret).
    #[serde(rename = "type")]
    pub kind: Option<String>,
    /// The API key or token. Write-only: no answer ever returns it.
    pub secret: String,
    /// When a static token stops working (RFC 3339); tokens only.
    pub expires_at: Option<String>,
}

/// Add an API key or token
#[utoipa::path(post, path = "/api/v1/profiles", tag = "admin", request_body = NewProfileRequest,
    responses((status = 201, body = ProfileInfo), (status = 400, body = crate::api::ErrorBody), (status = 401, body = crate::api::ErrorBody),
        (status = 403, body = crate::api::ErrorBody), (status = 409, body = crate::api::ErrorBody)))]
async fn add_profile(
    State(state): State<ApiState>,
    Operator(actor): Operator,
    Body(req): Body<NewProfileRequest>,
) -> Result<(StatusCode, Json<ProfileInfo>), ApiError> {
    let settings = state.runtime.settings();
    let now = state.runtime.clock.now();
    let kind = req.kind.as_deref().unwrap_or("api_key");
    let new = rules::check_new(&settings.config, &req.provider, &req.name, kind, req.expires_at.as_deref(), now)
        .map_err(ApiError::BadRequest)?;
    let allow = settings.config.providers.get(&req.provider).and_then(|p| p.client_credentials.as_ref());
    let allow = allow.and_then(|c| c.allow_token_uri.as_deref());
    let secret = rules::check_secret(&req.secret, new.kind, new.id.name(), allow).map_err(ApiError::BadRequest)?;
    let sealed = state.key.seal(&new.id, new.field, &secret);
    let profile = StoredProfile::stored(new.id.clone(), new.kind, new.expires_at, now);
    changes(&state).add(&profile, &[sealed], Credential::new(new.kind, secret)).await?;
    tracing::info!(profile = %new.id, "profile added through the admin API");
    let added = one(&state, &new.id)?.0;
    state.record(&actor, "profile.add", Some(new.id.as_str()), (None, Some(summary(&added)))).await?;
    Ok((StatusCode::CREATED, Json(added)))
}

/// One profile
#[utoipa::path(get, path = "/api/v1/profiles/{id}", tag = "admin", params(("id" = String, Path, description = "provider:name")),
    responses((status = 200, body = ProfileInfo), (status = 400, body = crate::api::ErrorBody), (status = 404, body = crate::api::ErrorBody)))]
async fn get_profile(
    State(state): State<ApiState>,
    _: Viewer,
    Path(id): Path<String>,
) -> Result<Json<ProfileInfo>, ApiError> {
    one(&state, &profile_id(&id)?)
}

#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ProfilePatch {
    /// Each call costs money: a request it serves raises the `paid` alert.
    pub paid: bool,
}

/// Change a profile: mark it paid or not
#[utoipa::path(patch, path = "/api/v1/profiles/{id}", tag = "admin", params(("id" = String, Path, description = "provider:name")),
    request_body = ProfilePatch,
    responses((status = 200, body = ProfileInfo), (status = 400, body = crate::api::ErrorBody), (status = 404, body = crate::api::ErrorBody),
        (status = 409, description = "Declared `paid = true` in the config file", body = crate::api::ErrorBody)))]
async fn patch_profile(
    State(state): State<ApiState>,
    Operator(actor): Operator,
    Path(id): Path<String>,
    Body(patch): Body<ProfilePatch>,
) -> Result<Json<ProfileInfo>, ApiError> {
    let id = profile_id(&id)?;
    let declared = state.runtime.settings().config.auth.profiles.get(&id).is_some_and(|p| p.paid);
    if declared && !patch.paid {
        return Err(ApiError::Conflict(format!(
            "profile {id} is declared `paid = true` in the config file; change it there"
        )));
    }
    let before = summary(&one(&state, &id)?.0);
    changes(&state).set_paid(&id, patch.paid).await?;
    let after = one(&state, &id)?;
    state.record(&actor, "profile.paid", Some(id.as_str()), (Some(before), Some(summary(&after.0)))).await?;
    Ok(after)
}

/// Remove a stored profile and its secret
#[utoipa::path(delete, path = "/api/v1/profiles/{id}", tag = "admin", params(("id" = String, Path, description = "provider:name")),
    responses((status = 204, description = "Removed"), (status = 400, body = crate::api::ErrorBody), (status = 404, body = crate::api::ErrorBody),
        (status = 409, description = "Declared in the config file", body = crate::api::ErrorBody)))]
async fn remove_profile(
    State(state): State<ApiState>,
    Admin(actor): Admin,
    Path(id): Path<String>,
) -> Result<StatusCode, ApiError> {
    let id = profile_id(&id)?;
    let settings = state.runtime.settings();
    if settings.config.auth.profiles.contains_key(&id) {
        return Err(ApiError::Conflict(format!("profile {id} is declared in the config file; remove it there")));
    }
    let before = summary(&one(&state, &id)?.0);
    changes(&state).remove(&id).await?;
    tracing::info!(profile = %id, "profile removed through the admin API");
    state.record(&actor, "profile.delete", Some(id.as_str()), (Some(before), None)).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// What an admin action records of a profile: its type, whether rotation may use it, its state.
fn summary(p: &ProfileInfo) -> serde_json::Value {
    serde_json::json!({"type": p.kind, "enabled": p.enabled, "paid": p.paid, "state": p.status_text, "expires_at": p.expires_at})
}

async fn set_enabled(state: ApiState, actor: &Actor, raw: &str, enabled: bool) -> Result<Json<ProfileInfo>, ApiError> {
    let id = profile_id(raw)?;
    let before = summary(&one(&state, &id)?.0);
    changes(&state).set_enabled(&id, enabled).await?;
    let after = one(&state, &id)?;
    let action = if enabled { "profile.enable" } else { "profile.disable" };
    state.record(actor, action, Some(id.as_str()), (Some(before), Some(summary(&after.0)))).await?;
    Ok(after)
}

/// Let rotation use the profile again
#[utoipa::path(post, path = "/api/v1/profiles/{id}/enable", tag = "admin", params(("id" = String, Path, description = "provider:name")),
    responses((status = 200, body = ProfileInfo), (status = 400, body = crate::api::ErrorBody), (status = 404, body = crate::api::ErrorBody)))]
async fn enable_profile(
    State(state): State<ApiState>,
    Operator(actor): Operator,
    Path(id): Path<String>,
) -> Result<Json<ProfileInfo>, ApiError> {
    set_enabled(state, &actor, &id, true).await
}

/// Keep rotation from using the profile
#[utoipa::path(post, path = "/api/v1/profiles/{id}/disable", tag = "admin", params(("id" = String, Path, description = "provider:name")),
    responses((status = 200, body = ProfileInfo), (status = 400, body = crate::api::ErrorBody), (status = 404, body = crate::api::ErrorBody)))]
async fn disable_profile(
    State(state): State<ApiState>,
    Operator(actor): Operator,
    Path(id): Path<String>,
) -> Result<Json<ProfileInfo>, ApiError> {
    set_enabled(state, &actor, &id, false).await
}

/// Clear the profile's cooldown and disabled state
#[utoipa::path(post, path = "/api/v1/profiles/{id}/clear", tag = "admin", params(("id" = String, Path, description = "provider:name")),
    responses((status = 200, body = ProfileInfo), (status = 400, body = crate::api::ErrorBody), (status = 404, body = crate::api::ErrorBody)))]
async fn clear_profile(
    State(state): State<ApiState>,
    Operator(actor): Operator,
    Path(id): Path<String>,
) -> Result<Json<ProfileInfo>, ApiError> {
    let id = profile_id(&id)?;
    let before = summary(&one(&state, &id)?.0);
    changes(&state).clear(&state.runtime.settings().config, &id, state.runtime.clock.now()).await?;
    let after = one(&state, &id)?;
    state.record(&actor, "profile.clear", Some(id.as_str()), (Some(before), Some(summary(&after.0)))).await?;
    Ok(after)
}

/// Profile changes through the store, then the running book.
pub(super) fn changes(state: &ApiState) -> Changes<'_> {
    Changes::new(state.store.as_ref(), Some(&state.runtime.book))
}
