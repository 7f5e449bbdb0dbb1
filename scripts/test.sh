#!/usr/bin/env bash
# The project's full test command: Rust tests, then the peer tests (real client SDKs against the
# built binary, with llmock as the upstream). Installs its Python peers into ./.venv on first use
# and again whenever tests/peers/requirements.txt changes.
set -euo pipefail
cd "$(dirname "$0")/.."

cargo test --locked
cargo build --locked

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

export PYTHONDONTWRITEBYTECODE=1  # no __pycache__ left in tests/peers
target_dir=${CARGO_TARGET_DIR:-target}
ROTA_BIN="$(realpath "$target_dir")/debug/rota" exec .venv/bin/python -m pytest -q tests/peers
