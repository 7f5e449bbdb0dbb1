//! Who may do what through the admin API and the console (docs/operations.md, "Roles"): a
//! `viewer` sees everything but secrets and changes nothing, an `operator` also runs the
//! accounts (enable, disable, clear, order, add and re-login them), an `admin` also manages
//! agents, keys, limits and deletions. An admin agent's key is an admin; a person signed in
//! through the console's identity provider has the role the sign-in gave.

use super::{ApiError, ApiState, Caller};
use crate::access::presented_key;
use axum::extract::FromRequestParts;
use axum::http::request::Parts;
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum Role {
    Viewer,
    Operator,
    Admin,
}

impl Role {
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Viewer => "viewer",
            Role::Operator => "operator",
            Role::Admin => "admin",
        }
    }
}

/// Who makes a request of the admin API: an agent (by its key or its console session) or a
/// person (a console session from the identity provider), with their role.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Actor {
    /// The agent's name, or the person's email (else their subject).
    pub name: String,
    pub person: bool,
    pub role: Role,
}

impl Actor {
    pub fn kind(&self) -> &'static str {
        if self.person { "person" } else { "agent" }
    }
}

/// The actor of a request that needs `need`: a console session's (whose changes carry its CSRF
/// token), else an admin agent's key.
async fn actor(parts: &mut Parts, state: &ApiState, need: Role) -> Result<Actor, ApiError> {
    let session = match presented_key(&parts.headers) {
        None => state.session(&parts.headers),
        Some(_) => None,
    };
    let actor = match session {
        Some(session) => {
            let safe = matches!(parts.method, axum::http::Method::GET | axum::http::Method::HEAD);
            let presented = parts.headers.get("x-csrf-token").and_then(|v| v.to_str().ok());
            if !safe && !session.csrf_ok(presented) {
                return Err(ApiError::Csrf(
                    "missing or wrong x-csrf-token: a console session's changes carry the token GET /api/v1/session gives",
                ));
            }
            session.actor
        }
        None => {
            let Caller(agent) = Caller::from_request_parts(parts, state).await?;
            if !agent.admin {
                return Err(ApiError::Forbidden(format!(
                    "agent {} is not an admin; the admin API needs a key from `rota agents create NAME --admin`",
                    agent.name
                )));
            }
            Actor { name: agent.name, person: false, role: Role::Admin }
        }
    };
    if actor.role < need {
        return Err(ApiError::Forbidden(format!(
            "{} {} has the {} role; this needs {} (docs/operations.md)",
            actor.kind(),
            actor.name,
            actor.role.as_str(),
            need.as_str()
        )));
    }
    Ok(actor)
}

macro_rules! role_extractor {
    ($name:ident, $role:expr, $doc:literal) => {
        #[doc = $doc]
        pub struct $name(pub Actor);

        impl FromRequestParts<ApiState> for $name {
            type Rejection = ApiError;

            async fn from_request_parts(parts: &mut Parts, state: &ApiState) -> Result<Self, Self::Rejection> {
                actor(parts, state, $role).await.map($name)
            }
        }
    };
}

role_extractor!(Viewer, Role::Viewer, "Any role: reads.");
role_extractor!(Operator, Role::Operator, "An operator or an admin: the accounts' day-to-day changes.");
role_extractor!(Admin, Role::Admin, "An admin: agents, keys, limits, deletions.");

/// The role a person signing in has: the highest of the roles `role_claim` names and those of
/// the `roles` lists that name their email (exactly, or `*@domain`) or one of their groups.
pub fn role_of(sso: &crate::config::Sso, claims: &serde_json::Value) -> Option<Role> {
    let strings = |v: Option<&serde_json::Value>| -> Vec<String> {
        match v {
            Some(serde_json::Value::String(s)) => vec![s.clone()],
            Some(serde_json::Value::Array(a)) => a.iter().filter_map(|x| x.as_str().map(str::to_string)).collect(),
            _ => Vec::new(),
        }
    };
    let mut roles: Vec<Role> = Vec::new();
    if let Some(claim) = &sso.role_claim {
        roles.extend(strings(claims.get(claim)).iter().filter_map(|r| match r.as_str() {
            "viewer" => Some(Role::Viewer),
            "operator" => Some(Role::Operator),
            "admin" => Some(Role::Admin),
            _ => None,
        }));
    }
    let email = claims.get("email").and_then(|e| e.as_str()).map(str::to_ascii_lowercase);
    let verified = claims.get("email_verified").and_then(|v| v.as_bool()) != Some(false);
    let groups = strings(claims.get(&sso.groups_claim));
    let names = |entry: &String| {
        let e = entry.to_ascii_lowercase();
        let mail = email.as_deref().filter(|_| verified).is_some_and(|m| match e.strip_prefix("*@") {
            Some(domain) => m.rsplit_once('@').is_some_and(|(_, d)| d == domain),
            None => m == e,
        });
        mail || groups.iter().any(|g| g == entry)
    };
    for (list, role) in
        [(&sso.roles.admin, Role::Admin), (&sso.roles.operator, Role::Operator), (&sso.roles.viewer, Role::Viewer)]
    {
        if list.iter().any(names) {
            roles.push(role);
        }
    }
    roles.into_iter().max()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_persons_role_is_the_highest_their_claims_and_the_lists_give() {
        let config = crate::config::Config::from_toml(
            r#"
[console.sso]
issuer = "https://idp.example.com"
client_id = "rota"
role_claim = "rota_role"
[console.sso.roles]
admin = ["alice@example.com"]
operator = ["sre", "*@ops.example.com"]
viewer = ["*@example.com"]
"#,
        )
        .unwrap_or_else(|e| panic!("{e}"));
        let sso = config.console.sso.as_ref().unwrap();
        let role = |claims| role_of(sso, &claims);
        assert_eq!(role(json!({"email": "Alice@Example.com"})), Some(Role::Admin));
        assert_eq!(role(json!({"email": "bob@example.com"})), Some(Role::Viewer));
        assert_eq!(role(json!({"email": "bob@example.com", "groups": ["sre"]})), Some(Role::Operator));
        assert_eq!(role(json!({"email": "carol@ops.example.com"})), Some(Role::Operator));
        assert_eq!(role(json!({"email": "x@evil.com", "rota_role": "admin"})), Some(Role::Admin), "the claim");
        assert_eq!(role(json!({"email": "x@evil.com", "rota_role": ["viewer", "bogus"]})), Some(Role::Viewer));
        assert_eq!(role(json!({"email": "x@evil.com"})), None, "no role: no sign-in");
        assert_eq!(role(json!({"email": "x@sub.example.com"})), None, "`*@domain` is that domain only");
        assert_eq!(
            role(json!({"email": "alice@example.com", "email_verified": false})),
            None,
            "an unverified email names nobody"
        );
    }
}
