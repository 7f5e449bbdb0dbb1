//! The fault suite (issue 14): the real `rota serve` binary under load from 32 concurrent
//! clients while its database fails, is locked, is pinned by a reader, fills its disk, or the
//! process is killed or stopped. Each case asserts numbers and prints them (`--nocapture` shows
//! them). Sized to run in minutes; `ROTA_FAULTS_LONG=1` runs the full figures with 64 clients,
//! enough to saturate a release build (`scripts/faults.sh --long`, which builds one and names it
//! in `ROTA_FAULTS_BIN`; without it the cases run the debug binary `cargo test` built).
//!
//! The unwritable database is real: `chattr +i` on the database, its `-wal` and `-shm` and
//! their directory (root on ext4, as on these machines; the case says so when it cannot). So is
//! the full disk: a small ext4 file system in a file, loop-mounted (root).

use crate::support::{Mock, Reply};
use serde_json::{Value, json};
use sqlx::ConnectOptions;
use std::collections::HashSet;
use std::io::{BufRead, BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

/// The cases share two cores: one at a time.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// The profiles the load rotates over, and those of another provider that only the SIGKILL
/// case's own requests reach (three a kill).
const PROFILES: usize = 12;
const VICTIMS: usize = 30;

fn long() -> bool {
    std::env::var_os("ROTA_FAULTS_LONG").is_some()
}

/// Clients of the load: 64 saturate a release build on two cores (the load generator, the mock
/// and rota share them); 32 keep the short run's figures comparable with earlier ones.
fn concurrency() -> usize {
    if long() { 64 } else { 32 }
}

/// A database directory, its config and the agent key, for `rota serve` processes.
struct Site {
    dir: tempfile::TempDir,
    agent: String,
}

impl Site {
    /// A site whose providers are a fresh mock upstream, and that mock.
    async fn on_mock(extra: &str) -> (Mock, Site) {
        let (mock, upstream) = Mock::started().await;
        (mock, Site::new(&upstream, extra).await)
    }

    async fn new(upstream: &str, extra: &str) -> Site {
        Site::new_with(upstream, extra, |_| {}).await
    }

    /// A site whose directory `setup` prepares first (the full-disk case mounts its file system
    /// there).
    async fn new_with(upstream: &str, extra: &str, setup: impl FnOnce(&Path)) -> Site {
        let dir = tempfile::tempdir().unwrap();
        setup(dir.path());
        let mut config = format!(
            "[providers.openai]\napi = \"openai\"\nbase_url = \"{upstream}/v1\"\n\n[providers.victim]\napi = \"openai\"\nbase_url = \"{upstream}/v1\"\n\n[models]\nprimary = \"openai/gpt-4.1-mini\"\n\n[secrets]\nkeyring = \"off\"\n\n{extra}\n"
        );
        for i in 0..PROFILES {
            config.push_str(&format!("[auth.profiles.\"openai:k{i}\"]\nprovider = \"openai\"\ntype = \"api_key\"\napi_key_env = \"FAULT_K{i}\"\n"));
        }
        for i in 0..VICTIMS {
            config.push_str(&format!("[auth.profiles.\"victim:v{i}\"]\nprovider = \"victim\"\ntype = \"api_key\"\napi_key_env = \"FAULT_V{i}\"\n"));
        }
        std::fs::write(dir.path().join("rota.toml"), config).unwrap();
        let site = Site { dir, agent: String::new() };
        let out = site.cmd(&["agents", "create", "load"]).output().unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        let agent = String::from_utf8(out.stdout).unwrap().lines().last().unwrap().to_string();
        Site { agent, ..site }
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    fn cmd(&self, args: &[&str]) -> Command {
        let mut c = match std::env::var_os("ROTA_FAULTS_BIN") {
            Some(bin) => crate::support::rota_command_of(&bin),
            None => crate::support::rota_command(),
        };
        // `ROTA_FAULTS_LOG`: rota's log filter for a case under study (`warn` otherwise); its
        // log is then kept (`Server`'s drop).
        if let Some(filter) = std::env::var_os("ROTA_FAULTS_LOG") {
            c.env("ROTA_LOG", filter);
        }
        c.args(args).current_dir(self.dir.path());
        for i in 0..PROFILES {
            c.env(format!("FAULT_K{i}"), format!("sk-fault-{i}"));
        }
        for i in 0..VICTIMS {
            c.env(format!("FAULT_V{i}"), format!("sk-victim-{i}"));
        }
        c
    }

    /// `rota serve` on a free port; its log goes to `rota.log`.
    fn serve(&self) -> Server {
        let log = std::fs::OpenOptions::new().create(true).append(true).open(self.path("rota.log")).unwrap();
        let mut child = self
            .cmd(&["serve", "--listen", "127.0.0.1:0"])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(log)
            .spawn()
            .unwrap();
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap()).read_line(&mut line).unwrap();
        let addr =
            line.trim().strip_prefix("rota listening on http://").unwrap_or_else(|| panic!("{line}")).to_string();
        Server { child, url: format!("http://{addr}"), addr, log: self.path("rota.log") }
    }

    async fn db(&self) -> sqlx::SqliteConnection {
        let opts = sqlx::sqlite::SqliteConnectOptions::new()
            .filename(self.path("rota.db"))
            .busy_timeout(Duration::from_secs(30));
        opts.connect().await.unwrap()
    }

    async fn request_ids(&self) -> HashSet<String> {
        let mut db = self.db().await;
        let ids: Vec<String> = sqlx::query_scalar("SELECT id FROM requests").fetch_all(&mut db).await.unwrap();
        ids.into_iter().collect()
    }

    async fn count(&self, sql: &str) -> i64 {
        let mut db = self.db().await;
        sqlx::query_scalar(sqlx::AssertSqlSafe(sql.to_string())).fetch_one(&mut db).await.unwrap()
    }
}

struct Server {
    child: Child,
    /// rota's log, shown when the test fails.
    log: PathBuf,
    url: String,
    addr: String,
}

impl Server {
    fn rss_mb(&self) -> u64 {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.child.id())).unwrap_or_default();
        let kb: u64 = status
            .lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))
            .and_then(|v| v.split_whitespace().next()?.parse().ok())
            .unwrap_or(0);
        kb / 1024
    }

    async fn health(&self) -> Value {
        let resp = client().get(format!("{}/healthz", self.url)).send().await.unwrap();
        assert_eq!(resp.status(), 200, "/healthz stays 200");
        resp.json().await.unwrap()
    }

    /// The sum of a counter over its labels, from `/metrics`.
    async fn counter(&self, name: &str) -> u64 {
        let text = client().get(format!("{}/metrics", self.url)).send().await.unwrap().text().await.unwrap();
        text.lines()
            .filter(|l| l.starts_with(name) && l[name.len()..].starts_with(['{', ' ']))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum::<f64>() as u64
    }

    /// Watches for `d`: the largest RSS seen (MB), and whether `/healthz` said `degraded`.
    async fn watch(&self, d: Duration) -> (u64, bool) {
        let (t, mut rss_max, mut degraded) = (Instant::now(), self.rss_mb(), false);
        while t.elapsed() < d {
            tokio::time::sleep(Duration::from_millis(500)).await;
            rss_max = rss_max.max(self.rss_mb());
            degraded |= self.health().await["status"] == "degraded";
        }
        (rss_max, degraded)
    }

    /// Waits until both writers are idle and not failing; how long that took.
    async fn drained(&self, limit: Duration) -> Duration {
        let t = Instant::now();
        loop {
            let h = self.health().await;
            if h["audit"]["queued"] == 0 && h["audit"]["failing"] == false && h["stats"]["failing"] == false {
                return t.elapsed();
            }
            assert!(t.elapsed() < limit, "the writers did not drain within {limit:?}: {h}");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    fn signal(&self, sig: &str) {
        assert!(Command::new("kill").args([sig, &self.child.id().to_string()]).status().unwrap().success());
    }

    fn kill(mut self) {
        self.child.kill().unwrap();
        self.child.wait().unwrap();
    }

    /// Waits for the process to exit; how long it took.
    fn exited_within(&mut self, limit: Duration) -> Duration {
        let t = Instant::now();
        loop {
            if self.child.try_wait().unwrap().is_some() {
                return t.elapsed();
            }
            if t.elapsed() > limit {
                let _ = self.child.kill();
                panic!("rota did not exit within {limit:?}");
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let exited = self.child.try_wait().ok().flatten();
        let _ = self.child.kill();
        let _ = self.child.wait();
        // A case run with its own log filter keeps the log, beside the temporary directories.
        if std::env::var_os("ROTA_FAULTS_LOG").is_some() {
            let kept = std::env::temp_dir().join(format!("rota-faults-{}.log", self.child.id()));
            let _ = std::fs::copy(&self.log, &kept);
            eprintln!("rota's log: {}", kept.display());
        }
        if std::thread::panicking() {
            let log = std::fs::read_to_string(&self.log).unwrap_or_default();
            // The line a second that counts shed rows would hide the rest (but a panic's message
            // written into one of them).
            let lines = log.lines().filter(|l| !l.contains("audit rows are shed") || l.contains("panicked"));
            let tail: Vec<&str> = lines.rev().take(40).collect();
            eprintln!("rota had exited before the test ended it: {exited:?}; the end of its log:");
            tail.iter().rev().for_each(|l| eprintln!("  {l}"));
        }
    }
}

fn client() -> reqwest::Client {
    crate::support::Rota::client()
}

/// A request the client got an answer to.
struct Answered {
    id: String,
    status: u16,
    at: Instant,
}

/// `concurrency()` clients sending chat requests until stopped.
struct Load {
    stop: Arc<AtomicBool>,
    workers: Vec<tokio::task::JoinHandle<Vec<Answered>>>,
    started: Instant,
}

impl Load {
    fn start(url: &str, agent: &str) -> Load {
        let stop = Arc::new(AtomicBool::new(false));
        let workers = (0..concurrency())
            .map(|_| {
                let (url, agent, stop) = (format!("{url}/v1/chat/completions"), agent.to_string(), stop.clone());
                tokio::spawn(async move {
                    let http = client();
                    let body = json!({"model": "openai/gpt-4.1-mini", "messages": [{"role": "user", "content": "hi"}]});
                    let mut out = Vec::new();
                    while !stop.load(Ordering::Relaxed) {
                        let sent = http.post(&url).bearer_auth(&agent).json(&body).send().await;
                        let Ok(resp) = sent else {
                            tokio::time::sleep(Duration::from_millis(20)).await;
                            continue;
                        };
                        let status = resp.status().as_u16();
                        let id = resp.headers().get("x-request-id").map(|v| v.to_str().unwrap().to_string());
                        if resp.bytes().await.is_ok()
                            && let Some(id) = id
                        {
                            out.push(Answered { id, status, at: Instant::now() });
                        }
                    }
                    out
                })
            })
            .collect();
        Load { stop, workers, started: Instant::now() }
    }

    async fn stop(self) -> Vec<Answered> {
        self.stop.store(true, Ordering::Relaxed);
        let mut all = Vec::new();
        for w in self.workers {
            all.extend(w.await.unwrap());
        }
        all
    }

    /// Stops the load; what was answered, and the rate it was answered at (req/s).
    async fn stop_rate(self) -> (Vec<Answered>, f64) {
        let took = self.started.elapsed().as_secs_f64();
        let answered = self.stop().await;
        let rate = answered.len() as f64 / took;
        (answered, rate)
    }
}

/// `chattr +i` on the database's files and directory until dropped. Not on `rota.db-shm`: SQLite
/// maps it shared, and the first write to a page of a mapping whose file became immutable is a
/// SIGBUS (seen once), a fault of the test's making rather than of a failing disk.
struct Immutable(Vec<PathBuf>);

impl Immutable {
    fn set(dir: &Path) -> Immutable {
        let mut files: Vec<PathBuf> =
            ["rota.db", "rota.db-wal"].iter().map(|f| dir.join(f)).filter(|p| p.exists()).collect();
        files.push(dir.to_path_buf());
        let out = Command::new("chattr").arg("+i").args(&files).output().expect("chattr (e2fsprogs) is installed");
        assert!(
            out.status.success(),
            "chattr +i needs root on a filesystem with attributes (ext4): {}",
            String::from_utf8_lossy(&out.stderr)
        );
        Immutable(files)
    }
}

impl Drop for Immutable {
    fn drop(&mut self) {
        let _ = Command::new("chattr").arg("-i").args(&self.0).status();
    }
}

/// Every answered request has its row, or is among those counted as shed; and rota's own
/// books balance exactly: rows written plus rows shed is rows queued, per table.
async fn assert_nothing_lost_uncounted(site: &Site, server: &Server, answered: &[Answered]) -> (usize, u64, u64) {
    let ids = site.request_ids().await;
    let missing = answered.iter().filter(|a| !ids.contains(&a.id)).count();
    let h = server.health().await;
    let dropped_requests = h["audit"]["dropped_requests"].as_u64().unwrap();
    let dropped_attempts = h["audit"]["dropped_attempts"].as_u64().unwrap();
    assert!(
        missing as u64 <= dropped_requests,
        "{missing} answered requests have no row; {dropped_requests} counted as shed"
    );
    let requests = server.counter("rota_requests_total").await;
    let attempts = server.counter("rota_attempts_total").await;
    let rows = site.count("SELECT count(*) FROM requests").await as u64;
    let attempt_rows = site.count("SELECT count(*) FROM attempts").await as u64;
    assert_eq!(rows + dropped_requests, requests, "request rows + shed = requests answered");
    assert_eq!(attempt_rows + dropped_attempts, attempts, "attempt rows + shed = attempts made");
    assert_eq!(
        server.counter("rota_audit_dropped_total").await,
        dropped_requests + dropped_attempts,
        "/metrics counts what /healthz does"
    );
    (missing, dropped_requests, dropped_attempts)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unwritable_database_loses_nothing_uncounted_and_writes_resume() {
    let _one = SERIAL.lock().await;
    let _alone = crate::support::Alone::take();
    let (_mock, site) = Site::on_mock("[audit]\nqueue = 20000\n").await;
    let server = site.serve();
    let load = Load::start(&server.url, &site.agent);
    tokio::time::sleep(Duration::from_secs(2)).await;
    let rss_before = server.rss_mb();
    let fault = if long() { 30 } else { 10 };
    let frozen = Immutable::set(site.dir.path());
    let (rss_max, degraded) = server.watch(Duration::from_secs(fault)).await;
    drop(frozen);
    let answered = load.stop().await;
    let resumed = server.drained(Duration::from_secs(10)).await;
    let (missing, dropped, dropped_attempts) = assert_nothing_lost_uncounted(&site, &server, &answered).await;
    let ok = answered.iter().filter(|a| a.status == 200).count();
    eprintln!(
        "unwritable {fault} s: {} answered ({ok} ok); every row written or counted {resumed:?} after the fault; {missing} rows missing, {dropped} request and {dropped_attempts} attempt rows counted as shed; RSS {rss_before} → max {rss_max} MB",
        answered.len()
    );
    assert!(degraded, "/healthz said degraded while the database failed");
    assert_eq!(server.health().await["status"], "ok", "and ok again after");
    assert!(ok * 10 >= answered.len() * 9, "requests kept being served");
    assert!(rss_max < rss_before + 100, "memory stays bounded: {rss_before} → {rss_max} MB");
    assert_eq!(
        site.count("SELECT count(*) FROM usage_stats WHERE last_used IS NULL AND profile_id LIKE 'openai:%'").await,
        0,
        "stats written"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_writer_blocked_by_an_auditor_sheds_exactly_what_it_counts() {
    let _one = SERIAL.lock().await;
    let _alone = crate::support::Alone::take();
    let (_mock, site) = Site::on_mock("[audit]\nqueue = 2000\n").await;
    let server = site.serve();
    let load = Load::start(&server.url, &site.agent);
    tokio::time::sleep(Duration::from_secs(1)).await;
    let rss_before = server.rss_mb();
    let block = if long() { 60 } else { 15 };
    let mut auditor = site.db().await;
    sqlx::query("BEGIN IMMEDIATE").execute(&mut auditor).await.unwrap();
    let (rss_max, degraded) = server.watch(Duration::from_secs(block)).await;
    sqlx::query("ROLLBACK").execute(&mut auditor).await.unwrap();
    drop(auditor);
    let answered = load.stop().await;
    let resumed = server.drained(Duration::from_secs(20)).await;
    let (missing, dropped, dropped_attempts) = assert_nothing_lost_uncounted(&site, &server, &answered).await;
    eprintln!(
        "writer blocked {block} s: {} answered; drained {resumed:?} after; {missing} rows missing, {dropped} request and {dropped_attempts} attempt rows shed and counted; RSS {rss_before} → max {rss_max} MB",
        answered.len()
    );
    assert!(dropped > 0, "a 2,000-row queue overflowed in {block} s of load: the test must shed to prove the count");
    assert!(degraded, "/healthz said degraded while the writer was blocked");
    assert!(rss_max < rss_before + 100, "memory stays bounded: {rss_before} → {rss_max} MB");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn saturated_load_sheds_nothing_and_the_wal_stays_small() {
    let _one = SERIAL.lock().await;
    let _alone = crate::support::Alone::take();
    let (_mock, site) = Site::on_mock("").await;
    let server = site.serve();
    let secs = if long() { 60 } else { 5 };
    let wal = || std::fs::metadata(site.path("rota.db-wal")).map(|m| m.len()).unwrap_or(0);
    let load = Load::start(&server.url, &site.agent);
    let (t, mut wal_max, mut lag_max, mut waiting_max) = (Instant::now(), 0, 0, 0);
    while t.elapsed() < Duration::from_secs(secs) {
        tokio::time::sleep(Duration::from_millis(250)).await;
        wal_max = wal_max.max(wal());
        let h = server.health().await;
        lag_max = lag_max.max(h["audit"]["lag_ms"].as_u64().unwrap());
        waiting_max = waiting_max.max(h["stats"]["waiting"].as_u64().unwrap());
    }
    let (answered, rate) = load.stop_rate().await;
    server.drained(Duration::from_secs(20)).await;
    let (missing, dropped, dropped_attempts) = assert_nothing_lost_uncounted(&site, &server, &answered).await;
    let h = server.health().await;
    eprintln!(
        "saturated {secs} s, {} clients: {} answered, {rate:.0} req/s; rows shed: {dropped} requests, {dropped_attempts} attempts; WAL at most {:.1} MB; oldest unwritten row at most {lag_max} ms; {} requests held for the writer; slowest batch: audit {} ms, stats {} ms; the checkpoints held the writers up {} ms at most; stats waiting at most {waiting_max} profiles",
        concurrency(),
        answered.len(),
        wal_max as f64 / 1e6,
        h["audit"]["held"],
        h["audit"]["slowest_write_ms"],
        h["stats"]["slowest_write_ms"],
        h["database"]["checkpoint_hold_ms"],
    );
    assert_eq!((missing, dropped, dropped_attempts), (0, 0, 0), "at any load, nothing is shed");
    assert!(
        wal_max < 64 << 20,
        "the log is started over under load and never reaches database.wal_limit_mb (64 MB): {wal_max} bytes"
    );
    assert!(waiting_max <= (PROFILES + VICTIMS) as u64, "the stats backlog is bounded by the profiles");
}

/// A small ext4 file system in a file, loop-mounted on a directory until dropped (root).
#[cfg(target_os = "linux")]
struct LoopFs {
    image: PathBuf,
    at: PathBuf,
}

#[cfg(target_os = "linux")]
impl LoopFs {
    fn mount(at: &Path, mb: u64) -> LoopFs {
        let image = std::env::temp_dir().join(format!("rota-full-disk-{}.img", std::process::id()));
        let run = |cmd: &str, args: &[&std::ffi::OsStr]| {
            let out = Command::new(cmd).args(args).output().unwrap_or_else(|e| panic!("{cmd}: {e}"));
            assert!(
                out.status.success(),
                "{cmd} (the full-disk case needs root and a loop device): {}",
                String::from_utf8_lossy(&out.stderr)
            );
        };
        run("truncate", &["-s".as_ref(), format!("{mb}M").as_ref(), image.as_os_str()]);
        run("mkfs.ext4", &["-q".as_ref(), "-m".as_ref(), "0".as_ref(), image.as_os_str()]);
        run("mount", &["-o".as_ref(), "loop".as_ref(), image.as_os_str(), at.as_os_str()]);
        LoopFs { image, at: at.to_path_buf() }
    }

    fn free(&self) -> u64 {
        let st = nix::sys::statvfs::statvfs(&self.at).unwrap();
        st.blocks_available() as u64 * st.fragment_size() as u64
    }

    /// Fills the file system with files of 4 MiB (the last one smaller) until it is full.
    fn fill(&self) -> Vec<PathBuf> {
        let chunk = vec![0u8; 1 << 20];
        let mut files = Vec::new();
        'fill: for n in 0.. {
            let path = self.at.join(format!("filler-{n}"));
            let mut f = std::fs::File::create(&path).unwrap();
            files.push(path);
            for _ in 0..4 {
                if f.write_all(&chunk).and_then(|_| f.sync_all()).is_err() {
                    break 'fill;
                }
            }
        }
        files
    }
}

#[cfg(target_os = "linux")]
impl Drop for LoopFs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.at).status();
        let _ = std::fs::remove_file(&self.image);
    }
}

#[cfg(target_os = "linux")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_disk_once_freed_is_not_filled_again_by_the_drain() {
    let _one = SERIAL.lock().await;
    let _alone = crate::support::Alone::take();
    let (_mock, upstream) = crate::support::Mock::started().await;
    let mut fs = None;
    let site = Site::new_with(&upstream, "", |dir| fs = Some(LoopFs::mount(dir, 192))).await;
    let fs = fs.unwrap();
    let server = site.serve();
    let load = Load::start(&server.url, &site.agent);
    tokio::time::sleep(Duration::from_secs(2)).await;
    let mut filler = fs.fill();
    let full_for = if long() { 15 } else { 3 };
    let (_, degraded) = server.watch(Duration::from_secs(full_for)).await;
    // Free 64 MB: twice what the drain leaves free (`behind::DRAIN_FLOOR`, 32 MB).
    let free_before = fs.free();
    while fs.free() < free_before + (64 << 20) {
        std::fs::remove_file(filler.pop().expect("filler enough to free 64 MB")).unwrap();
    }
    let freed = fs.free() - free_before;
    let (t, mut min_free) = (Instant::now(), u64::MAX);
    let watch_for = Duration::from_secs(if long() { 30 } else { 5 });
    while t.elapsed() < watch_for {
        tokio::time::sleep(Duration::from_millis(50)).await;
        min_free = min_free.min(fs.free());
    }
    let (answered, rate) = load.stop_rate().await;
    for f in filler.drain(..) {
        std::fs::remove_file(f).unwrap();
    }
    let resumed = server.drained(Duration::from_secs(60)).await;
    let (missing, dropped, dropped_attempts) = assert_nothing_lost_uncounted(&site, &server, &answered).await;
    eprintln!(
        "disk full {full_for} s under load ({rate:.0} req/s), then {:.0} MB freed: for {watch_for:?} after, the least free was {:.1} MB; the rest drained {resumed:?} after the filler went; {missing} rows missing, {dropped} request and {dropped_attempts} attempt rows shed and counted",
        freed as f64 / 1e6,
        min_free as f64 / 1e6,
    );
    assert!(degraded, "/healthz said degraded while the disk was full");
    assert!(
        min_free >= 24 << 20,
        "the drain kept the space freed: at least the 32 MB floor less one batch stayed free, not {min_free} bytes"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_wal_shrinks_back_under_its_limit_after_a_long_reader() {
    let _one = SERIAL.lock().await;
    let _alone = crate::support::Alone::take();
    let (_mock, site) = Site::on_mock("[database]\nwal_limit_mb = 1\ncheckpoint_every = \"2s\"\n").await;
    let server = site.serve();
    let load = Load::start(&server.url, &site.agent);
    let wal = || std::fs::metadata(site.path("rota.db-wal")).map(|m| m.len()).unwrap_or(0);
    let mut reader = site.db().await;
    sqlx::query("BEGIN").execute(&mut reader).await.unwrap();
    let _: i64 = sqlx::query_scalar("SELECT count(*) FROM requests").fetch_one(&mut reader).await.unwrap();
    let (t, mut wal_max) = (Instant::now(), 0);
    while t.elapsed() < Duration::from_secs(20) {
        tokio::time::sleep(Duration::from_millis(500)).await;
        wal_max = wal_max.max(wal());
    }
    sqlx::query("COMMIT").execute(&mut reader).await.unwrap();
    drop(reader);
    let ended = Instant::now();
    let shrunk = loop {
        if wal() <= 1 << 20 {
            break ended.elapsed();
        }
        assert!(
            ended.elapsed() < Duration::from_secs(60),
            "the WAL is still {} bytes a minute after the reader",
            wal()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let answered = load.stop().await;
    eprintln!(
        "long reader 20 s: WAL grew to {:.1} MB under {} requests; back under 1 MB {shrunk:?} after the reader ended",
        wal_max as f64 / 1e6,
        answered.len()
    );
    assert!(wal_max > 1 << 20, "the reader pinned the WAL past its limit (else this shows nothing)");
}

/// Cools `victim:vN` for ten minutes through a request pinned to it: the 429 that says so is
/// answered only once the window is written (`Runtime::durable`).
async fn cool(mock: &Mock, server: &Server, site: &Site, n: usize) {
    mock.script(
        &format!("sk-victim-{n}"),
        vec![Reply::Status(
            429,
            vec![("retry-after", "600".into())],
            r#"{"error":{"message":"Rate limit reached","type":"rate_limit_error"}}"#.into(),
        )],
    );
    let resp = client()
        .post(format!("{}/v1/chat/completions", server.url))
        .bearer_auth(&site.agent)
        .header("x-rota-profile", format!("victim:v{n}"))
        .json(&json!({"model": "victim/gpt-4.1-mini", "messages": [{"role": "user", "content": "hi"}]}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 429);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_under_load_keeps_every_cooldown_and_loses_at_most_the_window() {
    let _one = SERIAL.lock().await;
    let _alone = crate::support::Alone::take();
    let (mock, site) = Site::on_mock("").await;
    // Long: five kills after 10 s of saturated load each, the writers in their steady state.
    let (kills, loaded) = if long() { (5, 10_000) } else { (10, 800) };
    let mut worst = Duration::ZERO;
    let mut lost_total = 0;
    for i in 0..kills {
        let server = site.serve();
        let load = Load::start(&server.url, &site.agent);
        // Three victims a kill answer 429 for ten minutes: two while the load runs, the third
        // the last thing a client hears before the kill.
        let victims = [3 * i, 3 * i + 1, 3 * i + 2];
        tokio::time::sleep(Duration::from_millis(loaded / 3)).await;
        cool(&mock, &server, &site, victims[0]).await;
        tokio::time::sleep(Duration::from_millis(loaded / 3)).await;
        cool(&mock, &server, &site, victims[1]).await;
        tokio::time::sleep(Duration::from_millis(loaded / 3)).await;
        cool(&mock, &server, &site, victims[2]).await;
        server.kill();
        let killed = Instant::now();
        let (answered, rate) = load.stop_rate().await;

        let integrity: String =
            sqlx::query_scalar("PRAGMA integrity_check").fetch_one(&mut site.db().await).await.unwrap();
        assert_eq!(integrity, "ok");
        for v in victims {
            let cooled = site
                .count(&format!(
                    "SELECT count(*) FROM profile_cooldowns WHERE profile_id = 'victim:v{v}' AND cooldown_until > strftime('%s','now') * 1000 + 500000"
                ))
                .await;
            assert_eq!(
                cooled, 1,
                "kill {i}: the cooldown of victim:v{v} rota answered before the kill is in the database"
            );
        }
        let ids = site.request_ids().await;
        let lost: Vec<Duration> =
            answered.iter().filter(|a| !ids.contains(&a.id)).map(|a| killed.duration_since(a.at)).collect();
        let oldest = lost.iter().max().copied().unwrap_or_default();
        eprintln!(
            "kill {i}: {} answered ({rate:.0} req/s), {} audit rows lost, the oldest answered {oldest:?} before the kill",
            answered.len(),
            lost.len()
        );
        worst = worst.max(oldest);
        lost_total += lost.len();
    }
    let server = site.serve();
    let h = server.health().await;
    assert_eq!(h["status"], "ok");
    eprintln!(
        "{kills} kills: {lost_total} audit rows lost in all; the oldest lost row was answered {worst:?} before its kill; {} cooldowns answered, all written",
        3 * kills
    );
    assert!(worst <= Duration::from_millis(250), "rows lost per kill are within the documented window (docs/audit.md)");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_cuts_an_endless_stream_after_the_grace_and_audits_it_cancelled() {
    let _one = SERIAL.lock().await;
    let _alone = crate::support::Alone::take();
    let (mock, site) = Site::on_mock("[server]\nshutdown_grace = \"2s\"\n").await;
    let mut server = site.serve();
    mock.script("sk-fault-0", vec![Reply::StreamStallAfterFirst]);
    let mut resp = client()
        .post(format!("{}/v1/chat/completions", server.url))
        .bearer_auth(&site.agent)
        .header("x-rota-profile", "openai:k0")
        .json(&json!({"model": "openai/gpt-4.1-mini", "stream": true, "messages": [{"role": "user", "content": "hi"}]}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let first = resp.chunk().await.unwrap().unwrap();
    assert!(!first.is_empty());
    server.signal("-TERM");
    let reader = tokio::spawn(async move {
        let mut rest = Vec::new();
        while let Ok(Some(c)) = resp.chunk().await {
            rest.extend_from_slice(&c);
        }
        String::from_utf8_lossy(&rest).to_string()
    });
    let took = tokio::task::spawn_blocking(move || server.exited_within(Duration::from_secs(7))).await.unwrap();
    let rest = reader.await.unwrap();
    eprintln!("SIGTERM with an endless stream open: exited after {took:?} (grace 2 s)");
    assert!(took >= Duration::from_secs(2), "the stream had its grace");
    assert!(rest.contains("rota is shutting down"), "the client got the in-band error: {rest}");
    let cancelled =
        site.count("SELECT count(*) FROM attempts WHERE reason = 'cancelled' AND error LIKE '%shutting down%'").await;
    assert_eq!(cancelled, 1, "the stream's attempt is audited cancelled");
}

/// Shutdown answers everyone (docs/gateway.md, "Shutdown"): 500 requests, half OpenAI chat and
/// half Anthropic messages, waiting on an upstream that accepts and never answers when SIGTERM
/// comes, each get rota's 503 in their own wire format once the grace is over, and each has its
/// `requests` row and its `cancelled` attempt.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_answers_every_request_waiting_on_a_silent_upstream_and_audits_it() {
    let _one = SERIAL.lock().await;
    let _alone = crate::support::Alone::take();
    let silent = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let upstream = format!("http://{}", silent.local_addr().unwrap());
    let held = Arc::new(parking_lot::Mutex::new(Vec::new()));
    let holder = {
        let held = held.clone();
        tokio::spawn(async move {
            while let Ok((socket, _)) = silent.accept().await {
                held.lock().push(socket);
            }
        })
    };
    let site = Site::new(&upstream, "[server]\nshutdown_grace = \"1s\"\n").await;
    let mut server = site.serve();
    const N: usize = 500;
    let client = client();
    let calls: Vec<_> = (0..N)
        .map(|i| {
            let (client, url, agent) = (client.clone(), server.url.clone(), site.agent.clone());
            tokio::spawn(async move {
                let messages = json!([{"role": "user", "content": "hi"}]);
                let req = if i % 2 == 0 {
                    client
                        .post(format!("{url}/v1/chat/completions"))
                        .json(&json!({"model": "openai/gpt-4.1-mini", "messages": messages}))
                } else {
                    client
                        .post(format!("{url}/v1/messages"))
                        .header("anthropic-version", "2023-06-01")
                        .json(&json!({"model": "openai/gpt-4.1-mini", "max_tokens": 16, "messages": messages}))
                };
                let r = req.bearer_auth(agent).send().await.unwrap();
                (i, r.status().as_u16(), r.json::<Value>().await.unwrap())
            })
        })
        .collect();
    let t = Instant::now();
    while held.lock().len() < N {
        assert!(t.elapsed() < Duration::from_secs(30), "{} of {N} calls reached the upstream", held.lock().len());
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    server.signal("-TERM");
    let took = tokio::task::spawn_blocking(move || server.exited_within(Duration::from_secs(15))).await.unwrap();
    let mut answered = 0;
    for call in calls {
        let (i, status, body) = call.await.unwrap();
        let message = if i % 2 == 0 {
            body["error"]["message"].as_str()
        } else {
            assert_eq!(body["type"], "error", "request {i}: an Anthropic error: {body}");
            body["error"]["message"].as_str()
        };
        assert_eq!(status, 503, "request {i}: {body}");
        assert!(message.is_some_and(|m| m.contains("rota is shutting down")), "request {i}: {body}");
        answered += 1;
    }
    holder.abort();
    eprintln!("SIGTERM with {N} requests waiting on a silent upstream: {answered} answered, exited after {took:?}");
    let rows =
        site.count("SELECT count(*) FROM requests WHERE status = 503 AND error LIKE 'rota is shutting down%'").await;
    let attempts = site.count("SELECT count(*) FROM attempts WHERE outcome = 'failure' AND reason = 'cancelled' AND error LIKE 'rota is shutting down%'").await;
    assert_eq!((answered, rows, attempts), (N, N as i64, N as i64), "every request answered, with its rows");
    let marked =
        site.count("SELECT count(*) FROM usage_stats WHERE error_count > 0 OR cooldown_until IS NOT NULL").await;
    assert_eq!(marked, 0, "a cut call leaves no mark on its profile");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_doors_close_on_slow_and_idle_clients_and_healthz_still_answers() {
    let _one = SERIAL.lock().await;
    let _alone = crate::support::Alone::take();
    #[cfg(unix)]
    rlimit::increase_nofile_limit(u64::MAX).unwrap();
    let (_mock, site) = Site::on_mock("[server]\nheader_timeout = \"1s\"\nbody_timeout = \"1s\"\n").await;
    let server = site.serve();

    // Slowloris: half a request head, then nothing.
    let mut slow = std::net::TcpStream::connect(&server.addr).unwrap();
    slow.write_all(b"POST /v1/chat/completions HTTP/1.1\r\nHost: rota\r\n").unwrap();
    slow.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let t = Instant::now();
    let mut buf = Vec::new();
    let _ = slow.read_to_end(&mut buf);
    let closed = t.elapsed();
    assert!(closed < Duration::from_secs(3), "closed {closed:?} after half a head");

    // A body that trickles: 408 within the body timeout.
    let mut trickle = std::net::TcpStream::connect(&server.addr).unwrap();
    write!(
        trickle,
        "POST /v1/chat/completions HTTP/1.1\r\nHost: rota\r\nAuthorization: Bearer {}\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{{\"mod",
        site.agent
    )
    .unwrap();
    trickle.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let t = Instant::now();
    let mut answer = [0u8; 512];
    let n = trickle.read(&mut answer).unwrap();
    let answer = String::from_utf8_lossy(&answer[..n]).to_string();
    assert!(answer.starts_with("HTTP/1.1 408"), "{answer}");
    assert!(answer.contains("server.body_timeout"), "{answer}");
    let body_cut = t.elapsed();

    // 5,000 idle sockets, five times the connection cap: /healthz still answers.
    let idle: Vec<std::net::TcpStream> =
        (0..5000).map(|_| std::net::TcpStream::connect(&server.addr).unwrap()).collect();
    let t = Instant::now();
    let health = tokio::time::timeout(Duration::from_secs(10), server.health()).await.expect("/healthz answered");
    let healthz = t.elapsed();
    assert_eq!(health["status"], "ok");
    drop(idle);
    eprintln!(
        "slowloris closed after {closed:?}; trickled body refused (408) after {body_cut:?}; /healthz answered in {healthz:?} behind 5,000 idle sockets"
    );
}
