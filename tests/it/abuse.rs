//! Memory and size under abuse (docs/gateway.md, "Bounds at the door"): the real `rota serve`
//! binary, an agent with an ordinary key, and what it may send: model names of 4 MiB, 32 MiB
//! bodies while over its limit, and thousands of invented model names. Each case measures the
//! process's resident memory, `/metrics` and the database, and holds them to bounds.
//! `ROTA_FAULTS_LONG=1` runs the full counts (`scripts/faults.sh --long`).

use crate::support::{Mock, Reply, Rota};
use serde_json::json;
use std::io::{BufRead, BufReader};
use std::process::{Child, Stdio};
use std::time::Duration;

fn long() -> bool {
    std::env::var_os("ROTA_FAULTS_LONG").is_some()
}

const NOT_FOUND: &str = r#"{"error":{"message":"The model `{model}` does not exist or you do not have access to it.","type":"invalid_request_error","param":null,"code":"model_not_found"}}"#;

struct Served {
    child: Child,
    url: String,
    dir: tempfile::TempDir,
}

impl Served {
    fn rss_mb(&self) -> f64 {
        self.status_mb("VmRSS:")
    }

    /// A memory figure of the process's `/proc/PID/status` (`VmRSS:`, `VmHWM:`), in MB.
    fn status_mb(&self, field: &str) -> f64 {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.child.id())).unwrap();
        let kb: f64 = status
            .lines()
            .find_map(|l| l.strip_prefix(field))
            .and_then(|v| v.split_whitespace().next()?.parse().ok())
            .unwrap();
        kb / 1024.0
    }

    async fn metrics_bytes(&self) -> usize {
        Rota::client().get(format!("{}/metrics", self.url)).send().await.unwrap().bytes().await.unwrap().len()
    }

    /// RSS once the allocator gave freed memory back (what was freed a second ago, its purge
    /// delay, goes back within the next second: src/main.rs), with ten ordinary requests after.
    async fn settled_rss(&self, key: &str) -> f64 {
        tokio::time::sleep(Duration::from_secs(3)).await;
        for _ in 0..10 {
            let body = json!({"model": "openai/gpt-4.1", "messages": [{"role": "user", "content": "hi"}]});
            assert_eq!(post(&self.url, key, serde_json::to_vec(&body).unwrap()).await, 200);
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
        self.rss_mb()
    }
}

impl Drop for Served {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `rota serve` in front of `upstream`, with the agent `abuser` (1 request a minute, the limit
/// its requests meet) and `tester` (no limit).
fn serve(upstream: &str) -> (Served, String, String) {
    serve_with(upstream, "")
}

/// `serve`, with `extra` at the end of the config.
fn serve_with(upstream: &str, extra: &str) -> (Served, String, String) {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("rota.toml"),
        format!(
            "[providers.openai]\napi = \"openai\"\nbase_url = \"{upstream}/v1\"\n[models]\nprimary = \"openai/gpt-4.1\"\n\
             [auth.profiles.\"openai:k1\"]\nprovider = \"openai\"\ntype = \"api_key\"\napi_key_env = \"ABUSE_KEY\"\n\
             [agents.abuser]\nrequests_per_minute = 1\n[secrets]\nkeyring = \"off\"\n{extra}"
        ),
    )
    .unwrap();
    let key = |name: &str| {
        let out =
            crate::support::rota_command().args(["agents", "create", name]).current_dir(dir.path()).output().unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8(out.stdout).unwrap().lines().last().unwrap().to_string()
    };
    let (abuser, tester) = (key("abuser"), key("tester"));
    let mut child = crate::support::rota_command()
        .args(["serve", "--listen", "127.0.0.1:0"])
        .current_dir(dir.path())
        .env("ABUSE_KEY", "sk-abuse-0001")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap()).read_line(&mut line).unwrap();
    let addr = line.trim().strip_prefix("rota listening on http://").unwrap().to_string();
    (Served { child, url: format!("http://{addr}"), dir }, abuser, tester)
}

async fn post(url: &str, key: &str, body: Vec<u8>) -> u16 {
    Rota::client()
        .post(format!("{url}/v1/chat/completions"))
        .bearer_auth(key)
        .header("content-type", "application/json")
        .body(body)
        .send()
        .await
        .map(|r| r.status().as_u16())
        .unwrap_or(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn abuse_keeps_memory_metrics_and_the_database_bounded() {
    let _alone = crate::support::Alone::take();
    let (mock, upstream) = Mock::started().await;
    let (rota, abuser, tester) = serve(&upstream);
    let chat = |model: &str| json!({"model": model, "messages": [{"role": "user", "content": "hi"}]});
    for _ in 0..20 {
        assert_eq!(post(&rota.url, &tester, serde_json::to_vec(&chat("openai/gpt-4.1")).unwrap()).await, 200);
    }
    let idle = rota.settled_rss(&tester).await;

    // Model names of 4 MiB, four at a time: refused, and nothing kept of them but a prefix.
    let names = if long() { 1000 } else { 40 };
    let mut peak_names: f64 = idle;
    for round in 0..names / 4 {
        let sends = (0..4).map(|i| {
            let name = format!("openai/{}{}", round * 4 + i, "x".repeat(4 << 20));
            post(&rota.url, &tester, serde_json::to_vec(&chat(&name)).unwrap())
        });
        let statuses = futures_util::future::join_all(sends).await;
        assert!(statuses.iter().all(|s| *s == 400), "{statuses:?}");
        peak_names = peak_names.max(rota.rss_mb());
    }
    let after_names = rota.settled_rss(&tester).await;

    // Three 32 MiB bodies at once from an agent over its limit: refused before they are read.
    assert_eq!(post(&rota.url, &abuser, serde_json::to_vec(&chat("openai/gpt-4.1")).unwrap()).await, 200);
    let big = serde_json::to_vec(
        &json!({"model": "openai/gpt-4.1", "messages": [{"role": "user", "content": "y".repeat((32 << 20) - 200)}]}),
    )
    .unwrap();
    let sends = (0..3).map(|_| post(&rota.url, &abuser, big.clone()));
    let statuses = futures_util::future::join_all(sends).await;
    assert!(statuses.iter().all(|s| *s == 429 || *s == 0), "refused (or cut off while sending): {statuses:?}");
    let peak_bodies = rota.rss_mb();
    let after_bodies = rota.settled_rss(&tester).await;

    // Session ids of 1 MiB (the OpenAI `user` field), each new: served, and kept as a digest.
    let sessions = if long() { 1000 } else { 100 };
    for i in 0..sessions {
        let mut body = chat("openai/gpt-4.1");
        body["user"] = json!(format!("{i}{}", "u".repeat(1 << 20)));
        assert_eq!(post(&rota.url, &tester, serde_json::to_vec(&body).unwrap()).await, 200);
    }
    let after_sessions = rota.settled_rss(&tester).await;

    // Invented model names, each answered 404 by the upstream: no label, no state.
    let metrics_before = rota.metrics_bytes().await;
    let invented = if long() { 10_000 } else { 1_000 };
    for i in 0..invented {
        mock.script("sk-abuse-0001", vec![Reply::Echo(404, NOT_FOUND)]);
        let status =
            post(&rota.url, &tester, serde_json::to_vec(&chat(&format!("openai/invented-{i}"))).unwrap()).await;
        assert_eq!(status, 404);
    }
    let growth = rota.metrics_bytes().await as i64 - metrics_before as i64;

    let db = sqlx::sqlite::SqliteConnectOptions::new().filename(rota.dir.path().join("rota.db"));
    let mut conn = sqlx::ConnectOptions::connect(&db).await.unwrap();
    let longest: i64 =
        sqlx::query_scalar("SELECT max(length(requested_model)) FROM requests").fetch_one(&mut conn).await.unwrap();
    let cooled: i64 = sqlx::query_scalar("SELECT count(*) FROM model_cooldowns").fetch_one(&mut conn).await.unwrap();
    eprintln!(
        "idle {idle:.1} MB; {names} names of 4 MiB: {after_names:.1} MB after; three 32 MiB bodies over the limit: \
         {after_bodies:.1} MB after; {sessions} session ids of 1 MiB: {after_sessions:.1} MB after; peaks {peak_names:.1} and {peak_bodies:.1} MB; /metrics {growth:+} bytes after {invented} invented names; \
         longest model kept {longest} bytes; {cooled} model cooldowns"
    );
    let peak = peak_names.max(peak_bodies);
    // Four 4 MiB bodies in flight, each buffer with its last doubling, and what the allocator's
    // threads hold of them until they hand pages back: 45 to 72 MB over idle on 2 cores, the
    // spread being when that happens. 160 MiB were sent.
    assert!(peak - idle <= 80.0, "peak {peak:.1} MB, idle {idle:.1} MB");
    // What the bodies took goes back: rota returns to its idle size within 5 MB.
    assert!(after_names - idle <= 5.0, "kept after the names: idle {idle:.1}, after {after_names:.1}");
    assert!(after_bodies - idle <= 5.0, "kept after the bodies: idle {idle:.1}, after {after_bodies:.1}");
    assert!(after_sessions - idle <= 5.0, "kept after the sessions: idle {idle:.1}, after {after_sessions:.1}");
    assert!(growth < 2048, "/metrics grew by {growth} bytes");
    assert_eq!((longest, cooled), (256, 0));
}

/// Finding: one announced 32 MiB body held the whole read budget until its timeout (every other
/// body over 64 KiB waited 24–29 s), and accepted large bodies were not counted once parsed (ten
/// at once: 631 MB). Now the budget is taken as a body grows and held until its request ends,
/// one body at a time reads past it, and the memory of bodies in flight stays under the bound
/// docs/gateway.md gives: five times `limits.bodies_in_flight_mb` plus `limits.max_body_bytes`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_trickled_body_delays_no_other_and_large_bodies_in_flight_stay_bounded() {
    use tokio::io::AsyncWriteExt;
    let _alone = crate::support::Alone::take();
    let (_mock, upstream) = Mock::started().await;
    let (rota, _, tester) =
        serve_with(&upstream, "[limits]\nbodies_in_flight_mb = 64\n[server]\nbody_timeout = \"120s\"\n");
    let idle = rota.settled_rss(&tester).await;
    let body = |mb: usize| {
        let text = "y".repeat((mb << 20) - 200);
        serde_json::to_vec(&json!({"model": "openai/gpt-4.1", "messages": [{"role": "user", "content": text}]}))
            .unwrap()
    };

    // A client announces 32 MiB, sends 1 MiB of it, and goes quiet.
    let addr = rota.url.trim_start_matches("http://").to_string();
    let mut trickler = tokio::net::TcpStream::connect(&addr).await.unwrap();
    let head = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nhost: {addr}\r\nauthorization: Bearer {tester}\r\n\
         content-type: application/json\r\ncontent-length: {}\r\n\r\n",
        32 << 20
    );
    trickler.write_all(head.as_bytes()).await.unwrap();
    trickler.write_all(&body(32)[..1 << 20]).await.unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;

    let one = body(1);
    let timed = (0..10).map(|_| {
        let (url, key, one) = (rota.url.clone(), tester.clone(), one.clone());
        async move {
            let t = std::time::Instant::now();
            let status = post(&url, &key, one).await;
            (status, t.elapsed())
        }
    });
    let answered = futures_util::future::join_all(timed).await;
    for (status, took) in &answered {
        assert_eq!(*status, 200);
        assert!(*took < Duration::from_secs(1), "a 1 MiB body beside the trickled one took {took:?}");
    }
    drop(trickler);

    // Ten 32 MiB bodies at once, each served: the peak stays under the bound.
    let big = body(32);
    let sends = (0..10).map(|_| post(&rota.url, &tester, big.clone()));
    let statuses = futures_util::future::join_all(sends).await;
    assert!(statuses.iter().all(|s| *s == 200), "{statuses:?}");
    let peak = rota.status_mb("VmHWM:"); // the peak so far
    let bound = 5.0 * (64.0 + 32.0);
    eprintln!(
        "ten 1 MiB bodies beside a trickled 32 MiB one: slowest {:?}; ten 32 MiB bodies at once: peak {:.1} MB over idle {idle:.1} MB (bound {bound} MB)",
        answered.iter().map(|a| a.1).max().unwrap(),
        peak - idle
    );
    assert!(peak - idle <= bound, "peak {peak:.1} MB, idle {idle:.1} MB, bound {bound} MB");
}

/// Finding: each `GET /ui/sso` stored a sign-in for 15 minutes with no bound and scanned them
/// all under a lock (120,000 starts: RSS 39 → 117 MB, 4,545 → 1,826 req/s). Now one address
/// starts 20 a minute and the rest are refused at once: memory and rate stay where they were.
/// `ROTA_FAULTS_LONG=1` sends 100,000 (docs/operations.md, "Signing in").
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sign_in_starts_keep_memory_and_rate_flat() {
    let _alone = crate::support::Alone::take();
    let (_mock, upstream) = Mock::started().await;
    let idp = crate::people::Idp::started().await;
    let sso = format!(
        "[console.sso]\nissuer = \"{}\"\nclient_id = \"rota\"\n[console.sso.roles]\nadmin = [\"*@example.com\"]\n",
        idp.url()
    );
    let (rota, _, tester) = serve_with(&upstream, &sso);
    let idle = rota.settled_rss(&tester).await;
    let client = reqwest::Client::builder().redirect(reqwest::redirect::Policy::none()).build().unwrap();
    let total = if long() { 100_000 } else { 20_000 };
    let tenth = total / 10;
    let mut rates = Vec::new();
    let mut statuses = std::collections::BTreeMap::<u16, usize>::new();
    for _ in 0..10 {
        let started = std::time::Instant::now();
        let sends = (0..32).map(|_| {
            let (client, url) = (client.clone(), format!("{}/ui/sso", rota.url));
            async move {
                let mut seen = Vec::new();
                for _ in 0..tenth / 32 {
                    seen.push(client.get(&url).send().await.map(|r| r.status().as_u16()).unwrap_or(0));
                }
                seen
            }
        });
        for s in futures_util::future::join_all(sends).await.into_iter().flatten() {
            *statuses.entry(s).or_default() += 1;
        }
        rates.push((tenth / 32 * 32) as f64 / started.elapsed().as_secs_f64());
    }
    let after = rota.settled_rss(&tester).await;
    eprintln!(
        "{total} sign-in starts: {statuses:?}; rate first {:.0}/s, last {:.0}/s; RSS idle {idle:.1} MB, after {after:.1} MB",
        rates[0], rates[9]
    );
    assert!(statuses.get(&303).copied().unwrap_or(0) <= 40, "20 a minute from one address: {statuses:?}");
    assert!(after - idle <= 10.0, "RSS idle {idle:.1} MB, after {after:.1} MB");
    // Not a speed target (docs/performance.md measures those): a guard against the scan that made
    // each start slower than the one before (2.5 times slower by 120,000).
    let (first, last) = (rates[0], rates[9]);
    assert!(last >= first * 0.5, "the rate fell: first {first:.0}/s, last {last:.0}/s");
}
