//! The audit log written: each request's row and its attempts' (every request writes them, in
//! batches), the minute, hourly and daily roll-ups and the agents' day counters kept with them,
//! and the pruning of old rows.

use super::{Affected, Backend, DAY, Driver, HOUR, MINUTE, Sql, Value};
use crate::engine::Millis;
use crate::store::{AttemptRecord, Pruned, RequestRecord, StoreError};
use sqlx::{ColumnIndex, Encode, Executor, Row, Type};
use std::collections::{BTreeMap, BTreeSet, HashSet};

/// The tokens (in and out) and cost of requests, summed per agent and UTC day (its start).
fn agent_days<'a>(requests: impl Iterator<Item = &'a RequestRecord>) -> BTreeMap<(&'a str, Millis), (i64, f64)> {
    let mut days: BTreeMap<(&str, Millis), (i64, f64)> = BTreeMap::new();
    for r in requests {
        let Some(agent) = r.agent.as_deref() else { continue };
        let sums = days.entry((agent, crate::agents::day_start(r.started_at))).or_default();
        sums.0 = sums.0.saturating_add(r.tokens_in.unwrap_or(0).saturating_add(r.tokens_out.unwrap_or(0)));
        sums.1 += r.cost.unwrap_or(0.0);
    }
    days
}

/// A row of `usage_daily`: the day (UTC, `YYYY-MM-DD`), agent, provider, model and profile.
type Day = (String, String, String, String, String);

/// A row of `audit_minutely` (or `audit_hourly`): the minute (hour), kind (`attempt` or
/// `request`), provider, outcome and reason.
type Minute<'a> = (Millis, &'static str, &'a str, &'a str, &'a str);

/// An audit batch's rows summed for the roll-ups written with them: its attempts per hour and
/// profile (`usage_hourly`), its attempts and requests per minute (`audit_minutely`).
#[derive(Default)]
struct RollUps<'a> {
    /// Attempts, successes, failures, tokens in and out of the rows that were inserted.
    hours: BTreeMap<(Millis, &'a str), [i64; 5]>,
    /// Hours to count again from `attempts`: a chunk only some of whose rows were new.
    recount_hours: BTreeSet<(Millis, &'a str)>,
    /// The attempts and requests that were inserted, per minute.
    minutes: BTreeMap<Minute<'a>, i64>,
    /// Minutes whose attempts are counted again from `attempts`, as hours are.
    recount_minutes: BTreeSet<Millis>,
}

impl<'a> RollUps<'a> {
    /// A chunk of attempts of which `inserted` were new. None: a retried batch whose first
    /// commit did land (`ON CONFLICT DO NOTHING`), already counted; all: added; some (which
    /// ones is not known): their hours and minutes are counted again from the table.
    fn add_attempts(&mut self, chunk: &'a [AttemptRecord], inserted: u64) {
        if inserted == 0 {
            return;
        }
        let some = inserted < chunk.len() as u64;
        for a in chunk {
            let minute = a.started_at.div_euclid(MINUTE) * MINUTE;
            if some {
                self.recount_minutes.insert(minute);
            } else {
                let key =
                    (minute, "attempt", a.provider.as_str(), a.outcome.as_str(), a.reason.as_deref().unwrap_or(""));
                *self.minutes.entry(key).or_default() += 1;
            }
            let Some(profile) = a.profile_id.as_deref() else { continue };
            let key = (a.started_at.div_euclid(HOUR) * HOUR, profile);
            if some {
                self.recount_hours.insert(key);
                continue;
            }
            count_attempt(self.hours.entry(key).or_default(), &a.outcome, a.tokens_in, a.tokens_out);
        }
    }

    /// A request that was inserted: `served` (a 2xx), `refused` (no attempt) or `failed`.
    fn add_request(&mut self, r: &RequestRecord) {
        let outcome = match (r.attempts, r.status) {
            (0, _) => "refused",
            (_, Some(200..=299)) => "served",
            _ => "failed",
        };
        *self.minutes.entry((r.started_at.div_euclid(MINUTE) * MINUTE, "request", "", outcome, "")).or_default() += 1;
    }
}

/// The statement that adds the sums of the JSON rows in `$1` to their rows of `usage_hourly`
/// (`table`, keyed by `hour`) or `usage_profile_daily` (by `day`), given the SQL that turns the
/// rows into a `FROM` item named `r`.
pub(super) fn add_usage(rows: impl Fn(&[(&str, &str)]) -> String, table: &str, at: &str) -> String {
    format!(
        "INSERT INTO {table} ({at}, profile_id, attempts, successes, failures, tokens_in, tokens_out)
         SELECT r.{at}, r.profile_id, r.attempts, r.successes, r.failures, r.tokens_in, r.tokens_out FROM {}
         WHERE true ORDER BY r.{at}, r.profile_id
         ON CONFLICT ({at}, profile_id) DO UPDATE SET
             attempts = {table}.attempts + excluded.attempts,
             successes = {table}.successes + excluded.successes,
             failures = {table}.failures + excluded.failures,
             tokens_in = {table}.tokens_in + excluded.tokens_in,
             tokens_out = {table}.tokens_out + excluded.tokens_out",
        rows(&[
            (at, "BIGINT"),
            ("profile_id", "TEXT"),
            ("attempts", "BIGINT"),
            ("successes", "BIGINT"),
            ("failures", "BIGINT"),
            ("tokens_in", "BIGINT"),
            ("tokens_out", "BIGINT"),
        ])
    )
}

/// The statements that keep `failure_windows` (PostgreSQL's migration 0024): the failures that
/// open a window on their profile, each with the profile's first success inside it. The close
/// ends a window at a success written after its failure's row; the open finds one written
/// before (a long call's failure lands after the success of a call started later).
pub(super) struct WindowTexts {
    /// Locks the profiles of the JSON array in `$1` until the commit, in the order of their
    /// locks' keys (the same for every writer, so two batches cannot wait on each other), so
    /// the statements after it see every row another writer's batch wrote of these profiles:
    /// a failure and a later success written at once by two servers would otherwise each miss
    /// the other's uncommitted row. It also turns JIT compilation off for the rest of the
    /// transaction: the searches' estimates grow with the table and passed its threshold,
    /// compiling tens of milliseconds for statements that run in a few.
    lock: String,
    /// Inserts the windows of the JSON rows in `$1` with each one's next success in `attempts`.
    open: String,
    /// The windows open at the successes of the JSON rows in `$1`, each with the earliest of
    /// them that ends it: one search of `failure_windows_open` a success, kept apart
    /// (`OFFSET 0`), since the join the planner made of it read the whole table for each batch.
    ended: String,
    /// Ends the windows of the JSON rows in `$1` at their successes, each looked up by its key.
    close: String,
}

/// A window of `failure_windows` while a success may end it, as its index `failure_windows_open`
/// has it: from the failure's start to its end or its next success, both excluded.
const OPEN: &str =
    "int8range(o.started_at, greatest(o.started_at, least(coalesce(o.cooldown_until, 9223372036854775807),
    coalesce(o.next_success, 9223372036854775807))), '()')";

/// The first key of `failure_windows`' locks (`pg_advisory_xact_lock(key, hashtext(profile))`):
/// "rota" in ASCII.
const WINDOW_LOCKS: i32 = 0x726f_7461;

impl WindowTexts {
    pub(super) fn new(ids: &str, rows: impl Fn(&[(&str, &str)]) -> String) -> WindowTexts {
        WindowTexts {
            lock: format!(
                "SELECT set_config('jit', 'off', true), count(pg_advisory_xact_lock({WINDOW_LOCKS}, h))
                 FROM (SELECT DISTINCT hashtext(p) AS h FROM ({ids}) AS t(p) ORDER BY h) AS l"
            ),
            open: format!(
                "INSERT INTO failure_windows
                     (request_id, seq, profile_id, started_at, duration_ms, reason, cooldown_until, next_success)
                 SELECT r.request_id, r.seq, r.profile_id, r.started_at, r.duration_ms, r.reason, r.cooldown_until,
                     (SELECT s.started_at FROM attempts s
                      WHERE s.profile_id = r.profile_id AND s.started_at > r.started_at
                        AND s.started_at < coalesce(r.cooldown_until, 9223372036854775807) AND s.outcome = 'success'
                      ORDER BY s.started_at LIMIT 1)
                 FROM {}
                 ON CONFLICT (request_id, seq) DO NOTHING",
                rows(&[
                    ("request_id", "TEXT"),
                    ("seq", "BIGINT"),
                    ("profile_id", "TEXT"),
                    ("started_at", "BIGINT"),
                    ("duration_ms", "BIGINT"),
                    ("reason", "TEXT"),
                    ("cooldown_until", "BIGINT"),
                ])
            ),
            ended: format!(
                "SELECT o.request_id, o.seq, min(r.started_at)
                 FROM {} CROSS JOIN LATERAL (
                     SELECT request_id, seq FROM failure_windows o
                     WHERE {OPEN} @> r.started_at AND o.profile_id = r.profile_id
                     OFFSET 0) AS o
                 GROUP BY o.request_id, o.seq",
                rows(&[("profile_id", "TEXT"), ("started_at", "BIGINT")])
            ),
            close: format!(
                "UPDATE failure_windows w SET next_success = r.at FROM {}
                 WHERE w.request_id = r.request_id AND w.seq = r.seq
                   AND (w.next_success IS NULL OR w.next_success > r.at)",
                rows(&[("request_id", "TEXT"), ("seq", "BIGINT"), ("at", "BIGINT")])
            ),
        }
    }
}

/// The statement that adds the counts of the JSON rows in `$1` to their rows of
/// `audit_minutely` (`table`, keyed by `minute`) or `audit_hourly` (by `hour`), given the SQL that
/// turns the rows into a `FROM` item named `r`.
pub(super) fn add_counts(rows: impl Fn(&[(&str, &str)]) -> String, table: &str, at: &str) -> String {
    format!(
        "INSERT INTO {table} ({at}, kind, provider, outcome, reason, n)
         SELECT r.{at}, r.kind, r.provider, r.outcome, r.reason, r.n FROM {}
         WHERE true ORDER BY r.{at}, r.kind, r.provider, r.outcome, r.reason
         ON CONFLICT ({at}, kind, provider, outcome, reason) DO UPDATE SET n = {table}.n + excluded.n",
        rows(&[
            (at, "BIGINT"),
            ("kind", "TEXT"),
            ("provider", "TEXT"),
            ("outcome", "TEXT"),
            ("reason", "TEXT"),
            ("n", "BIGINT")
        ])
    )
}

/// Adds one attempt to a roll-up's attempts, successes, failures, tokens in and out.
fn count_attempt(sums: &mut [i64; 5], outcome: &str, tokens_in: Option<i64>, tokens_out: Option<i64>) {
    sums[0] += 1;
    sums[1] += i64::from(outcome == "success");
    sums[2] += i64::from(outcome == "failure");
    sums[3] = sums[3].saturating_add(tokens_in.unwrap_or(0));
    sums[4] = sums[4].saturating_add(tokens_out.unwrap_or(0));
}

/// The row counts of the audit's multi-row INSERTs, largest first.
const SHAPES: [usize; 3] = [64, 8, 1];

/// `rows` cut into chunks whose lengths are among [`SHAPES`], the largest that fits first.
fn shaped<T>(mut rows: &[T]) -> impl Iterator<Item = &[T]> {
    std::iter::from_fn(move || {
        let n = SHAPES.into_iter().find(|&n| rows.len() >= n)?;
        let (chunk, rest) = rows.split_at(n);
        rows = rest;
        Some(chunk)
    })
}

/// `INSERT INTO {table} VALUES (…), … ON CONFLICT DO NOTHING`, one text per shape.
pub(super) struct Shapes([String; SHAPES.len()]);

impl Shapes {
    /// The attempts table's INSERTs; `numbered`: `$N` parameters, else `?`.
    pub(super) fn attempts(numbered: bool) -> Shapes {
        Shapes::new(
            "attempts (request_id, seq, kind, agent, provider, model, profile_id, started_at, duration_ms, ttfb_ms,
             http_status, outcome, reason, retry_after_ms, cooldown_until, error, tokens_in, tokens_out, cost,
             usage_suspect)",
            20,
            numbered,
        )
    }

    /// The requests table's INSERTs.
    pub(super) fn requests(numbered: bool) -> Shapes {
        Shapes::new(
            "requests (id, agent, api, requested_model, served_model, served_profile, status, attempts, started_at,
             duration_ms, stream, tokens_in, tokens_out, error, cost, usage_suspect)",
            16,
            numbered,
        )
        .returning("id")
    }

    fn new(table: &str, columns: usize, numbered: bool) -> Shapes {
        Shapes(SHAPES.map(|rows| {
            let values: Vec<String> = (0..rows)
                .map(|r| {
                    let row: Vec<String> = (1..=columns)
                        .map(|c| if numbered { format!("${}", r * columns + c) } else { "?".to_string() })
                        .collect();
                    format!("({})", row.join(", "))
                })
                .collect();
            format!("INSERT INTO {table} VALUES {} ON CONFLICT DO NOTHING", values.join(", "))
        }))
    }

    /// The same INSERTs answering with `column` of each row they inserted.
    fn returning(self, column: &str) -> Shapes {
        Shapes(self.0.map(|sql| format!("{sql} RETURNING {column}")))
    }

    fn sql(&self, rows: usize) -> &str {
        &self.0[SHAPES.iter().position(|&n| n == rows).expect("a chunk of shaped()")]
    }
}

impl<S, DB> Sql<'_, S>
where
    S: Backend<Db = DB>,
    DB: Driver,
    for<'c> &'c mut DB::Connection: Executor<'c, Database = DB>,
    for<'n> &'n str: ColumnIndex<DB::Row> + Encode<'n, DB> + Type<DB>,
    for<'n> Option<&'n str>: Encode<'n, DB>,
    usize: ColumnIndex<DB::Row>,
    bool: Value<DB>,
    i64: Value<DB>,
    f64: Value<DB>,
    String: Value<DB>,
    Vec<u8>: Value<DB>,
    Option<i64>: Value<DB>,
    Option<f64>: Value<DB>,
    Option<String>: Value<DB>,
{
    pub(super) async fn insert_audit(
        &self,
        requests: &[RequestRecord],
        attempts: &[AttemptRecord],
    ) -> Result<(), StoreError> {
        // Multi-row INSERTs of 64, 8 or 1 rows (`shaped`): few statements a batch, since each
        // is a round trip to the SQLite worker thread, and only three SQL texts a table, each
        // parsed once and kept in the connection's statement cache. (A text per batch size
        // was parsed anew for every batch: a third of the audit's cost at low load.)
        // `ON CONFLICT DO NOTHING`: a retried batch whose first commit did land (an I/O
        // error after the commit record was written) adds nothing twice.
        let mut tx = self.store.audit_tx().await?;
        let mut sums = Self::insert_attempts(&mut tx, attempts).await?;
        Self::add_usage(&mut tx, &S::texts().add_hours, "hour", &sums.hours).await?;
        Self::recount_hours(&mut tx, &sums.recount_hours).await?;
        Self::add_to_profile_days(&mut tx, &sums.hours, &sums.recount_hours).await?;
        Self::keep_windows(&mut tx, attempts).await?;
        let inserted = Self::insert_requests(&mut tx, requests).await?;
        // The roll-ups and each agent's day (`agent_usage`) take the requests written now
        // (not those of a retried batch's rows that had landed); the minutes last, since every
        // server of a fleet adds to the same few rows of the minute, each held to the commit.
        let new = || requests.iter().filter(|r| inserted.contains(&r.id));
        Self::add_to_agent_days(&mut tx, &agent_days(new())).await?;
        new().for_each(|r| sums.add_request(r));
        Self::add_to_minutes(&mut tx, &sums.minutes).await?;
        Self::recount_minutes(&mut tx, &sums.recount_minutes).await?;
        Self::add_to_audit_hours(&mut tx, &sums.minutes, &sums.recount_minutes).await?;
        tx.commit().await?;
        Ok(())
    }

    /// Inserts attempts, in chunks of the prepared shapes; the roll-ups' sums of those that
    /// were new.
    async fn insert_attempts<'a>(
        tx: &mut DB::Connection,
        attempts: &'a [AttemptRecord],
    ) -> Result<RollUps<'a>, StoreError> {
        let mut sums = RollUps::default();
        for chunk in shaped(attempts) {
            let mut q = sqlx::query(S::texts().attempts.sql(chunk.len()));
            for a in chunk {
                q = q
                    .bind(&a.request_id)
                    .bind(a.seq)
                    .bind(&a.kind)
                    .bind(&a.agent)
                    .bind(&a.provider)
                    .bind(&a.model)
                    .bind(&a.profile_id)
                    .bind(a.started_at)
                    .bind(a.duration_ms)
                    .bind(a.ttfb_ms)
                    .bind(a.http_status)
                    .bind(&a.outcome)
                    .bind(&a.reason)
                    .bind(a.retry_after_ms)
                    .bind(a.cooldown_until)
                    .bind(&a.error)
                    .bind(a.tokens_in)
                    .bind(a.tokens_out)
                    .bind(a.cost)
                    .bind(a.usage_suspect);
            }
            let inserted = q.execute(&mut *tx).await?.rows_affected();
            sums.add_attempts(chunk, inserted);
        }
        Ok(sums)
    }

    /// Adds attempts' sums to their rows of `usage_hourly` or `usage_profile_daily` (by
    /// `statement`, whose time column is `at`), in one statement, in the order of their keys (as
    /// every writer locks them).
    async fn add_usage(
        tx: &mut DB::Connection,
        statement: &'static str,
        at: &str,
        sums: &BTreeMap<(Millis, &str), [i64; 5]>,
    ) -> Result<(), StoreError> {
        if sums.is_empty() {
            return Ok(());
        }
        let rows: Vec<serde_json::Value> = sums
            .iter()
            .map(|((time, profile), [n, ok, failed, tin, tout])| {
                serde_json::json!({at: time, "profile_id": profile, "attempts": n, "successes": ok,
                    "failures": failed, "tokens_in": tin, "tokens_out": tout})
            })
            .collect();
        let rows = serde_json::to_string(&rows).expect("rows serialize");
        sqlx::query(statement).bind(rows).execute(&mut *tx).await?;
        Ok(())
    }

    /// Adds the hours' sums to their days' rows of `usage_profile_daily`, then sums the days of
    /// the recounted hours again from `usage_hourly`, where the writer keeps it (`Texts`).
    async fn add_to_profile_days(
        tx: &mut DB::Connection,
        hours: &BTreeMap<(Millis, &str), [i64; 5]>,
        recounted: &BTreeSet<(Millis, &str)>,
    ) -> Result<(), StoreError> {
        let Some(statement) = &S::texts().add_profile_days else { return Ok(()) };
        let mut days: BTreeMap<(Millis, &str), [i64; 5]> = BTreeMap::new();
        for ((hour, profile), sums) in hours {
            let day = days.entry((hour.div_euclid(DAY) * DAY, profile)).or_default();
            day.iter_mut().zip(sums).for_each(|(d, s)| *d = d.saturating_add(*s));
        }
        Self::add_usage(tx, statement, "day", &days).await?;
        Self::recount_profile_days(tx, recounted.iter().map(|(hour, _)| hour.div_euclid(DAY) * DAY).collect()).await
    }

    /// Sums these days of `usage_profile_daily` again from `usage_hourly` (the profiles whose
    /// hours there are all gone go too).
    async fn recount_profile_days(tx: &mut DB::Connection, days: BTreeSet<Millis>) -> Result<(), StoreError> {
        for day in days {
            sqlx::query("DELETE FROM usage_profile_daily WHERE day = $1").bind(day).execute(&mut *tx).await?;
            sqlx::query(
                "INSERT INTO usage_profile_daily (day, profile_id, attempts, successes, failures, tokens_in, tokens_out)
                 SELECT $1, profile_id, CAST(sum(attempts) AS BIGINT), CAST(sum(successes) AS BIGINT),
                        CAST(sum(failures) AS BIGINT), CAST(sum(tokens_in) AS BIGINT),
                        CAST(sum(tokens_out) AS BIGINT)
                 FROM usage_hourly WHERE hour >= $1 AND hour < $2 GROUP BY profile_id",
            )
            .bind(day)
            .bind(day + DAY)
            .execute(&mut *tx)
            .await?;
        }
        Ok(())
    }

    /// Opens the windows of the batch's failures and ends the open ones at its successes, in
    /// `failure_windows`, where the writer keeps it (`Texts`). A retried batch whose first
    /// commit landed changes nothing: its windows are there, and its successes ended them.
    async fn keep_windows(tx: &mut DB::Connection, attempts: &[AttemptRecord]) -> Result<(), StoreError> {
        let Some(texts) = &S::texts().windows else { return Ok(()) };
        let (mut profiles, mut opened, mut successes) = (BTreeSet::new(), Vec::new(), Vec::new());
        for a in attempts {
            let Some(profile) = a.profile_id.as_deref() else { continue };
            if a.outcome == "success" {
                successes.push(serde_json::json!({"profile_id": profile, "started_at": a.started_at}));
            } else if a.outcome == "failure"
                && (a.cooldown_until.is_some() || a.reason.as_deref() == Some("auth_permanent"))
            {
                opened.push(serde_json::json!({"request_id": a.request_id, "seq": a.seq, "profile_id": profile,
                    "started_at": a.started_at, "duration_ms": a.duration_ms, "reason": a.reason,
                    "cooldown_until": a.cooldown_until}));
            } else {
                continue;
            }
            profiles.insert(profile);
        }
        if profiles.is_empty() {
            return Ok(());
        }
        sqlx::query(texts.lock.as_str())
            .bind(serde_json::to_string(&profiles).expect("names serialize"))
            .execute(&mut *tx)
            .await?;
        let json = |rows: &[serde_json::Value]| serde_json::to_string(rows).expect("rows serialize");
        if !opened.is_empty() {
            sqlx::query(texts.open.as_str()).bind(json(&opened)).execute(&mut *tx).await?;
        }
        if successes.is_empty() {
            return Ok(());
        }
        let ended: Vec<(String, i64, i64)> =
            sqlx::query_as(texts.ended.as_str()).bind(json(&successes)).fetch_all(&mut *tx).await?;
        if !ended.is_empty() {
            let ended: Vec<serde_json::Value> = ended
                .into_iter()
                .map(|(request_id, seq, at)| serde_json::json!({"request_id": request_id, "seq": seq, "at": at}))
                .collect();
            sqlx::query(texts.close.as_str()).bind(json(&ended)).execute(&mut *tx).await?;
        }
        Ok(())
    }

    /// Counts these hours of these profiles in `usage_hourly` again, from `attempts`.
    async fn recount_hours(tx: &mut DB::Connection, hours: &BTreeSet<(Millis, &str)>) -> Result<(), StoreError> {
        for (hour, profile) in hours {
            sqlx::query(
                "INSERT INTO usage_hourly (hour, profile_id, attempts, successes, failures, tokens_in, tokens_out)
                 SELECT $1, profile_id, count(*), sum(CASE WHEN outcome = 'success' THEN 1 ELSE 0 END),
                        sum(CASE WHEN outcome = 'failure' THEN 1 ELSE 0 END), coalesce(sum(tokens_in), 0),
                        coalesce(sum(tokens_out), 0)
                 FROM attempts WHERE started_at >= $1 AND started_at < $1 + 3600000 AND profile_id = $2
                 GROUP BY profile_id
                 ON CONFLICT (hour, profile_id) DO UPDATE SET attempts = excluded.attempts,
                     successes = excluded.successes, failures = excluded.failures,
                     tokens_in = excluded.tokens_in, tokens_out = excluded.tokens_out",
            )
            .bind(hour)
            .bind(profile)
            .execute(&mut *tx)
            .await?;
        }
        Ok(())
    }

    /// Adds attempts' and requests' counts to their minutes' rows of `audit_minutely`, in one
    /// statement, in the order of their keys.
    async fn add_to_minutes(tx: &mut DB::Connection, minutes: &BTreeMap<Minute<'_>, i64>) -> Result<(), StoreError> {
        Self::add_counts(tx, &S::texts().add_minutes, "minute", minutes).await
    }

    /// Adds the minutes' counts to their hours' rows of `audit_hourly`, then counts the hours
    /// of the recounted minutes again from `audit_minutely`.
    async fn add_to_audit_hours(
        tx: &mut DB::Connection,
        minutes: &BTreeMap<Minute<'_>, i64>,
        recounted: &BTreeSet<Millis>,
    ) -> Result<(), StoreError> {
        let mut hours: BTreeMap<Minute<'_>, i64> = BTreeMap::new();
        for ((minute, kind, provider, outcome, reason), n) in minutes {
            *hours.entry((minute.div_euclid(HOUR) * HOUR, kind, provider, outcome, reason)).or_default() += n;
        }
        Self::add_counts(tx, &S::texts().add_audit_hours, "hour", &hours).await?;
        let recount: BTreeSet<Millis> = recounted.iter().map(|m| m.div_euclid(HOUR) * HOUR).collect();
        for hour in recount {
            sqlx::query("DELETE FROM audit_hourly WHERE hour = $1 AND kind = 'attempt'")
                .bind(hour)
                .execute(&mut *tx)
                .await?;
            sqlx::query(
                "INSERT INTO audit_hourly (hour, kind, provider, outcome, reason, n)
                 SELECT $1, kind, provider, outcome, reason, sum(n) FROM audit_minutely
                 WHERE minute >= $1 AND minute < $2 AND kind = 'attempt' GROUP BY 2, 3, 4, 5",
            )
            .bind(hour)
            .bind(hour + HOUR)
            .execute(&mut *tx)
            .await?;
        }
        Ok(())
    }

    /// Adds counts to their rows (of `audit_minutely` or `audit_hourly`, by `statement`, whose
    /// time column is `at`), in one statement, in the order of their keys.
    async fn add_counts(
        tx: &mut DB::Connection,
        statement: &'static str,
        at: &str,
        counts: &BTreeMap<Minute<'_>, i64>,
    ) -> Result<(), StoreError> {
        if counts.is_empty() {
            return Ok(());
        }
        let rows: Vec<serde_json::Value> = counts
            .iter()
            .map(|((time, kind, provider, outcome, reason), n)| {
                serde_json::json!({at: time, "kind": kind, "provider": provider, "outcome": outcome,
                    "reason": reason, "n": n})
            })
            .collect();
        let rows = serde_json::to_string(&rows).expect("rows serialize");
        sqlx::query(statement).bind(rows).execute(&mut *tx).await?;
        Ok(())
    }

    /// Counts these minutes' attempts in `audit_minutely` again, from `attempts`.
    async fn recount_minutes(tx: &mut DB::Connection, minutes: &BTreeSet<Millis>) -> Result<(), StoreError> {
        for minute in minutes {
            sqlx::query("DELETE FROM audit_minutely WHERE minute = $1 AND kind = 'attempt'")
                .bind(minute)
                .execute(&mut *tx)
                .await?;
            sqlx::query(
                "INSERT INTO audit_minutely (minute, kind, provider, outcome, reason, n)
                 SELECT $1, 'attempt', provider, outcome, coalesce(reason, ''), count(*)
                 FROM attempts WHERE started_at >= $1 AND started_at < $2 GROUP BY 3, 4, 5",
            )
            .bind(minute)
            .bind(minute + MINUTE)
            .execute(&mut *tx)
            .await?;
        }
        Ok(())
    }

    /// Inserts requests, in chunks of the prepared shapes; the ids of those that were new.
    async fn insert_requests(
        tx: &mut DB::Connection,
        requests: &[RequestRecord],
    ) -> Result<HashSet<String>, StoreError> {
        let mut inserted: HashSet<String> = HashSet::new();
        for chunk in shaped(requests) {
            let mut q = sqlx::query_scalar::<_, String>(S::texts().requests.sql(chunk.len()));
            for r in chunk {
                q = q
                    .bind(&r.id)
                    .bind(&r.agent)
                    .bind(&r.api)
                    .bind(&r.requested_model)
                    .bind(&r.served_model)
                    .bind(&r.served_profile)
                    .bind(r.status)
                    .bind(r.attempts)
                    .bind(r.started_at)
                    .bind(r.duration_ms)
                    .bind(r.stream)
                    .bind(r.tokens_in)
                    .bind(r.tokens_out)
                    .bind(&r.error)
                    .bind(r.cost)
                    .bind(r.usage_suspect);
            }
            inserted.extend(q.fetch_all(&mut *tx).await?);
        }
        Ok(inserted)
    }

    /// Adds tokens and cost to agents' days in `agent_usage`.
    async fn add_to_agent_days(
        tx: &mut DB::Connection,
        days: &BTreeMap<(&str, Millis), (i64, f64)>,
    ) -> Result<(), StoreError> {
        for ((agent, day), (tokens, cost)) in days {
            sqlx::query(
                "INSERT INTO agent_usage (agent, period, period_start, tokens, cost) VALUES ($1, 'day', $2, $3, $4)
                 ON CONFLICT (agent, period, period_start) DO UPDATE SET
                     tokens = agent_usage.tokens + excluded.tokens, cost = agent_usage.cost + excluded.cost",
            )
            .bind(*agent)
            .bind(day)
            .bind(tokens)
            .bind(cost)
            .execute(&mut *tx)
            .await?;
        }
        Ok(())
    }

    pub(super) async fn newest_audit(&self) -> Result<Option<Millis>, StoreError> {
        let mut conn = self.store.pool().acquire().await?;
        Ok(sqlx::query_scalar("SELECT max(started_at) FROM requests").fetch_one(&mut *conn).await?)
    }

    pub(super) async fn prune_audit(&self, before: Millis, batch: usize) -> Result<Pruned, StoreError> {
        let mut tx = self.store.audit_tx().await?;
        // The batch ends at the `batch`-th oldest attempt (all of its millisecond go too).
        let last: Option<i64> = sqlx::query_scalar(
            "SELECT started_at FROM attempts WHERE started_at < $1 ORDER BY started_at LIMIT 1 OFFSET $2",
        )
        .bind(before)
        .bind(batch as i64 - 1)
        .fetch_optional(&mut *tx)
        .await?;
        let upto = last.unwrap_or(before - 1);
        let gone = sqlx::query(
            "DELETE FROM attempts WHERE started_at <= $1 AND started_at < $2
             RETURNING started_at, agent, provider, model, profile_id, outcome, tokens_in, tokens_out",
        )
        .bind(upto)
        .bind(before)
        .fetch_all(&mut *tx)
        .await?;
        // The hours and minutes whose attempts are all gone now (usage_daily keeps their sums).
        let cut = (upto + 1).min(before);
        if S::texts().windows.is_some() {
            sqlx::query("DELETE FROM failure_windows WHERE started_at < $1").bind(cut).execute(&mut *tx).await?;
        }
        sqlx::query("DELETE FROM usage_hourly WHERE hour + 3600000 <= $1").bind(cut).execute(&mut *tx).await?;
        // The days whose hours are all gone, and the day the cut falls in summed again (where
        // the writer keeps them; SQLite's triggers did as the hours went).
        if S::texts().add_profile_days.is_some() {
            sqlx::query("DELETE FROM usage_profile_daily WHERE day + 86400000 <= $1")
                .bind(cut)
                .execute(&mut *tx)
                .await?;
            Self::recount_profile_days(&mut tx, BTreeSet::from([cut.div_euclid(DAY) * DAY])).await?;
        }
        sqlx::query("DELETE FROM audit_minutely WHERE minute <= $1").bind(cut - MINUTE).execute(&mut *tx).await?;
        sqlx::query("DELETE FROM audit_hourly WHERE hour + 3600000 <= $1").bind(cut).execute(&mut *tx).await?;
        Self::add_to_days(&mut tx, &Self::daily_sums(&gone)?).await?;
        let requests = sqlx::query("DELETE FROM requests WHERE started_at <= $1 AND started_at < $2")
            .bind(upto)
            .bind(before)
            .execute(&mut *tx)
            .await?
            .rows_affected();
        tx.commit().await?;
        Ok(Pruned { attempts: gone.len() as u64, requests, more: last.is_some() })
    }

    /// Deleted attempts summed per day, agent, provider, model and profile.
    fn daily_sums(gone: &[DB::Row]) -> Result<BTreeMap<Day, [i64; 5]>, StoreError> {
        let mut days: BTreeMap<Day, [i64; 5]> = BTreeMap::new();
        for r in gone {
            let day = chrono::DateTime::from_timestamp_millis(r.try_get("started_at")?)
                .map(|t| t.format("%Y-%m-%d").to_string())
                .unwrap_or_default();
            let text =
                |c: &str| -> Result<String, sqlx::Error> { Ok(r.try_get::<Option<String>, _>(c)?.unwrap_or_default()) };
            let key = (day, text("agent")?, text("provider")?, text("model")?, text("profile_id")?);
            let outcome: String = r.try_get("outcome")?;
            count_attempt(days.entry(key).or_default(), &outcome, r.try_get("tokens_in")?, r.try_get("tokens_out")?);
        }
        Ok(days)
    }

    /// Adds attempts' sums to their days' rows of `usage_daily`.
    async fn add_to_days(tx: &mut DB::Connection, days: &BTreeMap<Day, [i64; 5]>) -> Result<(), StoreError> {
        for ((day, agent, provider, model, profile), [n, ok, failed, tin, tout]) in days {
            sqlx::query(
                "INSERT INTO usage_daily (day, agent, provider, model, profile_id, attempts, successes, failures,
                     tokens_in, tokens_out) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)
                 ON CONFLICT (day, agent, provider, model, profile_id) DO UPDATE SET
                     attempts = usage_daily.attempts + excluded.attempts,
                     successes = usage_daily.successes + excluded.successes,
                     failures = usage_daily.failures + excluded.failures,
                     tokens_in = usage_daily.tokens_in + excluded.tokens_in,
                     tokens_out = usage_daily.tokens_out + excluded.tokens_out",
            )
            .bind(day)
            .bind(agent)
            .bind(provider)
            .bind(model)
            .bind(profile)
            .bind(n)
            .bind(ok)
            .bind(failed)
            .bind(tin)
            .bind(tout)
            .execute(&mut *tx)
            .await?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn batches_are_cut_into_the_prepared_shapes() {
        let rows: Vec<usize> = (0..147).collect();
        let lens: Vec<usize> = shaped(&rows).map(<[usize]>::len).collect();
        assert_eq!(lens, [64, 64, 8, 8, 1, 1, 1]);
        assert_eq!(shaped(&rows).flatten().copied().collect::<Vec<_>>(), rows);
        assert_eq!(shaped::<usize>(&[]).count(), 0);
        let s = Shapes::new("t (a, b)", 2, true);
        assert_eq!(s.sql(1), "INSERT INTO t (a, b) VALUES ($1, $2) ON CONFLICT DO NOTHING");
        assert!(s.sql(8).ends_with("($15, $16) ON CONFLICT DO NOTHING"));
        assert!(s.sql(64).contains("($127, $128)"));
        assert!(Shapes::new("t (a, b)", 2, false).sql(8).ends_with("(?, ?), (?, ?) ON CONFLICT DO NOTHING"));
    }
}
