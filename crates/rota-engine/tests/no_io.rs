//! "The engine does no I/O" as a checked fact: its normal dependency tree holds no async
//! runtime, HTTP or database crate.

#[test]
fn the_engine_depends_on_no_runtime_http_or_database_crate() {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let out = std::process::Command::new(cargo)
        .args(["tree", "--locked", "--offline", "-p", "rota-engine", "-e", "normal", "--prefix", "none"])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .expect("cargo tree runs");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let tree = String::from_utf8(out.stdout).unwrap();
    let crates: Vec<&str> = tree.lines().filter_map(|l| l.split_whitespace().next()).collect();
    assert!(crates.contains(&"regex"), "the tree was read: {tree}");
    for io in ["tokio", "axum", "hyper", "sqlx", "reqwest", "mio", "rustls"] {
        assert!(!crates.contains(&io), "the engine depends on {io}:\n{tree}");
    }
}
