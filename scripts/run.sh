#!/usr/bin/env bash
# Sluice's main job on defaults (no special hardware: emulated media in
# virtual time, a few minutes on 2 cores after the build):
#  1. the CSAL paper's table at --quick scale: Sluice's write-shaping log on
#     emulated SCM + QLC (and ZNS) beside the bare QLC, TLC and a
#     set-associative cache, on the same fio jobs;
#  2. caching over a plain disk at --quick scale: an SCM cache in front of
#     an emulated HDD, temporary data and HDFS-like streams, no cache
#     against caching everything against selective caching.
# `sluice bench media` (the bare QLC/TLC rows alone) stays its own command.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
cargo build --release -p sluice
S=target/release/sluice
echo
echo "== 1/2: the CSAL table (docs/csal.md). MiB/s per job and WAF (capacity media bytes programmed per"
echo "   byte written): sluice+qlc against the bare qlc row of the same workload is what the write-shaping"
echo "   log buys; busy c/cap says which device bounds each Sluice row."
"$S" bench csal --quick
echo
echo "== 2/2: caching over a plain disk (docs/caching.md). The HDD's bytes and busy time, and the temp"
echo "   job's throughput, with no cache, everything cached, and only what pays (selective)."
"$S" bench caching --quick
