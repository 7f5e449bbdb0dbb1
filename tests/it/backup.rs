//! Backups of a live SQLite database (docs/operations.md, "Backups"): `rota backup FILE` and
//! `POST /api/v1/backup` while rota serves under load; the copy passes `integrity_check` and
//! rota started on it (with the same master key) serves the same profiles and agents, with the
//! audit rows up to the backup's moment; a PostgreSQL database is dumped and restored with its own
//! tools, and rota serves from the restored one.

use crate::support::{self, KEYS, Mock, Rota, Scenario, spawn};
use serde_json::json;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

async fn copy_rows(file: &std::path::Path) -> (String, i64, i64) {
    let opts = sqlx::sqlite::SqliteConnectOptions::new().filename(file).read_only(true);
    let mut conn = sqlx::ConnectOptions::connect(&opts).await.unwrap();
    let ok: String = sqlx::query_scalar("PRAGMA integrity_check").fetch_one(&mut conn).await.unwrap();
    let profiles: i64 = sqlx::query_scalar("SELECT count(*) FROM profiles").fetch_one(&mut conn).await.unwrap();
    let requests: i64 = sqlx::query_scalar("SELECT count(*) FROM requests").fetch_one(&mut conn).await.unwrap();
    (ok, profiles, requests)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backup_under_load_opens_checks_and_serves() {
    let (_mock, base) = Mock::started().await;
    let rota = spawn(Scenario { config: &support::config(&base), keys: &KEYS[..2], ..Scenario::default() }).await;
    let (stop, served) = (Arc::new(AtomicBool::new(false)), Arc::new(AtomicUsize::new(0)));
    let load: Vec<_> = (0..4)
        .map(|_| {
            let (url, key, stop, served) = (rota.url.clone(), rota.agent_key.clone(), stop.clone(), served.clone());
            tokio::spawn(async move {
                while !stop.load(Ordering::Relaxed) {
                    let r = Rota::client()
                        .post(format!("{url}/v1/chat/completions"))
                        .bearer_auth(&key)
                        .json(&support::chat())
                        .send()
                        .await
                        .unwrap();
                    assert_eq!(r.status(), 200);
                    served.fetch_add(1, Ordering::Relaxed);
                }
            })
        })
        .collect();
    while served.load(Ordering::Relaxed) < 50 {
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }

    // The CLI, beside the serving process, on the same database.
    let dir = rota.dir.path();
    let cli_copy = dir.join("copy.db");
    let out = support::rota_command().args(["backup", "copy.db"]).current_dir(dir).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let again = support::rota_command().args(["backup", "copy.db"]).current_dir(dir).output().unwrap();
    assert!(!again.status.success(), "an existing file is never overwritten");
    // The admin API, a copy beside the database.
    let (code, answer) = rota.api("POST", "/api/v1/backup", Some(&rota.admin_key), None).await;
    assert_eq!(code, 201, "{answer}");
    let api_copy = std::path::PathBuf::from(answer["file"].as_str().unwrap());
    assert_eq!(api_copy.parent(), Some(dir));
    let (code, _) = rota.api("POST", "/api/v1/backup", Some(&rota.agent_key), None).await;
    assert_eq!(code, 403, "an admin's");
    stop.store(true, Ordering::Relaxed);
    for task in load {
        task.await.unwrap();
    }
    let total = rota.scalar("SELECT count(*) FROM requests").await.unwrap();

    for copy in [&cli_copy, &api_copy] {
        let mode = std::os::unix::fs::PermissionsExt::mode(&std::fs::metadata(copy).unwrap().permissions());
        assert_eq!(mode & 0o777, 0o600, "{}: owner only", copy.display());
        let (ok, profiles, requests) = copy_rows(copy).await;
        assert_eq!((ok.as_str(), profiles), ("ok", 2), "{}", copy.display());
        assert!(requests > 0 && requests <= total, "{}: {requests} of {total} requests", copy.display());
    }
    let (code, actions) = rota.api("GET", "/api/v1/admin-actions", Some(&rota.admin_key), None).await;
    assert_eq!(code, 200);
    let backups = actions.as_array().unwrap().iter().filter(|a| a["action"] == "database.backup").count();
    assert_eq!(backups, 2, "the CLI's and the API's: {actions}");

    // Restored: the copy in place of the database, with the same master key.
    let restored = tempfile::tempdir().unwrap();
    std::fs::copy(&cli_copy, restored.path().join("rota.db")).unwrap();
    std::fs::copy(dir.join("rota.key"), restored.path().join("rota.key")).unwrap();
    let config = std::fs::read_to_string(dir.join("rota.toml")).unwrap().replace(
        &format!("sqlite://{}", dir.join("rota.db").display()),
        &format!("sqlite://{}", restored.path().join("rota.db").display()),
    );
    std::fs::write(restored.path().join("rota.toml"), config).unwrap();
    let back = Rota::on_config(restored, (rota.agent_key.clone(), rota.admin_key.clone())).await;
    let r = back.chat(json!({"model": "openai/gpt-4.1", "messages": [{"role": "user", "content": "hi"}]}), &[]).await;
    assert_eq!(r.status(), 200, "the same agents and profiles, the secrets opened with the same key");
    let (_, profiles) = back.api("GET", "/api/v1/profiles", Some(&back.admin_key), None).await;
    let ids: Vec<&str> = profiles.as_array().unwrap().iter().map(|p| p["id"].as_str().unwrap()).collect();
    assert_eq!(ids, [KEYS[0].0, KEYS[1].0]);
}

/// PostgreSQL's backup is `pg_dump`'s (rota's own says so): a dump of a database rota served,
/// restored into a new database, is one rota starts on and serves from, with the same key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_postgres_dump_restores_into_a_database_rota_serves() {
    let url = support::postgres_database().await;
    let (_mock, base) = Mock::started().await;
    let config = support::config(&base);
    let rota = spawn(Scenario {
        config: &config,
        keys: &KEYS[..2],
        db: support::Db::Postgres(url.clone()),
        ..Scenario::default()
    })
    .await;
    for _ in 0..3 {
        assert_eq!(rota.chat(support::chat(), &[]).await.status(), 200);
    }
    rota.flush().await;
    let (code, answer) = rota.api("POST", "/api/v1/backup", Some(&rota.admin_key), None).await;
    assert_eq!(code, 400);
    assert!(answer.to_string().contains("pg_dump"), "{answer}");

    let bin = std::fs::read_dir("/usr/lib/postgresql")
        .unwrap()
        .map(|e| e.unwrap().path().join("bin"))
        .max()
        .expect("PostgreSQL's binaries (scripts/test.sh installs them)");
    let dump = rota.dir.path().join("rota.dump");
    let out =
        std::process::Command::new(bin.join("pg_dump")).args(["-Fc", "-f"]).arg(&dump).arg(&url).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let restored = support::postgres_database().await;
    let out = std::process::Command::new(bin.join("pg_restore"))
        .args(["--no-owner", "-d", &restored])
        .arg(&dump)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));

    let dir = tempfile::tempdir().unwrap();
    let text = std::fs::read_to_string(rota.dir.path().join("rota.toml")).unwrap().replace(&url, &restored);
    std::fs::write(dir.path().join("rota.toml"), text).unwrap();
    let back = Rota::on_config(dir, (rota.agent_key.clone(), rota.admin_key.clone())).await;
    assert_eq!(back.chat(support::chat(), &[]).await.status(), 200, "the same agents, profiles and key");
    let (_, requests) = back.api("GET", "/api/v1/requests", Some(&back.admin_key), None).await;
    assert!(requests["items"].as_array().is_some_and(|r| r.len() >= 3), "the dumped rows: {requests}");
}
