//! Time can't fool rota (docs/rotation.md, "Time"): the real `rota serve` binary runs under
//! libfaketime, whose offset the test moves while it serves (`FAKETIME_TIMESTAMP_FILE`, read at
//! every call; the monotonic clock left true). A jump of +31 days, then one of −2 hours, must
//! delete no audit row that the retention keeps by the true time and cut no cooldown window.

use crate::support::{Mock, Reply, Rota};
use serde_json::json;
use sqlx::ConnectOptions;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::time::Duration;

const FAKETIME: &str = "/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1";
const DAY: i64 = 86_400_000;

/// `rota serve` under libfaketime, on a database in `dir`; killed when dropped.
struct Faked {
    child: Child,
    url: String,
    log: PathBuf,
}

impl Faked {
    fn start(dir: &Path) -> Faked {
        assert!(
            Path::new(FAKETIME).exists(),
            "{FAKETIME} is missing: apt-get install libfaketime (scripts/test.sh does)"
        );
        let log = dir.join("rota.log");
        let mut child = crate::support::rota_command()
            .args(["serve", "--listen", "127.0.0.1:0"])
            .current_dir(dir)
            .env("ROTA_LOG", "warn")
            .env("KEY_ONE", "sk-clock-one")
            .env("KEY_TWO", "sk-clock-two")
            .env("LD_PRELOAD", FAKETIME)
            .env("FAKETIME_TIMESTAMP_FILE", dir.join("faketime"))
            .env("FAKETIME_NO_CACHE", "1")
            .env("FAKETIME_DONT_FAKE_MONOTONIC", "1")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .unwrap();
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap()).read_line(&mut line).unwrap();
        let addr = line.trim().strip_prefix("rota listening on http://").unwrap_or_else(|| panic!("{line}"));
        Faked { url: format!("http://{addr}"), child, log }
    }

    /// The profile that served one chat request (its status when none did).
    async fn served_by(&self, agent: &str) -> Result<String, u16> {
        let r = Rota::client()
            .post(format!("{}/v1/chat/completions", self.url))
            .bearer_auth(agent)
            .json(&json!({"model": "openai/gpt-4.1", "messages": [{"role": "user", "content": "hi"}]}))
            .send()
            .await
            .unwrap();
        match r.status().as_u16() {
            200 => Ok(r.headers()["x-rota-profile"].to_str().unwrap().to_string()),
            code => Err(code),
        }
    }
}

impl Drop for Faked {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        if std::thread::panicking() {
            eprintln!("rota's log:\n{}", std::fs::read_to_string(&self.log).unwrap_or_default());
        }
    }
}

fn true_now() -> i64 {
    chrono::Utc::now().timestamp_millis()
}

async fn db(dir: &Path) -> sqlx::SqliteConnection {
    let opts =
        sqlx::sqlite::SqliteConnectOptions::new().filename(dir.join("rota.db")).busy_timeout(Duration::from_secs(10));
    opts.connect().await.unwrap()
}

async fn scalar(dir: &Path, sql: &str) -> i64 {
    sqlx::query_scalar(sqlx::AssertSqlSafe(sql.to_string())).fetch_one(&mut db(dir).await).await.unwrap()
}

/// k1's cooldown window as stored: its end.
async fn k1_window(dir: &Path) -> Vec<i64> {
    sqlx::query_scalar("SELECT cooldown_until FROM profile_cooldowns WHERE profile_id = 'openai:k1'")
        .fetch_all(&mut db(dir).await)
        .await
        .unwrap()
}

/// Moves the faked clock: `offset` as libfaketime reads it (`+31d`, `-2h`).
async fn jump(dir: &Path, offset: &str) {
    std::fs::write(dir.join("faketime"), format!("{offset}\n")).unwrap();
    // The jump is logged within 5 s, and the retention task prunes every second meanwhile.
    tokio::time::sleep(Duration::from_millis(6_500)).await;
}

/// The config (two profiles in order, a 30-day retention pruned every second) and an agent's key.
fn setup(dir: &Path, upstream: &str) -> String {
    std::fs::write(
        dir.join("rota.toml"),
        format!(
            r#"[providers.openai]
api = "openai"
base_url = "{upstream}/v1"
[models]
primary = "openai/gpt-4.1"
[auth.profiles."openai:k1"]
provider = "openai"
type = "api_key"
api_key_env = "KEY_ONE"
[auth.profiles."openai:k2"]
provider = "openai"
type = "api_key"
api_key_env = "KEY_TWO"
[auth.order]
openai = ["openai:k1", "openai:k2"]
[audit]
retention = "30d"
prune_every = "1s"
[secrets]
keyring = "off"
"#
        ),
    )
    .unwrap();
    let out = crate::support::rota_command().args(["agents", "create", "clock"]).current_dir(dir).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout).unwrap().lines().last().unwrap().to_string()
}

/// Rows the 30-day retention keeps by the true time (1, 10 and 29 days old), and k1 cooling
/// for ten minutes from now (a 429): the end of its window.
async fn seed_and_cool_k1(dir: &Path, mock: &Mock, rota: &Faked, agent: &str) -> i64 {
    // Rows the 30-day retention keeps by the true time: 1, 10 and 29 days old.
    let t0 = true_now();
    for (i, age) in [1, 10, 29].into_iter().enumerate() {
        sqlx::query(
            "INSERT INTO requests (id, agent, api, status, attempts, started_at, duration_ms, stream)
             VALUES ($1, 'clock', 'chat', 200, 1, $2, 5, 0)",
        )
        .bind(format!("seeded-{i}"))
        .bind(t0 - age * DAY)
        .execute(&mut db(dir).await)
        .await
        .unwrap();
    }
    // k1 answers 429 for ten minutes: the next requests go to k2.
    mock.script(
        "sk-clock-one",
        vec![Reply::Status(
            429,
            vec![("retry-after", "600".into())],
            r#"{"error":{"message":"Rate limit reached","type":"rate_limit_error"}}"#.into(),
        )],
    );
    assert_eq!(rota.served_by(agent).await.as_deref(), Ok("openai:k2"));
    tokio::time::sleep(Duration::from_millis(300)).await;
    let window = k1_window(dir).await;
    assert_eq!(window.len(), 1);
    let ends = window[0];
    assert!((ends - t0 - 600_000).abs() < 5_000, "k1 cools for ten minutes from now: {}", ends - t0);
    ends
}

async fn healthz(rota: &Faked) -> serde_json::Value {
    Rota::client().get(format!("{}/healthz", rota.url)).send().await.unwrap().json().await.unwrap()
}

/// Finding: a restart with the clock 31 days ahead rolled up and deleted the whole true past
/// within seconds and dropped the live cooldowns, and after the clock was corrected rota kept
/// dating rows 31 days ahead until restarted. Now a start far from the newest stored row (either
/// way) runs from that row's time, untrusted (in the log and `/healthz`), deletes nothing, and
/// adopts the system clock once it agrees (docs/rotation.md, "Time").
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_on_a_wrong_clock_deletes_nothing_and_the_corrected_clock_is_adopted() {
    let _share = crate::support::Share::take();
    let (mock, upstream) = Mock::started().await;
    let dir = tempfile::tempdir().unwrap();
    let dir = dir.path();
    std::fs::write(dir.join("faketime"), "+0\n").unwrap();
    let agent = setup(dir, &upstream);
    let rota = Faked::start(dir);
    let ends = seed_and_cool_k1(dir, &mock, &rota, &agent).await;
    assert_eq!(healthz(&rota).await["clock"]["trusted"], true);
    drop(rota);

    for offset in ["+31d", "-31d"] {
        std::fs::write(dir.join("faketime"), format!("{offset}\n")).unwrap();
        let rota = Faked::start(dir);
        let health = healthz(&rota).await;
        assert_eq!((health["status"].as_str(), health["clock"]["trusted"].as_bool()), (Some("degraded"), Some(false)));
        for _ in 0..20 {
            assert_eq!(rota.served_by(&agent).await.as_deref(), Ok("openai:k2"), "{offset}: k1's window holds");
        }
        tokio::time::sleep(Duration::from_millis(3_000)).await; // three prunes' time
        assert_eq!(k1_window(dir).await, [ends], "{offset}: the window is neither cut nor stretched");
        let seeded = scalar(dir, "SELECT count(*) FROM requests WHERE id LIKE 'seeded-%'").await;
        assert_eq!(seeded, 3, "{offset}: no row of the true past deleted");
        let newest = scalar(dir, "SELECT max(started_at) FROM requests").await;
        assert!((newest - true_now()).abs() < 120_000, "{offset}: rows dated from the stored evidence, not the clock");
        let log = std::fs::read_to_string(&rota.log).unwrap();
        assert!(log.contains("far from the newest stored row"), "{offset}: said in the log:\n{log}");
    }

    // Started 31 days ahead, then the system clock is corrected while it runs: adopted.
    std::fs::write(dir.join("faketime"), "+31d\n").unwrap();
    let rota = Faked::start(dir);
    assert_eq!(healthz(&rota).await["clock"]["trusted"], false);
    std::fs::write(dir.join("faketime"), "+0\n").unwrap();
    let started = std::time::Instant::now();
    while healthz(&rota).await["clock"]["trusted"] != true {
        assert!(started.elapsed() < Duration::from_secs(60), "the corrected clock adopted within a minute");
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    assert_eq!(healthz(&rota).await["status"], "ok");
    drop(rota);
    let rota = Faked::start(dir);
    assert_eq!(healthz(&rota).await["clock"]["trusted"], true, "on the true clock: trusted at once");
    tokio::time::sleep(Duration::from_millis(2_000)).await;
    let seeded = scalar(dir, "SELECT count(*) FROM requests WHERE id LIKE 'seeded-%'").await;
    assert_eq!(seeded, 3, "the 30-day retention keeps the 29-day-old row by the true time");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clock_jumps_of_31_days_and_minus_2_hours_delete_no_row_and_cut_no_window() {
    let _share = crate::support::Share::take();
    let (mock, upstream) = Mock::started().await;
    let dir = tempfile::tempdir().unwrap();
    let dir = dir.path();
    std::fs::write(dir.join("faketime"), "+0\n").unwrap();
    let agent = setup(dir, &upstream);
    let rota = Faked::start(dir);

    let ends = seed_and_cool_k1(dir, &mock, &rota, &agent).await;

    for (offset, told) in [("+31d", 1), ("-2h", 2)] {
        jump(dir, offset).await;
        for _ in 0..5 {
            assert_eq!(rota.served_by(&agent).await.as_deref(), Ok("openai:k2"), "after {offset}: k1 still cools");
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert_eq!(k1_window(dir).await, [ends], "after {offset}: the window is unchanged");
        let seeded = scalar(dir, "SELECT count(*) FROM requests WHERE id LIKE 'seeded-%'").await;
        assert_eq!(seeded, 3, "after {offset}: no row the retention keeps by the true time was deleted");
        let newest = scalar(dir, "SELECT max(started_at) FROM requests").await;
        assert!((newest - true_now()).abs() < 60_000, "after {offset}: rows are written at rota's own time");
        let log = std::fs::read_to_string(&rota.log).unwrap();
        assert_eq!(log.matches("the system clock jumped").count(), told, "after {offset}: the jump is logged:\n{log}");
    }
    let k1_calls = mock.keys().iter().filter(|k| *k == "sk-clock-one").count();
    assert_eq!(k1_calls, 1, "no call reached k1 during its window");
}
