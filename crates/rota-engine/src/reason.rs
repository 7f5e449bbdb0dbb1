//! Failure reasons and what each one does to a request (docs/rotation.md, "effect" column).

use serde::{Deserialize, Serialize};
use std::fmt;
use std::str::FromStr;

/// Why an attempt failed. The string forms are the values stored in `attempts.reason`,
/// `usage_stats.cooldown_reason` and the keys of `usage_stats.failure_counts`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Reason {
    ContextOverflow,
    Format,
    AuthPermanent,
    Auth,
    Billing,
    RateLimit,
    Overloaded,
    ServerError,
    Timeout,
    Network,
    ModelNotFound,
    Cancelled,
    Unknown,
    /// Not an upstream answer: the provider had no profile with a usable secret, so the
    /// candidate was skipped without a call.
    NoProfile,
    /// Not an upstream answer: the request cannot be put in the provider's wire format, so the
    /// candidate was skipped without a call.
    WireFormat,
}

/// What the failover loop does next after a failure of this reason.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Next {
    /// Return the upstream error to the client; no other profile or model is tried.
    Stop,
    /// Try the next profile of the same provider, then the next model.
    Rotate,
    /// Skip the remaining profiles of this provider and go to the next model.
    NextModel,
}

/// Where a failure leaves its mark.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mark {
    /// Nothing is recorded against the profile (the request or the client is at fault).
    None,
    /// The profile's cooldown lane, limited to the failing model unless the provider
    /// signalled an account-wide limit.
    CooldownModel,
    /// The profile's cooldown lane for every model.
    CooldownProfile,
    /// The profile's disabled lane (billing: escalating expiry; auth_permanent: none).
    Disabled,
    /// The model on that provider, for every profile.
    Model,
}

impl Reason {
    pub const ALL: [Reason; 15] = [
        Reason::ContextOverflow,
        Reason::Format,
        Reason::AuthPermanent,
        Reason::Auth,
        Reason::Billing,
        Reason::RateLimit,
        Reason::Overloaded,
        Reason::ServerError,
        Reason::Timeout,
        Reason::Network,
        Reason::ModelNotFound,
        Reason::Cancelled,
        Reason::Unknown,
        Reason::NoProfile,
        Reason::WireFormat,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Reason::ContextOverflow => "context_overflow",
            Reason::Format => "format",
            Reason::AuthPermanent => "auth_permanent",
            Reason::Auth => "auth",
            Reason::Billing => "billing",
            Reason::RateLimit => "rate_limit",
            Reason::Overloaded => "overloaded",
            Reason::ServerError => "server_error",
            Reason::Timeout => "timeout",
            Reason::Network => "network",
            Reason::ModelNotFound => "model_not_found",
            Reason::Cancelled => "cancelled",
            Reason::Unknown => "unknown",
            Reason::NoProfile => "no_profile",
            Reason::WireFormat => "wire_format",
        }
    }

    pub fn next(self) -> Next {
        match self {
            Reason::ContextOverflow | Reason::Format | Reason::Cancelled | Reason::Unknown => Next::Stop,
            Reason::ModelNotFound | Reason::NoProfile | Reason::WireFormat => Next::NextModel,
            Reason::AuthPermanent
            | Reason::Auth
            | Reason::Billing
            | Reason::RateLimit
            | Reason::Overloaded
            | Reason::ServerError
            | Reason::Timeout
            | Reason::Network => Next::Rotate,
        }
    }

    pub fn mark(self) -> Mark {
        match self {
            Reason::RateLimit | Reason::Overloaded | Reason::Timeout | Reason::ServerError => Mark::CooldownModel,
            Reason::Auth | Reason::Network => Mark::CooldownProfile,
            Reason::Billing | Reason::AuthPermanent => Mark::Disabled,
            Reason::ModelNotFound => Mark::Model,
            Reason::ContextOverflow
            | Reason::Format
            | Reason::Cancelled
            | Reason::Unknown
            | Reason::NoProfile
            | Reason::WireFormat => Mark::None,
        }
    }

    /// Whether a failure of this reason counts against the profile that made the call
    /// (`error_count`, `failure_counts`, `failure_total`): every answer of the upstream and
    /// every fault of the request does; a client that went away and a candidate skipped
    /// without a call do not. Counting is not cooling: `mark` says which ones open a window.
    pub fn counts(self) -> bool {
        !matches!(self, Reason::Cancelled | Reason::NoProfile | Reason::WireFormat)
    }

    /// How many times the same profile is asked again before rotating. A throttled
    /// profile is never retried: rotating is always faster than sleeping.
    pub fn same_profile_retries(self) -> u8 {
        match self {
            Reason::Overloaded => 2,
            Reason::ServerError | Reason::Network => 1,
            _ => 0,
        }
    }

    /// Failures that say "come back later" rather than "something is wrong": the
    /// aggregated error answers 429 with `Retry-After` when every failure was one of these.
    pub fn is_throttle(self) -> bool {
        matches!(self, Reason::RateLimit)
    }
}

impl fmt::Display for Reason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

#[derive(Debug, thiserror::Error)]
#[error(
    "unknown failure reason `{0}` (expected one of: context_overflow, format, auth_permanent, auth, billing, rate_limit, overloaded, server_error, timeout, network, model_not_found, cancelled, unknown, no_profile, wire_format)"
)]
pub struct UnknownReason(pub String);

impl FromStr for Reason {
    type Err = UnknownReason;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Reason::ALL.into_iter().find(|r| r.as_str() == s).ok_or_else(|| UnknownReason(s.to_string()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reason_strings_round_trip() {
        for r in Reason::ALL {
            assert_eq!(r.as_str().parse::<Reason>().unwrap(), r);
            assert_eq!(serde_json::to_string(&r).unwrap(), format!("\"{}\"", r.as_str()));
        }
        assert!("nope".parse::<Reason>().is_err());
    }

    #[test]
    fn request_faults_never_fail_over_or_cool() {
        for r in [Reason::ContextOverflow, Reason::Format, Reason::Cancelled, Reason::Unknown] {
            assert_eq!(r.next(), Next::Stop, "{r}");
            assert_eq!(r.mark(), Mark::None, "{r}");
        }
    }

    #[test]
    fn same_profile_retries_follow_the_table() {
        assert_eq!(Reason::Overloaded.same_profile_retries(), 2);
        assert_eq!(Reason::ServerError.same_profile_retries(), 1);
        assert_eq!(Reason::Network.same_profile_retries(), 1);
        assert_eq!(Reason::RateLimit.same_profile_retries(), 0);
        assert_eq!(Reason::Timeout.same_profile_retries(), 0);
    }

    #[test]
    fn model_not_found_cools_the_model_and_moves_to_the_next_model() {
        assert_eq!(Reason::ModelNotFound.mark(), Mark::Model);
        assert_eq!(Reason::ModelNotFound.next(), Next::NextModel);
    }

    #[test]
    fn auth_and_billing_cover_the_whole_profile() {
        assert_eq!(Reason::Auth.mark(), Mark::CooldownProfile);
        assert_eq!(Reason::Billing.mark(), Mark::Disabled);
        assert_eq!(Reason::AuthPermanent.mark(), Mark::Disabled);
        assert_eq!(Reason::RateLimit.mark(), Mark::CooldownModel);
    }
}
