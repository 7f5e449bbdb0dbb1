//! Whether a candidate of the chain is tried, probed or skipped (docs/rotation.md), and the probe
//! throttle that decides when a cooling primary is asked again.

use super::recent::Recent;
use super::{Millis, Reason, Until};

pub const PROBE_MARGIN: Millis = 2 * 60_000;
pub const PROBE_INTERVAL: Millis = 30_000;
pub const PROBE_TTL: Millis = 24 * 3_600_000;
pub const PROBE_KEYS: usize = 256;

/// How a provider stands for one model before the candidate is tried.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Availability {
    /// At least one profile may serve the model.
    Usable,
    /// Every profile is cooling (or the model itself is): the soonest end and the dominant reason.
    Cooled { until: Until, reason: Reason },
    /// The provider has no profile with a usable secret.
    NoProfile,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Gate {
    Try,
    /// Try the cooling primary to learn whether it has recovered.
    Probe,
    Skip {
        reason: Reason,
        until: Option<Until>,
    },
}

/// Last probe time per (agent, provider), and the last failure that opened a window per
/// provider, bounded: 24 h TTL, 256 keys each.
#[derive(Debug)]
pub struct ProbeThrottle {
    last: Recent<(String, String), ()>,
    failed: Recent<String, ()>,
}

impl Default for ProbeThrottle {
    fn default() -> Self {
        ProbeThrottle { last: Recent::new(PROBE_TTL, PROBE_KEYS), failed: Recent::new(PROBE_TTL, PROBE_KEYS) }
    }
}

impl ProbeThrottle {
    /// Claims the probe for `(agent, provider)` if none ran in the last 30 s and no call to the
    /// provider failed in that time (that failure is the freshest evidence there is). The check
    /// and the claim are one step, so among concurrent requests exactly one wins.
    pub fn try_claim(&mut self, agent: &str, provider: &str, now: Millis) -> bool {
        let fresh = |at: Millis| (0..PROBE_INTERVAL).contains(&(now - at));
        if self.failed.get(&provider.to_string(), now).is_some_and(|(_, at)| fresh(at)) {
            return false;
        }
        let key = (agent.to_string(), provider.to_string());
        if self.last.get(&key, now).is_some_and(|(_, at)| now - at < PROBE_INTERVAL) {
            return false;
        }
        self.last.insert(key, (), now);
        true
    }

    /// A call to `provider` failed at `now` and opened a window: no probe of it for 30 s.
    pub fn failed(&mut self, provider: &str, now: Millis) {
        self.failed.insert(provider.to_string(), (), now);
    }

    pub fn len(&self) -> usize {
        self.last.len()
    }

    pub fn is_empty(&self) -> bool {
        self.last.is_empty()
    }
}

/// Where the candidate stands in the chain.
#[derive(Clone, Copy, Debug)]
pub struct Position<'a> {
    pub index: usize,
    pub len: usize,
    pub agent: &'a str,
    pub provider: &'a str,
}

/// Decides a candidate: usable ones are tried; the last candidate is always tried (with its
/// least-cooled profile); a cooling primary with fallbacks behind it is probed near the end of
/// its window, at most every 30 s per agent and provider; any other cooled candidate is skipped.
pub fn gate(pos: Position<'_>, avail: Availability, probes: &mut ProbeThrottle, now: Millis) -> Gate {
    let is_last = pos.index + 1 == pos.len;
    match avail {
        Availability::Usable => Gate::Try,
        Availability::NoProfile => Gate::Skip { reason: Reason::NoProfile, until: None },
        Availability::Cooled { .. } if is_last => Gate::Try,
        Availability::Cooled { until, reason } => {
            let near_end = matches!(until, Until::At(t) if now >= t - PROBE_MARGIN);
            if pos.index == 0 && pos.len > 1 && near_end && probes.try_claim(pos.agent, pos.provider, now) {
                Gate::Probe
            } else {
                Gate::Skip { reason, until: Some(until) }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const NOW: Millis = 100_000_000;

    fn pos(index: usize, len: usize) -> Position<'static> {
        Position { index, len, agent: "planner", provider: "anthropic" }
    }

    fn cooled(until: Millis) -> Availability {
        Availability::Cooled { until: Until::At(until), reason: Reason::RateLimit }
    }

    #[test]
    fn usable_candidate_is_tried() {
        assert_eq!(gate(pos(1, 3), Availability::Usable, &mut ProbeThrottle::default(), NOW), Gate::Try);
    }

    #[test]
    fn cooled_candidate_is_skipped_while_others_remain() {
        let g = gate(pos(1, 3), cooled(NOW + 60_000), &mut ProbeThrottle::default(), NOW);
        assert_eq!(g, Gate::Skip { reason: Reason::RateLimit, until: Some(Until::At(NOW + 60_000)) });
    }

    #[test]
    fn the_last_candidate_is_always_tried() {
        assert_eq!(gate(pos(2, 3), cooled(NOW + 3_600_000), &mut ProbeThrottle::default(), NOW), Gate::Try);
        let forever = Availability::Cooled { until: Until::Cleared, reason: Reason::AuthPermanent };
        assert_eq!(gate(pos(0, 1), forever, &mut ProbeThrottle::default(), NOW), Gate::Try);
    }

    #[test]
    fn provider_without_profiles_is_skipped_even_when_last() {
        let g = gate(pos(0, 1), Availability::NoProfile, &mut ProbeThrottle::default(), NOW);
        assert_eq!(g, Gate::Skip { reason: Reason::NoProfile, until: None });
    }

    #[test]
    fn primary_is_probed_within_two_minutes_of_its_expiry() {
        let mut p = ProbeThrottle::default();
        assert!(matches!(gate(pos(0, 2), cooled(NOW + PROBE_MARGIN + 1), &mut p, NOW), Gate::Skip { .. }));
        assert_eq!(gate(pos(0, 2), cooled(NOW + PROBE_MARGIN), &mut p, NOW), Gate::Probe);
    }

    #[test]
    fn probes_are_throttled_to_one_per_30_seconds_per_agent_and_provider() {
        let mut p = ProbeThrottle::default();
        let c = cooled(NOW + 1_000);
        assert_eq!(gate(pos(0, 2), c, &mut p, NOW), Gate::Probe);
        assert!(matches!(gate(pos(0, 2), c, &mut p, NOW + PROBE_INTERVAL - 1), Gate::Skip { .. }));
        let other_agent = Position { agent: "writer", ..pos(0, 2) };
        assert_eq!(gate(other_agent, c, &mut p, NOW + 1), Gate::Probe);
        assert_eq!(gate(pos(0, 2), c, &mut p, NOW + PROBE_INTERVAL), Gate::Probe);
    }

    #[test]
    fn a_failure_that_opened_a_window_holds_the_provider_s_probe_for_30_seconds() {
        let mut p = ProbeThrottle::default();
        let c = cooled(NOW + 60_000);
        p.failed("anthropic", NOW);
        assert!(matches!(gate(pos(0, 2), c, &mut p, NOW + 1), Gate::Skip { .. }), "right after the failure");
        let other_agent = Position { agent: "writer", ..pos(0, 2) };
        assert!(matches!(gate(other_agent, c, &mut p, NOW + PROBE_INTERVAL - 1), Gate::Skip { .. }), "any agent");
        let other_provider = Position { provider: "openai", ..pos(0, 2) };
        assert_eq!(gate(other_provider, c, &mut p, NOW + 1), Gate::Probe);
        assert_eq!(gate(pos(0, 2), c, &mut p, NOW + PROBE_INTERVAL), Gate::Probe, "30 s on");
        // A clock that stepped back does not hold the probe for longer than 30 s of its own.
        let mut p = ProbeThrottle::default();
        p.failed("anthropic", NOW + 3_600_000);
        assert_eq!(gate(pos(0, 2), c, &mut p, NOW), Gate::Probe);
    }

    #[test]
    fn only_one_of_many_concurrent_requests_wins_the_probe() {
        let mut p = ProbeThrottle::default();
        let wins = (0..50).filter(|_| gate(pos(0, 2), cooled(NOW + 1_000), &mut p, NOW) == Gate::Probe).count();
        assert_eq!(wins, 1);
    }

    #[test]
    fn only_the_primary_is_probed() {
        let g = gate(pos(1, 3), cooled(NOW + 1_000), &mut ProbeThrottle::default(), NOW);
        assert!(matches!(g, Gate::Skip { .. }));
    }

    #[test]
    fn primary_without_fallbacks_is_tried_not_probed() {
        assert_eq!(gate(pos(0, 1), cooled(NOW + 1_000), &mut ProbeThrottle::default(), NOW), Gate::Try);
    }

    #[test]
    fn a_profile_disabled_until_cleared_is_never_probed() {
        let forever = Availability::Cooled { until: Until::Cleared, reason: Reason::AuthPermanent };
        assert!(matches!(gate(pos(0, 2), forever, &mut ProbeThrottle::default(), NOW), Gate::Skip { .. }));
    }

    #[test]
    fn probe_state_is_bounded_to_256_keys_and_expires_after_a_day() {
        let mut p = ProbeThrottle::default();
        for i in 0..300 {
            p.try_claim(&format!("agent{i}"), "anthropic", NOW + i);
        }
        assert_eq!(p.len(), PROBE_KEYS);
        assert!(p.try_claim("agent0", "anthropic", NOW + 400), "the oldest key was evicted");
        let mut p = ProbeThrottle::default();
        p.try_claim("a", "x", NOW);
        assert!(p.try_claim("a", "x", NOW + PROBE_TTL));
    }
}
