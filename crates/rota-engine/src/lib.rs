//! The rotation engine: pure rules, no I/O. Every function that depends on time takes `now`
//! (Unix milliseconds) from its caller, so tests control the clock.

pub mod aggregate;
pub mod chain;
pub mod classify;
pub mod duration;
pub mod gate;
pub mod hints;
pub mod order;
pub mod profile;
pub mod quota;
pub mod reason;
pub mod recent;
pub mod stats;

pub use profile::{BadProfileId, ProfileId, ProfileType, ProfileView, RefreshWindow, Unusable, Views};
pub use reason::{Mark, Next, Reason};
pub use stats::{
    BillingLane, Change, Cooldown, CooldownLane, CooldownPolicy, Disabled, Failure, ModelChange, ModelCooldown, Until,
    Unwritten, UsageStats,
};

/// Unix time in milliseconds, the unit of every stored time.
pub type Millis = i64;

/// The source of `now` at the edges. Tests use a fixed or stepped clock.
pub trait Clock: Send + Sync {
    fn now(&self) -> Millis;
}

#[derive(Clone, Copy, Debug, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> Millis {
        chrono::Utc::now().timestamp_millis()
    }
}
