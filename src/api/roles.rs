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
    /// The agent's name, or the person's verified subject (`issuer sub`).
    pub name: String,
    pub person: bool,
    pub role: Role,
    /// A person's verified email (docs/operations.md, "Signing in").
    pub email: Option<String>,
}

impl Actor {
    pub fn agent(name: &str) -> Actor {
        Actor { name: name.to_string(), person: false, role: Role::Admin, email: None }
    }

    pub fn kind(&self) -> &'static str {
        if self.person { "person" } else { "agent" }
    }

    /// The name people read: a person's verified email, else their subject; an agent's name.
    pub fn shown(&self) -> &str {
        self.email.as_deref().unwrap_or(&self.name)
    }
}

/// A person signed in through `[console.sso]`, as their identity provider vouched for them:
/// what their role is worked out from again at every request, under the config in force.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Person {
    /// `issuer sub`: the id_token's issuer and subject.
    pub subject: String,
    /// Their email, only when verified: `email_verified` is the JSON `true`, or the address is
    /// in one of `console.sso.own_domains`.
    pub email: Option<String>,
    /// The groups of `groups_claim` and the roles of `role_claim`, as the id_token gave them.
    pub groups: Vec<String>,
    pub claimed_roles: Vec<String>,
}

impl Person {
    /// The person an id_token's `claims` name (with `sub`), the email taken from `claims` or,
    /// when they hold no verified one, from `userinfo` (whose `sub` must be the same).
    pub fn verified(
        sso: &crate::config::Sso,
        claims: &serde_json::Value,
        userinfo: Option<&serde_json::Value>,
    ) -> Result<Person, String> {
        let text = |v: &serde_json::Value, k: &str| v.get(k).and_then(|x| x.as_str()).map(str::to_string);
        let sub = text(claims, "sub").filter(|s| !s.is_empty()).ok_or("the id_token names no subject (sub)")?;
        let issuer = text(claims, "iss").unwrap_or_default();
        let same = |info: &&serde_json::Value| text(info, "sub").as_deref() == Some(sub.as_str());
        let email = verified_email(sso, claims).or_else(|| userinfo.filter(same).and_then(|i| verified_email(sso, i)));
        Ok(Person {
            subject: format!("{issuer} {sub}"),
            email,
            groups: strings(claims.get(&sso.groups_claim)),
            claimed_roles: sso.role_claim.as_ref().map(|c| strings(claims.get(c))).unwrap_or_default(),
        })
    }
}

/// The `email` of `claims` if it is verified: `email_verified` is the JSON boolean `true`
/// (a string or a missing claim is not), or its domain is one the operator names as the
/// identity provider's own (`own_domains`). `preferred_username` never counts.
fn verified_email(sso: &crate::config::Sso, claims: &serde_json::Value) -> Option<String> {
    let email = claims.get("email")?.as_str()?.trim().to_ascii_lowercase();
    let (local, domain) = email.rsplit_once('@')?;
    if local.is_empty() {
        return None;
    }
    let flagged = claims.get("email_verified") == Some(&serde_json::Value::Bool(true));
    let own = sso.own_domains.iter().any(|d| d.eq_ignore_ascii_case(domain));
    (flagged || own).then_some(email)
}

fn strings(v: Option<&serde_json::Value>) -> Vec<String> {
    match v {
        Some(serde_json::Value::String(s)) => vec![s.clone()],
        Some(serde_json::Value::Array(a)) => a.iter().filter_map(|x| x.as_str().map(str::to_string)).collect(),
        _ => Vec::new(),
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
            Actor::agent(&agent.name)
        }
    };
    if actor.role < need {
        return Err(ApiError::Forbidden(format!(
            "{} {} has the {} role; this needs {} (docs/operations.md)",
            actor.kind(),
            actor.shown(),
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

/// The role `person` has under `sso`: the highest of the roles their `role_claim` names and
/// those of the `roles` lists that name their verified email (exactly, or `*@domain`) or one
/// of their groups. `None`: no role, no sign-in.
pub fn role_of(sso: &crate::config::Sso, person: &Person) -> Option<Role> {
    let mut roles: Vec<Role> = person
        .claimed_roles
        .iter()
        .filter_map(|r| match r.as_str() {
            "viewer" => Some(Role::Viewer),
            "operator" => Some(Role::Operator),
            "admin" => Some(Role::Admin),
            _ => None,
        })
        .collect();
    let names = |entry: &String| {
        let e = entry.to_ascii_lowercase();
        let mail = person.email.as_deref().is_some_and(|m| match e.strip_prefix("*@") {
            Some(domain) => m.rsplit_once('@').is_some_and(|(_, d)| d == domain),
            None => m == e,
        });
        mail || person.groups.iter().any(|g| g == entry)
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
        let role = |mut claims: serde_json::Value| {
            claims["sub"] = json!("s1");
            if claims.get("email_verified").is_none() {
                claims["email_verified"] = json!(true);
            }
            role_of(sso, &Person::verified(sso, &claims, None).unwrap())
        };
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
        assert_eq!(role(json!({"email": "alice@example.com", "email_verified": "true"})), None, "a string is no flag");
    }

    #[test]
    fn only_a_verified_email_is_a_persons_email() {
        let config = crate::config::Config::from_toml(
            "[console.sso]\nissuer = \"https://idp\"\nclient_id = \"rota\"\nown_domains = [\"corp.example\"]",
        )
        .unwrap_or_else(|e| panic!("{e}"));
        let sso = config.console.sso.as_ref().unwrap();
        let email = |claims: serde_json::Value, info: Option<serde_json::Value>| {
            Person::verified(sso, &claims, info.as_ref()).map(|p| p.email)
        };
        let sub = |extra: serde_json::Value| {
            let mut c = json!({"iss": "https://idp", "sub": "s1"});
            c.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
            c
        };
        let alice = Some("alice@example.com".to_string());
        assert_eq!(email(sub(json!({"email": "Alice@Example.com", "email_verified": true})), None), Ok(alice.clone()));
        assert_eq!(email(sub(json!({"email": "alice@example.com"})), None), Ok(None), "no flag");
        assert_eq!(email(sub(json!({"email": "alice@example.com", "email_verified": false})), None), Ok(None));
        assert_eq!(email(sub(json!({"email": "alice@example.com", "email_verified": "false"})), None), Ok(None));
        assert_eq!(email(sub(json!({"email": "alice@example.com", "email_verified": 1})), None), Ok(None));
        assert_eq!(email(sub(json!({"preferred_username": "alice@example.com"})), None), Ok(None), "a user name");
        assert_eq!(email(sub(json!({"email": "bob@corp.example"})), None), Ok(Some("bob@corp.example".into())));
        assert_eq!(email(sub(json!({"email": "bob@sub.corp.example"})), None), Ok(None), "that domain only");
        let info = |v: serde_json::Value| Some(v);
        let verified = json!({"sub": "s1", "email": "alice@example.com", "email_verified": true});
        assert_eq!(email(sub(json!({})), info(verified.clone())), Ok(alice));
        assert_eq!(
            email(sub(json!({})), info(json!({"sub": "s1", "email": "a@example.com", "email_verified": false}))),
            Ok(None)
        );
        assert_eq!(
            email(sub(json!({})), info(json!({"sub": "s1", "email": "a@example.com", "email_verified": "false"}))),
            Ok(None)
        );
        let mut other = verified.clone();
        other["sub"] = json!("s2");
        assert_eq!(email(sub(json!({})), info(other)), Ok(None), "another subject's userinfo");
        assert!(email(json!({"iss": "https://idp", "email": "a@example.com", "email_verified": true}), None).is_err());
        let p = Person::verified(sso, &sub(json!({})), None).unwrap();
        assert_eq!(p.subject, "https://idp s1");
    }
}
