//! What docs/deploy.md promises: the systemd unit in deploy/systemd passes `systemd-analyze
//! verify` (where systemd's tools are installed) and its command line serves and stops cleanly on
//! the signal the unit sends; rota migrates and serves a PostgreSQL database as a role that has
//! exactly the privileges the page lists, and a role without them is refused with words that
//! name what it lacks.

use crate::support::{self, Db, KEYS, Mock, Scenario, spawn};
use std::io::{BufRead, BufReader};
use std::path::Path;

const UNIT: &str = include_str!("../../deploy/systemd/rota.service");

/// The unit's `ExecStart`, split into words.
fn exec_start() -> Vec<String> {
    let line = UNIT.lines().find_map(|l| l.strip_prefix("ExecStart=")).expect("the unit has an ExecStart");
    line.split_whitespace().map(str::to_string).collect()
}

#[test]
fn the_systemd_unit_verifies_and_its_command_line_serves_and_stops_on_sigterm() {
    let dir = tempfile::tempdir().unwrap();
    let bin = env!("CARGO_BIN_EXE_rota");
    let unit = dir.path().join("rota.service");
    std::fs::write(&unit, UNIT.replace("/usr/local/bin/rota", bin)).unwrap();
    match std::process::Command::new("systemd-analyze").arg("verify").arg(&unit).output() {
        Ok(out) => {
            let said = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
            assert!(out.status.success() && said.trim().is_empty(), "systemd-analyze verify: {said}");
        }
        Err(e) => eprintln!("systemd-analyze is not installed ({e}): the unit's syntax is not checked here"),
    }

    // Its command line, with the config at a path of the test's.
    let config = dir.path().join("rota.toml");
    std::fs::write(&config, "[server]\nlisten = \"127.0.0.1:0\"\n[providers.openai]\npreset = \"openai\"\n").unwrap();
    let words = exec_start();
    assert_eq!(words[0], "/usr/local/bin/rota");
    let args: Vec<String> = words[1..]
        .iter()
        .map(|w| if w == "/etc/rota/rota.toml" { config.display().to_string() } else { w.clone() })
        .collect();
    let mut child = support::rota_command()
        .args(&args)
        .current_dir(dir.path())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap()).read_line(&mut line).unwrap();
    assert!(line.starts_with("rota listening on http://127.0.0.1:"), "{line}");
    assert!(UNIT.contains("KillSignal=SIGTERM"));
    let status = support::stop(child);
    assert!(status.success(), "a clean stop on SIGTERM: {status}");
    assert!(dir.path().join("rota.db").exists(), "the database in the working directory (StateDirectory)");
}

/// docs/deploy.md's psql script, run as written as the superuser `admin` but for the names: the
/// role is `role`, the database `db` (made by the caller, so `CREATE DATABASE` is left out), and
/// the password one of the test's. `create_on_schema: false` leaves `CREATE` out of the schema's
/// grant.
async fn run_the_deploy_md_script(admin: &str, db: &str, role: &str, create_on_schema: bool) {
    let doc = include_str!("../../docs/deploy.md");
    let script = doc.split("```psql\n").nth(1).expect("docs/deploy.md has a psql block").split("\n```").next().unwrap();
    let script = script.replace("DATABASE rota", &format!("DATABASE {db}")).replace("TO rota", &format!("TO {role}"));
    let script = script.replace("ROLE rota ", &format!("ROLE {role} ")).replace("'…'", "'test-only-password'");
    let script = if create_on_schema { script } else { script.replace("USAGE, CREATE ON SCHEMA", "USAGE ON SCHEMA") };
    let (on_server, on_database) = script.split_once("\\c rota").expect("the script connects to the database");
    let mut url = url::Url::parse(admin).unwrap();
    for (part, target) in [
        (on_server, admin.to_string()),
        (on_database, {
            url.set_path(db);
            url.to_string()
        }),
    ] {
        let mut conn = <sqlx::PgConnection as sqlx::Connection>::connect(&target).await.unwrap();
        for sql in part.lines().filter(|l| !l.starts_with("--") && !l.starts_with("CREATE DATABASE")).map(str::trim) {
            if !sql.is_empty() {
                sqlx::query(sqlx::AssertSqlSafe(sql.to_string()))
                    .execute(&mut conn)
                    .await
                    .unwrap_or_else(|e| panic!("{sql}: {e}"));
            }
        }
    }
}

fn as_role(url: &str, role: &str) -> String {
    let mut url = url::Url::parse(url).unwrap();
    url.set_username(role).unwrap();
    url.to_string()
}

#[tokio::test]
async fn rota_migrates_and_serves_postgres_as_a_role_with_exactly_the_documented_privileges() {
    let admin = std::env::var("ROTA_TEST_PG").expect("ROTA_TEST_PG (scripts/test.sh starts the server)");
    let url = support::postgres_database().await;
    let db = Path::new(url::Url::parse(&url).unwrap().path()).file_name().unwrap().to_str().unwrap().to_string();
    let role = format!("{db}_app");
    run_the_deploy_md_script(&admin, &db, &role, true).await;
    let (_mock, base) = Mock::started().await;
    let rota = spawn(Scenario {
        config: &support::config(&base),
        keys: &KEYS[..2],
        db: Db::Postgres(as_role(&url, &role)),
        ..Scenario::default()
    })
    .await;
    for _ in 0..3 {
        assert_eq!(rota.chat(support::chat(), &[]).await.status(), 200);
    }
    rota.flush().await;
    let (status, requests) = rota.api("GET", "/api/v1/requests", Some(&rota.admin_key), None).await;
    assert_eq!(status, 200);
    assert_eq!(requests["items"].as_array().unwrap().len(), 3, "{requests}");
    let mut conn = <sqlx::PgConnection as sqlx::Connection>::connect(&url).await.unwrap();
    let owner: String = sqlx::query_scalar("SELECT tableowner FROM pg_tables WHERE tablename = 'profiles'")
        .fetch_one(&mut conn)
        .await
        .unwrap();
    assert_eq!(owner, role, "rota's role owns what it created");
}

#[tokio::test]
async fn a_role_that_may_not_create_in_the_schema_is_refused_naming_the_grant() {
    let admin = std::env::var("ROTA_TEST_PG").expect("ROTA_TEST_PG (scripts/test.sh starts the server)");
    let url = support::postgres_database().await;
    let db = Path::new(url::Url::parse(&url).unwrap().path()).file_name().unwrap().to_str().unwrap().to_string();
    let role = format!("{db}_ro");
    run_the_deploy_md_script(&admin, &db, &role, false).await;
    let target = rota::store::DatabaseTarget::Postgres(as_role(&url, &role));
    let err = rota::store::open(&target).await.err().expect("refused").to_string();
    assert!(err.contains("GRANT USAGE, CREATE ON SCHEMA public TO"), "{err}");
    assert!(err.contains("docs/deploy.md"), "{err}");
}

/// A rollback to an older binary meets a database a newer one migrated: refused, saying what to do.
#[tokio::test]
async fn a_database_a_newer_rota_migrated_is_refused_with_the_way_back() {
    let dir = tempfile::tempdir().unwrap();
    let target = rota::store::DatabaseTarget::Sqlite(dir.path().join("rota.db"));
    drop(rota::store::open(&target).await.unwrap());
    let pool = sqlx::SqlitePool::connect(&format!("sqlite://{}", dir.path().join("rota.db").display())).await.unwrap();
    sqlx::query(
        "INSERT INTO _sqlx_migrations (version, description, success, checksum, execution_time)
         VALUES (9999, 'from a newer rota', 1, x'00', 1)",
    )
    .execute(&pool)
    .await
    .unwrap();
    pool.close().await;
    let err = rota::store::open(&target).await.err().expect("refused").to_string();
    assert!(err.contains("migrated by a newer rota (its migration 9999"), "{err}");
    assert!(err.contains("restore the backup taken before the upgrade"), "{err}");
}
