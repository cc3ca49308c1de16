#!/usr/bin/env bash
# The fault suite: what operators get wrong and what breaks, against a real
# `sluice serve` (crates/sluice/tests/faults.rs: two servers on one data
# directory, truncated, missing, foreign or mismatched devices, config
# changes the engine cannot apply, format and --force, a panic, a full
# filesystem, damaged log records and blocks with `sluice check` and
# `--salvage`, protocol violations), then the kill -9 loop with its
# durability checker (scripts/kill9-loop.py; KILLS, default 30, SEED).
# CI runs the first part as part of the test suite.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
cargo test --release -p sluice --test faults -- --test-threads=2
cargo build --release -p sluice
KILLS=${KILLS:-30} SLUICE=target/release/sluice /usr/bin/python3 scripts/kill9-loop.py
