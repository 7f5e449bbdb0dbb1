#!/usr/bin/env bash
# Regenerates the console's pictures in docs/img/ (each view at 1440 and 390 px wide) from the
# browser tests that check those views (tests/browser/views.test.mjs; signins.test.mjs for each way
# to add an account; operators.test.mjs for sign-in, roles and changes; firsthour.test.mjs for the
# Alerts view), so the pictures show what
# the tests saw.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --locked --bin rota
ROTA_DOC_SHOTS=1 tests/browser/run.sh views.test.mjs signins.test.mjs operators.test.mjs firsthour.test.mjs
ls -l docs/img/
