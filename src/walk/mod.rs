//! The failover walk of one request, shared by the gateway (which makes each upstream call
//! itself) and the lease API (whose agent makes it): which profile of which model comes next,
//! what a failure does to the profile and to the walk, and every attempt and skip audited (its
//! `Trail`).
//!
//! A walk is driven by `next` (the next attempt, or the end) and `failed` / `succeeded` (what
//! the attempt came to), each told with the `Attempt` that `next` handed out. The gateway drives
//! it in one loop; a lease drives it one report at a time, so both produce the same attempts,
//! in the same order, for the same faults.

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
use crate::engine::order::Ordered;
use crate::engine::{Failure, Millis, Next as After, ProfileId, Reason, Until};
use crate::prices::Tokens;
use crate::redact::truncate;
use crate::status::until_ms;
use crate::store::{AttemptRow, Kind, Outcome};
use std::time::Duration;

/// Why an attempt still under way when `server.shutdown_grace` ran out was cut.
pub const STOPPING: &str = "rota is shutting down (server.shutdown_grace is over)";

/// The next upstream call to make, and the handle its outcome is told with. While the call is
/// under way the attempt holds the walk's place among its candidate's profiles; `failed` and
/// `retry_same` give it back for the next `next`, `succeeded` and `stream_ended` end the walk.
/// Only `next` makes one, so no outcome can be told of an attempt that was not made.
#[derive(Debug)]
pub struct Attempt {
    pub index: usize,
    pub cand: Candidate,
    pub pid: ProfileId,
    pub cred: Credential,
    pub kind: Kind,
    cursor: Box<Cursor>,
}

/// What `next` found.
pub enum Step {
    Try(Attempt),
    /// The request names a profile that cannot serve it (a pin error): a 400.
    Refuse(String),
    /// Every candidate failed or was skipped.
    Exhausted(Aggregated),
}

/// A failed attempt as the walk is told of it (`Walk::failed`, `Runtime::settle`).
pub struct Failed<'a> {
    pub row: AttemptRow,
    /// What the failure was; it ends as recorded (`Runtime::settle` may make it
    /// `auth_permanent`).
    pub class: &'a mut Classified,
    /// The upstream's HTTP status, when it answered.
    pub status: Option<u16>,
    /// Whether a same-profile retry still fits in the request's time.
    pub may_retry: bool,
    /// Whether it may leave its mark (a window, a count): false for an agent's claim past its
    /// share (`leases.claim_share`), which is only audited (the walk goes on as it would).
    pub marks: bool,
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

/// The profiles of the candidate under way, and the walk's place among them.
#[derive(Debug)]
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

impl Cursor {
    /// The profiles of a candidate that its gate lets the walk try: the usable ones in order,
    /// or only the first when none is usable or the gate probes. `picked`: `Book::pick` marked
    /// the first one used.
    fn of(ordered: Ordered, picked: bool, gate: Gate) -> Cursor {
        let probe = gate == Gate::Probe;
        let usable: Vec<ProfileId> =
            ordered.slots.iter().filter(|s| s.blocked.is_none()).map(|s| s.id.clone()).collect();
        let slots = if usable.is_empty() || probe {
            ordered.slots.iter().take(1).map(|s| s.id.clone()).collect()
        } else {
            usable
        };
        Cursor {
            slots,
            j: 0,
            tries: 0,
            probe,
            pinned: ordered.pinned,
            picked: picked && !probe,
            more: ordered.more && !probe,
            tried: Vec::new(),
            last: None,
        }
    }

    /// What an attempt with the profile at the cursor is; `first`: the request has had no
    /// attempt or skip yet.
    fn kind(&self, first: bool) -> Kind {
        if self.probe && self.tries == 0 && self.j == 0 {
            Kind::Probe
        } else if self.tries > 0 {
            Kind::Retry
        } else if first {
            Kind::Primary
        } else if self.j > 0 || !self.tried.is_empty() {
            Kind::Rotate
        } else {
            Kind::Fallback
        }
    }
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
    /// The place among the profiles of the candidate under way, between its attempts (an
    /// attempt under way holds it).
    cur: Option<Box<Cursor>>,
    failures: Vec<ModelFailure>,
    /// Upstream calls made so far (`limits.max_attempts` bounds them).
    calls: u32,
    /// A failure of this request put a profile or a model in a window, or it bound or moved its
    /// session: the answer waits until that is written (`Runtime::durable`).
    marked: bool,
    pub trail: Trail,
}

/// The row's reason, retry hint and error, from the classified failure.
fn describe(row: &mut AttemptRow, class: &Classified) {
    row.reason = Some(class.reason);
    row.retry_after_ms = class.hint.map(|h| h.wait_ms);
    row.error = Some(truncate(&class.message, 500));
}

/// What a candidate's profiles allow: its model cooling (`model_not_found`), no profile, every
/// profile cooling, or a usable one.
fn availability(book: &Book, cand: &Candidate, ordered: &Ordered, now: Millis) -> Availability {
    if let Some(until) = book.model_cooled_until(&cand.provider, &cand.model, now) {
        Availability::Cooled { until: Until::At(until), reason: Reason::ModelNotFound }
    } else if ordered.slots.is_empty() {
        Availability::NoProfile
    } else if let Some((until, reason)) = ordered.all_blocked() {
        Availability::Cooled { until, reason }
    } else {
        Availability::Usable
    }
}

impl Walk {
    /// A walk of `chain` for the trail's agent; `session` is the agent's own
    /// (`agents_session`), so that no other agent's request can move or learn its binding.
    pub fn new(chain: Vec<Candidate>, session: Option<String>, pin: Option<ProfileId>, trail: Trail) -> Walk {
        Walk {
            chain,
            single: false,
            session: session.map(|s| crate::book::agents_session(trail.agent(), &s)),
            pin,
            exclude: Vec::new(),
            index: 0,
            cur: None,
            failures: Vec::new(),
            calls: 0,
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
            if self.calls >= config.limits.max_attempts {
                return self.capped(config.limits.max_attempts, now);
            }
            if let Some(cur) = self.cur.take()
                && let Some(att) = self.resume(book, config, cur, now)
            {
                return Step::Try(att);
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
            match self.begin(book, config, agent, &cand, now) {
                Ok(cur) => self.cur = cur,
                Err(pin) => return Step::Refuse(pin),
            }
        }
    }

    /// The end of a walk that made `max` upstream calls (`limits.max_attempts`, counted across
    /// retries, rotations and fallbacks): the failures so far, the candidate under way's
    /// included, with the cap named first.
    fn capped(&mut self, max: u32, now: Millis) -> Step {
        if let Some(cur) = self.cur.take() {
            self.failures.extend(cur.last);
        }
        let mut out = aggregate(&self.failures, now);
        out.message = format!("stopped after {max} upstream calls (limits.max_attempts = {max}): {}", out.message);
        self.trail.answered(&out.message);
        Step::Exhausted(out)
    }

    /// The next attempt of the candidate under way: its next profile with a credential, then
    /// the further profiles its order has (`more`). `None` once it has none left: its latest
    /// failure goes to the aggregated error, and the walk on to the next candidate.
    fn resume(&mut self, book: &Book, config: &Config, mut cur: Box<Cursor>, now: Millis) -> Option<Attempt> {
        loop {
            while cur.j < cur.slots.len() {
                let pid = &cur.slots[cur.j];
                if let Some(cred) = book.credential(pid) {
                    let kind = cur.kind(self.trail.seq == 0);
                    let cand = self.chain[self.index].clone();
                    // The first profile was marked used when it was picked; a rotation or a
                    // retry marks the one it tries.
                    if cur.j > 0 || cur.tries > 0 || !cur.picked {
                        self.marked |= book.mark_used(pid, self.session.as_deref(), now);
                    }
                    let pid = pid.clone();
                    self.calls += 1;
                    return Some(Attempt { index: self.index, cand, pid, cred, kind, cursor: cur });
                }
                cur.j += 1;
                cur.tries = 0;
            }
            if !(cur.more && self.more(book, config, &mut cur, now)) {
                self.failures.extend(cur.last);
                self.index += 1;
                return None;
            }
        }
    }

    /// The next usable profiles of the candidate under way, those tried left out (its order
    /// went on past the first ones: `Ordered::more`); false when there are none.
    fn more(&mut self, book: &Book, config: &Config, cur: &mut Cursor, now: Millis) -> bool {
        cur.tried.append(&mut cur.slots);
        let exclude: Vec<ProfileId> = self.exclude.iter().chain(&cur.tried).cloned().collect();
        let cand = &self.chain[self.index];
        let target = (cand.provider.as_str(), cand.model.as_str());
        let Ok(picked) = book.pick(config, target, self.session.as_deref(), None, &exclude, now) else {
            return false;
        };
        self.marked |= picked.bound;
        let ordered = picked.ordered;
        cur.slots = ordered.slots.into_iter().filter(|s| s.blocked.is_none()).map(|s| s.id).collect();
        (cur.j, cur.tries, cur.picked, cur.more) = (0, 0, picked.marked, ordered.more);
        !cur.slots.is_empty()
    }

    /// The provider and model of the first candidate.
    pub fn first_target(&self) -> Option<(&str, &str)> {
        self.chain.first().map(|c| (c.provider.as_str(), c.model.as_str()))
    }

    /// Begins the candidate `cand`: its provider's profiles in order, as far as its gate lets
    /// them be tried (docs/rotation.md). `None` when the gate skips it (audited); the error is
    /// a pin that cannot serve it.
    fn begin(
        &mut self,
        book: &Book,
        config: &Config,
        agent: &str,
        cand: &Candidate,
        now: Millis,
    ) -> Result<Option<Box<Cursor>>, String> {
        let pin = self.pin.as_ref().filter(|p| p.provider() == cand.provider);
        let target = (cand.provider.as_str(), cand.model.as_str());
        let picked =
            book.pick(config, target, self.session.as_deref(), pin, &self.exclude, now).map_err(|e| e.to_string())?;
        self.marked |= picked.bound;
        let ordered = picked.ordered;
        let avail = availability(book, cand, &ordered, now);
        let gate = if ordered.pinned && !ordered.slots.is_empty() {
            Gate::Try
        } else {
            let pos = Position { index: self.index, len: self.chain.len(), agent, provider: &cand.provider };
            book.gate(pos, avail, now)
        };
        if let Gate::Skip { reason, until } = gate {
            let message = self.skipped(cand, reason, until);
            self.skip(cand, reason, until, message, now);
            return Ok(None);
        }
        Ok(Some(Box::new(Cursor::of(ordered, picked.marked, gate))))
    }

    /// Why the gate skips `cand`, as its row and the aggregated error say.
    fn skipped(&self, cand: &Candidate, reason: Reason, until: Option<Until>) -> String {
        match until {
            Some(u) => format!("every profile is cooling ({reason}) until {}", crate::status::time(u.key())),
            None if reason == Reason::NoProfile && self.exclude.iter().any(|p| p.provider() == cand.provider) => {
                format!("provider {} has no usable profile that is not excluded", cand.provider)
            }
            None if reason == Reason::NoProfile => {
                format!("provider {} has no profile with a usable secret", cand.provider)
            }
            None => reason.to_string(),
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

    /// `att` failed as `failed.class` says: records it on the profile (or the model) and in the
    /// audit, takes back the walk's place and tells what comes next.
    pub fn failed(
        &mut self,
        book: &Book,
        config: &Config,
        mut att: Attempt,
        failed: Failed<'_>,
        now: Millis,
    ) -> Verdict {
        let verdict = self.verdict(book, config, &mut att, failed, now);
        self.cur = Some(att.cursor);
        verdict
    }

    /// What `failed` records, and what comes next: the same profile again while its retries
    /// last, else the next profile or model, or the end of the walk.
    fn verdict(&mut self, book: &Book, config: &Config, att: &mut Attempt, failed: Failed<'_>, now: Millis) -> Verdict {
        let Failed { mut row, class, status, may_retry, marks } = failed;
        let reason = class.reason;
        row.http_status = status;
        let cur = &mut att.cursor;
        // A probe asks once whether the provider is back: no same-profile retry.
        if cur.tries < reason.same_profile_retries() && may_retry && !self.single && !cur.probe {
            if marks {
                book.count_failure(&att.pid, reason, now);
            }
            describe(&mut row, class);
            self.trail.record(row);
            cur.tries += 1;
            let backoff = 100 * u64::from(cur.tries) + fastrand::u64(0..100);
            return Verdict::Retry(Duration::from_millis(backoff));
        }
        let until = if marks {
            self.mark(book, att, row, class, now)
        } else {
            describe(&mut row, class);
            self.trail.record(row);
            None
        };
        let message = class.message.clone();
        att.cursor.last =
            Some(ModelFailure { label: att.cand.label(), reason, message, status, until, skipped: false });
        if self.single || reason.next() == After::Stop {
            let larger = reason == Reason::ContextOverflow && self.overflow(config, att);
            return if larger { Verdict::Moved } else { Verdict::Stop };
        }
        let cur = &mut att.cursor;
        cur.j = if reason.next() == After::NextModel || cur.pinned { cur.slots.len() } else { cur.j + 1 };
        cur.tries = 0;
        Verdict::Moved
    }

    /// `att`'s candidate answered `context_overflow`, which stops the walk: it goes on with the
    /// models of a larger window instead (`models.context_fallbacks`, docs/rotation.md), which
    /// replace the rest of the chain; models already tried are left out. Whether it goes on.
    fn overflow(&mut self, config: &Config, att: &mut Attempt) -> bool {
        let larger = match config.context_chain(&att.cand, fastrand::u64(..)) {
            Ok(larger) => larger,
            Err(e) => {
                tracing::warn!("models.context_fallbacks.\"{}\": {e}", att.cand.label());
                return false;
            }
        };
        let tried = &self.chain[..=self.index];
        let larger: Vec<Candidate> = larger.into_iter().filter(|c| !tried.contains(c)).collect();
        if self.single || larger.is_empty() {
            return false;
        }
        self.chain.truncate(self.index + 1);
        self.chain.extend(larger);
        att.cursor.j = att.cursor.slots.len();
        att.cursor.tries = 0;
        true
    }

    /// Records a failure of `att`: counted on the profile that made the call, with its mark
    /// where it leaves one (the profile's windows, or the model's), and its row; returns the
    /// window it set.
    fn mark(
        &mut self,
        book: &Book,
        att: &Attempt,
        mut row: AttemptRow,
        class: &Classified,
        now: Millis,
    ) -> Option<Until> {
        let cand = &att.cand;
        let failure = Failure {
            reason: class.reason,
            model: cand.model.clone(),
            hint_ms: class.hint.map(|h| h.wait_ms),
            account_wide: class.account_wide,
            started_at: row.started_at,
            claim: class.claim,
        };
        let profile_until = book.record_failure(&att.pid, &failure, now);
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

    /// The committed stream of `att` ended: it served the request, or failed after commit (no
    /// failover then: the client has the in-band error).
    pub fn stream_ended(
        &mut self,
        book: &Book,
        att: &Attempt,
        mut row: AttemptRow,
        ended: Ended,
        tokens: Tokens,
        now: Millis,
    ) {
        // Only a whole stream's usage is final: a cut one's cost is not known.
        let spent = self.trail.spend(&mut row, tokens, matches!(ended, Ended::Whole));
        match ended {
            Ended::Whole => {
                book.record_success(&att.pid, &att.cand.model, row.started_at, now);
                row.outcome = Outcome::Success;
                self.trail.record(row);
            }
            Ended::Failed { class, .. } => {
                self.mark(book, att, row, &class, now);
            }
            Ended::Deadline(message) => self.abandoned(row, &message),
            Ended::Stopped(message) => self.stopped(row, &message),
        }
        self.trail.finish(200, Some((&att.cand, &att.pid)), spent);
    }

    /// Whether `att` is its profile's first try in this request, and another may follow (not
    /// when failover is off).
    pub fn first_try(&self, att: &Attempt) -> bool {
        !self.single && att.cursor.tries == 0
    }

    /// `att` failed for a cause rota has since removed (`then`: an expired OAuth token
    /// refreshed, thinking blocks taken out): records it (no cooldown, no failure counted),
    /// takes back the walk's place, and the same profile is tried once more.
    pub fn retry_same(
        &mut self,
        mut att: Attempt,
        mut row: AttemptRow,
        class: &Classified,
        status: Option<u16>,
        then: &str,
    ) {
        row.reason = Some(class.reason);
        row.http_status = status;
        row.error = Some(truncate(&format!("{} ({then}; trying again)", class.message), 500));
        self.trail.record(row);
        att.cursor.tries += 1;
        self.cur = Some(att.cursor);
    }

    /// `att` served the request: records it and the request.
    pub fn succeeded(
        &mut self,
        book: &Book,
        att: &Attempt,
        mut row: AttemptRow,
        status: u16,
        tokens: Tokens,
        now: Millis,
    ) {
        book.record_success(&att.pid, &att.cand.model, row.started_at, now);
        row.outcome = Outcome::Success;
        row.http_status = Some(status);
        let spent = self.trail.spend(&mut row, tokens, true);
        self.trail.record(row);
        self.trail.finish(status, Some((&att.cand, &att.pid)), spent);
        self.log_fallback(&att.cand);
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
