//! Console sign-in: an admin key buys a session cookie and a CSRF token.

use super::roles::Person;
use super::{Actor, ApiState, Role};
use super::{ApiError, Body};
use crate::agents::Agent;
use crate::engine::Millis;
use crate::web::{self, BACKGROUND, COOKIE, SESSION_TTL};
use axum::Json;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use parking_lot::Mutex;
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use utoipa::ToSchema;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

pub fn routes() -> OpenApiRouter<ApiState> {
    OpenApiRouter::new().routes(routes!(sign_in, current, sign_out))
}

/// `/ui/`: the console with a session, else the sign-in page.
pub async fn console(State(state): State<ApiState>, headers: HeaderMap) -> Response {
    let settings = state.runtime.settings();
    let sso = settings.config.console.sso.as_ref().map(|s| s.label.as_str());
    web::console_page(state.session(&headers).is_some(), sso)
}

#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct SignIn {
    /// An admin agent's key (`rota agents create NAME --admin`).
    pub key: String,
}

#[derive(Serialize, ToSchema)]
pub struct SessionInfo {
    /// Who is signed in: the agent's name, or the person's verified email (else their subject).
    pub agent: String,
    /// `agent` or `person`.
    pub kind: String,
    pub role: Role,
    /// Send it as `x-csrf-token` with every POST, PUT and DELETE of this session.
    pub csrf: String,
}

/// Sign in to the console
///
/// Sets the session cookie (`HttpOnly; SameSite=Strict`, and `Secure` when `server.public_url`
/// is https). The session ends after `server.session_idle` unused, 12 hours at most.
#[utoipa::path(post, path = "/api/v1/session", tag = "console", security(()), request_body = SignIn,
    responses((status = 200, body = SessionInfo), (status = 400, body = super::ErrorBody),
        (status = 401, body = super::ErrorBody), (status = 403, body = super::ErrorBody)))]
async fn sign_in(State(state): State<ApiState>, Body(req): Body<SignIn>) -> Result<Response, ApiError> {
    let agent = state
        .agents
        .find(req.key.trim())
        .await
        .ok_or_else(|| ApiError::Unauthorized("invalid or revoked agent key".into()))?;
    if !agent.admin {
        return Err(ApiError::Forbidden(format!("agent {} is not an admin", agent.name)));
    }
    let settings = state.runtime.settings();
    let server = &settings.config.server;
    let actor = Actor::agent(&agent.name);
    let (token, session) =
        state.sessions.create(actor, Opener::Agent(agent), state.runtime.clock.now(), server.session_idle);
    tracing::info!(agent = %session.actor.name, "console sign-in");
    state.record(&session.actor, "session.sign_in", None, (None, None)).await?;
    let body = SessionInfo::of(&session);
    Ok(([(header::SET_COOKIE, web::set_cookie(Some(&token), server.secure_cookies()))], Json(body)).into_response())
}

/// The current console session
#[utoipa::path(get, path = "/api/v1/session", tag = "console", security(()),
    responses((status = 200, body = SessionInfo), (status = 401, body = super::ErrorBody)))]
async fn current(State(state): State<ApiState>, headers: HeaderMap) -> Result<Json<SessionInfo>, ApiError> {
    let s = state
        .session(&headers)
        .ok_or_else(|| ApiError::Unauthorized(format!("no console session (cookie {COOKIE})")))?;
    Ok(Json(SessionInfo::of(&s)))
}

/// Sign out
#[utoipa::path(delete, path = "/api/v1/session", tag = "console", security(()),
    responses((status = 204, description = "Signed out"), (status = 401, body = super::ErrorBody), (status = 403, body = super::ErrorBody)))]
async fn sign_out(State(state): State<ApiState>, headers: HeaderMap) -> Result<Response, ApiError> {
    let s = state.session(&headers).ok_or_else(|| ApiError::Unauthorized("no console session".into()))?;
    if !s.csrf_ok(headers.get("x-csrf-token").and_then(|v| v.to_str().ok())) {
        return Err(ApiError::Csrf("missing or wrong x-csrf-token"));
    }
    state.sessions.end(&s.id);
    state.record(&s.actor, "session.sign_out", None, (None, None)).await?;
    let secure = state.runtime.settings().config.server.secure_cookies();
    Ok((StatusCode::NO_CONTENT, [(header::SET_COOKIE, web::set_cookie(None, secure))]).into_response())
}

impl SessionInfo {
    fn of(s: &Session) -> SessionInfo {
        let a = &s.actor;
        SessionInfo { agent: a.shown().to_string(), kind: a.kind().into(), role: a.role, csrf: s.csrf.clone() }
    }
}

/// Who opened a console session: an admin agent with its key, or a person through the
/// identity provider.
#[derive(Clone, Debug)]
pub enum Opener {
    Agent(Agent),
    Person(Person),
}

#[derive(Clone, Debug)]
pub struct Session {
    pub actor: Actor,
    opener: Opener,
    pub csrf: String,
    /// The digest of the cookie's token: what OAuth logins started in this session are bound to.
    pub id: String,
    expires_at: Millis,
    /// Unused for this long, the session ends (`server.session_idle` when it was created).
    idle: Millis,
    last_used: Millis,
}

impl Session {
    fn live(&self, now: Millis) -> bool {
        self.expires_at > now && now - self.last_used < self.idle
    }

    /// Whether `presented` is this session's CSRF token (compared as digests).
    pub fn csrf_ok(&self, presented: Option<&str>) -> bool {
        presented.is_some_and(|p| web::digest(p) == web::digest(&self.csrf))
    }
}

/// Console sessions, in memory: a restart signs everyone out.
#[derive(Default)]
pub struct Sessions {
    by_digest: Mutex<HashMap<String, Session>>,
}

impl Sessions {
    /// A new session for `actor` (opened with an agent's key, or by a person) that ends after
    /// `idle` unused (and 12 hours at most): the cookie's value and the session.
    pub fn create(&self, actor: Actor, opener: Opener, now: Millis, idle: std::time::Duration) -> (String, Session) {
        let token = web::random_token();
        let id = web::digest(&token);
        let idle = Millis::try_from(idle.as_millis()).unwrap_or(Millis::MAX).max(1);
        let session = Session {
            actor,
            opener,
            csrf: web::random_token(),
            id: id.clone(),
            expires_at: now + SESSION_TTL,
            idle,
            last_used: now,
        };
        let mut map = self.by_digest.lock();
        map.retain(|_, s| s.live(now));
        map.insert(id, session.clone());
        (token, session)
    }

    /// The session the request's cookie names, if it is live (used within its idle timeout,
    /// younger than 12 hours) and its opener still admitted: an agent that is still an active
    /// admin (a key revoked or demoted anywhere, by the CLI or another instance too, ends its
    /// sessions at their next use), a person whom the config in force still gives a role
    /// (`role`: the session carries that role from then on, lower or higher). Finding it counts
    /// as a use, its idle timeout starting again, unless the request says it is the console's
    /// own background refresh (`x-rota-background`).
    pub fn find(
        &self,
        headers: &HeaderMap,
        now: Millis,
        admitted: impl Fn(&Agent) -> bool,
        role: impl Fn(&Person) -> Option<Role>,
    ) -> Option<Session> {
        let token = web::cookie(headers, COOKIE)?;
        let id = web::digest(token);
        let mut map = self.by_digest.lock();
        let session = map.get_mut(&id)?;
        let now_role = match &session.opener {
            Opener::Agent(a) => admitted(a).then_some(Role::Admin),
            Opener::Person(p) => role(p),
        };
        let Some(now_role) = now_role.filter(|_| session.live(now)) else {
            map.remove(&id);
            return None;
        };
        session.actor.role = now_role;
        if !headers.contains_key(BACKGROUND) {
            session.last_used = session.last_used.max(now);
        }
        Some(session.clone())
    }

    pub fn end(&self, id: &str) {
        self.by_digest.lock().remove(id);
    }

    /// Ends every session of an agent (its key was revoked).
    pub fn end_agent(&self, name: &str) {
        self.by_digest.lock().retain(|_, s| !matches!(&s.opener, Opener::Agent(a) if a.name == name));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;

    /// An admin agent `ops`, as a session's actor and agent.
    fn ops() -> (Actor, Opener) {
        (Actor::agent("ops"), Opener::Agent(ops_agent()))
    }

    fn ops_agent() -> Agent {
        Agent {
            id: "1".into(),
            name: "ops".into(),
            admin: true,
            created_at: 0,
            revoked_at: None,
            limits: Default::default(),
            models: None,
        }
    }

    #[test]
    fn an_idle_session_ends_and_each_use_extends_it() {
        let s = Sessions::default();
        let agent = ops();
        let (token, _) = s.create(agent.0, agent.1, 0, std::time::Duration::from_secs(60));
        let mut h = HeaderMap::new();
        h.insert(header::COOKIE, HeaderValue::from_str(&format!("{COOKIE}={token}")).unwrap());
        for minute in 1..=5 {
            let now = minute * 59_000;
            assert!(s.find(&h, now, |_| true, |_| None).is_some(), "used every 59 s: alive at {now} ms");
        }
        assert!(s.find(&h, 5 * 59_000 + 60_000, |_| true, |_| None).is_none(), "60 s unused: gone");
        assert!(s.find(&h, 5 * 59_000 + 1_000, |_| true, |_| None).is_none(), "and it stays gone");
    }

    #[test]
    fn sessions_expire_and_end() {
        let s = Sessions::default();
        let agent = ops();
        let forever = std::time::Duration::from_millis(SESSION_TTL as u64 * 2);
        let (token, session) = s.create(agent.0.clone(), agent.1.clone(), 1_000, forever);
        let mut h = HeaderMap::new();
        let with = |h: &mut HeaderMap, token: &str| {
            h.insert(header::COOKIE, HeaderValue::from_str(&format!("{COOKIE}={token}")).unwrap());
        };
        with(&mut h, &token);
        let admitted = |_: &Agent| true;
        assert_eq!(s.find(&h, 2_000, admitted, |_| None).map(|x| x.id), Some(session.id.clone()));
        assert!(session.csrf_ok(Some(&session.csrf)) && !session.csrf_ok(Some("x")) && !session.csrf_ok(None));
        assert!(s.find(&h, 3_000, |_| false, |_| None).is_none(), "the agent is no longer an active admin");
        assert!(s.find(&h, 4_000, admitted, |_| None).is_none(), "and the session is gone");
        let (token, _) = s.create(agent.0, agent.1, 1_000, forever);
        with(&mut h, &token);
        assert!(s.find(&h, SESSION_TTL, admitted, |_| None).is_some(), "used all along, it lasts its 12 hours");
        assert!(s.find(&h, 1_000 + SESSION_TTL, admitted, |_| None).is_none(), "and not longer");
        let (token, _) =
            s.create(session.actor.clone(), session.opener.clone(), 1_000, std::time::Duration::from_secs(60));
        h.insert(header::COOKIE, HeaderValue::from_str(&format!("{COOKIE}={token}")).unwrap());
        s.end_agent("ops");
        assert!(s.find(&h, 2_000, admitted, |_| None).is_none());
    }

    #[test]
    fn a_persons_session_carries_the_role_the_config_gives_now() {
        let s = Sessions::default();
        let person = Person {
            subject: "https://idp s1".into(),
            email: Some("p@example.com".into()),
            groups: vec![],
            claimed_roles: vec![],
        };
        let actor =
            Actor { name: person.subject.clone(), person: true, role: Role::Admin, email: person.email.clone() };
        let (token, _) = s.create(actor, Opener::Person(person), 0, std::time::Duration::from_secs(600));
        let mut h = HeaderMap::new();
        h.insert(header::COOKIE, HeaderValue::from_str(&format!("{COOKIE}={token}")).unwrap());
        let role_at = |now, role: Option<Role>| s.find(&h, now, |_| true, |_| role).map(|x| x.actor.role);
        assert_eq!(role_at(1_000, Some(Role::Admin)), Some(Role::Admin));
        assert_eq!(role_at(2_000, Some(Role::Viewer)), Some(Role::Viewer), "demoted: the lower role at once");
        assert_eq!(role_at(3_000, Some(Role::Operator)), Some(Role::Operator));
        assert_eq!(role_at(4_000, None), None, "removed: signed out");
        assert_eq!(role_at(5_000, Some(Role::Admin)), None, "and it stays out");
    }
}
