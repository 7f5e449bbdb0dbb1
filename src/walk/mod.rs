//! The failover walk of one request, shared by the gateway (which makes each upstream call
//! itself) and the lease API (whose agent makes it): which profile of which model comes next,
//! what a failure does to the profile and to the walk, and every attempt and skip audited (its
//! `Trail`).
//!
//! A walk is driven by `next` (the next attempt, or the end) and `failed` / `succeeded` (what
//! the attempt came to). The gateway drives it in one loop; a lease drives it one report at a
//! time, so both produce the same attempts, in the same order, for the same faults.

mod runtime;
mod trail;
pub use runtime::Runtime;
pub use trail::{Spent, Trail};

use crate::book::{Book, Credential};
use crate::config::Config;
use crate::engine::aggregate::{Aggregated, ModelFailure, aggregate};
use crate::engine::chain::Candidate;
use crate::engine::classify::Classified;
use crate::engine::gate::{Availability, Gate, Position};
use crate::engine::{Failure, Millis, Next as After, ProfileId, Reason, Until};
use crate::prices::Tokens;
use crate::redact::truncate;
use crate::status::until_ms;
use crate::store::{AttemptRow, Kind, Outcome};
use std::time::Duration;

/// Why an attempt still under way when `server.shutdown_grace` ran out was cut.
pub const STOPPING: &str = "rota is shutting down (server.shutdown_grace is over)";

/// The next upstream call to make.
#[derive(Clone, Debug)]
pub struct Attempt {
    pub index: usize,
    pub cand: Candidate,
    pub pid: ProfileId,
    pub cred: Credential,
    pub kind: Kind,
}

/// What `next` found.
pub enum Step {
    Try(Attempt),
    /// The request names a profile that cannot serve it (a pin error): a 400.
    Refuse(String),
    /// Every candidate failed or was skipped.
    Exhausted(Aggregated),
}

/// What a failed attempt leads to.
#[derive(Debug, PartialEq, Eq)]
pub enum Verdict {
    /// The same profile again, after this backoff.
    Retry(Duration),
    /// On to the next profile or model (`next`).
    Moved,
    /// The reason does not fail over: the request ends with this failure.
    Stop,
}

/// How a committed stream ended.
pub enum Ended {
    Whole,
    /// `said`: the upstream sent its own error event (already forwarded to the client).
    Failed {
        class: Classified,
        said: bool,
    },
    /// rota's own request deadline (`timeouts.total`) cut the stream: not the profile's fault.
    Deadline(String),
    /// rota shut down and cut the stream (`cancelled`): not the profile's fault either.
    Stopped(String),
}

/// The profiles of the candidate under way.
struct Cursor {
    slots: Vec<ProfileId>,
    j: usize,
    tries: u8,
    probe: bool,
    pinned: bool,
    /// `Book::pick` marked the first slot used as it ordered them.
    picked: bool,
    /// The order goes on past `slots` (`Ordered::more`): once they are tried, ask for the next.
    more: bool,
    /// The profiles of this candidate tried before `slots`.
    tried: Vec<ProfileId>,
    /// This candidate's latest failure, for the aggregated error.
    last: Option<ModelFailure>,
}

pub struct Walk {
    chain: Vec<Candidate>,
    /// `failover.enabled = false`: the first choice only, no retry, rotation or fallback.
    single: bool,
    session: Option<String>,
    pin: Option<ProfileId>,
    /// Profiles this request must not use (a lease's `exclude`).
    exclude: Vec<ProfileId>,
    index: usize,
    cur: Option<Cursor>,
    failures: Vec<ModelFailure>,
    /// A failure of this request put a profile or a model in a window: the answer waits until
    /// that is written (`Engine::durable`).
    marked: bool,
    pub trail: Trail,
}

/// The row's reason, retry hint and error, from the classified failure.
fn describe(row: &mut AttemptRow, class: &Classified) {
    row.reason = Some(class.reason);
    row.retry_after_ms = class.hint.map(|h| h.wait_ms);
    row.error = Some(truncate(&class.message, 500));
}

impl Walk {
    pub fn new(chain: Vec<Candidate>, session: Option<String>, pin: Option<ProfileId>, trail: Trail) -> Walk {
        Walk {
            chain,
            single: false,
            session,
            pin,
            exclude: Vec::new(),
            index: 0,
            cur: None,
            failures: Vec::new(),
            marked: false,
            trail,
        }
    }

    /// Whether a failure of this request opened or extended a window.
    pub fn marked(&self) -> bool {
        self.marked
    }

    /// `failover.enabled`: when false, the first failure ends the walk (docs/rotation.md).
    pub fn failover(mut self, enabled: bool) -> Walk {
        self.single = !enabled;
        self
    }

    pub fn excluding(mut self, exclude: Vec<ProfileId>) -> Walk {
        self.exclude = exclude;
        self
    }

    pub fn session(&self) -> Option<&str> {
        self.session.as_deref()
    }

    /// The next attempt. Candidates that cannot be tried are skipped (and audited) on the way;
    /// `admit` tells whether the caller can use a candidate at all (the gateway's translation).
    pub fn next(
        &mut self,
        book: &Book,
        config: &Config,
        agent: &str,
        now: Millis,
        mut admit: impl FnMut(usize, &Candidate) -> Result<(), String>,
    ) -> Step {
        loop {
            if let Some(cur) = self.cur.as_mut() {
                while cur.j < cur.slots.len() {
                    let pid = &cur.slots[cur.j];
                    if let Some(cred) = book.credential(pid) {
                        let kind = if cur.probe && cur.tries == 0 && cur.j == 0 {
                            Kind::Probe
                        } else if cur.tries > 0 {
                            Kind::Retry
                        } else if self.trail.seq == 0 {
                            Kind::Primary
                        } else if cur.j > 0 || !cur.tried.is_empty() {
                            Kind::Rotate
                        } else {
                            Kind::Fallback
                        };
                        let cand = self.chain[self.index].clone();
                        // The first profile was marked used when it was picked; a rotation or a
                        // retry marks the one it tries.
                        if cur.j > 0 || cur.tries > 0 || !cur.picked {
                            book.mark_used(pid, self.session.as_deref(), now);
                        }
                        return Step::Try(Attempt { index: self.index, cand, pid: pid.clone(), cred, kind });
                    }
                    cur.j += 1;
                    cur.tries = 0;
                }
                if cur.more {
                    // The next usable profiles of this candidate, those tried left out.
                    cur.tried.append(&mut cur.slots);
                    let exclude: Vec<ProfileId> = self.exclude.iter().chain(&cur.tried).cloned().collect();
                    let cand = &self.chain[self.index];
                    let target = (cand.provider.as_str(), cand.model.as_str());
                    if let Ok((ordered, picked)) =
                        book.pick(config, target, self.session.as_deref(), None, &exclude, now)
                    {
                        cur.slots = ordered.slots.into_iter().filter(|s| s.blocked.is_none()).map(|s| s.id).collect();
                        (cur.j, cur.tries, cur.picked, cur.more) = (0, 0, picked, ordered.more);
                        if !cur.slots.is_empty() {
                            continue;
                        }
                    }
                }
                self.failures.extend(cur.last.take());
                self.cur = None;
                self.index += 1;
                continue;
            }
            let Some(cand) = self.chain.get(self.index).cloned() else {
                let out = aggregate(&self.failures, now);
                self.trail.answered(&out.message);
                return Step::Exhausted(out);
            };
            if let Err(why) = admit(self.index, &cand) {
                self.skip(&cand, Reason::WireFormat, None, format!("{}: {why}", cand.provider), now);
                continue;
            }
            let pin = self.pin.as_ref().filter(|p| p.provider() == cand.provider);
            let target = (cand.provider.as_str(), cand.model.as_str());
            let (ordered, picked) = match book.pick(config, target, self.session.as_deref(), pin, &self.exclude, now) {
                Ok(o) => o,
                Err(e) => return Step::Refuse(e.to_string()),
            };
            let avail = if let Some(until) = book.model_cooled_until(&cand.provider, &cand.model, now) {
                Availability::Cooled { until: Until::At(until), reason: Reason::ModelNotFound }
            } else if ordered.slots.is_empty() {
                Availability::NoProfile
            } else if let Some((until, reason)) = ordered.all_blocked() {
                Availability::Cooled { until, reason }
            } else {
                Availability::Usable
            };
            let gate = if ordered.pinned && !ordered.slots.is_empty() {
                Gate::Try
            } else {
                let pos = Position { index: self.index, len: self.chain.len(), agent, provider: &cand.provider };
                book.gate(pos, avail, now)
            };
            if let Gate::Skip { reason, until } = gate {
                let msg = match until {
                    Some(u) => format!("every profile is cooling ({reason}) until {}", crate::status::time(u.key())),
                    None if reason == Reason::NoProfile
                        && self.exclude.iter().any(|p| p.provider() == cand.provider) =>
                    {
                        format!("provider {} has no usable profile that is not excluded", cand.provider)
                    }
                    None if reason == Reason::NoProfile => {
                        format!("provider {} has no profile with a usable secret", cand.provider)
                    }
                    None => reason.to_string(),
                };
                self.skip(&cand, reason, until, msg, now);
                continue;
            }
            let usable: Vec<ProfileId> =
                ordered.slots.iter().filter(|s| s.blocked.is_none()).map(|s| s.id.clone()).collect();
            let slots = if usable.is_empty() || gate == Gate::Probe {
                ordered.slots.iter().take(1).map(|s| s.id.clone()).collect()
            } else {
                usable
            };
            let picked = picked && gate != Gate::Probe;
            self.cur = Some(Cursor {
                slots,
                j: 0,
                tries: 0,
                probe: gate == Gate::Probe,
                pinned: ordered.pinned,
                picked,
                more: ordered.more && gate != Gate::Probe,
                tried: Vec::new(),
                last: None,
            });
        }
    }

    fn skip(&mut self, cand: &Candidate, reason: Reason, until: Option<Until>, message: String, now: Millis) {
        let mut row = self.trail.row(Kind::Skipped, cand, None, now);
        row.outcome = Outcome::Skipped;
        row.reason = Some(reason);
        row.cooldown_until = until.and_then(until_ms);
        row.duration_ms = Some(0);
        row.error = Some(message.clone());
        self.trail.record(row);
        self.failures.push(ModelFailure { label: cand.label(), reason, message, status: None, until, skipped: true });
        self.index += 1;
    }

    /// The attempt under way failed as `class` says: records it on the profile (or the model)
    /// and in the audit, and tells what comes next. `may_retry`: whether a same-profile retry
    /// still fits in the request's time.
    pub fn failed(
        &mut self,
        book: &Book,
        mut row: AttemptRow,
        class: &Classified,
        status: Option<u16>,
        may_retry: bool,
        now: Millis,
    ) -> Verdict {
        let reason = class.reason;
        row.http_status = status;
        let cur = self.cur.as_mut().expect("a failure is reported for an attempt under way");
        if cur.tries < reason.same_profile_retries() && may_retry && !self.single {
            book.count_failure(&cur.slots[cur.j], reason, now);
            describe(&mut row, class);
            self.trail.record(row);
            cur.tries += 1;
            let backoff = 100 * u64::from(cur.tries) + fastrand::u64(0..100);
            return Verdict::Retry(Duration::from_millis(backoff));
        }
        let until = self.mark(book, row, class, now);
        let cur = self.cur.as_mut().expect("checked above");
        let cand = &self.chain[self.index];
        cur.last = Some(ModelFailure {
            label: cand.label(),
            reason,
            message: class.message.clone(),
            status,
            until,
            skipped: false,
        });
        if self.single || reason.next() == After::Stop {
            return Verdict::Stop;
        }
        cur.j = if reason.next() == After::NextModel || cur.pinned { cur.slots.len() } else { cur.j + 1 };
        cur.tries = 0;
        Verdict::Moved
    }

    /// The candidate under way answered `context_overflow` (and `failed` said stop): go on with
    /// `larger`, the models with a larger window (`models.context_fallbacks`, docs/rotation.md), which
    /// replace the rest of the chain; models already tried are left out. Whether the walk goes on.
    pub fn overflow_to(&mut self, larger: Vec<Candidate>) -> bool {
        let tried = &self.chain[..=self.index];
        let larger: Vec<Candidate> = larger.into_iter().filter(|c| !tried.contains(c)).collect();
        if self.single || larger.is_empty() {
            return false;
        }
        self.chain.truncate(self.index + 1);
        self.chain.extend(larger);
        let cur = self.cur.as_mut().expect("an overflow is reported for an attempt under way");
        cur.j = cur.slots.len();
        cur.tries = 0;
        true
    }

    /// Records a failure of the attempt under way: counted on the profile that made the call,
    /// with its mark where it leaves one (the profile's windows, or the model's), and its row;
    /// returns the window it set.
    fn mark(&mut self, book: &Book, mut row: AttemptRow, class: &Classified, now: Millis) -> Option<Until> {
        let cur = self.cur.as_ref().expect("a failure is reported for an attempt under way");
        let cand = &self.chain[self.index];
        let failure = Failure {
            reason: class.reason,
            model: cand.model.clone(),
            hint_ms: class.hint.map(|h| h.wait_ms),
            account_wide: class.account_wide,
            started_at: row.started_at,
            claim: class.claim,
        };
        let profile_until = book.record_failure(&cur.slots[cur.j], &failure, now);
        let until = match class.reason.next() {
            // A model the config names cools on its provider; any other is only moved past: a
            // client may name models without end, and each would be kept and written.
            After::NextModel if self.trail.names(&cand.provider, &cand.model) => {
                Some(Until::At(book.record_model_not_found(&cand.provider, &cand.model, now, row.started_at)))
            }
            After::NextModel => None,
            After::Stop | After::Rotate => profile_until,
        };
        describe(&mut row, class);
        row.cooldown_until = until.and_then(until_ms);
        self.trail.record(row);
        self.marked |= until.is_some();
        until
    }

    /// rota's own request deadline cut the attempt under way: a failed row (`timeout`) that
    /// leaves no mark on the profile, which was not given the time it needed.
    pub fn abandoned(&mut self, mut row: AttemptRow, message: &str) {
        row.reason = Some(Reason::Timeout);
        row.error = Some(truncate(message, 500));
        self.trail.record(row);
    }

    /// rota is shutting down and its grace is over: the attempt under way is cut, a failed row
    /// (`cancelled`) that leaves no mark on the profile.
    pub fn stopped(&mut self, mut row: AttemptRow, message: &str) {
        row.reason = Some(Reason::Cancelled);
        row.error = Some(truncate(message, 500));
        self.trail.record(row);
    }

    /// The answer when the request's deadline (`timeouts.total`) stopped the walk: what was
    /// tried, in order. No further candidate is tried and nothing else is recorded.
    pub fn timed_out(&self, limit: Duration) -> String {
        let tried = self.trail.tried();
        let what = if tried.is_empty() { "no upstream call".to_string() } else { tried.join(" | ") };
        format!(
            "the request passed its {}s limit (timeouts.total) after {} attempt(s): {what}",
            limit.as_secs_f64(),
            tried.len()
        )
    }

    /// The committed stream of the attempt under way ended: it served the request, or failed
    /// after commit (no failover then: the client has the in-band error).
    pub fn stream_ended(&mut self, book: &Book, mut row: AttemptRow, ended: Ended, tokens: Tokens, now: Millis) {
        // Only a whole stream's usage is final: a cut one's cost is not known.
        let spent = self.trail.spend(&mut row, tokens, matches!(ended, Ended::Whole));
        let pid = {
            let cur = self.cur.as_ref().expect("a stream is reported for an attempt under way");
            cur.slots[cur.j].clone()
        };
        match ended {
            Ended::Whole => {
                book.record_success(&pid, &self.chain[self.index].model, row.started_at, now);
                row.outcome = Outcome::Success;
                self.trail.record(row);
            }
            Ended::Failed { class, .. } => {
                self.mark(book, row, &class, now);
            }
            Ended::Deadline(message) => self.abandoned(row, &message),
            Ended::Stopped(message) => self.stopped(row, &message),
        }
        self.trail.finish(200, Some((&self.chain[self.index], &pid)), spent);
    }

    /// Whether the attempt under way is the profile's first try in this request, and another
    /// may follow (not when failover is off).
    pub fn first_try(&self) -> bool {
        !self.single && self.cur.as_ref().is_some_and(|c| c.tries == 0)
    }

    /// The attempt under way failed for a cause rota has since removed (`then`: an expired OAuth
    /// token refreshed, thinking blocks taken out): records it (no cooldown, no failure counted)
    /// and tries the same profile once more.
    pub fn retry_same(&mut self, mut row: AttemptRow, class: &Classified, status: Option<u16>, then: &str) {
        let cur = self.cur.as_mut().expect("a failure is reported for an attempt under way");
        row.reason = Some(class.reason);
        row.http_status = status;
        row.error = Some(truncate(&format!("{} ({then}; trying again)", class.message), 500));
        self.trail.record(row);
        cur.tries += 1;
    }

    /// The attempt under way was served: records it and the request.
    pub fn succeeded(&mut self, book: &Book, mut row: AttemptRow, status: u16, tokens: Tokens, now: Millis) {
        let att_pid = {
            let cur = self.cur.as_ref().expect("a success is reported for an attempt under way");
            cur.slots[cur.j].clone()
        };
        book.record_success(&att_pid, &self.chain[self.index].model, row.started_at, now);
        row.outcome = Outcome::Success;
        row.http_status = Some(status);
        let spent = self.trail.spend(&mut row, tokens, true);
        self.trail.record(row);
        self.trail.finish(status, Some((&self.chain[self.index], &att_pid)), spent);
        self.log_fallback(&self.chain[self.index]);
    }

    /// The line docs/audit.md asks for when a request was served by a later model of its chain.
    pub fn log_fallback(&self, served: &Candidate) {
        if self.failures.is_empty() {
            return;
        }
        let why: Vec<String> = self
            .failures
            .iter()
            .map(|f| format!("{}: {} {}", f.label, f.status.map_or("-".into(), |s| s.to_string()), f.reason))
            .collect();
        tracing::info!(request_id = %self.trail.request_id, "fallback: served by {} ({})", served.label(), why.join(", "));
    }
}
