//! The alerting rules and the dashboard shipped in `deploy/` (docs/operations.md, "Dashboards and
//! alerting rules"): promtool checks the rules and runs their unit tests; every dashboard query
//! parses as PromQL (promtool checks it as a recording rule); and every `rota_` series the rules
//! and the dashboard name is one a running rota exports.

use crate::support::*;
use serde_json::{Value, json};
use std::collections::BTreeSet;
use std::path::Path;
use std::process::Command;

/// Runs promtool (Debian's `prometheus` package; scripts/test.sh installs it) in `dir`.
fn promtool(dir: &Path, args: &[&str]) {
    let out = Command::new("promtool")
        .args(args)
        .current_dir(dir)
        .output()
        .unwrap_or_else(|e| panic!("promtool: {e}: apt-get install prometheus (scripts/test.sh does)"));
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "promtool {args:?}:\n{text}");
}

/// The `rota_…` series names in a PromQL text.
fn series(expr: &str) -> BTreeSet<String> {
    let re = regex::Regex::new(r"\brota_[a-z_]+").unwrap();
    re.find_iter(expr).map(|m| m.as_str().to_string()).collect()
}

/// The series names a scrape holds: a counter's `_total`, a histogram's `_bucket`, `_sum` and
/// `_count`, a gauge's own name (from the `# TYPE` lines of the families with samples).
fn exported(scrape: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    for line in scrape.lines().filter_map(|l| l.strip_prefix("# TYPE ")) {
        let mut parts = line.split_whitespace();
        let (Some(name), Some(kind)) = (parts.next(), parts.next()) else { continue };
        match kind {
            "counter" => _ = out.insert(format!("{name}_total")),
            "histogram" => out.extend(["_bucket", "_sum", "_count"].map(|s| format!("{name}{s}"))),
            _ => _ = out.insert(name.to_string()),
        }
    }
    out
}

#[tokio::test]
async fn the_rules_and_the_dashboard_check_and_name_only_what_rota_exports() {
    let deploy = Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy");
    let rules_dir = deploy.join("prometheus");
    promtool(&rules_dir, &["check", "rules", "rota-rules.yml"]);
    promtool(&rules_dir, &["test", "rules", "rota-rules.test.yml"]);

    let dashboard: Value =
        serde_json::from_str(&std::fs::read_to_string(deploy.join("grafana/rota-dashboard.json")).unwrap()).unwrap();
    let exprs: Vec<String> = dashboard["panels"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|p| p["targets"].as_array().unwrap().iter().map(|t| t["expr"].as_str().unwrap().to_string()))
        .collect();
    assert!(exprs.len() >= 10, "{exprs:?}");
    // Grafana's `$__rate_interval` is a duration to Prometheus once Grafana substitutes it.
    let recording: Vec<Value> = exprs
        .iter()
        .enumerate()
        .map(|(i, e)| json!({"record": format!("rota:dashboard_panel_{i}"), "expr": e.replace("$__rate_interval", "5m")}))
        .collect();
    let dir = tempfile::tempdir().unwrap();
    let as_rules = json!({"groups": [{"name": "dashboard", "rules": recording}]});
    std::fs::write(dir.path().join("dashboard.yml"), as_rules.to_string()).unwrap();
    promtool(dir.path(), &["check", "rules", "dashboard.yml"]);

    // A request that every family sees: k1 throttled (cooling), k2 out of credit (the disabled
    // lane), the backup fallback serving it, for an agent with a limit.
    let (mock, base) = Mock::started().await;
    let config = format!("{}[agents.tester]\ntokens_per_day = 100\n", config_with_backup(&base));
    let keys = [KEYS[0], KEYS[1], KEYS[3]];
    let rota = spawn(Scenario { config: &config, keys: &keys, ..Scenario::default() }).await;
    mock.script(
        KEYS[0].1,
        vec![Reply::Status(429, vec![("retry-after", "30".into())], r#"{"error":{"message":"rate limit"}}"#.into())],
    );
    let no_credit = r#"{"error":{"message":"You exceeded your current quota","type":"insufficient_quota","code":"insufficient_quota"}}"#;
    mock.script(KEYS[1].1, vec![Reply::Status(429, vec![], no_credit.into())]);
    let r = rota.chat(chat(), &[]).await;
    assert_eq!((r.status().as_u16(), r.headers()["x-rota-provider"].to_str().unwrap()), (200, "backup"));
    rota.flush().await;
    let scrape = Rota::client().get(format!("{}/metrics", rota.url)).send().await.unwrap().text().await.unwrap();
    assert!(
        scrape.lines().any(|l| l == r#"rota_agent_limit_used_ratio{agent="tester",limit="tokens_per_day"} 0.05"#),
        "5 of 100 tokens today:\n{scrape}"
    );
    let have = exported(&scrape);
    let rules = std::fs::read_to_string(rules_dir.join("rota-rules.yml")).unwrap();
    let named: BTreeSet<String> = exprs.iter().map(String::as_str).chain([rules.as_str()]).flat_map(series).collect();
    let unknown: Vec<&String> = named.iter().filter(|n| !have.contains(*n)).collect();
    assert!(unknown.is_empty(), "named but not exported: {unknown:?}; exported: {have:?}");
    assert!(named.len() >= 10, "{named:?}");
}
