#!/usr/bin/env bash
# The fault suite (tests/it/faults.rs) alone, with its figures printed: the real `rota serve`
# under 32-way load while its database is unwritable, locked by an auditor or pinned by a long
# reader, while it is killed or stopped, and against slow and idle clients.
#
#   scripts/faults.sh           the sizes the test command runs (about 90 s)
#   scripts/faults.sh --long    the full figures: 30 s unwritable, 60 s locked, longer loads
#
# Needs root on a filesystem with attributes (ext4) for `chattr +i`.
set -euo pipefail
cd "$(dirname "$0")/.."
[[ ${1:-} == --long ]] && export ROTA_FAULTS_LONG=1
cargo test --locked --test it faults:: -- --nocapture --test-threads 1
