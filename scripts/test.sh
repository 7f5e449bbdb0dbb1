#!/usr/bin/env bash
# The project's full test command: Rust tests (on SQLite files and on a throwaway PostgreSQL
# server), then the peer tests (real client SDKs against the built binary, with llmock as the
# upstream), then the browser tests (Chromium against rota and a real OpenID provider). Installs
# its Python peers into ./.venv and its npm peers into tests/browser/node_modules on first use and
# again whenever their lock files change, and Debian's postgresql when its server is missing.
set -euo pipefail
cd "$(dirname "$0")/.."

# Debian packages the tests need, installed when missing.
apt_install() {
    local sudo=""
    [[ $(id -u) -eq 0 ]] || sudo="sudo"
    $sudo apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "$@" >/dev/null
}

# The clock-jump test runs rota under libfaketime (tests/it/clock.rs).
[[ -e /usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1 ]] || apt_install libfaketime
# The alerting rules in deploy/ are checked and unit-tested by promtool (tests/it/dashboards.rs).
command -v promtool >/dev/null || apt_install prometheus

pg=$(mktemp -d)
trap 'scripts/postgres.sh stop "$pg" || true; rm -rf "$pg"' EXIT
eval "$(scripts/postgres.sh start "$pg")"

cargo test --locked --workspace
# rota, and the benchmark's mock and floor (crates/rota-bench), which scripts/audit_scale.py runs.
cargo build --locked --workspace --bins

req=tests/peers/requirements.txt
stamp=.venv/.requirements.sha256
if [[ ! -x .venv/bin/python ]]; then
    python3 -m venv .venv
fi
want=$(sha256sum "$req" | cut -d' ' -f1)
if [[ ! -f "$stamp" || "$(cat "$stamp")" != "$want" ]]; then
    .venv/bin/python -m pip install -q -r "$req"
    printf '%s\n' "$want" > "$stamp"
fi

# The coding agents tests/peers/test_agents.py runs (Claude Code, Codex CLI: ~760 MB, native
# binaries inside the npm packages), into tests/agents/node_modules whenever its lock changes.
agents_stamp=tests/agents/node_modules/.package-lock.sha256
want=$(sha256sum tests/agents/package-lock.json | cut -d' ' -f1)
if [[ ! -f "$agents_stamp" || "$(cat "$agents_stamp")" != "$want" ]]; then
    (cd tests/agents && npm ci --no-audit --no-fund --loglevel=error)
    printf '%s\n' "$want" > "$agents_stamp"
fi

export PYTHONDONTWRITEBYTECODE=1  # no __pycache__ left in tests/peers
target_dir=${CARGO_TARGET_DIR:-target}
export ROTA_BIN="$(realpath "$target_dir")/debug/rota"
.venv/bin/python -m pytest -q tests/peers

# The benchmark, CI-sized (seconds, debug build), so that it never rots (docs/performance.md).
scripts/bench.sh --smoke --postgres --callgrind
# The audit trail at scale, CI-sized (20,000 attempts; seconds): the generator, every listing,
# usage window and docs/audit.md query it times still run.
python3 scripts/audit_scale.py --smoke --bin "$target_dir/debug" --throughput 0 > /dev/null
python3 scripts/capacity.py --bin "$target_dir/debug" --profiles 10 --instances 2 --seconds 2 --concurrency 4 > /dev/null

# Browser and OAuth end-to-end tests: Debian Chromium (installed here when missing), a real
# OpenID provider and playwright-core from npm (tests/browser/run.sh installs node_modules).
[[ -x /usr/bin/chromium ]] || apt_install chromium
tests/browser/run.sh
