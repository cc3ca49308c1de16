#!/usr/bin/env bash
# Installs what Sluice's build, tests and benchmarks need on a fresh Debian
# machine of this kind (Rust toolchain already present). Idempotent and
# non-interactive: safe to run on every invocation.
set -euo pipefail

# Debian packages: fio is the reference peer for the workload generator and
# the io_uring benchmark; the NBD clients and peers test and measure the server.
need=()
command -v fio >/dev/null 2>&1 || need+=(fio)
command -v openssl >/dev/null 2>&1 || need+=(openssl)
command -v qemu-io >/dev/null 2>&1 || need+=(qemu-utils)
command -v nbdinfo >/dev/null 2>&1 || need+=(libnbd-bin)
command -v nbdkit >/dev/null 2>&1 || need+=(nbdkit)
command -v mkfs.ext4 >/dev/null 2>&1 || need+=(e2fsprogs)
command -v losetup >/dev/null 2>&1 || need+=(mount)
/usr/bin/python3 -c 'import nbd' >/dev/null 2>&1 || need+=(python3-libnbd)
/usr/bin/python3 -c 'import prometheus_client' >/dev/null 2>&1 || need+=(python3-prometheus-client)
if ((${#need[@]})); then
    export DEBIAN_FRONTEND=noninteractive
    SUDO=""
    [ "$(id -u)" -eq 0 ] || SUDO="sudo"
    echo "setup: installing ${need[*]}" >&2
    # Wait for another apt (unattended upgrades, a second job) rather than
    # failing at once, and let apt's own errors through.
    apt=($SUDO apt-get -o DPkg::Lock::Timeout=600 -y -q)
    "${apt[@]}" install "${need[@]}" >/dev/null ||
        { echo "setup: install failed; updating the package lists and retrying" >&2 &&
            "${apt[@]}" update >/dev/null && "${apt[@]}" install "${need[@]}"; }
fi
