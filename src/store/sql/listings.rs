//! The audit log read: its listings (`GET /api/v1/attempts`, `/requests`), the usage per profile
//! and per time bucket, and the windows failures put profiles in.

use super::{Backend, DAY, Driver, HOUR, Sql, Value};
use crate::engine::Millis;
use crate::store::{AttemptRecord, AuditQuery, FailureWindow, ProfileUsage, RequestRecord, SeriesRows, StoreError};
use sqlx::{ColumnIndex, Encode, Executor, Type};
use std::collections::{HashMap, HashSet};

/// Fewer matching attempts than this, and a requests listing filtered on attempts looks its
/// requests up from them; more, and it walks the requests (see `requests`).
const SELECTIVE: i64 = 5_000;

/// The most attempts one step of `requests_from_attempts` reads.
const WALK_MAX: usize = 4_096;

/// A requests listing's columns (`RequestRecord`).
const REQUEST_COLUMNS: &str = "SELECT id, agent, api, requested_model, served_model, served_profile, status, attempts,
    started_at, duration_ms, stream, tokens_in, tokens_out, error, cost, usage_suspect FROM requests";

/// The filters of an audit query on attempt columns: profile, provider, model, reason, outcome.
fn attempt_filters(q: &AuditQuery) -> [(&'static str, &Option<String>); 5] {
    [
        ("profile_id", &q.profile),
        ("provider", &q.provider),
        ("model", &q.model),
        ("reason", &q.reason),
        ("outcome", &q.outcome),
    ]
}

/// The whole units (hours, days) in `[since, until)`, as `[first, last)`: empty (`first ==
/// last == until`) when there is none.
fn whole(since: Millis, until: Millis, unit: Millis) -> (Millis, Millis) {
    let first = (since + unit - 1).div_euclid(unit) * unit;
    let last = until.div_euclid(unit) * unit;
    if first < last { (first, last) } else { (until, until) }
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
    /// `AND column = value` for each filter given: only those, so that each can seek its index
    /// (a `($n IS NULL OR column = $n)` term can use none: the listing scanned and sorted
    /// every attempt).
    fn push_equal(qb: &mut sqlx::QueryBuilder<DB>, filters: &[(&str, &Option<String>)]) {
        for (column, value) in filters {
            if let Some(v) = value {
                qb.push(format_args!(" AND {column} = ")).push_bind(v.clone());
            }
        }
    }

    /// An audit listing's own filters: agent, request id (`id`: the table's column), time.
    fn push_filters(qb: &mut sqlx::QueryBuilder<DB>, q: &AuditQuery, id: &str) {
        Self::push_equal(qb, &[("agent", &q.agent), (id, &q.request_id)]);
        if let Some(since) = q.since {
            qb.push(" AND started_at >= ").push_bind(since);
        }
        if let Some(until) = q.until {
            qb.push(" AND started_at < ").push_bind(until);
        }
    }

    pub(super) async fn attempts(&self, q: &AuditQuery) -> Result<Vec<AttemptRecord>, StoreError> {
        let mut qb = sqlx::QueryBuilder::new(
            "SELECT request_id, seq, kind, agent, provider, model, profile_id, started_at, duration_ms, ttfb_ms,
                    http_status, outcome, reason, retry_after_ms, cooldown_until, error, tokens_in, tokens_out,
                    cost, usage_suspect
             FROM attempts WHERE TRUE",
        );
        Self::push_filters(&mut qb, q, "request_id");
        Self::push_equal(&mut qb, &attempt_filters(q));
        if let Some((t, id, seq)) = &q.after {
            // The plain bound first: the row comparison alone seeks no index.
            qb.push(" AND started_at <= ").push_bind(*t);
            qb.push(" AND (started_at, request_id, seq) < (").push_bind(*t).push(", ").push_bind(id.clone());
            qb.push(", ").push_bind(*seq).push(")");
        }
        qb.push(" ORDER BY started_at DESC, request_id DESC, seq DESC LIMIT ").push_bind(i64::from(q.limit));
        Ok(qb.build_query_as::<AttemptRecord>().fetch_all(self.store.pool()).await?)
    }

    pub(super) async fn requests(&self, q: &AuditQuery) -> Result<Vec<RequestRecord>, StoreError> {
        let mut qb = sqlx::QueryBuilder::new(REQUEST_COLUMNS);
        qb.push(" r WHERE TRUE");
        Self::push_filters(&mut qb, q, "id");
        if let Some((t, id, _)) = &q.after {
            qb.push(" AND started_at <= ").push_bind(*t);
            qb.push(" AND (started_at, id) < (").push_bind(*t).push(", ").push_bind(id.clone()).push(")");
        }
        let of_attempts = attempt_filters(q);
        if of_attempts.iter().any(|(_, v)| v.is_some()) {
            if let Some(rows) = self.requests_from_attempts(q).await? {
                return Ok(rows);
            }
            // Few matching attempts: the requests are looked up from them (each filter has
            // its index). Many: the requests are walked newest first, each one's attempts
            // looked up by request id, and the page fills fast. (Either way alone took
            // seconds at millions of rows: walking every request for a value no attempt
            // has, or gathering and sorting hundreds of thousands of matches.)
            let mut count = sqlx::QueryBuilder::new("SELECT count(*) FROM (SELECT 1 FROM attempts WHERE TRUE");
            Self::push_equal(&mut count, &of_attempts);
            count.push(" LIMIT ").push_bind(SELECTIVE).push(") n");
            let matching: i64 = count.build_query_scalar().fetch_one(self.store.pool()).await?;
            if matching < SELECTIVE {
                qb.push(" AND id IN (SELECT request_id FROM attempts WHERE TRUE");
                Self::push_equal(&mut qb, &of_attempts);
                qb.push(")");
            } else {
                // Kept as `($n IS NULL OR …)` on purpose: so written, the planner looks
                // the request's attempts up by request id; with a plain
                // `a.profile_id = $n` it walked the filter's index instead.
                qb.push(" AND EXISTS (SELECT 1 FROM attempts a WHERE a.request_id = r.id");
                for (column, value) in of_attempts {
                    qb.push(" AND (").push_bind(value.clone());
                    qb.push(format_args!(" IS NULL OR a.{column} = ")).push_bind(value.clone()).push(")");
                }
                qb.push(")");
            }
        }
        qb.push(" ORDER BY started_at DESC, id DESC LIMIT ").push_bind(i64::from(q.limit));
        Ok(qb.build_query_as::<RequestRecord>().fetch_all(self.store.pool()).await?)
    }

    /// A requests listing filtered on attempt columns, from the filter's own attempts index
    /// walked newest first: each stretch of matching attempts' requests is looked up, and the
    /// walk stops once the page is certain: every attempt not yet read started before the
    /// page's last request (an attempt never starts before its request: both are dated by one
    /// server's clock, which only moves forward), so none can add a request to the page. A
    /// first page reads about its own number of attempts, whatever the filter matches. None
    /// when the walk would be long: a page after
    /// a cursor or before `until` with more than `SELECTIVE` matching attempts since then
    /// (the walk starts at the newest), or a millisecond holding more matches than a stretch.
    async fn requests_from_attempts(&self, q: &AuditQuery) -> Result<Option<Vec<RequestRecord>>, StoreError> {
        if q.request_id.is_some() || q.limit == 0 {
            return Ok(None);
        }
        let filters = attempt_filters(q);
        let matching = |qb: &mut sqlx::QueryBuilder<DB>| {
            Self::push_equal(qb, &[("agent", &q.agent)]);
            Self::push_equal(qb, &filters);
            if let Some(since) = q.since {
                qb.push(" AND started_at >= ").push_bind(since);
            }
        };
        if let Some(bound) = q.until.into_iter().chain(q.after.as_ref().map(|(t, _, _)| *t)).min() {
            let mut count = sqlx::QueryBuilder::new("SELECT count(*) FROM (SELECT 1 FROM attempts WHERE TRUE");
            matching(&mut count);
            count.push(" AND started_at >= ").push_bind(bound);
            count.push(" LIMIT ").push_bind(SELECTIVE).push(") n");
            if count.build_query_scalar::<i64>().fetch_one(self.store.pool()).await? >= SELECTIVE {
                return Ok(None);
            }
        }
        let limit = q.limit as usize;
        let mut page: Vec<RequestRecord> = Vec::new();
        let mut seen = HashSet::new();
        // Attempts from `hi` down (exclusive) are not read yet.
        let mut hi: Option<Millis> = None;
        let mut stretch = (limit + 1).clamp(64, WALK_MAX);
        loop {
            let mut walk = sqlx::QueryBuilder::new("SELECT request_id, started_at FROM attempts WHERE TRUE");
            matching(&mut walk);
            if let Some(hi) = hi {
                walk.push(" AND started_at < ").push_bind(hi);
            }
            walk.push(" ORDER BY started_at DESC LIMIT ").push_bind(stretch as i64);
            let mut rows: Vec<(String, Millis)> = walk.build_query_as().fetch_all(self.store.pool()).await?;
            let done = rows.len() < stretch;
            if !done {
                // The last millisecond read may go on past the stretch: it is read whole next.
                let last = rows[rows.len() - 1].1;
                if rows[0].1 == last {
                    if stretch == WALK_MAX {
                        return Ok(None);
                    }
                    stretch = (stretch * 4).min(WALK_MAX);
                    continue;
                }
                rows.retain(|(_, t)| *t != last);
                hi = Some(last + 1);
            }
            rows.retain(|(id, _)| seen.insert(id.clone()));
            if !rows.is_empty() {
                page.extend(self.requests_of(&rows).await?.into_iter().filter(|r| Self::listed(q, r)));
                page.sort_by(|a, b| (b.started_at, &b.id).cmp(&(a.started_at, &a.id)));
                page.truncate(limit);
            }
            let certain = page.len() == limit && hi.is_some_and(|hi| page[limit - 1].started_at >= hi);
            if done || certain {
                return Ok(Some(page));
            }
            stretch = (stretch * 2).min(WALK_MAX);
        }
    }

    /// The requests of these attempts (request id, start): first those that started within a
    /// day before the attempts (on PostgreSQL that reads those days' partitions alone: without
    /// a time, each id was looked for in every day's, 100 ids of a page in 100 days' taking
    /// 100 to 200 ms), then any other by id alone (an attempt a day or more into its request).
    async fn requests_of(&self, attempts: &[(String, Millis)]) -> Result<Vec<RequestRecord>, StoreError> {
        let from = attempts.iter().map(|(_, t)| *t).min().unwrap_or_default() - DAY;
        let to = attempts.iter().map(|(_, t)| *t).max().unwrap_or_default();
        let ids: Vec<&str> = attempts.iter().map(|(id, _)| id.as_str()).collect();
        let mut found: Vec<RequestRecord> =
            Self::lookup(&ids, Some((from, to))).build_query_as().fetch_all(self.store.pool()).await?;
        if found.len() < ids.len() {
            let have: HashSet<&str> = found.iter().map(|r| r.id.as_str()).collect();
            let rest: Vec<&str> = ids.iter().copied().filter(|id| !have.contains(id)).collect();
            if !rest.is_empty() {
                let more: Vec<RequestRecord> =
                    Self::lookup(&rest, None).build_query_as().fetch_all(self.store.pool()).await?;
                found.extend(more);
            }
        }
        Ok(found)
    }

    /// The requests with these ids, started within `[from, to]` when given.
    fn lookup(ids: &[&str], within: Option<(Millis, Millis)>) -> sqlx::QueryBuilder<DB> {
        let mut qb = sqlx::QueryBuilder::new(REQUEST_COLUMNS);
        qb.push(" WHERE id IN (");
        let mut list = qb.separated(", ");
        for id in ids {
            list.push_bind(id.to_string());
        }
        qb.push(")");
        if let Some((from, to)) = within {
            qb.push(" AND started_at >= ").push_bind(from).push(" AND started_at <= ").push_bind(to);
        }
        qb
    }

    /// Whether a request passes a listing's own filters (`push_filters`, but the request id)
    /// and its cursor.
    fn listed(q: &AuditQuery, r: &RequestRecord) -> bool {
        q.agent.as_ref().is_none_or(|a| r.agent.as_ref() == Some(a))
            && q.since.is_none_or(|s| r.started_at >= s)
            && q.until.is_none_or(|u| r.started_at < u)
            && q.after.as_ref().is_none_or(|(t, id, _)| (r.started_at, r.id.as_str()) < (*t, id.as_str()))
    }

    pub(super) async fn usage(&self, since: Millis, until: Millis) -> Result<Vec<ProfileUsage>, StoreError> {
        // Whole days from usage_profile_daily, the whole hours at either end from usage_hourly,
        // the partial hours from attempts. Each row's tokens are held to a range first (an
        // attempt's to `TOKENS_MAX`, a roll-up's to 10^15), so that whatever a row holds the sums
        // stay within BIGINT (docs/schema.md, `usage_suspect`).
        let (first, last) = whole(since, until, HOUR);
        let (first_day, last_day) = whole(first, last, DAY);
        let rows = sqlx::query_as::<_, ProfileUsage>(
            "SELECT profile_id, CAST(sum(attempts) AS BIGINT) AS attempts,
                    CAST(sum(successes) AS BIGINT) AS successes, CAST(sum(failures) AS BIGINT) AS failures,
                    CAST(sum(tokens_in) AS BIGINT) AS tokens_in, CAST(sum(tokens_out) AS BIGINT) AS tokens_out
             FROM (
                 SELECT profile_id, attempts, successes, failures,
                        CASE WHEN tokens_in > 1000000000000000 THEN 1000000000000000
                             WHEN tokens_in < 0 THEN 0 ELSE tokens_in END AS tokens_in,
                        CASE WHEN tokens_out > 1000000000000000 THEN 1000000000000000
                             WHEN tokens_out < 0 THEN 0 ELSE tokens_out END AS tokens_out
                 FROM usage_profile_daily WHERE day >= $5 AND day < $6
                 UNION ALL
                 SELECT profile_id, attempts, successes, failures,
                        CASE WHEN tokens_in > 1000000000000000 THEN 1000000000000000
                             WHEN tokens_in < 0 THEN 0 ELSE tokens_in END,
                        CASE WHEN tokens_out > 1000000000000000 THEN 1000000000000000
                             WHEN tokens_out < 0 THEN 0 ELSE tokens_out END
                 FROM usage_hourly WHERE hour >= $3 AND hour < $5
                 UNION ALL
                 SELECT profile_id, attempts, successes, failures,
                        CASE WHEN tokens_in > 1000000000000000 THEN 1000000000000000
                             WHEN tokens_in < 0 THEN 0 ELSE tokens_in END,
                        CASE WHEN tokens_out > 1000000000000000 THEN 1000000000000000
                             WHEN tokens_out < 0 THEN 0 ELSE tokens_out END
                 FROM usage_hourly WHERE hour >= $6 AND hour < $4
                 UNION ALL
                 SELECT profile_id, 1, CASE WHEN outcome = 'success' THEN 1 ELSE 0 END,
                        CASE WHEN outcome = 'failure' THEN 1 ELSE 0 END,
                        CASE WHEN tokens_in > 100000000 THEN 100000000 WHEN tokens_in > 0 THEN tokens_in ELSE 0 END,
                        CASE WHEN tokens_out > 100000000 THEN 100000000 WHEN tokens_out > 0 THEN tokens_out ELSE 0 END
                 FROM attempts
                 WHERE profile_id IS NOT NULL
                   AND ((started_at >= $1 AND started_at < $3) OR (started_at >= $4 AND started_at < $2))
             ) u
             GROUP BY profile_id ORDER BY profile_id",
        )
        .bind(since)
        .bind(until)
        .bind(first)
        .bind(last)
        .bind(first_day)
        .bind(last_day)
        // Planned with its values each time: PostgreSQL then plans only the days' partitions
        // it reads (4 ms with the read), where a statement kept on a connection is planned
        // once without them, over every day's partitions of three tables, on its sixth
        // execution there (75 ms; docs/performance.md, "Audit at scale").
        .persistent(false)
        .fetch_all(self.store.pool())
        .await?;
        Ok(rows)
    }

    pub(super) async fn usage_series(
        &self,
        since: Millis,
        until: Millis,
        step: Millis,
    ) -> Result<SeriesRows, StoreError> {
        let texts = &S::texts().series;
        let query = if [since, until, step].iter().all(|t| t % HOUR == 0) { &texts.hours } else { &texts.minutes };
        let buckets = usize::try_from((until - since + step - 1).div_euclid(step)).unwrap_or(0);
        let rows: Vec<(i64, String, i64)> = self.series_rows(query.as_str(), &[since, until]).await?;
        // Each series' counts per bucket, by its names (one text, as read).
        let mut series: HashMap<String, Vec<i64>> = HashMap::new();
        for (at, names, n) in rows {
            let counts = series.entry(names).or_insert_with(|| vec![0; buckets]);
            if let Some(count) = usize::try_from((at - since).div_euclid(step)).ok().and_then(|b| counts.get_mut(b)) {
                *count += n;
            }
        }
        let mut rows = SeriesRows::default();
        for (names, counts) in series {
            // Kind, provider, outcome and reason: a provider's name is what the others leave.
            let split = names
                .split_once(SEP)
                .and_then(|(kind, rest)| rest.rsplit_once(SEP).map(|(rest, reason)| (kind, rest, reason)))
                .and_then(|(kind, rest, reason)| rest.rsplit_once(SEP).map(|(p, outcome)| (kind, p, outcome, reason)));
            let Some((kind, provider, outcome, reason)) = split else {
                return Err(StoreError::Db(sqlx::Error::Decode(format!("series names {names:?}").into())));
            };
            if kind == "request" {
                rows.requests.push((outcome.to_string(), counts));
            } else {
                let reason = Some(reason.to_string()).filter(|r| !r.is_empty());
                rows.attempts.push((provider.to_string(), outcome.to_string(), reason, counts));
            }
        }
        rows.attempts.sort();
        rows.requests.sort();
        Ok(rows)
    }

    pub(super) async fn failure_windows(
        &self,
        (far, near): (Millis, Millis),
        since: Millis,
        until: Millis,
    ) -> Result<Vec<FailureWindow>, StoreError> {
        let text = S::texts().series.windows.as_str();
        let rows: Vec<WindowRow> = if S::texts().series.searched {
            let mid = near + (until - near) / 2;
            let (first, second) = ([far, near, since, until, mid], [mid, mid, since, until, until]);
            let (first, second) = tokio::try_join!(
                self.series_rows::<WindowRow>(text, &first),
                self.series_rows::<WindowRow>(text, &second),
            )?;
            first.into_iter().chain(second).collect()
        } else {
            self.series_rows(text, &[far, near, since, until, until]).await?
        };
        Ok(rows
            .into_iter()
            .map(|(profile_id, started_at, duration_ms, reason, cooldown_until, next_success)| FailureWindow {
                profile_id,
                started_at,
                duration_ms,
                reason,
                cooldown_until,
                next_success,
            })
            .collect())
    }

    /// The rows of one of `SeriesTexts`' statements: as one JSON array of arrays, or row by row.
    async fn series_rows<T>(&self, query: &'static str, args: &[Millis]) -> Result<Vec<T>, StoreError>
    where
        T: serde::de::DeserializeOwned + for<'r> sqlx::FromRow<'r, DB::Row> + Send + Unpin,
    {
        if !S::texts().series.json {
            let mut q = sqlx::query_as::<_, T>(query);
            for a in args {
                q = q.bind(*a);
            }
            return Ok(q.fetch_all(self.store.pool()).await?);
        }
        let mut q = sqlx::query_scalar::<_, String>(query);
        for a in args {
            q = q.bind(*a);
        }
        let text = q.fetch_one(self.store.pool()).await?;
        serde_json::from_str(&text).map_err(|e| StoreError::Db(sqlx::Error::Decode(e.into())))
    }
}

/// What joins the names of a series' counts in one text (`SeriesTexts`): no kind, outcome or
/// reason holds it, so a provider's name is what they leave, whatever it holds.
const SEP: char = '|';

/// A failure's window as `failure_windows` reads it: profile, start, duration, reason, cooldown
/// end, next success.
type WindowRow = (String, i64, Option<i64>, Option<String>, Option<i64>, Option<i64>);

/// The usage series' reads. On SQLite each answers its rows as one text (a JSON array of arrays,
/// made by the engine's aggregate): a day is 12,800 count rows and 6,500 windows, and a row
/// handed from sqlx's SQLite thread to the handler cost several microseconds. PostgreSQL sends
/// rows as they are: its `json_agg` of 36,700 rows took 60 ms against 9 ms to read them
/// (docs/performance.md, "Audit at scale").
pub(super) struct SeriesTexts {
    /// Whether the statements answer one JSON text.
    json: bool,
    /// The counts of `audit_minutely` and `audit_hourly` from `$1` to `$2`, through their
    /// primary keys (time first); summed into buckets by `usage_series`, since grouping them
    /// by the bucket's expression sorted them all first (SQLite's temporary b-tree: a day,
    /// 12,800 rows, 24 ms against 6 ms read alone). Kind, provider, outcome and reason come as
    /// one text, joined by `SEP`: 30 days are 36,700 rows, and each text read and each map
    /// entry made from it took rota's time (docs/performance.md, "Audit at scale").
    minutes: String,
    hours: String,
    /// The failures whose windows reach past `$3` (the timeline's start) up to `$4`: those
    /// started from `$2` up to `$5`, and the `billing` and `auth_permanent` ones from `$1` up to
    /// `$2`. Sorted by the caller.
    ///
    /// Where the writer keeps `failure_windows` (PostgreSQL), read there with each one's next
    /// success: searching it for each of a day's 6,500 failures took 30 ms of the series' 70
    /// (docs/performance.md, "Audit at scale"). Elsewhere through attempts_failed (the failures
    /// alone, with every column read here: no table row is read), each one's next success
    /// through attempts_profile (profile_id, started_at, outcome: the outcome read from the
    /// index, not the table), walked in order and stopped at the first (a cooling profile is
    /// rarely called), also bounded by its branch's constant range.
    windows: String,
    /// Each failure's next success is searched (`failure_windows` is not kept): the failures
    /// are read in two halves of the range at once, on two connections, since the search is
    /// most of the series' time (docs/performance.md, "Audit at scale").
    searched: bool,
}

impl SeriesTexts {
    /// `kept_windows`: the writer keeps `failure_windows`.
    pub(super) fn new(json_rows: Option<fn(&str) -> String>, kept_windows: bool) -> SeriesTexts {
        let select = |cols: &str| json_rows.map_or_else(|| cols.to_string(), |json| json(cols));
        let counts = |table: &str, at: &str| {
            format!(
                "SELECT {} FROM {table} WHERE {at} >= $1 AND {at} < $2",
                select(&format!("{at}, kind || '{SEP}' || provider || '{SEP}' || outcome || '{SEP}' || reason, n"))
            )
        };
        let kept_from = |from: &str| {
            format!(
                "SELECT profile_id, started_at, duration_ms, reason, cooldown_until,
                    CASE WHEN next_success < $4 THEN next_success END AS next_success
                 FROM failure_windows
                 WHERE started_at >= {from} AND started_at < $5
                   AND (cooldown_until > $3 OR (cooldown_until IS NULL AND reason = 'auth_permanent'))"
            )
        };
        let failures_from = |from: &str| {
            format!(
                "SELECT profile_id, started_at, duration_ms, reason, cooldown_until,
                    (SELECT s.started_at FROM attempts s
                     WHERE s.profile_id = w.profile_id AND s.started_at > w.started_at
                       AND s.started_at >= {from} AND s.started_at < $4
                       AND s.started_at < coalesce(w.cooldown_until, $4) AND s.outcome = 'success'
                     ORDER BY s.started_at LIMIT 1) AS next_success
                 FROM attempts w
                 WHERE outcome = 'failure' AND started_at >= {from} AND started_at < $5
                   AND profile_id IS NOT NULL
                   AND (cooldown_until > $3 OR (cooldown_until IS NULL AND reason = 'auth_permanent'))"
            )
        };
        SeriesTexts {
            json: json_rows.is_some(),
            minutes: counts("audit_minutely", "minute"),
            hours: counts("audit_hourly", "hour"),
            windows: format!(
                "SELECT {} FROM ({} UNION ALL {} AND reason IN ('billing', 'auth_permanent') AND started_at < $2) w",
                select("profile_id, started_at, duration_ms, reason, cooldown_until, next_success"),
                if kept_windows { kept_from("$2") } else { failures_from("$2") },
                if kept_windows { kept_from("$1") } else { failures_from("$1") },
            ),
            searched: !kept_windows,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_window_splits_into_its_whole_days_hours_and_the_parts_at_its_ends() {
        let h = HOUR;
        assert_eq!(whole(0, 3 * h, h), (0, 3 * h));
        assert_eq!(whole(1, 3 * h - 1, h), (h, 2 * h));
        assert_eq!(whole(h + 5, 2 * h - 5, h), (2 * h - 5, 2 * h - 5), "no whole hour");
        assert_eq!(whole(h + 5, 2 * h, h), (2 * h, 2 * h), "no whole hour, ending on one");
        assert_eq!(whole(-h - 1, 0, h), (-h, 0));
        // The whole days within the whole hours.
        assert_eq!(whole(h, 50 * h, DAY), (DAY, 2 * DAY));
        assert_eq!(whole(h, 47 * h, DAY), (47 * h, 47 * h), "no whole day");
    }
}
