#!/usr/bin/env bash
# Sluice's main job on defaults (no special hardware: emulated media, a few
# minutes on 2 cores after the build):
#  1. Sluice served over NBD in real time: fio's 4 KiB random writes through
#     the write-shaping log on emulated SCM + QLC, beside the bare emulated
#     QLC on the same workload (MiB/s, p99, QLC bytes programmed);
#  2. the CSAL paper's table at --quick scale, in virtual time: the same
#     log on emulated SCM + QLC (and ZNS) beside the bare QLC, TLC and a
#     set-associative cache, on the same fio jobs;
#  3. caching over a plain disk at --quick scale: an SCM cache in front of
#     an emulated HDD, temporary data and HDFS-like streams, no cache
#     against caching everything against selective caching.
# `sluice bench media` (the bare QLC/TLC rows alone) stays its own command.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
cargo build --release -p sluice
S=target/release/sluice
echo
echo "== 1/3: Sluice in real time over NBD (scripts/bench-realtime.sh). fio 4 KiB random writes, queue"
echo "   depth 32, 20 s: the write-shaping log on emulated SCM + QLC against the bare emulated QLC. The"
echo "   bare drive read-modify-writes a 64 KiB IU per 4 KiB write; Sluice writes the QLC whole IUs."
RUNTIME=20 scripts/bench-realtime.sh 2>/dev/null | tail -5
echo
echo "== 2/3: the CSAL table (docs/csal.md). MiB/s per job and WAF (capacity media bytes programmed per"
echo "   byte written): sluice+qlc against the bare qlc row of the same workload is what the write-shaping"
echo "   log buys; busy c/cap says which device bounds each Sluice row."
"$S" bench csal --quick
echo
echo "== 3/3: caching over a plain disk (docs/caching.md). The HDD's bytes and busy time, and the temp"
echo "   job's throughput, with no cache, everything cached, and only what pays (selective)."
"$S" bench caching --quick
