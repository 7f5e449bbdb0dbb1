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

    /// Whether this clock's time is vouched for: false for a server started on a system clock
    /// far from its stored evidence, until the system clock agrees again (`SteadyClock::anchor`).
    fn trusted(&self) -> bool {
        true
    }

    /// Takes the system's time if it agrees with this clock's (within `AGREE`) while this one is
    /// not trusted; whether it did.
    fn adopt(&self) -> bool {
        false
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

/// How far before the newest stored evidence the system clock may start (rows are never from
/// the future; a few minutes cover another server's skew).
pub const BEHIND: Millis = 5 * 60_000;
/// How far after the newest stored evidence the system clock may start: a server stopped longer
/// than this looks like a clock that is that far ahead (`rota serve --trust-clock` says which).
pub const AHEAD: Millis = 7 * 86_400_000;
/// How close the system clock must come to an anchored clock for it to be adopted.
pub const AGREE: Millis = 5 * 60_000;

/// The clock a server runs on: the system's Unix time when it started, moved on by the
/// monotonic clock since. A step of the system clock while it runs (an NTP correction, a
/// manual change, either way) moves neither a cooldown window nor the audit retention: what
/// lasts ten minutes lasts ten minutes. A start on a system clock far from the newest stored
/// evidence (`anchor`) runs from that evidence instead, untrusted, until the system clock agrees
/// (`adopt`) (docs/rotation.md, "Time").
#[derive(Debug)]
pub struct SteadyClock {
    start: std::sync::atomic::AtomicI64,
    at: std::time::Instant,
    trusted: std::sync::atomic::AtomicBool,
}

impl SteadyClock {
    pub fn new() -> SteadyClock {
        SteadyClock {
            at: std::time::Instant::now(),
            start: std::sync::atomic::AtomicI64::new(SystemClock.now()),
            trusted: std::sync::atomic::AtomicBool::new(true),
        }
    }

    /// Sets this clock so that it reads `to` now.
    fn rebase(&self, to: Millis) {
        let elapsed = self.at.elapsed().as_millis().min(Millis::MAX as u128) as Millis;
        self.start.store(to.saturating_sub(elapsed), std::sync::atomic::Ordering::SeqCst);
    }

    /// Checks the system clock against `newest`, the latest time the store holds: more than
    /// `BEHIND` before it or `AHEAD` after it, the clock runs from `newest` instead, untrusted.
    /// The signed gap (system minus newest) when it does.
    pub fn anchor(&self, newest: Option<Millis>) -> Option<Millis> {
        let newest = newest?;
        let gap = SystemClock.now().saturating_sub(newest);
        if (-BEHIND..=AHEAD).contains(&gap) {
            return None;
        }
        self.rebase(newest);
        self.trusted.store(false, std::sync::atomic::Ordering::SeqCst);
        Some(gap)
    }
}

impl Default for SteadyClock {
    fn default() -> Self {
        SteadyClock::new()
    }
}

impl Clock for SteadyClock {
    fn now(&self) -> Millis {
        let start = self.start.load(std::sync::atomic::Ordering::SeqCst);
        start.saturating_add(self.at.elapsed().as_millis().min(Millis::MAX as u128) as Millis)
    }

    fn drift(&self) -> Millis {
        SystemClock.now().saturating_sub(self.now())
    }

    fn trusted(&self) -> bool {
        self.trusted.load(std::sync::atomic::Ordering::SeqCst)
    }

    fn adopt(&self) -> bool {
        if self.trusted() || self.drift().abs() > AGREE {
            return false;
        }
        self.rebase(SystemClock.now());
        self.trusted.store(true, std::sync::atomic::Ordering::SeqCst);
        true
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

    #[test]
    fn a_start_far_from_the_stored_evidence_runs_from_it_until_the_system_agrees() {
        let sys = SystemClock.now();
        let near = SteadyClock::new();
        assert_eq!(near.anchor(Some(sys - 3 * 86_400_000)), None, "stopped three days: trusted");
        assert_eq!(near.anchor(Some(sys + 60_000)), None, "another server a minute ahead");
        assert_eq!(near.anchor(None), None, "nothing stored");
        assert!(near.trusted() && near.drift().abs() < 1_000);

        let ahead = SteadyClock::new();
        let newest = sys - 31 * 86_400_000;
        let gap = ahead.anchor(Some(newest)).expect("31 days ahead of the evidence");
        assert!((gap - 31 * 86_400_000).abs() < 1_000);
        assert!(!ahead.trusted());
        assert!((ahead.now() - newest).abs() < 1_000, "it runs from the newest row");
        assert!(!ahead.adopt(), "the system clock still disagrees");

        let behind = SteadyClock::new();
        assert!(behind.anchor(Some(sys + 2 * 3_600_000)).is_some(), "rows from two hours in the future");
        let wrong = SteadyClock::new();
        wrong.anchor(Some(sys - 40 * 86_400_000));
        wrong.rebase(sys - 60_000);
        assert!(wrong.adopt(), "the system clock now within a minute of rota's: adopted");
        assert!(wrong.trusted() && wrong.drift().abs() < 1_000);
    }
}
