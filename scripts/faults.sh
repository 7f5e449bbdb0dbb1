#!/usr/bin/env bash
# The fault suite (tests/it/faults.rs) alone, with its figures printed: the real `rota serve`
# under load while its database is unwritable, locked by an auditor or pinned by a long reader,
# while its disk fills up, while it is killed or stopped, against slow and idle clients, and at
# the saturated rate.
#
#   scripts/faults.sh           the sizes the test command runs (about 2 min), 32 clients, debug build
#   scripts/faults.sh --long    the full figures against a release build, 64 clients (enough to
#                               saturate it here): 60 s saturated, 30 s unwritable, 60 s locked,
#                               5 kills after 10 s of load each (about 8 min)
#
# Needs root: `chattr +i` on a filesystem with attributes (ext4), and a loop-mounted ext4 file
# system for the full disk.
set -euo pipefail
cd "$(dirname "$0")/.."
if [[ ${1:-} == --long ]]; then
    export ROTA_FAULTS_LONG=1
    cargo build --locked --release --bin rota
    ROTA_FAULTS_BIN="$(realpath "${CARGO_TARGET_DIR:-target}/release/rota")"
    export ROTA_FAULTS_BIN
fi
cargo test --locked --test it faults:: -- --nocapture --test-threads 1
