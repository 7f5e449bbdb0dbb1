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

    /// How far the system's clock is now from this one (system minus this), where this one
    /// keeps its own time (`SteadyClock`): a jump of the system clock since it started.
    fn drift(&self) -> Millis {
        0
    }
}

/// The system's clock as it reads now, jumps and all (the CLI's one-shot commands).
#[derive(Clone, Copy, Debug, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> Millis {
        chrono::Utc::now().timestamp_millis()
    }
}

/// The clock a server runs on: the system's Unix time when it started, moved on by the
/// monotonic clock since. A step of the system clock while it runs (an NTP correction, a
/// manual change, either way) moves neither a cooldown window nor the audit retention: what
/// lasts ten minutes lasts ten minutes. A restart takes the system's time again
/// (docs/rotation.md, "Time").
#[derive(Clone, Copy, Debug)]
pub struct SteadyClock {
    start: Millis,
    at: std::time::Instant,
}

impl SteadyClock {
    pub fn new() -> SteadyClock {
        SteadyClock { at: std::time::Instant::now(), start: SystemClock.now() }
    }
}

impl Default for SteadyClock {
    fn default() -> Self {
        SteadyClock::new()
    }
}

impl Clock for SteadyClock {
    fn now(&self) -> Millis {
        self.start.saturating_add(self.at.elapsed().as_millis().min(Millis::MAX as u128) as Millis)
    }

    fn drift(&self) -> Millis {
        SystemClock.now().saturating_sub(self.now())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_steady_clock_starts_at_the_system_time_and_only_moves_forward() {
        let c = SteadyClock::new();
        let first = c.now();
        assert!((first - SystemClock.now()).abs() < 1_000, "it starts at the system's time");
        assert!(c.drift().abs() < 1_000, "no jump yet");
        let mut last = first;
        for _ in 0..100 {
            let t = c.now();
            assert!(t >= last, "never backwards");
            last = t;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
        assert!(c.now() >= first + 20, "it moves with the monotonic clock");
    }
}
