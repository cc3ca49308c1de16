#!/usr/bin/env bash
# Installs what Sluice's build, tests and benchmarks need on a fresh Debian
# machine of this kind (Rust toolchain already present). Idempotent and
# non-interactive: safe to run on every invocation.
set -euo pipefail

# Debian packages: fio is the reference peer for the workload generator and
# the io_uring benchmark.
need=()
command -v fio >/dev/null 2>&1 || need+=(fio)
if ((${#need[@]})); then
    export DEBIAN_FRONTEND=noninteractive
    SUDO=""
    [ "$(id -u)" -eq 0 ] || SUDO="sudo"
    echo "setup: installing ${need[*]}" >&2
    $SUDO apt-get install -y -q "${need[@]}" >/dev/null 2>&1 ||
        { $SUDO apt-get update -q >/dev/null && $SUDO apt-get install -y -q "${need[@]}" >/dev/null; }
fi
