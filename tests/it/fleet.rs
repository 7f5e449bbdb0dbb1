//! The database is the truth: the CLI's changes reach a running server, and instances on one
//! SQLite file or one PostgreSQL database share what each of them learns (docs/scale.md). Real
//! `rota` binaries for the CLI, in-process servers on one real file or a real PostgreSQL server,
//! a fault-injecting upstream on loopback.

use crate::support::{self, Db, KEYS, Mock, Reply, Rota, Scenario, chat, spawn};
use serde_json::json;
use std::process::{Output, Stdio};
use std::time::{Duration, Instant};

/// The base config, with the OS keyring off (the CLI opens the same secrets).
fn config(base: &str) -> String {
    format!("{}[secrets]\nkeyring = \"off\"\n", support::config(base))
}

/// OpenAI's 429 as it is written: its error body, and a wait of 600 s.
fn limited_for_ten_minutes() -> Reply {
    let body = r#"{"error":{"message":"Rate limit reached for gpt-4.1 in organization org-x on requests per min (RPM): Limit 500, Used 500, Requested 1. Please try again in 600s.","type":"requests","param":null,"code":"rate_limit_exceeded"}}"#;
    Reply::Status(429, vec![("retry-after", "600".into())], body.into())
}

/// Runs the `rota` CLI on the server's config file; `input` goes to stdin.
fn cli(rota: &Rota, args: &[&str], input: &str) -> Output {
    let mut cmd = support::rota_command();
    cmd.arg("--config").arg(rota.dir.path().join("rota.toml")).args(args);
    let mut child = cmd.stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
    std::io::Write::write_all(&mut child.stdin.take().unwrap(), input.as_bytes()).unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "rota {args:?}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// The profile that served one request, or the status when none did.
async fn served_by(rota: &Rota, key: &str) -> Result<String, u16> {
    let r = Rota::client()
        .post(format!("{}/v1/chat/completions", rota.url))
        .bearer_auth(key)
        .json(&chat())
        .send()
        .await
        .unwrap();
    match r.status().as_u16() {
        200 => Ok(r.headers()["x-rota-profile"].to_str().unwrap().to_string()),
        code => Err(code),
    }
}

/// Sends requests until `holds` is true of four answers in a row; returns how long it took
/// from `since` until the first of them.
async fn settles(
    rota: &Rota,
    key: &str,
    since: Instant,
    what: &str,
    holds: impl Fn(&Result<String, u16>) -> bool,
) -> Duration {
    let mut first: Option<Duration> = None;
    let mut row = 0;
    while row < 4 {
        let at = since.elapsed();
        assert!(at < Duration::from_secs(10), "{what}: still not in force after {at:?}");
        if holds(&served_by(rota, key).await) {
            first.get_or_insert(at);
            row += 1;
        } else {
            (first, row) = (None, 0);
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    let took = first.unwrap();
    assert!(took <= Duration::from_secs(1), "{what}: in force after {took:?}, more than a second");
    took
}

/// Sends requests until one answer is `want`; returns how long that took from `since`.
async fn reaches(rota: &Rota, key: &str, since: Instant, what: &str, want: &str) -> Duration {
    loop {
        let at = since.elapsed();
        assert!(at < Duration::from_secs(10), "{what}: {want} never served");
        if served_by(rota, key).await.as_deref() == Ok(want) {
            assert!(at <= Duration::from_secs(1), "{what}: in force after {at:?}, more than a second");
            return at;
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cli_changes_reach_a_running_server_within_a_second() {
    cli_changes_reach_a_running_server(Db::Sqlite).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cli_changes_reach_a_running_server_on_postgres_within_a_second() {
    cli_changes_reach_a_running_server(Db::Postgres(crate::support::postgres_database().await)).await;
}

async fn cli_changes_reach_a_running_server(db: Db) {
    let (mock, base) = Mock::started().await;
    let rota = spawn(Scenario { config: &config(&base), keys: &KEYS[..2], db, ..Scenario::default() }).await;
    let agent = rota.agent_key.clone();
    let is = |p: &'static str| move |r: &Result<String, u16>| r.as_deref() == Ok(p);
    let not = |p: &'static str| move |r: &Result<String, u16>| r.as_ref().is_ok_and(|s| s != p);

    cli(&rota, &["profiles", "disable", "openai:k1"], "");
    let t = Instant::now();
    settles(&rota, &agent, t, "disable", not("openai:k1")).await;

    cli(&rota, &["profiles", "enable", "openai:k1"], "");
    let t = Instant::now();
    reaches(&rota, &agent, t, "enable", "openai:k1").await;

    cli(&rota, &["profiles", "paid", "openai:k1", "on"], "");
    let t = Instant::now();
    while !rota.app().0.marked_paid(&"openai:k1".parse().unwrap()) {
        assert!(t.elapsed() < Duration::from_secs(1), "paid: not in force within a second");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }

    cli(&rota, &["profiles", "order", "openai", "openai:k2", "openai:k1"], "");
    let t = Instant::now();
    settles(&rota, &agent, t, "order", is("openai:k2")).await;
    cli(&rota, &["profiles", "order", "openai", "--reset"], "");
    let t = Instant::now();
    reaches(&rota, &agent, t, "order --reset", "openai:k1").await;

    // A 429 with Retry-After: 600 keeps k1 away; the CLI's clear brings it back.
    mock.script(KEYS[0].1, vec![limited_for_ten_minutes()]);
    while served_by(&rota, &agent).await.ok().as_deref() != Some("openai:k2") {}
    rota.flush().await;
    assert!(served_by(&rota, &agent).await.ok().as_deref() == Some("openai:k2"), "k1 cools for 10 minutes");
    cli(&rota, &["profiles", "clear", "openai:k1"], "");
    let t = Instant::now();
    reaches(&rota, &agent, t, "clear", "openai:k1").await;

    cli(&rota, &["profiles", "add", "openai", "--name", "k3"], "sk-fleet-key-three-0003\n");
    let t = Instant::now();
    reaches(&rota, &agent, t, "add", "openai:k3").await;
    assert!(mock.keys().iter().any(|k| k == "sk-fleet-key-three-0003"), "with the secret given on stdin");

    cli(&rota, &["profiles", "remove", "openai:k3"], "");
    let t = Instant::now();
    settles(&rota, &agent, t, "remove", not("openai:k3")).await;

    let created = cli(&rota, &["agents", "create", "late"], "");
    let late = String::from_utf8(created.stdout).unwrap().lines().last().unwrap().trim().to_string();
    let t = Instant::now();
    settles(&rota, &late, t, "agents create", |r| r.is_ok()).await;
    cli(&rota, &["agents", "revoke", "late"], "");
    let t = Instant::now();
    settles(&rota, &late, t, "agents revoke", |r| *r == Err(401)).await;
}

/// Waits until `rota`'s book says whether `id` may serve gpt-4.1; returns how long it took.
async fn book_says(rota: &Rota, id: &str, blocked: bool, since: Instant) -> Duration {
    let id: rota::engine::ProfileId = id.parse().unwrap();
    loop {
        let now = chrono::Utc::now().timestamp_millis();
        let stats = rota.app().0.stats(&id).unwrap();
        if stats.blocked_until("gpt-4.1", now).is_some() == blocked {
            return since.elapsed();
        }
        assert!(since.elapsed() < Duration::from_secs(10), "{id} never became blocked={blocked}: {stats:?}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn what_one_instance_learns_the_other_keeps_within_a_second() {
    what_one_instance_learns_the_others_keep(Db::Sqlite, 2).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn what_one_of_three_instances_on_postgres_learns_the_others_keep_within_a_second() {
    what_one_instance_learns_the_others_keep(Db::Postgres(crate::support::postgres_database().await), 3).await;
}

async fn what_one_instance_learns_the_others_keep(db: Db, instances: usize) {
    let (mock, base) = Mock::started().await;
    let a = spawn(Scenario { config: &config(&base), keys: &KEYS[..2], db, ..Scenario::default() }).await;
    let mut others = Vec::new();
    for _ in 1..instances {
        others.push(a.another().await);
    }
    let agent = a.agent_key.clone();
    let k1_calls = || mock.keys().iter().filter(|k| *k == KEYS[0].1).count();

    // Instance A sees k1 answer 429 with Retry-After: 600 (k1 would serve any later call).
    mock.script(KEYS[0].1, vec![limited_for_ten_minutes()]);
    let t = Instant::now();
    assert_eq!(served_by(&a, &agent).await.ok().as_deref(), Some("openai:k2"), "k1 first, then k2");
    for b in &others {
        let took = book_says(b, "openai:k1", true, t).await;
        assert!(took <= Duration::from_secs(1), "another instance learned of the cooldown after {took:?}");
    }
    for b in &others {
        for _ in 0..4 {
            assert_eq!(served_by(b, &agent).await.ok().as_deref(), Some("openai:k2"));
        }
    }
    assert_eq!(k1_calls(), 1, "one call to k1, A's; the others kept off it");
    let k1: rota::engine::ProfileId = "openai:k1".parse().unwrap();
    let stored = a.store.stats_of(std::slice::from_ref(&k1)).await.unwrap().1[0].1.clone().unwrap();
    let windows: Vec<i64> = stored.cooldowns.iter().map(|c| c.until - c.opened_at).collect();
    assert_eq!(windows, [600_000]);

    // A clear on the last instance frees k1 on all the others.
    let last = others.last().unwrap();
    let t = Instant::now();
    let (code, _) = last.api("POST", "/api/v1/profiles/openai:k1/clear", Some(&last.admin_key.clone()), None).await;
    assert_eq!(code, 200);
    for r in std::iter::once(&a).chain(&others[..others.len() - 1]) {
        let took = book_says(r, "openai:k1", false, t).await;
        assert!(took <= Duration::from_secs(1), "an instance learned of the clear after {took:?}");
    }
    reaches(&a, &agent, t, "A serves k1 again", "openai:k1").await;
}

/// One OAuth profile whose access token (valid for a day) is inside a 25-hour refresh lead:
/// every request wants it refreshed. The IdP grants tokens valid for two days, after 200 ms.
async fn expiring_token_fleet(db: Db, instances: usize) -> (Mock, Vec<Rota>) {
    let (mock, base) = Mock::started().await;
    mock.token_endpoint(2 * 86_400, Duration::from_millis(200));
    let config =
        format!("{}[refresh]\nlead = \"25h\"\n[secrets]\nkeyring = \"off\"\n", crate::support::oauth_provider(&base));
    let first = spawn(Scenario {
        config: &config,
        oauth: &[("corp:alice", "at-old-0001", "rt-old-0001")],
        db,
        ..Scenario::default()
    })
    .await;
    let mut fleet = vec![first];
    for _ in 1..instances {
        let next = fleet[0].another().await;
        fleet.push(next);
    }
    (mock, fleet)
}

/// 50 concurrent requests spread over the instances: one call at the IdP, and every request
/// served with its token.
async fn one_refresh_for_the_fleet(db: Db, instances: usize) {
    let (mock, fleet) = expiring_token_fleet(db, instances).await;
    let agent = fleet[0].agent_key.clone();
    let calls = (0..50).map(|i| {
        let rota = &fleet[i % fleet.len()];
        let agent = agent.clone();
        async move {
            let r = Rota::client()
                .post(format!("{}/v1/chat/completions", rota.url))
                .bearer_auth(agent)
                .json(&json!({"model": "corp/m", "messages": [{"role": "user", "content": "hi"}]}))
                .send()
                .await
                .unwrap();
            r.status().as_u16()
        }
    });
    let statuses = futures_util::future::join_all(calls).await;
    assert!(statuses.iter().all(|s| *s == 200), "{statuses:?}");
    assert_eq!(mock.token_calls(), 1, "one refresh at the IdP for the whole fleet");
    let keys = mock.keys();
    assert_eq!(keys.len(), 50);
    assert!(keys.iter().all(|k| k == "at-new-0001"), "every call with the one refreshed token: {keys:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_instances_on_one_sqlite_file_refresh_an_expiring_token_once() {
    one_refresh_for_the_fleet(Db::Sqlite, 3).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_instances_on_postgres_refresh_an_expiring_token_once() {
    one_refresh_for_the_fleet(Db::Postgres(crate::support::postgres_database().await), 3).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_console_session_ends_when_the_cli_revokes_its_admin_key() {
    let (_mock, base) = Mock::started().await;
    let rota = spawn(Scenario { config: &config(&base), keys: &KEYS[..2], ..Scenario::default() }).await;
    let client = Rota::client();
    let signed_in =
        client.post(format!("{}/api/v1/session", rota.url)).json(&json!({"key": rota.admin_key})).send().await.unwrap();
    assert_eq!(signed_in.status(), 200);
    let cookie = signed_in.headers()["set-cookie"].to_str().unwrap().split(';').next().unwrap().to_string();
    let current = || async {
        let r = client.get(format!("{}/api/v1/session", rota.url)).header("cookie", &cookie).send().await.unwrap();
        r.status().as_u16()
    };
    assert_eq!(current().await, 200);
    cli(&rota, &["agents", "revoke", "admin"], "");
    let t = Instant::now();
    while current().await == 200 {
        assert!(t.elapsed() < Duration::from_secs(1), "the session outlived its key by more than a second");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(current().await, 401, "and it stays ended");
    let page = client.get(format!("{}/ui/", rota.url)).header("cookie", &cookie).send().await.unwrap();
    assert!(page.text().await.unwrap().to_lowercase().contains("sign in"), "the console asks to sign in again");
}

/// Evidence is dated when its call was sent (docs/rotation.md): five 2-second calls are in
/// flight on k1 when a sixth gets 429 with `Retry-After: 600`. Their successes arrive after the
/// 429 and must not end the window it opened: not in memory, not in the database, on no
/// instance; and no later call reaches k1. With two instances the five go through the second
/// one, as a peer serving on the account would.
async fn calls_in_flight_never_end_the_window_a_429_opened(db: Db, instances: usize) {
    let (mock, base) = Mock::started().await;
    let cfg = format!("{}[auth.order]\nopenai = [\"openai:k1\", \"openai:k2\"]\n", config(&base));
    let a = spawn(Scenario { config: &cfg, keys: &KEYS[..2], db, ..Scenario::default() }).await;
    let mut fleet = vec![a];
    for _ in 1..instances {
        let next = fleet[0].another().await;
        fleet.push(next);
    }
    let (first, slow) = (&fleet[0], fleet.last().unwrap());
    let agent = first.agent_key.clone();
    let k1_calls = || mock.keys().iter().filter(|k| *k == KEYS[0].1).count();

    mock.script(KEYS[0].1, vec![Reply::After(Duration::from_secs(2), Box::new(Reply::Ok)); 5]);
    let five = futures_util::future::join_all((0..5).map(|_| served_by(slow, &agent)));
    let sixth = async {
        let t = Instant::now();
        while k1_calls() < 5 {
            assert!(t.elapsed() < Duration::from_secs(5), "the five calls never reached k1");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        mock.script(KEYS[0].1, vec![limited_for_ten_minutes()]);
        served_by(first, &agent).await
    };
    let (five, sixth) = tokio::join!(five, sixth);
    assert_eq!(sixth.as_deref(), Ok("openai:k2"), "the sixth call got the 429 on k1 and moved on");
    assert!(five.iter().all(|r| r.as_deref() == Ok("openai:k1")), "the five in flight were served by k1: {five:?}");
    assert_eq!(k1_calls(), 6);

    // Every write landed and every instance read the others' (the change feed's period, twice).
    for r in &fleet {
        r.flush().await;
    }
    tokio::time::sleep(rota::book::FEED_EVERY * 2).await;
    let k1: rota::engine::ProfileId = "openai:k1".parse().unwrap();
    let now = chrono::Utc::now().timestamp_millis();
    for (i, r) in fleet.iter().enumerate() {
        let held = r.app().0.stats(&k1).unwrap().blocked_until("gpt-4.1", now);
        let left = held.map(|u| u.key() - now);
        assert!(left.is_some_and(|l| l > 590_000 && l <= 600_000), "instance {i}: k1's window in memory: {held:?}");
    }
    let stored = first.store.stats_of(std::slice::from_ref(&k1)).await.unwrap().1[0].1.clone().unwrap();
    let windows: Vec<i64> = stored.cooldowns.iter().map(|c| c.until - c.opened_at).collect();
    assert_eq!(windows, [600_000], "the window in the database");
    assert_eq!((stored.success_count, stored.error_count), (5, 1), "the five successes counted, the 429 kept");

    for i in 0..10 {
        let r = &fleet[i % fleet.len()];
        assert_eq!(served_by(r, &agent).await.as_deref(), Ok("openai:k2"), "request {i} after the five");
    }
    assert_eq!(k1_calls(), 6, "no call reached the throttled account after the five");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calls_in_flight_never_end_the_window_a_429_opened_on_one_instance() {
    calls_in_flight_never_end_the_window_a_429_opened(Db::Sqlite, 1).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calls_in_flight_on_a_peer_never_end_the_window_a_429_opened_on_postgres() {
    calls_in_flight_never_end_the_window_a_429_opened(Db::Postgres(crate::support::postgres_database().await), 2).await;
}
