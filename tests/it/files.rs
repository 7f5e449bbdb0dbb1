//! The SQLite database's files when rota cannot write them (docs/deploy.md, "A systemd
//! service"; docs/gateway.md, "Audit, health and shutdown"): another user's database is refused
//! by the CLI and `doctor` in one message naming its owner and the `chown`/`chmod` to run;
//! `doctor` changes no file's mode; a `-shm` made immutable under a running server is logged
//! and shown by `/healthz`, a change through the admin API is answered 503 with why, and a
//! start on such a file is refused with the same words, never a silent SIGBUS.

use crate::support::{self, stop};
use std::io::{BufRead, BufReader};
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const CONFIG: &str = "[server]\nlisten = \"127.0.0.1:0\"\n[providers.openai]\npreset = \"openai\"\n\
                      [models]\nprimary = \"openai/gpt-4.1\"\n";

fn rota(dir: &Path, args: &[&str]) -> Command {
    let mut c = support::rota_command();
    c.arg("--config").arg(dir.join("rota.toml")).args(args).current_dir(dir);
    c
}

/// A folder with a config and a database holding one stored key and an admin agent; the
/// agent's key. On the repository's file system (not a tmpfs: `chattr` needs ext4 or the like).
fn seeded() -> (tempfile::TempDir, String) {
    seeded_in(Path::new(env!("CARGO_TARGET_TMPDIR")))
}

/// `seeded`, in a folder of `parent`.
fn seeded_in(parent: &Path) -> (tempfile::TempDir, String) {
    let dir = tempfile::tempdir_in(parent).unwrap();
    std::fs::write(dir.path().join("rota.toml"), CONFIG).unwrap();
    let mut add = rota(dir.path(), &["profiles", "add", "openai", "--name", "work"])
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    std::io::Write::write_all(&mut add.stdin.take().unwrap(), b"sk-files-test-0001").unwrap();
    assert!(add.wait().unwrap().success());
    let created = rota(dir.path(), &["agents", "create", "ops", "--admin"]).output().unwrap();
    let key = String::from_utf8(created.stdout).unwrap().lines().last().unwrap().trim().to_string();
    (dir, key)
}

fn root() -> bool {
    nix::unistd::geteuid().is_root()
}

/// Runs rota with these arguments, as some user.
type Runner = dyn Fn(&[&str]) -> std::process::Output;

#[test]
fn another_users_database_is_refused_in_one_message_naming_the_owner_and_the_fix() {
    // Another user must reach the folder and the binary: both in the system's temporary folder,
    // whatever the path of the checkout (a `mktemp -d` clone is 0700).
    let (dir, _) = if root() { seeded_in(&std::env::temp_dir()) } else { seeded() };
    let db = dir.path().join("rota.db");
    // As another user when the tests run as root (root writes any file), else a database whose
    // mode forbids its owner to write.
    let (run_as, expect): (Box<Runner>, &str) = if root() {
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
        std::fs::set_permissions(dir.path().join("rota.toml"), std::fs::Permissions::from_mode(0o644)).unwrap();
        let bin = dir.path().join("rota-bin");
        std::fs::copy(env!("CARGO_BIN_EXE_rota"), &bin).unwrap();
        std::fs::set_permissions(&bin, std::fs::Permissions::from_mode(0o755)).unwrap();
        let config = dir.path().join("rota.toml");
        let d = dir.path().to_path_buf();
        (
            Box::new(move |args: &[&str]| {
                Command::new("runuser")
                    .args(["-u", "nobody", "--"])
                    .arg(&bin)
                    .arg("--config")
                    .arg(&config)
                    .args(args)
                    .current_dir(&d)
                    .env("ROTA_LOG", "warn")
                    .output()
                    .unwrap()
            }),
            "it belongs to root (uid 0) with mode 0600. Run rota as its owner (`sudo -u root rota …`), or give the database to this user: `chown nobody",
        )
    } else {
        std::fs::set_permissions(&db, std::fs::Permissions::from_mode(0o400)).unwrap();
        let d = dir.path().to_path_buf();
        (Box::new(move |args: &[&str]| rota(&d, args).output().unwrap()), "its mode is 0400; as its owner")
    };
    for args in [&["profiles", "list"][..], &["doctor"], &["serve"]] {
        let out = run_as(args);
        let said = String::from_utf8_lossy(&out.stderr).to_string() + &String::from_utf8_lossy(&out.stdout);
        assert!(!out.status.success(), "{args:?}: {said}");
        assert!(said.contains("rota.db cannot be written") && said.contains(expect), "{args:?}: {said}");
        assert_eq!(said.matches("cannot be written").count(), 1, "said once: {said}");
        assert!(!said.contains("unable to open database file"), "{args:?}: {said}");
    }
    let mode = std::fs::metadata(&db).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, if root() { 0o600 } else { 0o400 }, "doctor changed no mode");
}

/// `rota doctor` on a database readable by others (an old install's `0644`) says so and changes
/// nothing; `serve` and the commands that write make it owner-only.
#[test]
fn doctor_reports_a_database_readable_by_others_and_leaves_its_mode() {
    let (dir, _) = seeded();
    let db = dir.path().join("rota.db");
    std::fs::set_permissions(&db, std::fs::Permissions::from_mode(0o644)).unwrap();
    let out = rota(dir.path(), &["doctor"]).output().unwrap();
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{said}");
    assert!(said.contains("rota.db is readable by others (mode 0644)"), "{said}");
    assert_eq!(std::fs::metadata(&db).unwrap().permissions().mode() & 0o777, 0o644, "doctor changed no mode");
    assert!(rota(dir.path(), &["profiles", "list"]).output().unwrap().status.success());
    assert_eq!(std::fs::metadata(&db).unwrap().permissions().mode() & 0o777, 0o600, "a command that opens it to write");
}

/// `chattr` as root on the file; false when it cannot be done here (not root, a file system
/// without the attribute).
fn chattr(flag: &str, file: &Path) -> bool {
    root() && Command::new("chattr").arg(flag).arg(file).stderr(Stdio::null()).status().is_ok_and(|s| s.success())
}

#[tokio::test]
async fn a_shm_made_immutable_under_a_running_server_is_logged_shown_and_refused_never_a_silent_sigbus() {
    let (dir, key) = seeded();
    let shm = dir.path().join("rota.db-shm");
    let log = dir.path().join("serve.log");
    let serve = || {
        let err = std::fs::File::create(&log).unwrap();
        let mut child =
            rota(dir.path(), &["serve"]).stdout(Stdio::piped()).stderr(err).env("ROTA_LOG", "info").spawn().unwrap();
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap()).read_line(&mut line).unwrap();
        let addr = line.trim().strip_prefix("rota listening on ").map(str::to_string);
        (child, addr)
    };
    let (child, addr) = serve();
    let addr = addr.expect("serving");
    assert!(shm.exists(), "the server mapped its -shm");
    if !chattr("+i", &shm) {
        eprintln!("chattr +i is not possible here (not root, or a file system without it): skipped");
        stop(child);
        return;
    }
    struct Mutable<'a>(&'a Path);
    impl Drop for Mutable<'_> {
        fn drop(&mut self) {
            chattr("-i", self.0);
        }
    }
    let _undo = Mutable(&shm);
    let client = support::Rota::client();
    let logged = |log: &Path| std::fs::read_to_string(log).unwrap_or_default();
    let t = Instant::now();
    while !logged(&log).contains("the database's files cannot be written") {
        assert!(t.elapsed() < Duration::from_secs(2), "not logged within 2 s: {}", logged(&log));
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(logged(&log).contains("rota.db-shm cannot be written"), "{}", logged(&log));
    let health: serde_json::Value = client.get(format!("{addr}/healthz")).send().await.unwrap().json().await.unwrap();
    assert_eq!(health["status"], "degraded", "{health}");
    assert!(health["database"]["files"].as_str().unwrap().contains("chattr -i"), "{health}");
    let added = client
        .post(format!("{addr}/api/v1/profiles"))
        .bearer_auth(&key)
        .json(&serde_json::json!({"provider": "openai", "name": "late", "secret": "sk-files-test-0002"}))
        .send()
        .await
        .unwrap();
    assert_eq!(added.status().as_u16(), 503);
    let body: serde_json::Value = added.json().await.unwrap();
    assert_eq!(body["error"]["type"], "database_unwritable", "{body}");
    assert!(body["error"]["message"].as_str().unwrap().contains("rota.db-shm cannot be written"), "{body}");
    // Stopped while the file is immutable, the server says why it cannot write; a start then is
    // refused with the same words.
    stop(child);
    let (refused, addr) = serve();
    assert!(addr.is_none(), "no start on an immutable -shm");
    let status = stop(refused);
    assert!(!status.success(), "{status}");
    assert!(logged(&log).contains("rota.db-shm cannot be written"), "{}", logged(&log));
    chattr("-i", &shm);
    let (again, addr) = serve();
    assert!(addr.is_some(), "serving again once the file can be written: {}", logged(&log));
    assert!(stop(again).success());
}
