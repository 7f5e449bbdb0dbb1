//! The store on a real SQLite file (and a real PostgreSQL database): restarts restore state
//! exactly, concurrent updates lose nothing, migrations are idempotent, and secrets never reach
//! the file in plaintext.

use rota::book::Book;
use rota::config::Config;
use rota::engine::{Change, Failure, ProfileId, ProfileType, Reason, Until};
use rota::secrets::{MasterKey, SecretField};
use rota::store::DatabaseTarget;
use rota::store::{AttemptRecord, AuditQuery, Pruned, RequestRecord, SqliteStore, Store, StoredProfile};
use secrecy::{ExposeSecret, SecretString};
use std::sync::Arc;

const T0: i64 = 1_800_000_000_000;
const CONFIG: &str = r#"
[providers.openai]
api = "openai"
base_url = "http://127.0.0.1:9/v1"
"#;

fn id(s: &str) -> ProfileId {
    s.parse().unwrap()
}

fn key() -> MasterKey {
    MasterKey::from_bytes(&[42; 32])
}

async fn add_key(store: &dyn Store, key: &MasterKey, profile: &str, secret: &str) {
    let pid = id(profile);
    let sealed = key.seal(&pid, SecretField::ApiKey, &SecretString::from(secret.to_string()));
    let row = StoredProfile::stored(pid, ProfileType::ApiKey, None, T0);
    store.add_profile(&row, &[sealed]).await.unwrap();
}

fn failure(reason: Reason, model: &str, at: i64) -> Failure {
    Failure { reason, model: model.into(), hint_ms: None, account_wide: false, started_at: at, claim: false }
}

#[tokio::test]
async fn usage_stats_survive_a_restart_exactly() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("rota.db");
    let config = Config::from_toml(CONFIG).unwrap();
    let k = key();
    let before;
    {
        let store = SqliteStore::open(&path).await.unwrap();
        add_key(&store, &k, "openai:a", "sk-a").await;
        add_key(&store, &k, "openai:b", "sk-b").await;
        let book = Book::load(Arc::new(store.clone()), live(&config), Arc::new(key()), T0).await.unwrap();
        let a = id("openai:a");
        book.mark_used(&a, None, T0);
        book.record_failure(&a, &failure(Reason::RateLimit, "gpt-4.1", T0), T0 + 5);
        book.record_failure(
            &a,
            &Failure { hint_ms: Some(90_000), ..failure(Reason::Timeout, "gpt-4.1", T0 + 10) },
            T0 + 20,
        );
        book.record_failure(&a, &failure(Reason::Overloaded, "o3", T0 + 25), T0 + 25);
        book.record_failure(&a, &failure(Reason::Billing, "gpt-4.1", T0 + 30), T0 + 30);
        let b = id("openai:b");
        book.mark_used(&b, None, T0 + 40);
        book.record_success(&b, "gpt-4.1", T0 + 50, T0 + 50);
        book.record_model_not_found("openai", "gpt-9", T0 + 60, T0 + 55);
        book.flush().await;
        before = (book.stats(&a).unwrap(), book.stats(&b).unwrap());
        store.close().await;
    }
    assert_eq!(before.0.error_count, 4);
    assert_eq!(before.0.cooldowns.len(), 2, "gpt-4.1 and o3 cool in two windows");
    assert!(before.0.disabled.is_some());

    let store = SqliteStore::open(&path).await.unwrap();
    // What an auditor reads: every window in profile_cooldowns, the one that ends last in
    // usage_stats.cooldown_*.
    let rows: Vec<(Option<String>, i64, String, i64)> = sqlx::query_as(
        "SELECT model, cooldown_until, cooldown_reason, step FROM profile_cooldowns WHERE profile_id = 'openai:a'
         ORDER BY model",
    )
    .fetch_all(store.pool())
    .await
    .unwrap();
    assert_eq!(
        rows,
        [
            (Some("gpt-4.1".into()), T0 + 20 + 90_000, "timeout".into(), 2),
            (Some("o3".into()), T0 + 25 + 60_000, "overloaded".into(), 1)
        ]
    );
    let head: (Option<String>, i64) =
        sqlx::query_as("SELECT cooldown_model, cooldown_until FROM usage_stats WHERE profile_id = 'openai:a'")
            .fetch_one(store.pool())
            .await
            .unwrap();
    assert_eq!(head, (Some("gpt-4.1".into()), T0 + 20 + 90_000));
    let snap = store.snapshot().await.unwrap();
    assert_eq!(snap.stats[&id("openai:a")], before.0);
    assert_eq!(snap.stats[&id("openai:b")], before.1);
    assert_eq!(snap.model_cooldowns[&("openai".to_string(), "gpt-9".to_string())].until, T0 + 60 + 60_000);
    let book = Book::load(Arc::new(store), live(&config), Arc::new(key()), T0 + 100).await.unwrap();
    assert_eq!(book.stats(&id("openai:a")).unwrap(), before.0);
    assert_eq!(book.model_cooled_until("openai", "gpt-9", T0 + 100), Some(T0 + 60 + 60_000));
    match book.credential(&id("openai:b")).unwrap() {
        rota::book::Credential::ApiKey(s) => assert_eq!(s.expose_secret(), "sk-b"),
        other => panic!("unexpected credential {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_hundred_concurrent_failures_on_one_profile_lose_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("rota.db");
    let config = Config::from_toml(CONFIG).unwrap();
    let store = SqliteStore::open(&path).await.unwrap();
    add_key(&store, &key(), "openai:hot", "sk-hot").await;
    let book = Arc::new(Book::load(Arc::new(store.clone()), live(&config), Arc::new(key()), T0).await.unwrap());
    let hot = id("openai:hot");
    let tasks: Vec<_> = (0..200)
        .map(|i| {
            let (book, hot) = (book.clone(), hot.clone());
            tokio::spawn(async move {
                let reason = if i % 2 == 0 { Reason::RateLimit } else { Reason::Overloaded };
                book.record_failure(&hot, &failure(reason, "gpt-4.1", T0), T0 + 1 + i);
            })
        })
        .collect();
    for t in tasks {
        t.await.unwrap();
    }
    book.flush().await;
    let mem = book.stats(&hot).unwrap();
    assert_eq!((mem.error_count, mem.failure_total), (200, 200));
    assert_eq!(mem.failure_counts[&Reason::RateLimit] + mem.failure_counts[&Reason::Overloaded], 200);
    // Every attempt was in flight before the window opened: one window, not 200 escalations.
    // (Each lasts at least as long as its own first step: the last one sets the end.)
    assert_eq!(mem.cooldowns.iter().map(|c| (c.step, c.until)).collect::<Vec<_>>(), [(1, T0 + 200 + 60_000)]);
    store.close().await;

    let reopened = SqliteStore::open(&path).await.unwrap();
    let on_disk = &reopened.snapshot().await.unwrap().stats[&hot];
    assert_eq!(on_disk, &mem);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn three_instances_times_two_hundred_concurrent_failures_on_one_sqlite_file_lose_nothing() {
    let dir = tempfile::tempdir().unwrap();
    three_instances_times_two_hundred_failures(DatabaseTarget::Sqlite(dir.path().join("rota.db"))).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn three_instances_times_two_hundred_concurrent_failures_on_one_postgres_database_lose_nothing() {
    three_instances_times_two_hundred_failures(DatabaseTarget::Postgres(crate::support::postgres_database().await))
        .await;
}

async fn three_instances_times_two_hundred_failures(target: DatabaseTarget) {
    let config = Config::from_toml(CONFIG).unwrap();
    let first = rota::store::open(&target).await.unwrap();
    add_key(first.as_ref(), &key(), "openai:hot", "sk-hot").await;
    let mut books = Vec::new();
    for _ in 0..3 {
        let store = rota::store::open(&target).await.unwrap();
        books.push(Arc::new(Book::load(store, live(&config), Arc::new(key()), T0).await.unwrap()));
    }
    let hot = id("openai:hot");
    let mut tasks = Vec::new();
    for book in &books {
        for i in 0..200 {
            let (book, hot) = (book.clone(), hot.clone());
            tasks.push(tokio::spawn(async move {
                book.record_failure(&hot, &failure(Reason::RateLimit, "gpt-4.1", T0), T0 + 1 + i);
            }));
        }
    }
    for t in tasks {
        t.await.unwrap();
    }
    for book in &books {
        book.flush().await;
    }
    let stored = first.snapshot().await.unwrap().stats[&hot].clone();
    assert_eq!((stored.failure_total, stored.error_count, stored.failure_counts[&Reason::RateLimit]), (600, 600, 600));
    // Every call was in flight before the window opened (burst guard): one window at step 1.
    let windows: Vec<_> = stored.cooldowns.iter().map(|c| (c.step, c.until)).collect();
    assert_eq!(windows, [(1, T0 + 200 + 60_000)]);
    // Each instance's book comes to hold what the database holds, through the change feed.
    let started = std::time::Instant::now();
    for book in &books {
        while book.stats(&hot).unwrap() != stored {
            assert!(started.elapsed() < std::time::Duration::from_secs(2), "{:?} vs {stored:?}", book.stats(&hot));
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
    }
}

#[tokio::test]
async fn the_latest_quota_report_wins_across_instances_on_sqlite() {
    let dir = tempfile::tempdir().unwrap();
    latest_quota_report_wins(DatabaseTarget::Sqlite(dir.path().join("rota.db"))).await;
}

#[tokio::test]
async fn the_latest_quota_report_wins_across_instances_on_postgres() {
    latest_quota_report_wins(DatabaseTarget::Postgres(crate::support::postgres_database().await)).await;
}

/// Two instances report the quota of one profile: the report seen last is kept, whichever write
/// lands last, every model keeps its own row, and both books come to hold what the database does.
async fn latest_quota_report_wins(target: DatabaseTarget) {
    use rota::engine::quota::{Quota, Window};
    let config = Config::from_toml(CONFIG).unwrap();
    let first = rota::store::open(&target).await.unwrap();
    add_key(first.as_ref(), &key(), "openai:q", "sk-q").await;
    let (a, b) = (
        Book::load(rota::store::open(&target).await.unwrap(), live(&config), Arc::new(key()), T0).await.unwrap(),
        Book::load(rota::store::open(&target).await.unwrap(), live(&config), Arc::new(key()), T0).await.unwrap(),
    );
    let q = id("openai:q");
    let report = |model: &str, remaining: i64, seen_at: i64| Quota {
        model: model.into(),
        requests: Some(Window { remaining, limit: Some(60), reset_at: Some(seen_at + 30_000) }),
        tokens: Some(Window { remaining: remaining * 100, limit: None, reset_at: None }),
        plan: Some(Window { remaining: 100 - remaining, limit: Some(100), reset_at: Some(seen_at + 60_000) }),
        seen_at,
    };
    a.record_quota(&q, report("gpt-4.1", 0, T0 + 200));
    a.flush().await;
    b.record_quota(&q, report("gpt-4.1", 5, T0 + 100));
    b.record_quota(&q, report("o3", 7, T0 + 150));
    b.flush().await;
    let mut stored = first.snapshot().await.unwrap().stats[&q].quotas.clone();
    stored.sort_by(|x, y| x.model.cmp(&y.model));
    assert_eq!(stored, [report("gpt-4.1", 0, T0 + 200), report("o3", 7, T0 + 150)]);
    let started = std::time::Instant::now();
    for book in [&a, &b] {
        loop {
            let mut held = book.stats(&q).unwrap().quotas;
            held.sort_by(|x, y| x.model.cmp(&y.model));
            if held == stored {
                break;
            }
            assert!(started.elapsed() < std::time::Duration::from_secs(2), "{held:?} vs {stored:?}");
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_snapshot_is_one_state_while_tokens_are_refreshed_on_sqlite() {
    let dir = tempfile::tempdir().unwrap();
    reads_are_one_state_while_tokens_rotate(DatabaseTarget::Sqlite(dir.path().join("rota.db"))).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_snapshot_is_one_state_while_tokens_are_refreshed_on_postgres() {
    reads_are_one_state_while_tokens_rotate(DatabaseTarget::Postgres(crate::support::postgres_database().await)).await;
}

/// A refresh stores new tokens and their expiry in one transaction; a snapshot (what a book
/// loads from the change feed) and a profile's secrets (what a refresh re-reads) taken
/// meanwhile hold the tokens of one refresh with that refresh's expiry, never the new tokens
/// with the old expiry (which made a sibling instance refresh a fresh token again).
async fn reads_are_one_state_while_tokens_rotate(target: DatabaseTarget) {
    let store: Arc<dyn Store> = rota::store::open(&target).await.unwrap();
    let key = Arc::new(key());
    let pid = id("corp:alice");
    let tokens = {
        let (key, pid) = (key.clone(), pid.clone());
        move |n: i64| {
            let secret = |f, s: String| key.seal(&pid, f, &SecretString::from(s));
            [secret(SecretField::AccessToken, format!("at-{n}")), secret(SecretField::RefreshToken, format!("rt-{n}"))]
        }
    };
    let first = tokens(0);
    store.add_profile(&StoredProfile::stored(pid.clone(), ProfileType::OAuth, Some(T0), T0), &first).await.unwrap();
    // Which refresh the stored refresh token came from, and the expiry stored beside it.
    let refresh_of = |sealed: &[rota::secrets::Sealed]| -> i64 {
        let rt = sealed.iter().find(|s| s.field == SecretField::RefreshToken).unwrap();
        key.open(&pid, rt).unwrap().expose_secret().trim_start_matches("rt-").parse().unwrap()
    };
    // The writer refreshes until the reader has read 20 times (however slow the reads are on a
    // busy machine), or 2,000 times at most.
    let reads = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let writer = {
        let (store, pid, mut version, reads, tokens) =
            (store.clone(), pid.clone(), first[1].nonce.clone(), reads.clone(), tokens.clone());
        tokio::spawn(async move {
            for n in 1..=2000 {
                if reads.load(std::sync::atomic::Ordering::Relaxed) >= 20 {
                    break;
                }
                let s = tokens(n);
                assert!(store.swap_tokens(&pid, Some(&version), &s, Some(T0 + n)).await.unwrap());
                version = s[1].nonce.clone();
            }
        })
    };
    while !writer.is_finished() {
        let snap = store.snapshot().await.unwrap();
        let expires = snap.profiles.iter().find(|p| p.id == pid).unwrap().expires_at;
        assert_eq!(expires, Some(T0 + refresh_of(&snap.secrets[&pid])), "a snapshot mixed two refreshes");
        let (sealed, expires) = store.profile_secrets(&pid).await.unwrap();
        assert_eq!(expires, Some(T0 + refresh_of(&sealed)), "a profile's secrets mixed two refreshes");
        reads.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }
    writer.await.unwrap();
    let reads = reads.load(std::sync::atomic::Ordering::Relaxed);
    assert!(reads >= 20, "the reads ran while the tokens rotated: {reads}");
}

#[tokio::test]
async fn an_upgrade_keeps_the_cooldown_each_profile_had() {
    // A database written before the cooldown lane became a set of windows (migration 0004).
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("rota.db");
    {
        let opts = sqlx::sqlite::SqliteConnectOptions::new().filename(&path).create_if_missing(true);
        let pool = sqlx::SqlitePool::connect_with(opts).await.unwrap();
        let mut old = sqlx::migrate!("./migrations/sqlite");
        old.migrations = std::borrow::Cow::Owned(old.migrations[..3].to_vec());
        old.run(&pool).await.unwrap();
        sqlx::query(
            "INSERT INTO profiles (id, provider, name, type, source, created_at, updated_at)
             VALUES ('openai:a', 'openai', 'a', 'api_key', 'stored', 0, 0)",
        )
        .execute(&pool)
        .await
        .unwrap();
        sqlx::query(
            "INSERT INTO usage_stats (profile_id, cooldown_until, cooldown_reason, cooldown_model, error_count,
                 window_opened_at)
             VALUES ('openai:a', ?, 'rate_limit', 'gpt-4.1', 2, ?)",
        )
        .bind(T0 + 300_000)
        .bind(T0)
        .execute(&pool)
        .await
        .unwrap();
        pool.close().await;
    }
    let store = SqliteStore::open(&path).await.unwrap();
    let stats = &store.snapshot().await.unwrap().stats[&id("openai:a")];
    let c = &stats.cooldowns[..];
    assert_eq!(c.len(), 1);
    assert_eq!(
        (c[0].model.as_deref(), c[0].until, c[0].reason, c[0].step),
        (Some("gpt-4.1"), T0 + 300_000, Reason::RateLimit, 2)
    );
    assert_eq!(stats.blocked_until("gpt-4.1", T0), Some(Until::At(T0 + 300_000)));
    assert_eq!(stats.blocked_until("o3", T0), None);
}

#[tokio::test]
async fn migrations_are_idempotent() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("rota.db");
    let first = SqliteStore::open(&path).await.unwrap();
    add_key(&first, &key(), "openai:a", "sk-a").await;
    let n = first.applied_migrations().await.unwrap();
    first.close().await;
    for _ in 0..3 {
        let again = SqliteStore::open(&path).await.unwrap();
        assert_eq!(again.applied_migrations().await.unwrap(), n);
        assert_eq!(again.snapshot().await.unwrap().profiles.len(), 1, "data kept");
        again.close().await;
    }
    assert_eq!(n, first.known_migrations() as i64);
}

#[tokio::test]
async fn database_uses_wal_and_a_busy_timeout() {
    let dir = tempfile::tempdir().unwrap();
    let store = SqliteStore::open(&dir.path().join("rota.db")).await.unwrap();
    let mode: String = sqlx::query_scalar("PRAGMA journal_mode").fetch_one(store.pool()).await.unwrap();
    let busy: i64 = sqlx::query_scalar("PRAGMA busy_timeout").fetch_one(store.pool()).await.unwrap();
    assert_eq!((mode.as_str(), busy), ("wal", 10_000));
}

#[tokio::test]
async fn duplicate_profile_is_refused_and_changes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let store = SqliteStore::open(&dir.path().join("rota.db")).await.unwrap();
    add_key(&store, &key(), "openai:a", "sk-first").await;
    let pid = id("openai:a");
    let sealed = key().seal(&pid, SecretField::ApiKey, &SecretString::from("sk-second"));
    let row = StoredProfile::stored(pid.clone(), ProfileType::Token, None, T0);
    let err = store.add_profile(&row, &[sealed]).await.unwrap_err();
    assert_eq!(err.to_string(), "profile openai:a already exists");
    let snap = store.snapshot().await.unwrap();
    assert_eq!(snap.profiles[0].kind, ProfileType::ApiKey);
    assert_eq!(key().open(&pid, &snap.secrets[&pid][0]).unwrap().expose_secret(), "sk-first");
}

#[tokio::test]
async fn removing_a_profile_removes_its_secret_and_stats() {
    let dir = tempfile::tempdir().unwrap();
    let store = SqliteStore::open(&dir.path().join("rota.db")).await.unwrap();
    add_key(&store, &key(), "openai:a", "sk-a").await;
    store.remove_profile(&id("openai:a")).await.unwrap();
    let snap = store.snapshot().await.unwrap();
    assert!(snap.profiles.is_empty() && snap.secrets.is_empty() && snap.stats.is_empty());
    assert!(store.remove_profile(&id("openai:a")).await.is_err());
}

#[tokio::test]
async fn stats_written_after_a_removal_do_not_resurrect_the_profile() {
    let dir = tempfile::tempdir().unwrap();
    let store = SqliteStore::open(&dir.path().join("rota.db")).await.unwrap();
    let config = Config::from_toml(CONFIG).unwrap();
    add_key(&store, &key(), "openai:a", "sk-a").await;
    let book = Book::load(Arc::new(store.clone()), live(&config), Arc::new(key()), T0).await.unwrap();
    // A change queued while another writer removes the profile.
    assert_eq!(book.record_failure(&id("openai:a"), &failure(Reason::Auth, "m", T0), T0), Some(Until::At(T0 + 60_000)));
    store.remove_profile(&id("openai:a")).await.unwrap();
    let changes = [(id("openai:a"), vec![Change::Failed(failure(Reason::Auth, "m", T0), T0)])];
    let applied = store.apply(&changes, &[], &[], &config.cooldown_policy()).await.unwrap();
    assert!(applied.stats.is_empty(), "a gone profile's changes are dropped");
    book.flush().await;
    assert!(store.snapshot().await.unwrap().stats.is_empty());
}

#[tokio::test]
async fn secrets_are_not_in_the_database_file_in_plaintext() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("rota.db");
    let store = SqliteStore::open(&path).await.unwrap();
    let secrets = ["sk-proj-PLAINTEXTPROBE0001", "sk-ant-api03-PLAINTEXTPROBE0002"];
    add_key(&store, &key(), "openai:a", secrets[0]).await;
    add_key(&store, &key(), "openai:b", secrets[1]).await;
    sqlx::query("PRAGMA wal_checkpoint(TRUNCATE)").execute(store.pool()).await.unwrap();
    store.close().await;
    let mut bytes = std::fs::read(&path).unwrap();
    for extra in ["rota.db-wal", "rota.db-shm"] {
        bytes.extend(std::fs::read(dir.path().join(extra)).unwrap_or_default());
    }
    assert!(bytes.len() > 4096, "the database was written");
    for s in secrets {
        assert!(!bytes.windows(s.len()).any(|w| w == s.as_bytes()), "{s} found in plaintext");
        let tail = &s[s.len() - 12..];
        assert!(!bytes.windows(tail.len()).any(|w| w == tail.as_bytes()), "part of {s} found in plaintext");
    }
}

#[tokio::test]
async fn only_active_agents_are_listed_with_their_key_digest() {
    let dir = tempfile::tempdir().unwrap();
    let store = SqliteStore::open(&dir.path().join("rota.db")).await.unwrap();
    let key = rota::agents::new_key();
    let d = rota::agents::digest(&key);
    let a = store.create_agent("planner", &d, false, (&Default::default(), None), T0).await.unwrap();
    assert_eq!((a.name.as_str(), a.admin, a.revoked_at), ("planner", false, None));
    let active = |store: SqliteStore| async move { store.active_agents().await.unwrap() };
    assert_eq!(active(store.clone()).await, [(d.clone(), a.clone())]);
    assert!(store.create_agent("planner", "other", true, (&Default::default(), None), T0).await.is_err());
    store.revoke_agent("planner", T0 + 1).await.unwrap();
    assert!(active(store.clone()).await.is_empty());
    let again = store.create_agent("planner", "digest-2", true, (&Default::default(), None), T0 + 2).await.unwrap();
    assert_eq!((&again.id, again.admin, again.revoked_at), (&a.id, true, None), "same identity, new key");
    assert_eq!(active(store.clone()).await, [("digest-2".to_string(), again.clone())], "the old key stays dead");
}

#[tokio::test]
async fn postgres_over_tls_verifies_the_server_certificate() {
    let url = crate::support::postgres_database().await;
    let ca = std::env::var("ROTA_TEST_PG_CA").expect("ROTA_TEST_PG_CA: the test server's certificate");
    let verified = format!("{url}?sslmode=verify-full&sslrootcert={ca}");
    let store = rota::store::PgStore::open(&verified).await.unwrap();
    let encrypted: bool = sqlx::query_scalar("SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()")
        .fetch_one(store.pool())
        .await
        .unwrap();
    assert!(encrypted, "the connection is TLS");
    store.close().await;
    // A certificate nobody vouches for is refused.
    let unverified = rota::store::PgStore::open(&format!("{url}?sslmode=verify-full")).await;
    assert!(unverified.is_err(), "the self-signed certificate must not be trusted without sslrootcert");
}

#[cfg(unix)]
#[tokio::test]
async fn the_database_files_are_readable_by_their_owner_only() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("rota.db");
    let store = SqliteStore::open(&path).await.unwrap();
    add_key(&store, &key(), "openai:a", "sk-a").await;
    let mode = |suffix: &str| {
        let file = dir.path().join(format!("rota.db{suffix}"));
        std::fs::metadata(&file).unwrap_or_else(|e| panic!("{}: {e}", file.display())).permissions().mode() & 0o777
    };
    assert_eq!((mode(""), mode("-wal"), mode("-shm")), (0o600, 0o600, 0o600));
    store.close().await;
    // A database made readable to others (or by an older rota) is closed again at the next open.
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
    let store = SqliteStore::open(&path).await.unwrap();
    assert_eq!(mode(""), 0o600);
    store.close().await;
}

const DAY: i64 = 86_400_000;

fn attempt(
    request: &str,
    seq: i64,
    profile: &str,
    outcome: &str,
    at: i64,
    tokens: Option<(i64, i64)>,
) -> AttemptRecord {
    AttemptRecord {
        request_id: request.into(),
        seq,
        kind: if seq == 1 { "primary" } else { "rotate" }.into(),
        agent: Some("planner".into()),
        provider: "openai".into(),
        model: "gpt-4.1".into(),
        profile_id: Some(profile.into()),
        started_at: at,
        duration_ms: Some(5),
        ttfb_ms: None,
        http_status: Some(if outcome == "success" { 200 } else { 429 }),
        outcome: outcome.into(),
        reason: (outcome == "failure").then(|| "rate_limit".into()),
        retry_after_ms: None,
        cooldown_until: None,
        error: None,
        tokens_in: tokens.map(|t| t.0),
        tokens_out: tokens.map(|t| t.1),
        cost: None,
        usage_suspect: false,
    }
}

fn request(id: &str, attempts: i64, at: i64) -> RequestRecord {
    RequestRecord {
        id: id.into(),
        agent: Some("planner".into()),
        api: "chat".into(),
        requested_model: Some("openai/gpt-4.1".into()),
        served_model: Some("openai/gpt-4.1".into()),
        served_profile: Some("openai:b".into()),
        status: Some(200),
        attempts,
        started_at: at,
        duration_ms: Some(9),
        stream: false,
        tokens_in: None,
        tokens_out: None,
        error: None,
        cost: None,
        usage_suspect: false,
    }
}

#[tokio::test]
async fn pruning_rolls_old_audit_rows_up_per_day_then_deletes_them_on_sqlite() {
    let dir = tempfile::tempdir().unwrap();
    pruning_rolls_old_rows_up(DatabaseTarget::Sqlite(dir.path().join("rota.db"))).await;
}

#[tokio::test]
async fn pruning_rolls_old_audit_rows_up_per_day_then_deletes_them_on_postgres() {
    pruning_rolls_old_rows_up(DatabaseTarget::Postgres(crate::support::postgres_database().await)).await;
}

async fn pruning_rolls_old_rows_up(target: DatabaseTarget) {
    let store = rota::store::open(&target).await.unwrap();
    // 2027-01-12, three days before T0 (2027-01-15T08:00Z).
    let old = T0 - 3 * DAY;
    let requests = [request("r1", 2, old), request("r2", 1, old + 1_000), request("r3", 1, T0)];
    let attempts = [
        attempt("r1", 1, "openai:a", "failure", old, None),
        attempt("r1", 2, "openai:b", "success", old + 10, Some((10, 5))),
        attempt("r2", 1, "openai:b", "success", old + 1_000, Some((7, 3))),
        attempt("r3", 1, "openai:b", "success", T0, Some((1, 1))),
    ];
    store.insert_audit(&requests, &attempts).await.unwrap();
    store.insert_audit(&requests, &attempts).await.unwrap(); // a retried batch adds nothing

    // Two attempts a batch: r1's two, then r2's one; the day's roll-up row grows batch by batch.
    let pruned = |a, r, more| Pruned { attempts: a, requests: r, more };
    assert_eq!(store.prune_audit(T0 - DAY, 2).await.unwrap(), pruned(2, 1, true));
    assert_eq!(store.prune_audit(T0 - DAY, 2).await.unwrap(), pruned(1, 1, false));
    assert_eq!(store.prune_audit(T0 - DAY, 2).await.unwrap(), pruned(0, 0, false));

    let left = store.attempts(&AuditQuery { limit: 10, ..Default::default() }).await.unwrap();
    assert_eq!(left.iter().map(|a| a.request_id.as_str()).collect::<Vec<_>>(), ["r3"]);
    let left = store.requests(&AuditQuery { limit: 10, ..Default::default() }).await.unwrap();
    assert_eq!(left.iter().map(|r| r.id.as_str()).collect::<Vec<_>>(), ["r3"]);

    type Daily = (String, String, String, String, String, i64, i64, i64, i64, i64);
    let sql = "SELECT day, agent, provider, model, profile_id, attempts, successes, failures, tokens_in, tokens_out
               FROM usage_daily ORDER BY profile_id";
    let daily: Vec<Daily> = match &target {
        DatabaseTarget::Sqlite(path) => {
            let pool = sqlx::SqlitePool::connect(&format!("sqlite://{}", path.display())).await.unwrap();
            sqlx::query_as(sql).fetch_all(&pool).await.unwrap()
        }
        DatabaseTarget::Postgres(url) => {
            let pool = sqlx::PgPool::connect(url).await.unwrap();
            sqlx::query_as(sql).fetch_all(&pool).await.unwrap()
        }
    };
    let row = |p: &str, n, ok, failed, tin, tout| {
        (
            "2027-01-12".to_string(),
            "planner".to_string(),
            "openai".to_string(),
            "gpt-4.1".to_string(),
            p.to_string(),
            n,
            ok,
            failed,
            tin,
            tout,
        )
    };
    assert_eq!(daily, [row("openai:a", 1, 0, 1, 0, 0), row("openai:b", 2, 2, 0, 17, 8)]);
}

#[tokio::test]
async fn usage_and_its_series_read_the_roll_ups_kept_through_retried_batches_on_sqlite() {
    let dir = tempfile::tempdir().unwrap();
    usage_by_the_hour(DatabaseTarget::Sqlite(dir.path().join("rota.db"))).await;
}

/// On SQLite, triggers keep `usage_profile_daily` the sum of `usage_hourly` per UTC day, whoever
/// changes it: the audit writer, retention, an operator's own SQL (a row moved to another day,
/// changed, deleted).
#[tokio::test]
async fn the_days_follow_their_hours_through_any_sql_on_sqlite() {
    const HOUR: i64 = 3_600_000;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("rota.db");
    let store = rota::store::open(&DatabaseTarget::Sqlite(path.clone())).await.unwrap();
    let start = T0 - T0 % (24 * HOUR) - 2 * HOUR;
    let all: Vec<AttemptRecord> = (0..12)
        .map(|i| {
            attempt(
                &format!("r{i}"),
                1,
                ["openai:a", "openai:b"][i % 2],
                "success",
                start + i as i64 * 20 * 60_000,
                Some((5, 7)),
            )
        })
        .collect();
    let requests: Vec<RequestRecord> = all.iter().map(|a| request(&a.request_id, 1, a.started_at)).collect();
    store.insert_audit(&requests, &all).await.unwrap();
    let mut db =
        sqlx::ConnectOptions::connect(&sqlx::sqlite::SqliteConnectOptions::new().filename(&path)).await.unwrap();
    async fn check(db: &mut sqlx::SqliteConnection, what: &str) -> usize {
        type Day = (i64, String, i64, i64, i64, i64, i64);
        let days: Vec<Day> = sqlx::query_as("SELECT * FROM usage_profile_daily ORDER BY day, profile_id")
            .fetch_all(&mut *db)
            .await
            .unwrap();
        let summed: Vec<Day> = sqlx::query_as(
            "SELECT hour - hour % 86400000, profile_id, sum(attempts), sum(successes), sum(failures),
                    sum(tokens_in), sum(tokens_out)
             FROM usage_hourly GROUP BY 1, 2 ORDER BY 1, 2",
        )
        .fetch_all(&mut *db)
        .await
        .unwrap();
        assert_eq!(days, summed, "{what}");
        days.len()
    }
    assert_eq!(check(&mut db, "written").await, 4, "two profiles on two days");
    for (what, sql) in [
        (
            "a row moved to the next day",
            format!("UPDATE usage_hourly SET hour = hour + {} WHERE hour = {start} + {HOUR}", 10 * HOUR),
        ),
        (
            "a row changed",
            format!(
                "UPDATE usage_hourly SET attempts = attempts + 5, tokens_in = 0 WHERE hour = {start} + {} AND profile_id = 'openai:b'",
                3 * HOUR
            ),
        ),
        (
            "a profile moved",
            "UPDATE usage_hourly SET profile_id = 'openai:c' WHERE profile_id = 'openai:a'".to_string(),
        ),
        ("hours deleted", format!("DELETE FROM usage_hourly WHERE hour < {start} + {}", 2 * HOUR)),
    ] {
        sqlx::query(sqlx::AssertSqlSafe(sql)).execute(&mut db).await.unwrap();
        check(&mut db, what).await;
    }
    assert_eq!(check(&mut db, "the first day's hours gone").await, 2, "its rows went with them");
}

#[tokio::test]
async fn usage_and_its_series_read_the_roll_ups_kept_through_retried_batches_on_postgres() {
    usage_by_the_hour(DatabaseTarget::Postgres(crate::support::postgres_database().await)).await;
}

/// `usage` reads whole days from `usage_profile_daily`, whole hours from `usage_hourly` and the
/// ends from `attempts`; `usage_series`
/// reads `audit_minutely`, or `audit_hourly` for buckets of whole hours; all as the rows say,
/// through a retried batch and a partial one.
async fn usage_by_the_hour(target: DatabaseTarget) {
    const HOUR: i64 = 3_600_000;
    const DAY: i64 = 24 * HOUR;
    let store = rota::store::open(&target).await.unwrap();
    // Three hours before a UTC midnight.
    let start = T0 - T0 % DAY - 3 * HOUR;
    // 40 attempts over four hours on two profiles, every fourth with no profile (skipped), then
    // 20 more over the next three days.
    let at = |i: i64| if i < 40 { start + i * 6 * 60_000 + 7 } else { start + 4 * HOUR + (i - 40) * 197 * 60_000 + 11 };
    let all: Vec<AttemptRecord> = (0..60)
        .map(|i| {
            let profile = ["openai:a", "openai:b"][i % 2];
            let outcome = ["success", "failure", "success", "skipped"][i % 4];
            let mut a = attempt(&format!("r{i}"), 1, profile, outcome, at(i as i64), Some((3, i as i64)));
            if outcome == "skipped" {
                a.profile_id = None;
            }
            a
        })
        .collect();
    let requests: Vec<RequestRecord> = (0..60).map(|i| request(&format!("r{i}"), 1, all[i].started_at)).collect();
    // In three batches: the second retried whole after its commit landed (adds nothing), the
    // third a chunk of 8 rows of which 3 were written before (those hours are counted again).
    store.insert_audit(&requests[..20], &all[..20]).await.unwrap();
    store.insert_audit(&requests[20..29], &all[20..29]).await.unwrap();
    store.insert_audit(&requests[20..29], &all[20..29]).await.unwrap();
    store.insert_audit(&requests[29..], &all[26..]).await.unwrap();

    let counted = |since: i64, until: i64| {
        let mut by: std::collections::BTreeMap<String, rota::store::ProfileUsage> = Default::default();
        for a in all.iter().filter(|a| a.started_at >= since && a.started_at < until) {
            let Some(p) = &a.profile_id else { continue };
            let u = by
                .entry(p.clone())
                .or_insert_with(|| rota::store::ProfileUsage { profile_id: p.clone(), ..Default::default() });
            u.attempts += 1;
            u.successes += i64::from(a.outcome == "success");
            u.failures += i64::from(a.outcome == "failure");
            u.tokens_in += a.tokens_in.unwrap_or(0);
            u.tokens_out += a.tokens_out.unwrap_or(0);
        }
        by.into_values().collect::<Vec<_>>()
    };
    for (since, until) in [
        (start, start + 4 * HOUR),                  // four whole hours
        (start + 1, start + 4 * HOUR - 1),          // two whole hours and two partial ones
        (start + 13 * 60_000, start + 50 * 60_000), // inside one hour
        (start - 10 * HOUR, start + 10 * HOUR),
        (start + 2 * HOUR, start + 2 * HOUR + 1),
        (start + 3 * HOUR, start + 27 * HOUR),              // one whole day
        (start - DAY, start + 3 * DAY),                     // whole days and hours
        (start + 3 * HOUR + 1, start + 51 * HOUR + 59_999), // a whole day, whole and partial hours
    ] {
        assert_eq!(store.usage(since, until).await.unwrap(), counted(since, until), "{since}..{until}");
    }
    // The per-minute and per-hour counts `/usage/series` reads (`audit_minutely`,
    // `audit_hourly`), kept through the same batches: the same as grouping the rows.
    let grouped = |since: i64, until: i64, step: i64| {
        let bucket = |at: i64| (at >= since && at < until).then_some((at - since) / step);
        let mut attempts: std::collections::BTreeMap<_, i64> = Default::default();
        for a in &all {
            let Some(b) = bucket(a.started_at) else { continue };
            *attempts.entry((b, a.provider.clone(), a.outcome.clone(), a.reason.clone())).or_default() += 1;
        }
        let mut outcomes: std::collections::BTreeMap<_, i64> = Default::default();
        for r in &requests {
            let Some(b) = bucket(r.started_at) else { continue };
            let outcome = match (r.attempts, r.status) {
                (0, _) => "refused",
                (_, Some(200..=299)) => "served",
                _ => "failed",
            };
            *outcomes.entry((b, outcome.to_string())).or_default() += 1;
        }
        (
            attempts.into_iter().map(|((b, p, o, r), n)| (b, p, o, r, n)).collect::<Vec<_>>(),
            outcomes.into_iter().map(|((b, o), n)| (b, o, n)).collect::<Vec<_>>(),
        )
    };
    // The buckets that hold any, each series a count per bucket of the range.
    let sparse = |got: rota::store::SeriesRows| {
        let held = |counts: Vec<i64>| counts.into_iter().enumerate().filter(|(_, n)| *n != 0);
        let mut attempts = Vec::new();
        for (provider, outcome, reason, counts) in got.attempts {
            attempts
                .extend(held(counts).map(|(b, n)| (b as i64, provider.clone(), outcome.clone(), reason.clone(), n)));
        }
        let mut requests = Vec::new();
        for (outcome, counts) in got.requests {
            requests.extend(held(counts).map(|(b, n)| (b as i64, outcome.clone(), n)));
        }
        attempts.sort();
        requests.sort();
        (attempts, requests)
    };
    for (since, until, step) in [
        (start, start + 4 * HOUR, 120_000),
        (start - HOUR, start + 5 * HOUR, HOUR),                // audit_hourly
        (start - HOUR / 2, start + 4 * HOUR + HOUR / 2, HOUR), // hours from a half hour: per minute
        (start, start + 4 * HOUR, 2 * HOUR),                   // audit_hourly, two hours a bucket
    ] {
        let got = store.usage_series(since, until, step).await.unwrap();
        assert_eq!(sparse(got), grouped(since, until, step), "{since}..{until} by {step}");
    }

    // Pruning the first two hours: their hourly sums go with their attempts, and their day's sums
    // are what its hours left.
    while store.prune_audit(start + 2 * HOUR, 1000).await.unwrap().more {}
    assert_eq!(store.usage(start, start + 2 * HOUR).await.unwrap(), []);
    assert_eq!(store.usage(start, start + 4 * HOUR).await.unwrap(), counted(start + 2 * HOUR, start + 4 * HOUR));
    assert_eq!(store.usage(start - DAY, start + 3 * DAY).await.unwrap(), counted(start + 2 * HOUR, start + 3 * DAY));
    let got = store.usage_series(start, start + 4 * HOUR, HOUR).await.unwrap();
    let (attempts, requests) = grouped(start, start + 4 * HOUR, HOUR);
    let kept =
        (attempts.into_iter().filter(|a| a.0 >= 2).collect(), requests.into_iter().filter(|r| r.0 >= 2).collect());
    assert_eq!(sparse(got), kept);
    // Pruning past a midnight: that day's sums go.
    while store.prune_audit(start + 3 * HOUR + 1, 1000).await.unwrap().more {}
    assert_eq!(store.usage(start - DAY, start + 3 * DAY).await.unwrap(), counted(start + 3 * HOUR, start + 3 * DAY));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_failure_window_ends_at_the_first_success_however_the_rows_arrive_on_sqlite() {
    let dir = tempfile::tempdir().unwrap();
    failure_windows_however_rows_arrive(DatabaseTarget::Sqlite(dir.path().join("rota.db"))).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_failure_window_ends_at_the_first_success_however_the_rows_arrive_on_postgres() {
    failure_windows_however_rows_arrive(DatabaseTarget::Postgres(crate::support::postgres_database().await)).await;
}

/// `failure_windows` answers each window with its profile's first success inside it, whatever
/// order the rows are written in: successes before the failures whose windows they end, an
/// earlier success after a later one, a batch retried after its commit landed, and two servers
/// writing the same profiles at once (PostgreSQL's writer keeps `failure_windows` as the rows
/// come; SQLite's reads search `attempts`). Then the same after pruning.
async fn failure_windows_however_rows_arrive(target: DatabaseTarget) {
    use rota::store::FailureWindow;
    const MIN: i64 = 60_000;
    let servers = [rota::store::open(&target).await.unwrap(), rota::store::open(&target).await.unwrap()];
    let start = T0 - T0 % DAY;
    // 600 attempts over an hour on three profiles, from a fixed sequence.
    let mut seed: u64 = 0x2545_f491_4f6c_dd1d;
    let mut next = |n: u64| {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed % n
    };
    let mut all: Vec<AttemptRecord> = (0..600)
        .map(|i| {
            let profile = ["openai:a", "openai:b", "openai:c"][next(3) as usize];
            let at = start + i * 6_000 + (i % 7);
            let outcome = if next(3) == 0 { "failure" } else { "success" };
            let mut a = attempt(&format!("r{i}"), 1 + (i % 2), profile, outcome, at, None);
            if outcome == "failure" {
                let (reason, until) = match next(10) {
                    0 => ("billing", Some(at + 300 * MIN)),
                    1 => ("auth_permanent", None),
                    2 => ("format", None),
                    n => ("rate_limit", Some(at + (n as i64) * MIN)),
                };
                a.reason = Some(reason.into());
                a.cooldown_until = until;
            }
            a
        })
        .collect();
    // Written in an order of their own, in batches of 1 to 12, each pair of batches by the
    // two servers at once; one batch written twice.
    let mut order: Vec<usize> = (0..all.len()).collect();
    for i in (1..order.len()).rev() {
        order.swap(i, next(i as u64 + 1) as usize);
    }
    let mut batches: Vec<Vec<AttemptRecord>> = Vec::new();
    let mut rest = &order[..];
    while !rest.is_empty() {
        let (batch, tail) = rest.split_at((1 + next(12) as usize).min(rest.len()));
        batches.push(batch.iter().map(|&i| all[i].clone()).collect());
        rest = tail;
    }
    batches.insert(7, batches[3].clone());
    // Then 50 failures on a fourth profile, each written by one server while the other writes
    // the success that ends its window, half a second before and after a midnight (no row
    // of the roll-ups is common to the two, so nothing else makes one wait for the other).
    let mut raced = Vec::new();
    for k in 0..50 {
        let at = start + (k + 1) * DAY - 500;
        let mut failure = attempt(&format!("d{k}"), 1, "openai:d", "failure", at, None);
        failure.cooldown_until = Some(at + MIN);
        let success = attempt(&format!("d{k}"), 2, "openai:d", "success", at + 1_000, None);
        all.extend([failure.clone(), success.clone()]);
        raced.extend(if k % 2 == 0 { [vec![failure], vec![success]] } else { [vec![success], vec![failure]] });
    }
    for pair in batches.chunks(2).chain(raced.chunks(2)) {
        let writes = pair.iter().zip(&servers).map(|(batch, store)| store.insert_audit(&[], batch));
        for written in futures_util::future::join_all(writes).await {
            written.unwrap();
        }
    }

    let expected = |all: &[AttemptRecord], (far, near): (i64, i64), since: i64, until: i64| {
        let mut windows: Vec<FailureWindow> = all
            .iter()
            .filter(|f| {
                let lasting = matches!(f.reason.as_deref(), Some("billing" | "auth_permanent"));
                f.outcome == "failure"
                    && f.started_at < until
                    && (f.started_at >= near || (lasting && f.started_at >= far))
                    && (f.cooldown_until.is_some_and(|c| c > since)
                        || (f.cooldown_until.is_none() && f.reason.as_deref() == Some("auth_permanent")))
            })
            .map(|f| FailureWindow {
                profile_id: f.profile_id.clone().unwrap(),
                started_at: f.started_at,
                duration_ms: f.duration_ms,
                reason: f.reason.clone(),
                cooldown_until: f.cooldown_until,
                next_success: all
                    .iter()
                    .filter(|s| s.outcome == "success" && s.profile_id == f.profile_id)
                    .map(|s| s.started_at)
                    .filter(|&s| s > f.started_at && s < f.cooldown_until.unwrap_or(until).min(until))
                    .min(),
            })
            .collect();
        windows.sort_by_key(|w| (w.profile_id.clone(), w.started_at));
        windows
    };
    let check = |all: Vec<AttemptRecord>, what: &'static str| {
        let store = &servers[0];
        async move {
            let ranges = [
                ((start - DAY, start), start, start + 3 * 60 * MIN),
                ((start - DAY, start + 10 * MIN), start + 40 * MIN, start + 80 * MIN),
                ((start - DAY, start - 60 * MIN), start + 5 * MIN, start + 30 * MIN),
                ((start + 20 * MIN, start + 35 * MIN), start + 36 * MIN, start + 50 * MIN),
                ((start - DAY, start), start, start + 60 * DAY),
            ];
            for (far_near, since, until) in ranges {
                let mut got = store.failure_windows(far_near, since, until).await.unwrap();
                got.sort_by_key(|w| (w.profile_id.clone(), w.started_at));
                let want = expected(&all, far_near, since, until);
                assert!(want.iter().any(|w| w.next_success.is_some()), "{what}: a window a success ends");
                assert!(want.iter().any(|w| w.next_success.is_none()), "{what}: a window no success ends");
                assert_eq!(got, want, "{what}: {far_near:?} {since}..{until}");
            }
        }
    };
    check(all.clone(), "written").await;
    // Pruned up to 25 minutes in: the windows of the failures pruned go with them.
    while servers[1].prune_audit(start + 25 * MIN, 50).await.unwrap().more {}
    all.retain(|a| a.started_at >= start + 25 * MIN);
    check(all, "pruned").await;
}

#[tokio::test]
async fn requests_filtered_on_attempts_are_the_same_whether_matches_are_few_or_many_on_sqlite() {
    let dir = tempfile::tempdir().unwrap();
    requests_filtered_on_attempts(DatabaseTarget::Sqlite(dir.path().join("rota.db"))).await;
}

#[tokio::test]
async fn requests_filtered_on_attempts_are_the_same_whether_matches_are_few_or_many_on_postgres() {
    requests_filtered_on_attempts(DatabaseTarget::Postgres(crate::support::postgres_database().await)).await;
}

/// More successful attempts than the store's threshold for looking requests up from their
/// attempts (5,000), so `outcome=success` walks the requests, and fewer failures, so
/// `outcome=failure` and `reason=billing` look them up: both give what the rows say.
async fn requests_filtered_on_attempts(target: DatabaseTarget) {
    let store = rota::store::open(&target).await.unwrap();
    let n = 24_060;
    let mut requests = Vec::new();
    let mut attempts = Vec::new();
    for i in 0..n {
        let id = format!("r{i:05}");
        let at = T0 + (i as i64 / 2) * 10; // two requests in each millisecond step: ties on time
        let billing = [7, 5_000, 19_999].contains(&i);
        requests.push(request(&id, 1 + i64::from(billing), at));
        if billing {
            let mut a = attempt(&id, 1, "openai:a", "failure", at, None);
            a.reason = Some("billing".into());
            attempts.push(a);
        }
        // Every sixth request failed: 20,050 successes, 4,010 failures and 3 billing ones.
        let outcome = if i % 6 == 0 { "failure" } else { "success" };
        attempts.push(attempt(&id, 1 + i64::from(billing), "openai:b", outcome, at + 1, None));
        // A timeout right after every 100th; every 1,000th one two days after it began (a
        // long stream's retry, its request older than the day looked in first): newer than the
        // attempts of every later request.
        let timeout_at = match i % 1_000 {
            999 => Some(at + 2 * 86_400_000),
            n if n % 100 == 50 => Some(at + 2),
            _ => None,
        };
        if let Some(t) = timeout_at {
            let profile = if i % 1_000 == 999 { "openai:d" } else { "openai:c" };
            let mut timeout = attempt(&id, 2 + i64::from(billing), profile, "failure", t, None);
            timeout.reason = Some("timeout".into());
            attempts.push(timeout);
        }
    }
    store.insert_audit(&requests, &attempts).await.unwrap();

    let mut of_request: std::collections::HashMap<&str, Vec<&AttemptRecord>> = Default::default();
    for a in &attempts {
        of_request.entry(a.request_id.as_str()).or_default().push(a);
    }
    let expected = |q: &AuditQuery| -> Vec<String> {
        let mut rows: Vec<&RequestRecord> = requests
            .iter()
            .filter(|r| {
                of_request[r.id.as_str()].iter().any(|a| {
                    q.outcome.as_ref().is_none_or(|o| &a.outcome == o)
                        && q.reason.as_ref().is_none_or(|w| a.reason.as_ref() == Some(w))
                        && q.profile.as_ref().is_none_or(|p| a.profile_id.as_ref() == Some(p))
                })
            })
            .filter(|r| q.since.is_none_or(|s| r.started_at >= s) && q.until.is_none_or(|u| r.started_at < u))
            .filter(|r| q.after.as_ref().is_none_or(|(t, id, _)| (r.started_at, &r.id) < (*t, id)))
            .collect();
        rows.sort_by(|a, b| (b.started_at, &b.id).cmp(&(a.started_at, &a.id)));
        rows.iter().take(q.limit as usize).map(|r| r.id.clone()).collect()
    };
    let billing = || AuditQuery { reason: Some("billing".into()), limit: 10, ..Default::default() };
    let success = || AuditQuery { outcome: Some("success".into()), limit: 5, ..Default::default() };
    let late = || AuditQuery { reason: Some("timeout".into()), limit: 3, ..Default::default() };
    let newest = requests.last().unwrap();
    let cases = [
        billing(),
        AuditQuery { after: Some((T0 + 2_500 * 10, "r05001".into(), 0)), ..billing() },
        AuditQuery { reason: Some("wire_format".into()), ..billing() },
        success(),
        AuditQuery { after: Some((newest.started_at, newest.id.clone(), 0)), ..success() },
        AuditQuery { since: Some(T0 + 1_000), until: Some(T0 + 1_020), ..success() },
        AuditQuery { outcome: Some("failure".into()), ..success() },
        AuditQuery {
            outcome: Some("failure".into()),
            since: Some(T0 + 60),
            until: Some(T0 + 400),
            limit: 100,
            ..success()
        },
        AuditQuery { outcome: Some("failure".into()), limit: 1_000, ..Default::default() },
        AuditQuery { profile: Some("openai:b".into()), limit: 7, ..Default::default() },
        AuditQuery { profile: Some("openai:d".into()), limit: 5, ..Default::default() },
        late(),
        AuditQuery { limit: 30, ..late() },
        AuditQuery { limit: 63, ..late() },
        AuditQuery { after: Some((T0 + 9_000 * 5, "r09000".into(), 0)), ..late() },
        AuditQuery { since: Some(T0 + 5_000 * 5), until: Some(T0 + 15_000 * 5), ..late() },
        AuditQuery { until: Some(T0 + 12_000 * 5), ..success() },
    ];
    for q in cases {
        let got: Vec<String> = store.requests(&q).await.unwrap().into_iter().map(|r| r.id).collect();
        assert_eq!(got, expected(&q), "{q:?}");
        assert!(!got.is_empty() || q.reason.as_deref() == Some("wire_format"), "{q:?}");
    }
}

#[tokio::test]
async fn an_oauth_login_is_matched_by_its_subject_on_sqlite() {
    let dir = tempfile::tempdir().unwrap();
    logins_are_matched_by_subject(DatabaseTarget::Sqlite(dir.path().join("rota.db"))).await;
}

#[tokio::test]
async fn an_oauth_login_is_matched_by_its_subject_on_postgres() {
    logins_are_matched_by_subject(DatabaseTarget::Postgres(crate::support::postgres_database().await)).await;
}

/// `save_login` with subjects: the same subject updates its profile (and a copy to the other
/// engine keeps it), another subject never overwrites one, a profile without a subject adopts
/// the first one that logs in to it.
async fn logins_are_matched_by_subject(target: DatabaseTarget) {
    let store = rota::store::open(&target).await.unwrap();
    let login = |profile: &str, subject: Option<&str>, email: &str, token: &str| {
        let pid = id(profile);
        let sealed = key().seal(&pid, SecretField::AccessToken, &SecretString::from(token.to_string()));
        let mut row = StoredProfile::stored(pid, ProfileType::OAuth, None, T0);
        row.email = Some(email.into());
        row.oauth_subject = subject.map(str::to_string);
        let store = store.clone();
        async move { store.save_login(&row, &[sealed]).await }
    };
    let token = |snap: &rota::store::Snapshot, profile: &str| {
        let pid = id(profile);
        key().open(&pid, &snap.secrets[&pid][0]).unwrap().expose_secret().to_string()
    };
    assert!(login("corp:a@x", Some("iss s1"), "a@x", "at-1").await.unwrap(), "added");
    assert_eq!(store.login_profile("corp", "iss s1").await.unwrap(), Some(id("corp:a@x")));
    assert_eq!(store.login_profile("other", "iss s1").await.unwrap(), None, "per provider");
    assert!(!login("corp:a@x", Some("iss s1"), "a@new", "at-2").await.unwrap(), "updated");
    for (profile, subject) in [("corp:a@x", Some("iss s2")), ("corp:a@x", None), ("corp:b@x", Some("iss s1"))] {
        let err = login(profile, subject, "a@x", "at-evil").await.unwrap_err();
        assert!(matches!(err, rota::store::StoreError::OtherAccount(_)), "{profile} {subject:?}: {err}");
    }
    let snap = store.snapshot().await.unwrap();
    assert_eq!(snap.profiles.len(), 1);
    assert_eq!(snap.profiles[0].email.as_deref(), Some("a@new"));
    assert_eq!(snap.profiles[0].oauth_subject.as_deref(), Some("iss s1"));
    assert_eq!(token(&snap, "corp:a@x"), "at-2");

    // A profile from before subjects: the next login's subject is kept; no subject stays none.
    assert!(login("corp:old@x", None, "old@x", "at-3").await.unwrap());
    assert!(!login("corp:old@x", None, "old@x", "at-4").await.unwrap());
    assert!(!login("corp:old@x", Some("iss s3"), "old@x", "at-5").await.unwrap());
    assert_eq!(store.login_profile("corp", "iss s3").await.unwrap(), Some(id("corp:old@x")));
    assert!(login("corp:old@x", Some("iss s4"), "old@x", "at-evil").await.is_err());

    // `rota migrate --from` copies subjects too.
    let dir = tempfile::tempdir().unwrap();
    let copy = rota::store::open(&DatabaseTarget::Sqlite(dir.path().join("copy.db"))).await.unwrap();
    rota::store::copy(store.as_ref(), copy.as_ref()).await.unwrap();
    assert_eq!(copy.login_profile("corp", "iss s1").await.unwrap(), Some(id("corp:a@x")));
}

/// With 10,000 profiles and the database held by an auditor, 200,000 requests' changes (a use
/// and a success each) wait as one coalesced entry per profile, not one per request; once the
/// lock goes, each profile's row is written once per batch (its stats row only: no cooldown or
/// quota row is rewritten when it did not change), and every success is counted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_stats_backlog_is_bounded_by_the_profiles_not_by_the_requests() {
    const PROFILES: i64 = 10_000;
    const REQUESTS: i64 = 200_000;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("rota.db");
    let config = Config::from_toml(CONFIG).unwrap();
    let store = SqliteStore::open(&path).await.unwrap();
    let mut tx = store.pool().begin().await.unwrap();
    for sql in [
        "INSERT INTO profiles (id, provider, name, type, source, enabled, created_at, updated_at)
         WITH RECURSIVE n(i) AS (SELECT 0 UNION ALL SELECT i + 1 FROM n WHERE i + 1 < 10000)
         SELECT 'openai:p' || i, 'openai', 'p' || i, 'api_key', 'stored', 1, 0, 0 FROM n",
        "INSERT INTO usage_stats (profile_id) SELECT id FROM profiles",
    ] {
        sqlx::query(sql).execute(&mut *tx).await.unwrap();
    }
    tx.commit().await.unwrap();
    let book = Book::load(Arc::new(store.clone()), live(&config), Arc::new(key()), T0).await.unwrap();
    let ids: Vec<ProfileId> = (0..PROFILES).map(|i| id(&format!("openai:p{i}"))).collect();

    let mut auditor = store.pool().acquire().await.unwrap();
    sqlx::query("BEGIN IMMEDIATE").execute(&mut *auditor).await.unwrap();
    for r in 0..REQUESTS {
        let p = &ids[(r % PROFILES) as usize];
        book.mark_used(p, None, T0 + r);
        book.record_success(p, "gpt-4.1", T0 + r, T0 + r);
    }
    let backlog = book.backlog();
    assert!(backlog.inflight <= 256, "a batch takes 256 profiles at most: {backlog:?}");
    assert_eq!(backlog.pending, PROFILES as usize, "every profile changed, each waits once: {backlog:?}");
    // A use and a run of successes per profile: what waits does not grow with the requests.
    assert!(backlog.changes <= 2 * (backlog.inflight + backlog.pending), "{backlog:?}");
    let before = change_head(&mut auditor).await;
    sqlx::query("ROLLBACK").execute(&mut *auditor).await.unwrap();
    drop(auditor);

    book.flush().await;
    assert_eq!(book.backlog().changes, 0);
    let mut conn = store.pool().acquire().await.unwrap();
    let rows_written = change_head(&mut conn).await - before;
    assert_eq!(
        rows_written,
        (backlog.inflight + backlog.pending) as i64,
        "one row write per profile and batch, whatever the requests"
    );
    let (successes, latest): (i64, i64) = sqlx::query_as("SELECT sum(success_count), max(last_used) FROM usage_stats")
        .fetch_one(&mut *conn)
        .await
        .unwrap();
    assert_eq!((successes, latest), (REQUESTS, T0 + REQUESTS - 1));
    let last_of_p0: i64 = sqlx::query_scalar("SELECT last_used FROM usage_stats WHERE profile_id = 'openai:p0'")
        .fetch_one(&mut *conn)
        .await
        .unwrap();
    assert_eq!(last_of_p0, T0 + REQUESTS - PROFILES);
}

/// The change feed's head: one more for each row write of the shared state (docs/scale.md).
async fn change_head(conn: &mut sqlx::SqliteConnection) -> i64 {
    sqlx::query_scalar("SELECT n FROM change_seq").fetch_one(conn).await.unwrap()
}

/// Settings in force that never change (no reload task holds the sender).
fn live(config: &Config) -> rota::settings::Live {
    rota::settings::channel(rota::settings::Settings::new(config.clone())).1
}

/// The book reads the live settings, not a copy of its own: a reload (a new value sent on the
/// channel, as the reload task sends it) sets the cooldown of the next failure.
#[tokio::test]
async fn the_book_follows_the_settings_in_force() {
    let dir = tempfile::tempdir().unwrap();
    let store = SqliteStore::open(&dir.path().join("rota.db")).await.unwrap();
    for name in ["openai:a", "openai:b"] {
        add_key(&store, &key(), name, "sk-x").await;
    }
    let config = Config::from_toml(CONFIG).unwrap();
    let (sender, live) = rota::settings::channel(rota::settings::Settings::new(config));
    let book = Book::load(Arc::new(store), live, Arc::new(key()), T0).await.unwrap();
    let until = book.record_failure(&id("openai:a"), &failure(Reason::RateLimit, "m", T0), T0);
    assert_eq!(until, Some(Until::At(T0 + 60_000)), "the default ladder's first step");

    let faster = Config::from_toml(&format!("{CONFIG}[cooldown]\nbase = \"5s\"\n")).unwrap();
    sender.send_replace(Arc::new(rota::settings::Settings::new(faster)));
    let until = book.record_failure(&id("openai:b"), &failure(Reason::RateLimit, "m", T0), T0);
    assert_eq!(until, Some(Until::At(T0 + 5_000)), "the reloaded ladder, without a restart");
}
