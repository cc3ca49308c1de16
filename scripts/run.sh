#!/usr/bin/env bash
# Sluice's main job on defaults: build, then regenerate the CSAL paper's
# QLC/TLC rows on the media emulators (no special hardware needed).
# Extra arguments go to `sluice bench media` (e.g. --quick).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
cargo build --release -p sluice
exec target/release/sluice bench media "$@"
