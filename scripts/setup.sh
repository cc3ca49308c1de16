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
if ((${#need[@]})); then
    export DEBIAN_FRONTEND=noninteractive
    SUDO=""
    [ "$(id -u)" -eq 0 ] || SUDO="sudo"
    echo "setup: installing ${need[*]}" >&2
    $SUDO apt-get install -y -q "${need[@]}" >/dev/null 2>&1 ||
        { $SUDO apt-get update -q >/dev/null && $SUDO apt-get install -y -q "${need[@]}" >/dev/null; }
fi
