#!/usr/bin/env bash
# rota's browser and OAuth end-to-end tests: a real OpenID provider (oidc-provider), a scripted
# upstream and Debian Chromium (driven by playwright-core) against a built `rota serve`.
#
#   tests/browser/run.sh [test files…]        (default: every *.test.mjs here)
#
# ROTA_BIN: the rota binary (default target/debug/rota of this repo). CHROMIUM: the browser
# (default /usr/bin/chromium). KEEP_TMP=1 keeps each test's temp dir (logs, rota.db).
# Installs the npm packages into ./node_modules on first use and again whenever
# package-lock.json changes. Screenshots go to ./artifacts/.
set -euo pipefail
cd "$(dirname "$0")"

stamp=node_modules/.package-lock.sha256
want=$(sha256sum package-lock.json | cut -d' ' -f1)
if [[ ! -d node_modules || ! -f "$stamp" || "$(cat "$stamp")" != "$want" ]]; then
    npm ci --no-audit --no-fund
    printf '%s\n' "$want" > "$stamp"
fi

chromium=${CHROMIUM:-/usr/bin/chromium}
if [[ ! -x "$chromium" ]]; then
    echo "Chromium not found at $chromium. Install Debian's package (as root):" >&2
    echo "    apt-get update && apt-get install -y chromium" >&2
    echo "(never 'npx playwright install': browser downloads fail here)" >&2
    exit 1
fi

rota=${ROTA_BIN:-$(realpath -m ../../target/debug/rota)}
if [[ ! -x "$rota" ]]; then
    echo "rota binary not found at $rota: run 'cargo build' first or set ROTA_BIN" >&2
    exit 1
fi
export ROTA_BIN=$rota CHROMIUM=$chromium

mkdir -p artifacts
if [[ $# -gt 0 ]]; then
    exec node --test --test-concurrency=1 "$@"
fi
exec node --test --test-concurrency=1 ./*.test.mjs
