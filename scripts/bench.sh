#!/usr/bin/env bash
# rota's benchmark (docs/performance.md): the direct call to the mock upstream and the same call
# through rota, side by side, in one run, load from `hey`.
#
#   scripts/bench.sh            release build, full counts (a few minutes)
#   scripts/bench.sh --peers    also LiteLLM's proxy (PyPI) and Portkey's gateway (npm)
#   scripts/bench.sh --smoke    seconds: debug build, small counts (run by scripts/test.sh)
#   scripts/bench.sh --postgres also rota on PostgreSQL, one and two instances: on the server
#                               of $ROTA_TEST_PG, else a throwaway one (scripts/postgres.sh)
#   scripts/bench.sh --callgrind also instructions per request, rota's and the floor's (valgrind,
#                               installed here when missing)
#   scripts/bench.sh --out F    also write the table to F
set -euo pipefail
cd "$(dirname "$0")/.."

profile=release
args=()
for a in "$@"; do
    [[ $a == --smoke ]] && profile=debug
    if [[ $a == --postgres ]]; then
        if [[ -z ${ROTA_TEST_PG:-} ]]; then
            pg=$(mktemp -d)
            trap 'scripts/postgres.sh stop "$pg" || true; rm -rf "$pg"' EXIT
            eval "$(scripts/postgres.sh start "$pg")"
        fi
        args+=(--postgres "$ROTA_TEST_PG")
    else
        args+=("$a")
    fi
done
# rota, and the mock and the floor (crates/rota-bench).
if [[ $profile == release ]]; then
    cargo build --release --locked --workspace --bins
else
    cargo build --locked --workspace --bins
fi

need=()
command -v hey >/dev/null || need+=(hey)
if [[ " $* " == *" --callgrind "* ]] && ! command -v valgrind >/dev/null; then
    need+=(valgrind)
fi
if [[ ${#need[@]} -gt 0 ]]; then
    sudo=""
    [[ $(id -u) -eq 0 ]] || sudo="sudo"
    $sudo apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi

ulimit -n 65536 2>/dev/null || ulimit -n "$(ulimit -Hn)"
target_dir=${CARGO_TARGET_DIR:-target}
python3 scripts/bench.py --bin "$target_dir/$profile" "${args[@]}"
