#!/usr/bin/env bash
# The Hadoop temp-data experiment (docs/hadoop.md): Spark jobs (TeraSort-style
# sort, a wide group-by, a join) with their data on ext4 over an emulated
# 7200 rpm HDD served by `sluice serve` in real time, and their temporary data
# placed case by case (same HDD; a Sluice SCM cache selected by directory
# class or by a volume of its own; SCM only; half the cache; a cache that
# admits everything). Installs what it needs: the NBD clients and e2fsprogs
# (scripts/setup.sh), Java 17, and pyspark 4.3.0 in target/hadoop-venv.
# Needs root (loop devices, mounts, a memory cgroup).
#
#   scripts/bench-hadoop.sh --quick            # 1M records per job, one repeat
#   scripts/bench-hadoop.sh                    # 4M records, 3 repeats
#   scripts/bench-hadoop.sh --disks 1,2,4 --cases a-hdd,b2-volume
#
# Writes target/bench/hadoop.json and target/bench/hadoop.svg, prints a table.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
if ! command -v java >/dev/null 2>&1; then
    SUDO=""
    [ "$(id -u)" -eq 0 ] || SUDO="sudo"
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get -o DPkg::Lock::Timeout=600 -y -q install openjdk-17-jre-headless >/dev/null
fi
venv=target/hadoop-venv
if ! "$venv/bin/python" -c 'import pyspark; assert pyspark.__version__ == "4.3.0"' >/dev/null 2>&1; then
    python3 -m venv "$venv"
    "$venv/bin/pip" install -q 'pyspark==4.3.0'
fi
cargo build --release -q -p sluice
quick=()
for a in "$@"; do [ "$a" = "--quick" ] && quick=(--repeats 1); done
exec python3 scripts/hadoop/bench.py "${quick[@]}" "$@"
