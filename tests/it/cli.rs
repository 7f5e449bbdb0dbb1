//! The `rota` binary as an operator uses it: a real config file, a real SQLite file (or a real
//! PostgreSQL database), stdin for secrets, exit codes and messages.

use rota::config::Config;
use rota::engine::{Cooldown, Disabled, Reason, UsageStats};
use rota::store::{SqliteStore, Store};
use std::io::{BufRead, BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::Duration;

const BASE: &str = r#"
[providers.openai]
api = "openai"
base_url = "http://127.0.0.1:9/v1"

[providers.anthropic]
api = "anthropic"
base_url = "http://127.0.0.1:9"

[models]
primary = "anthropic/claude-sonnet-4-5"
fallbacks = ["openai/gpt-4.1-mini"]

[agents.planner]
fallbacks = []
"#;

struct Env {
    dir: tempfile::TempDir,
    _share: crate::support::Share,
}

impl Env {
    fn new(config: &str) -> Env {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("rota.toml"), config).unwrap();
        Env { dir, _share: crate::support::Share::take() }
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    fn cmd(&self, args: &[&str]) -> Command {
        let mut c = crate::support::rota_command();
        c.args(args).current_dir(self.dir.path());
        c
    }

    fn run(&self, args: &[&str]) -> Output {
        self.cmd(args).stdin(Stdio::null()).output().unwrap()
    }

    fn run_stdin(&self, args: &[&str], input: &str) -> Output {
        self.run_with(self.cmd(args), input)
    }

    fn run_with(&self, mut cmd: Command, input: &str) -> Output {
        let mut child = cmd.stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
        child.stdin.take().unwrap().write_all(input.as_bytes()).unwrap();
        child.wait_with_output().unwrap()
    }

    fn db_profiles(&self) -> Vec<String> {
        let path = self.path("rota.db");
        if !path.exists() {
            return vec![];
        }
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        rt.block_on(async {
            let store = SqliteStore::open(&path).await.unwrap();
            let mut ids: Vec<String> =
                store.snapshot().await.unwrap().profiles.iter().map(|p| format!("{}:{}", p.id, p.kind)).collect();
            ids.sort();
            store.close().await;
            ids
        })
    }
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

fn assert_ok(out: &Output) {
    assert!(out.status.success(), "failed: {}\n{}", text(&out.stdout), text(&out.stderr));
}

fn assert_refused(out: &Output, expected: &str) {
    assert!(!out.status.success(), "should have failed: {}", text(&out.stdout));
    let err = text(&out.stderr);
    assert!(err.contains(expected), "stderr does not say `{expected}`:\n{err}");
}

#[test]
fn bad_profile_input_is_refused_with_a_clear_message_and_writes_nothing() {
    let env = Env::new(BASE);
    assert_refused(
        &env.run_stdin(&["profiles", "add", "openai", "--name", "bad name"], "sk-1"),
        "malformed profile id `openai:bad name`",
    );
    assert_refused(&env.run_stdin(&["profiles", "add", "azure", "--name", "x"], "sk-1"), "unknown provider `azure`");
    assert_refused(&env.run_stdin(&["profiles", "add", "openai", "--name", "empty"], "  \n"), "empty API key");
    assert_refused(
        &env.run_stdin(&["profiles", "add", "openai", "--name", "two", "--type", "oauth"], "x"),
        "rota login openai",
    );
    assert_refused(
        &env.run_stdin(&["profiles", "add", "openai", "--name", "t", "--type", "token", "--expires", "tomorrow"], "x"),
        "RFC 3339",
    );
    assert_refused(
        &env.run_stdin(
            &["profiles", "add", "openai", "--name", "t", "--type", "token", "--expires", "2001-01-01T00:00:00Z"],
            "x",
        ),
        "in the past",
    );
    assert_refused(&env.run_stdin(&["profiles", "add", "openai", "--name", "k"], "sk one\nsk two"), "whitespace");
    assert!(!env.path("rota.db").exists(), "nothing was written, not even a database");
    assert!(!env.path("rota.key").exists(), "no key was created");

    assert_ok(&env.run_stdin(&["profiles", "add", "openai", "--name", "work"], "sk-first\n"));
    let before = env.db_profiles();
    assert_refused(
        &env.run_stdin(&["profiles", "add", "openai", "--name", "work", "--type", "token"], "sk-second"),
        "profile openai:work already exists",
    );
    assert_eq!(env.db_profiles(), before);
    assert_eq!(before, ["openai:work:api_key"]);

    for cmd in ["remove", "enable", "disable", "clear"] {
        assert_refused(&env.run(&["profiles", cmd, "openai"]), "malformed profile id `openai`");
        assert_refused(&env.run(&["profiles", cmd, "openai:ghost"]), "profile openai:ghost does not exist");
    }
    assert_refused(&env.run(&["profiles", "order", "openai", "anthropic:x"]), "belongs to provider anthropic");
    assert_refused(&env.run(&["profiles", "order", "openai", "openai:ghost"]), "openai:ghost does not exist");
    assert_refused(&env.run(&["profiles", "order", "openai", "openai:work", "openai:work"]), "listed twice");
    assert_refused(&env.run(&["profiles", "order", "nope", "nope:x"]), "unknown provider `nope`");
    assert_eq!(env.db_profiles(), before);
}

#[test]
fn api_key_never_reaches_argv_output_or_the_database_file() {
    let env = Env::new(BASE);
    let secret = "sk-proj-CLISECRETPROBE-0123456789";
    let added = env.run_stdin(&["profiles", "add", "openai", "--name", "work"], secret);
    assert_ok(&added);
    assert!(text(&added.stdout).starts_with("added openai:work (api_key); secret sealed with key "));
    let listed = env.run(&["profiles", "list", "--json"]);
    assert_ok(&listed);
    let human = env.run(&["profiles", "list"]);
    let doctor = env.run(&["doctor", "--json"]);
    for out in [&added, &listed, &human, &doctor] {
        let all = text(&out.stdout) + &text(&out.stderr);
        assert!(!all.contains("CLISECRETPROBE"), "secret printed:\n{all}");
    }
    let key_file = std::fs::metadata(env.path("rota.key")).unwrap();
    assert_eq!(std::os::unix::fs::PermissionsExt::mode(&key_file.permissions()) & 0o777, 0o600);
    let mut bytes = std::fs::read(env.path("rota.db")).unwrap();
    bytes.extend(std::fs::read(env.path("rota.db-wal")).unwrap_or_default());
    assert!(!bytes.windows(14).any(|w| w == b"CLISECRETPROBE"), "plaintext secret in the database file");
    let json: serde_json::Value = serde_json::from_slice(&listed.stdout).unwrap();
    assert_eq!(json[0]["id"], "openai:work");
    assert_eq!(json[0]["status"]["state"], "usable");
}

#[test]
fn serve_refuses_to_start_when_the_secrets_key_is_missing_or_wrong() {
    let env = Env::new(BASE);
    let key = "AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8=";
    let mut add = env.cmd(&["profiles", "add", "openai", "--name", "work"]);
    add.env("ROTA_MASTER_KEY", key);
    assert_ok(&env.run_with(add, "sk-sealed-with-env-key"));
    assert!(!env.path("rota.key").exists(), "the env key was used, no key file made");

    let out = env.run(&["serve", "--listen", "127.0.0.1:0"]);
    assert_refused(&out, "the database holds encrypted secrets");
    assert!(text(&out.stderr).contains("set ROTA_MASTER_KEY to the key that sealed them"), "{}", text(&out.stderr));
    assert!(!env.path("rota.key").exists(), "no new key replaces the lost one");

    let mut wrong = env.cmd(&["serve", "--listen", "127.0.0.1:0"]);
    wrong.env("ROTA_MASTER_KEY", "ICEiIyQlJicoKSorLC0uLzAxMjM0NTY3ODk6Ozw9Pj8=");
    let out = wrong.stdin(Stdio::null()).output().unwrap();
    assert_refused(&out, "were sealed with key id");

    let mut bad = env.cmd(&["serve"]);
    bad.env("ROTA_MASTER_KEY", "too-short");
    assert_refused(&bad.stdin(Stdio::null()).output().unwrap(), "ROTA_MASTER_KEY is not a valid key");
}

/// Starts `rota serve` on a free port; returns the child and its address.
fn spawn_serve(env: &Env, extra_env: &[(&str, &str)]) -> (std::process::Child, String) {
    let mut cmd = env.cmd(&["serve", "--listen", "127.0.0.1:0"]);
    for (k, v) in extra_env {
        cmd.env(k, v);
    }
    let mut child = cmd.stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap()).read_line(&mut line).unwrap();
    let addr = line
        .trim()
        .strip_prefix("rota listening on http://")
        .unwrap_or_else(|| panic!("unexpected: {line}"))
        .to_string();
    (child, addr)
}

fn http_get(addr: &str, path: &str) -> String {
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    write!(s, "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n").unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    out
}

#[test]
fn serve_migrates_answers_healthz_and_stops_cleanly_on_sigterm() {
    let env = Env::new(BASE);
    let (child, addr) = spawn_serve(&env, &[]);
    let answer = http_get(&addr, "/healthz");
    assert!(answer.starts_with("HTTP/1.1 200 OK"), "{answer}");
    assert!(answer.contains(r#""status":"ok""#), "{answer}");
    assert!(http_get(&addr, "/nope").starts_with("HTTP/1.1 404"));
    assert!(crate::support::stop(child).success());
    assert!(env.path("rota.db").exists() && env.path("rota.key").exists());
    let migrate = env.run(&["migrate"]);
    assert_ok(&migrate);
    assert!(text(&migrate.stdout).contains(" migration(s) applied, schema up to date"), "{}", text(&migrate.stdout));
}

/// A supervisor may stop rota the moment it says it listens: the signal handlers are in place
/// by then, so it drains and exits 0 instead of dying of the signal. Five times, at once.
#[test]
fn sigterm_as_soon_as_serve_listens_is_a_clean_stop() {
    let env = Env::new(BASE);
    for _ in 0..5 {
        let (child, _) = spawn_serve(&env, &[]);
        let status = crate::support::stop(child);
        assert!(status.success(), "{status}");
    }
}

#[test]
fn serve_refuses_a_config_with_problems() {
    let env = Env::new(&format!(
        "{BASE}\n[auth.profiles.\"openai:work\"]\nprovider = \"openai\"\napi_key_env = \"ROTA_TEST_UNSET_KEY\"\n"
    ));
    let out = env.run(&["serve", "--listen", "127.0.0.1:0"]);
    assert_refused(&out, "environment variable `ROTA_TEST_UNSET_KEY` is unset or empty");
    assert!(!env.path("rota.db").exists());
}

fn seed_stats(env: &Env, config_text: &str) {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    rt.block_on(async {
        let config = Config::from_toml(config_text).unwrap();
        let store = SqliteStore::open(&env.path("rota.db")).await.unwrap();
        store.sync_config_profiles(&rota::book::config_rows(&config, 0)).await.unwrap();
        let far = chrono::Utc::now().timestamp_millis() + 3_600_000;
        let cooling = UsageStats {
            cooldowns: vec![Cooldown {
                until: far,
                reason: Reason::RateLimit,
                model: Some("gpt-4.1-mini".into()),
                step: 1,
                opened_at: far - 60_000,
            }],
            error_count: 1,
            ..Default::default()
        };
        let gone = UsageStats {
            disabled: Some(Disabled { until: None, reason: Reason::AuthPermanent }),
            ..Default::default()
        };
        store.save_stats(&[("openai:b".parse().unwrap(), cooling), ("openai:c".parse().unwrap(), gone)]).await.unwrap();
        store.close().await;
    });
}

#[test]
fn doctor_prints_every_agents_chain_with_each_profiles_state() {
    let config = format!(
        "{BASE}
[auth.profiles.\"openai:a\"]
provider = \"openai\"
api_key_env = \"ROTA_TEST_KEY_A\"
[auth.profiles.\"openai:b\"]
provider = \"openai\"
api_key_env = \"ROTA_TEST_KEY_B\"
[auth.profiles.\"openai:c\"]
provider = \"openai\"
api_key_env = \"ROTA_TEST_KEY_C\"
"
    );
    let env = Env::new(&config);
    seed_stats(&env, &config);
    std::fs::write(env.path(".env"), "ROTA_TEST_KEY_A=sk-a\nROTA_TEST_KEY_B=sk-b\nROTA_TEST_KEY_C=sk-c\n").unwrap();
    let out = env.run(&["doctor"]);
    assert_ok(&out);
    let o = text(&out.stdout);
    assert!(o.contains("agent (default):\n  1. anthropic/claude-sonnet-4-5\n       (no usable profile"), "{o}");
    assert!(o.contains("  2. openai/gpt-4.1-mini\n       openai:a                         api_key  usable\n       openai:b                         api_key  cooling for gpt-4.1-mini until "), "{o}");
    assert!(
        o.contains("openai:c                         api_key  disabled because auth_permanent until cleared"),
        "{o}"
    );
    assert!(o.contains("agent planner:\n  1. anthropic/claude-sonnet-4-5\n"), "{o}");
    assert!(!o.contains("agent planner:\n  1. anthropic/claude-sonnet-4-5\n       (no usable profile: add one with `rota profiles add anthropic`)\n  2."), "{o}");
    assert!(o.ends_with("no problems found\n"), "{o}");
    assert!(
        o.contains("agent planner: no model of its chain (anthropic/claude-sonnet-4-5) has a usable profile"),
        "{o}"
    );
    assert!(!o.contains("agent (default): no model of its chain"), "openai:a serves its fallback: {o}");

    let json: serde_json::Value = serde_json::from_slice(&env.run(&["doctor", "--json"]).stdout).unwrap();
    let step = &json["agents"][0]["chain"][1];
    assert_eq!(step["model"], "openai/gpt-4.1-mini");
    assert_eq!(step["profiles"][1]["status"]["state"], "cooling");
    assert_eq!(step["profiles"][2]["status"]["reason"], "auth_permanent");

    let cleared = env.run(&["profiles", "clear", "openai:c"]);
    assert_ok(&cleared);
    let o = text(&env.run(&["doctor"]).stdout);
    assert!(o.contains("openai:c                         api_key  usable"), "{o}");
}

#[test]
fn doctor_exits_non_zero_naming_each_problem() {
    let cases = [
        (
            "[models]\nprimary = \"openai/gpt-4.1\"\nfallbacks = [\"mystery/m\"]",
            "models.fallbacks[0]: `mystery/m` names unknown provider `mystery`",
        ),
        (
            "[virtual_models.a]\ntargets = [\"b\"]\n[virtual_models.b]\ntargets = [\"a\"]",
            "virtual model or alias cycle: a → b → a",
        ),
        ("[cooldown]\nbase = \"a while\"", "key `cooldown.base`: invalid duration `a while`"),
        ("[server]\nlisten = \"8080\"", "server.listen = \"8080\": give HOST:PORT"),
        (
            "[auth.profiles.\"openai:w\"]\nprovider = \"openai\"\napi_key_env = \"ROTA_TEST_NEVER_SET\"",
            "environment variable `ROTA_TEST_NEVER_SET` is unset or empty",
        ),
    ];
    let providers = "[providers.openai]\napi = \"openai\"\nbase_url = \"http://127.0.0.1:9/v1\"\n";
    for (snippet, expected) in cases {
        let env = Env::new(&format!("{providers}{snippet}\n"));
        let out = env.run(&["doctor"]);
        assert!(!out.status.success(), "doctor accepted: {snippet}");
        assert!(text(&out.stdout).contains(expected), "doctor did not say `{expected}`:\n{}", text(&out.stdout));
    }
    let env = Env::new("[cooldown]\nbase = \"a while\"\n");
    let out = env.run(&["doctor"]);
    assert!(text(&out.stdout).contains("rota.toml: key `cooldown.base`"), "names the file: {}", text(&out.stdout));
}

#[test]
fn environment_overrides_config_keys() {
    let env = Env::new(BASE);
    let mut c = env.cmd(&["doctor"]);
    c.env("ROTA_COOLDOWN__BASE", "soon");
    let out = c.stdin(Stdio::null()).output().unwrap();
    assert!(!out.status.success());
    assert!(text(&out.stdout).contains("cooldown.base"), "{}", text(&out.stdout));

    let mut c = env.cmd(&["doctor", "--json"]);
    c.env("ROTA_FAILOVER_ENABLED", "false");
    let out = c.stdin(Stdio::null()).output().unwrap();
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(json["agents"][0]["chain"].as_array().unwrap().len(), 1, "failover off: first choice only");

    let mut c = env.cmd(&["migrate"]);
    c.env("DATABASE_URL", "sqlite://elsewhere/audit.db");
    assert_ok(&c.stdin(Stdio::null()).output().unwrap());
    assert!(env.path("elsewhere/audit.db").exists());
}

#[test]
fn missing_explicit_config_file_is_an_error() {
    let env = Env::new(BASE);
    let out = env.run(&["--config", "nope.toml", "doctor"]);
    assert!(!out.status.success());
    assert!(text(&out.stdout).contains("config file nope.toml not found"));
    let _ = Path::new("unused");
}

#[test]
fn agents_are_created_with_limits_and_listed_with_those_in_force_by_list_and_doctor() {
    let env = Env::new(&format!("{BASE}requests_per_minute = 7\n"));
    assert_ok(&env.run(&["agents", "create", "capped", "--requests-per-minute", "5", "--cost-per-day", "2.5"]));
    assert_ok(&env.run(&["agents", "create", "planner", "--requests-per-minute", "50", "--tokens-per-day", "9000"]));
    for (flag, value) in [("--requests-per-minute", "0"), ("--tokens-per-day", "-3"), ("--cost-per-day", "nan")] {
        let out = env.run(&["agents", "create", "bad", &format!("{flag}={value}")]);
        assert!(!out.status.success() && text(&out.stderr).contains(flag), "{flag} {value}: {}", text(&out.stderr));
    }
    let human = text(&env.run(&["agents", "list"]).stdout);
    let line =
        |name: &str| human.lines().find(|l| l.starts_with(name)).unwrap_or_else(|| panic!("{human}")).to_string();
    assert!(line("capped").ends_with("5 requests/min, 2.5 USD/day"), "{human}");
    assert!(line("planner").ends_with("7 requests/min, 9000 tokens/day"), "the config file's key wins: {human}");
    assert!(!human.contains("bad"), "{human}");
    let json: serde_json::Value = serde_json::from_slice(&env.run(&["agents", "list", "--json"]).stdout).unwrap();
    let capped = json.as_array().unwrap().iter().find(|a| a["name"] == "capped").unwrap();
    assert_eq!(
        (capped["limits"]["requests_per_minute"].as_i64(), capped["limits"]["cost_per_day"].as_f64()),
        (Some(5), Some(2.5))
    );
    let doctor = text(&env.run(&["doctor"]).stdout);
    assert!(doctor.contains("\nagent planner (limits: 7 requests/min, 9000 tokens/day):\n"), "{doctor}");
    let json: serde_json::Value = serde_json::from_slice(&env.run(&["doctor", "--json"]).stdout).unwrap();
    let planner = json["agents"].as_array().unwrap().iter().find(|a| a["agent"] == "planner").unwrap();
    assert_eq!(planner["limits"]["tokens_per_day"], 9000);
    assert!(json["agents"][0].get("limits").is_none(), "the default chain has no limits");
}

#[test]
fn an_agent_created_with_models_is_held_to_them() {
    let env = Env::new(BASE);
    assert_ok(&env.run(&["agents", "create", "scoped", "--models", "openai/gpt-4.1, anthropic/claude-x"]));
    assert_refused(&env.run(&["agents", "create", "wide", "--models", "nope"]), "--models: unknown model `nope`");
    let human = text(&env.run(&["agents", "list"]).stdout);
    let line = human.lines().find(|l| l.starts_with("scoped")).unwrap_or_else(|| panic!("{human}"));
    assert!(line.ends_with("none; models: openai/gpt-4.1, anthropic/claude-x"), "{human}");
    assert!(!human.contains("wide"), "{human}");
}

#[test]
fn agents_get_a_key_once_stored_only_as_a_digest_and_can_be_revoked() {
    let env = Env::new(BASE);
    let out = env.run(&["agents", "create", "planner"]);
    assert_ok(&out);
    let stdout = text(&out.stdout);
    let key = stdout.lines().last().unwrap().to_string();
    assert!(key.starts_with("rk_") && key.len() == 46, "last line is the key alone: {stdout}");
    assert_refused(&env.run(&["agents", "create", "planner"]), "agent planner already exists");
    assert_refused(&env.run(&["agents", "create", "Bad Name"]), "invalid agent name");
    assert_ok(&env.run(&["agents", "create", "ops", "--admin"]));

    let listed = env.run(&["agents", "list", "--json"]);
    assert_ok(&listed);
    let json: serde_json::Value = serde_json::from_slice(&listed.stdout).unwrap();
    assert_eq!((json[0]["name"].as_str(), json[0]["admin"].as_bool()), (Some("ops"), Some(true)));
    assert_eq!((json[1]["name"].as_str(), json[1]["revoked_at"].is_null()), (Some("planner"), true));
    assert!(!text(&listed.stdout).contains(&key));
    let bytes = std::fs::read(env.path("rota.db")).unwrap();
    let mut all = bytes;
    all.extend(std::fs::read(env.path("rota.db-wal")).unwrap_or_default());
    assert!(!all.windows(key.len()).any(|w| w == key.as_bytes()), "agent key stored in plaintext");

    assert_ok(&env.run(&["agents", "revoke", "planner"]));
    assert_refused(&env.run(&["agents", "revoke", "planner"]), "no active agent named planner");
    let human = text(&env.run(&["agents", "list"]).stdout);
    assert!(human.contains("planner") && human.contains("revoked "), "{human}");
    let again = env.run(&["agents", "create", "planner"]);
    assert_ok(&again);
    let new_key = text(&again.stdout).lines().last().unwrap().to_string();
    assert_ne!(new_key, key, "a revoked agent created again gets a new key");
}

#[test]
fn doctor_notes_the_candidates_whose_requests_are_translated() {
    let env = Env::new(BASE);
    let out = env.run(&["doctor"]);
    assert_ok(&out);
    let o = text(&out.stdout);
    assert!(
        o.contains("note: agent (default): anthropic/claude-sonnet-4-5 (anthropic): requests in another format are translated for them (docs/translation.md)"),
        "{o}"
    );
    assert!(o.contains("note: agent planner: anthropic/claude-sonnet-4-5 (anthropic): requests"), "{o}");
    let translated = o.lines().filter(|l| l.contains("are translated for them")).count();
    assert_eq!(translated, 2, "one note per agent whose chain holds an Anthropic candidate: {o}");
}

#[test]
fn openclaw_import_then_export_gives_back_an_equivalent_file() {
    let env = Env::new(BASE);
    let fixture = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/openclaw-auth-profiles.json");
    let out = env.run(&["import", "openclaw", fixture]);
    assert_ok(&out);
    assert!(text(&out.stdout).starts_with("imported 5 profile(s) and 1 order(s)"), "{}", text(&out.stdout));
    let listed: serde_json::Value = serde_json::from_slice(&env.run(&["profiles", "list", "--json"]).stdout).unwrap();
    let state = |id: &str| listed.as_array().unwrap().iter().find(|p| p["id"] == id).unwrap()["type"].clone();
    assert_eq!(
        (state("anthropic:ana@example.com"), state("openai:ci"), state("openai:work")),
        ("oauth".into(), "token".into(), "api_key".into())
    );
    let db = std::fs::read(env.path("rota.db")).unwrap();
    assert!(!db.windows(12).any(|w| w == b"FIXTUREKEYWO"), "imported secrets are sealed");

    assert_refused(&env.run(&["import", "openclaw", fixture]), "already exists; nothing was imported");
    assert_refused(&env.run(&["export", "openclaw"]), "--output");
    let exported = env.path("out.json");
    assert_ok(&env.run(&["export", "openclaw", "--output", exported.to_str().unwrap()]));
    let mode = std::os::unix::fs::PermissionsExt::mode(&std::fs::metadata(&exported).unwrap().permissions()) & 0o777;
    assert_eq!(mode, 0o600);
    let back: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&exported).unwrap()).unwrap();
    let original: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(fixture).unwrap()).unwrap();
    assert_eq!(back, original);
    assert_refused(&env.run(&["export", "openclaw", "--output", exported.to_str().unwrap()]), "must not exist yet");
}

#[test]
fn openclaw_import_of_an_unknown_provider_writes_nothing() {
    let env = Env::new(BASE);
    let file = env.path("in.json");
    std::fs::write(&file, r#"{"version":1,"profiles":{"openai:a":{"type":"api_key","provider":"openai","key":"sk-a-0000000001"},"mistral:x":{"type":"api_key","provider":"mistral","key":"sk-x-000000001"}}}"#).unwrap();
    assert_refused(&env.run(&["import", "openclaw", file.to_str().unwrap()]), "unknown provider `mistral`");
    assert_eq!(env.db_profiles(), Vec::<String>::new());
}

/// Opens every stored secret with the key in `key_file`; the plaintexts, sorted, or the error.
fn open_all(env: &Env, key_file: &str) -> Result<Vec<String>, String> {
    let key_text = std::fs::read_to_string(env.path(key_file)).unwrap();
    let db = env.path("rota.db");
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    rt.block_on(async {
        let store = SqliteStore::open(&db).await.unwrap();
        let dir = tempfile::tempdir().unwrap();
        let probe_db = dir.path().join("probe.db");
        std::fs::write(dir.path().join("probe.key"), &key_text).unwrap();
        let (key, _) = rota::secrets::resolve_key(&probe_db, &[], rota::secrets::Choice::Off).unwrap();
        let mut out = Vec::new();
        for (id, sealed) in store.snapshot().await.unwrap().secrets {
            for s in sealed {
                let plain = key.open(&id, &s).map_err(|e| e.to_string())?;
                out.push(secrecy::ExposeSecret::expose_secret(&plain).to_string());
            }
        }
        store.close().await;
        out.sort();
        Ok(out)
    })
}

#[test]
fn rotate_key_re_encrypts_every_secret_and_retires_the_old_key() {
    let env = Env::new(BASE);
    assert_ok(&env.run_stdin(&["profiles", "add", "openai", "--name", "a"], "sk-rotate-a"));
    assert_ok(&env.run_stdin(&["profiles", "add", "anthropic", "--name", "b", "--type", "token"], "tok-rotate-b"));
    std::fs::copy(env.path("rota.key"), env.path("old.key")).unwrap();
    assert_eq!(open_all(&env, "old.key"), Ok(vec!["sk-rotate-a".to_string(), "tok-rotate-b".to_string()]));

    let out = env.run(&["rotate-key"]);
    assert_ok(&out);
    assert!(text(&out.stdout).contains("re-encrypted 2 secret(s)"), "{}", text(&out.stdout));
    assert!(!env.path("rota.key.new").exists(), "the pending key was moved into place");
    assert_ne!(
        std::fs::read_to_string(env.path("rota.key")).unwrap(),
        std::fs::read_to_string(env.path("old.key")).unwrap()
    );
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        assert_eq!(std::fs::metadata(env.path("rota.key")).unwrap().permissions().mode() & 0o777, 0o600);
    }
    assert_eq!(open_all(&env, "rota.key"), Ok(vec!["sk-rotate-a".to_string(), "tok-rotate-b".to_string()]));
    assert!(open_all(&env, "old.key").is_err(), "the old key opens nothing any more");
    // The CLI and the server keep working with the new key.
    let out = env.run(&["doctor"]);
    assert_ok(&out);
    assert_ok(&env.run_stdin(&["profiles", "add", "openai", "--name", "c"], "sk-rotate-c"));
    assert_eq!(open_all(&env, "rota.key").unwrap().len(), 3);
}

#[test]
fn an_interrupted_rotation_leaves_a_key_that_opens_the_secrets() {
    let env = Env::new(BASE);
    assert_ok(&env.run_stdin(&["profiles", "add", "openai", "--name", "a"], "sk-interrupted"));
    assert_ok(&env.run(&["rotate-key"]));
    // Simulate a crash after the commit and before the rename: the new key sits in rota.key.new
    // and the old one in rota.key.
    std::fs::rename(env.path("rota.key"), env.path("rota.key.new")).unwrap();
    std::fs::write(env.path("rota.key"), "AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA=\n").unwrap();
    let out = env.run(&["profiles", "list"]);
    assert_ok(&out);
    let out = env.run_stdin(&["profiles", "add", "openai", "--name", "b"], "sk-after");
    assert_ok(&out);
    assert!(!env.path("rota.key.new").exists(), "the pending key was adopted");
    assert_eq!(open_all(&env, "rota.key").unwrap(), ["sk-after", "sk-interrupted"]);
}

#[test]
fn the_keyring_is_used_only_where_it_works_and_says_why_not() {
    // `auto` without a DBus session: the key goes to the key file, and the log says why.
    let env = Env::new(BASE);
    let mut cmd = env.cmd(&["profiles", "add", "openai", "--name", "a"]);
    cmd.env_remove("DBUS_SESSION_BUS_ADDRESS").env("ROTA_LOG", "info");
    let out = env.run_with(cmd, "sk-keyring-auto");
    assert_ok(&out);
    assert!(env.path("rota.key").exists());
    let log = text(&out.stderr);
    assert!(log.contains("no DBus session") && log.contains("keyutils store does not survive a reboot"), "{log}");

    // keyutils chosen explicitly: either the kernel store holds the key (no key file), or rota
    // refuses with the reason and writes no key anywhere.
    let env = Env::new(&format!("{BASE}\n[secrets]\nkeyring = \"keyutils\"\n"));
    let out = env.run_stdin(&["profiles", "add", "openai", "--name", "a"], "sk-keyring-kernel");
    if out.status.success() {
        assert!(!env.path("rota.key").exists(), "the key lives in the kernel keyring, not in a file");
        let listed = env.run(&["profiles", "list", "--json"]);
        assert_ok(&listed);
        assert!(text(&listed.stdout).contains("openai:a"));
        assert_ok(&env.run(&["rotate-key"]));
        assert_ok(&env.run_stdin(&["profiles", "add", "openai", "--name", "b"], "sk-keyring-kernel-b"));
    } else {
        let err = text(&out.stderr);
        assert!(err.contains("keyutils keyring") && err.contains("ROTA_MASTER_KEY"), "{err}");
        assert!(!env.path("rota.key").exists(), "no key file behind the operator's back");
    }
}

#[test]
fn a_secret_that_is_not_visible_ascii_is_refused_at_every_door_without_being_echoed() {
    let provider = "[providers.openai]\napi = \"openai\"\nbase_url = \"https://api.openai.com/v1\"\n";
    let env = Env::new(provider);
    assert_refused(
        &env.run_stdin(&["profiles", "add", "openai", "--name", "work"], "sk-clé-0123456789\n"),
        "a non-ASCII character",
    );
    let declared = format!(
        "{provider}[auth.profiles.\"openai:env\"]\nprovider = \"openai\"\ntype = \"api_key\"\napi_key_env = \"ROTA_TEST_KEY_WITH_SPACE\"\n"
    );
    let env = Env::new(&declared);
    let mut doctor = env.cmd(&["doctor"]);
    doctor.env("ROTA_TEST_KEY_WITH_SPACE", "sk-live 0123456789");
    let out = doctor.stdin(Stdio::null()).output().unwrap();
    assert!(!out.status.success());
    let said = format!("{}{}", text(&out.stdout), text(&out.stderr));
    assert!(said.contains("`ROTA_TEST_KEY_WITH_SPACE` holds whitespace"), "{said}");
    assert!(!said.contains("0123456789"), "the secret is never echoed: {said}");
}

#[test]
fn profiles_clear_model_ends_a_model_cooldown() {
    let env = Env::new(BASE);
    let db = env.path("rota.db");
    let model_until = |db: &Path| {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        rt.block_on(async {
            let store = SqliteStore::open(db).await.unwrap();
            let until = store
                .snapshot()
                .await
                .unwrap()
                .model_cooldowns
                .get(&("openai".into(), "gpt-4.1".into()))
                .map(|m| m.until);
            store.close().await;
            until
        })
    };
    let far = chrono::Utc::now().timestamp_millis() + 3_600_000;
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    rt.block_on(async {
        let store = SqliteStore::open(&db).await.unwrap();
        let cooling = rota::engine::ModelCooldown { until: far, error_count: 3, last_failure_at: far - 3_600_000 };
        store.save_model_cooldowns(&[(("openai".into(), "gpt-4.1".into()), cooling)]).await.unwrap();
        store.close().await;
    });
    let out = env.run(&["profiles", "clear", "--model", "openai/gpt-4.1"]);
    assert_ok(&out);
    assert!(text(&out.stdout).contains("cleared the cooldown of openai/gpt-4.1"), "{}", text(&out.stdout));
    assert!(model_until(&db).unwrap() <= chrono::Utc::now().timestamp_millis());
    let again = env.run(&["profiles", "clear", "--model", "openai/gpt-4.1"]);
    assert!(text(&again.stdout).contains("has no active cooldown"), "{}", text(&again.stdout));
    assert_refused(&env.run(&["profiles", "clear", "--model", "gpt-4.1"]), "not a provider/model reference");
    assert_refused(&env.run(&["profiles", "clear"]), "required");
}

#[test]
fn a_postgres_password_never_reaches_output_or_logs() {
    // A server that is not there: every command fails, and says so without the password.
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let password = "pg-secret-hunter2-0001";
    let url = format!("postgres://rota:{password}@127.0.0.1:{port}/rota");
    let env = Env::new(&format!("[database]\nurl = \"{url}\"\n{BASE}"));
    let commands = [
        &["doctor"][..],
        &["migrate"],
        &["profiles", "list"],
        &["agents", "list"],
        &["serve", "--listen", "127.0.0.1:0"],
    ];
    // Each waits out the pool's connect timeout (10 s): all at once.
    let children: Vec<_> = commands
        .iter()
        .map(|args| {
            let mut c = env.cmd(args);
            c.env("ROTA_LOG", "debug").stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped());
            (args, c.spawn().unwrap())
        })
        .collect();
    for (args, child) in children {
        let out = child.wait_with_output().unwrap();
        let all = format!("{}{}", text(&out.stdout), text(&out.stderr));
        assert!(!out.status.success(), "{args:?} succeeded without a database: {all}");
        assert!(
            all.contains(&format!("postgres://rota:***@127.0.0.1:{port}/rota")),
            "{args:?} names the database: {all}"
        );
        assert!(!all.contains(password), "{args:?} printed the password: {all}");
    }
}

#[test]
fn every_command_works_on_postgres() {
    let url = tokio::runtime::Runtime::new().unwrap().block_on(crate::support::postgres_database());
    let env = Env::new(&format!("[database]\nurl = \"{url}\"\n[secrets]\nkeyring = \"off\"\n{BASE}"));
    let out = env.run(&["migrate"]);
    assert_ok(&out);
    assert!(text(&out.stdout).contains(" migration(s) applied, schema up to date"), "{}", text(&out.stdout));

    let fixture = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/openclaw-auth-profiles.json");
    let out = env.run(&["import", "openclaw", fixture]);
    assert_ok(&out);
    assert!(text(&out.stdout).starts_with("imported 5 profile(s) and 1 order(s)"), "{}", text(&out.stdout));
    assert!(env.path("rota.key").exists(), "the key file is made in the working directory");
    assert_ok(&env.run_stdin(&["profiles", "add", "openai", "--name", "extra"], "sk-pg-extra-0001"));
    assert_ok(&env.run(&["profiles", "disable", "openai:extra"]));
    assert_ok(&env.run(&["profiles", "order", "openai", "openai:extra", "openai:work"]));
    let listed: serde_json::Value = serde_json::from_slice(&env.run(&["profiles", "list", "--json"]).stdout).unwrap();
    assert_eq!(listed.as_array().unwrap().len(), 6);
    assert_ok(&env.run(&["profiles", "remove", "openai:extra"]));
    assert_ok(&env.run(&["profiles", "order", "openai", "openai:work", "openai:personal", "openai:ci"]));
    assert_ok(&env.run(&["agents", "create", "pg-agent"]));
    assert_ok(&env.run(&["agents", "revoke", "pg-agent"]));
    assert!(text(&env.run(&["agents", "list"]).stdout).contains("pg-agent"));

    let out = env.run(&["rotate-key"]);
    assert_ok(&out);
    assert!(text(&out.stdout).contains("re-encrypted"), "{}", text(&out.stdout));
    let out = env.run(&["doctor"]);
    assert!(text(&out.stdout).contains(" migration(s) applied)"), "{}", text(&out.stdout));
    assert!(!text(&out.stdout).contains("does not match"), "the rotated key opens the secrets: {}", text(&out.stdout));
    // The secrets re-sealed under the new key export as they were imported.
    let exported = env.path("out.json");
    assert_ok(&env.run(&["export", "openclaw", "--output", exported.to_str().unwrap()]));
    let back: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&exported).unwrap()).unwrap();
    let original: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(fixture).unwrap()).unwrap();
    assert_eq!(back, original);
}

#[test]
fn dotenv_is_read_from_the_working_directory_and_beside_the_config_never_from_a_parent() {
    let env = Env::new(BASE);
    std::fs::create_dir(env.path("work")).unwrap();
    std::fs::write(env.path("work/rota.toml"), BASE).unwrap();
    // A parent's `.env` belongs to another project: ignored.
    std::fs::write(env.path(".env"), "ROTA_COOLDOWN__BASE=from-the-parent\n").unwrap();
    let mut c = env.cmd(&["doctor"]);
    c.current_dir(env.path("work"));
    let out = c.stdin(Stdio::null()).output().unwrap();
    assert_ok(&out);
    assert!(!text(&out.stdout).contains("from-the-parent"), "{}", text(&out.stdout));
    // The working directory's is read.
    std::fs::write(env.path("work/.env"), "ROTA_COOLDOWN__BASE=from-the-working-directory\n").unwrap();
    let mut c = env.cmd(&["doctor"]);
    c.current_dir(env.path("work"));
    let out = c.stdin(Stdio::null()).output().unwrap();
    assert!(text(&out.stdout).contains("from-the-working-directory"), "{}", text(&out.stdout));
    // So is the one beside a --config file elsewhere (run from a folder without one).
    std::fs::remove_file(env.path(".env")).unwrap();
    std::fs::create_dir(env.path("elsewhere")).unwrap();
    std::fs::write(env.path("elsewhere/.env"), "ROTA_COOLDOWN__BASE=beside-the-config\n").unwrap();
    let out = env.run(&["--config", "work/rota.toml", "doctor"]);
    assert!(!text(&out.stdout).contains("beside-the-config"), "{}", text(&out.stdout));
    std::fs::copy(env.path("work/rota.toml"), env.path("elsewhere/rota.toml")).unwrap();
    let out = env.run(&["--config", "elsewhere/rota.toml", "doctor"]);
    assert!(text(&out.stdout).contains("beside-the-config"), "{}", text(&out.stdout));
}

/// Every change made with the CLI is an `admin_actions` row (docs/operations.md, "Admin
/// actions"): `actor_kind` `cli`, the OS user who ran it as `actor`, and never a secret.
#[test]
fn cli_changes_are_recorded_as_the_os_users() {
    let env = Env::new(BASE);
    assert_ok(&env.run_stdin(&["profiles", "add", "openai", "--name", "work"], "sk-cli-recorded-0001\n"));
    assert_ok(&env.run(&["profiles", "disable", "openai:work"]));
    assert_ok(&env.run(&["profiles", "enable", "openai:work"]));
    assert_ok(&env.run(&["profiles", "clear", "openai:work"]));
    assert_ok(&env.run(&["profiles", "paid", "openai:work", "on"]));
    let listed = env.run(&["profiles", "list"]);
    assert!(String::from_utf8_lossy(&listed.stdout).contains("(paid)"), "{listed:?}");
    let json: serde_json::Value = serde_json::from_slice(&env.run(&["profiles", "list", "--json"]).stdout).unwrap();
    assert_eq!(json[0]["paid"], true);
    assert_ok(&env.run(&["profiles", "paid", "openai:work", "off"]));
    let refused = env.run(&["profiles", "paid", "openai:work", "maybe"]);
    assert!(
        !refused.status.success() && String::from_utf8_lossy(&refused.stderr).contains("[possible values: on, off]")
    );
    assert_ok(&env.run(&["profiles", "order", "openai", "openai:work"]));
    assert_ok(&env.run(&["agents", "create", "planner"]));
    assert_ok(&env.run(&["agents", "revoke", "planner"]));
    assert_ok(&env.run(&["profiles", "remove", "openai:work"]));
    let db = format!("sqlite://{}", env.path("rota.db").display());
    let rows: Vec<(String, String, String, String, Option<String>)> =
        tokio::runtime::Runtime::new().unwrap().block_on(async {
            let pool = sqlx::SqlitePool::connect(&db).await.unwrap();
            sqlx::query_as("SELECT actor, actor_kind, role, action, value_after FROM admin_actions ORDER BY at, id")
                .fetch_all(&pool)
                .await
                .unwrap()
        });
    let user = nix::unistd::User::from_uid(nix::unistd::getuid()).unwrap().unwrap().name;
    let actions: Vec<&str> = rows.iter().map(|r| r.3.as_str()).collect();
    assert_eq!(
        actions,
        [
            "profile.add",
            "profile.disable",
            "profile.enable",
            "profile.clear",
            "profile.paid",
            "profile.paid",
            "provider.order",
            "agent.create",
            "agent.revoke",
            "profile.delete"
        ]
    );
    assert!(rows.iter().all(|r| (r.0.as_str(), r.1.as_str(), r.2.as_str()) == (&user, "cli", "admin")), "{rows:?}");
    assert!(!format!("{rows:?}").contains("sk-cli-recorded-0001"), "no secret recorded");
}

/// The contract's forms of `profiles add`: a `client_credentials` profile by `--client-id`,
/// and a service account named after its key's `client_email` without `--name`.
#[test]
fn profiles_add_takes_the_client_id_and_names_a_service_account_after_its_key() {
    let config = format!(
        "{BASE}\n[providers.openai.client_credentials]\ntoken_url = \"http://127.0.0.1:9/token\"\n\
         [providers.vertex]\npreset = \"vertex\"\nproject = \"acme-ml\"\nlocation = \"us-central1\"\n"
    );
    let env = Env::new(&config);
    let added = env.run_stdin(
        &["profiles", "add", "openai", "--type", "client_credentials", "--client-id", "app-1"],
        "s3cret-value\n",
    );
    assert_ok(&added);
    assert!(text(&added.stdout).contains("added openai:app-1 (client_credentials)"), "{}", text(&added.stdout));
    assert_refused(
        &env.run_stdin(
            &["profiles", "add", "openai", "--type", "client_credentials", "--client-id", "a", "--name", "b"],
            "x\n",
        ),
        "differ",
    );
    assert_refused(&env.run_stdin(&["profiles", "add", "openai"], "sk-x\n"), "--name LABEL");
    let pem =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/service-accounts/a.pem")).unwrap();
    let email = "rota-cli@acme-ml.iam.gserviceaccount.com";
    let key = serde_json::json!({"type": "service_account", "project_id": "acme-ml", "private_key_id": "k1",
        "private_key": pem, "client_email": email, "token_uri": "https://oauth2.googleapis.com/token"});
    let added = env.run_stdin(&["profiles", "add", "vertex", "--type", "service_account"], &key.to_string());
    assert_ok(&added);
    assert!(
        text(&added.stdout).contains(&format!("added vertex:{email} (service_account)")),
        "{}",
        text(&added.stdout)
    );
}
