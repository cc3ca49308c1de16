#!/usr/bin/env bash
# The whole test suite: installs the peers the tests compare against (fio),
# then runs every crate's unit and integration tests.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
# Two cores: two test threads, release-like opt-level from [profile.test].
# --no-fail-fast: a failing crate does not hide the others' results.
cargo test --workspace --no-fail-fast -- --test-threads=2
