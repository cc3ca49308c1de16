#!/usr/bin/env bash
# Byte-granular clients (issue 37 item 11): the integrity trace of
# scripts/subblock-trace.py (4 connections that never negotiate block sizes:
# 512-byte-granular writes of 512 B-8 KiB, some FUA, checked reads, zeroes,
# trims, flushes) against `sluice serve` on its default file config and
# `nbdkit file` on a file in the same directory, REPEATS runs each (all of
# sluice's, then all of nbdkit's; a failed data check stops the script);
# then one connection's 1 KiB and 4 KiB writes and reads at queue depth 1.
# Goal: sluice within 1.5x nbdkit file's time on the trace.
# Usage: [REPEATS=3] [OPS=5000] [DIR=target/bench/subblock] scripts/bench-subblock.sh
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/bench-lib.sh
bench_init subblock
REPEATS=${REPEATS:-3} OPS=${OPS:-5000} PORT=${PORT:-10831}
dir=${DIR:-$OUT/subblock}
rm -rf "$dir" && mkdir -p "$dir" && dir=$(realpath "$dir")
printf 'data_dir = "%s/sluice-data"\nlisten = ["127.0.0.1:%s"]\nmetrics_listen = ""\nunix_socket = ""\n' "$dir" "$PORT" >"$dir/sluice.toml"
truncate -s 4G "$dir/nbdkit.img"
py=/usr/bin/python3
qd1() { # URI BYTES: MiB/s of 20,000 sequential writes, then reads, one connection
    $py - "$1" "$2" <<'PY'
import nbd, sys, time
h = nbd.NBD(); h.set_request_block_size(False); h.connect_uri(sys.argv[1])
b = int(sys.argv[2]); d = b"x" * b; n = 20000
t = time.time()
for i in range(n): h.pwrite(d, i * b)
h.flush(); w = n * b / (time.time() - t) / 2**20
t = time.time()
for i in range(n): h.pread(b, i * b)
r = n * b / (time.time() - t) / 2**20
print(f"{w:.1f} {r:.1f}")
PY
}
run() { # NAME URI START...
    local name=$1 uri=$2; shift 2
    "$@" >/dev/null 2>&1 &
    local pid=$!
    wait_nbd "$uri"
    for r in $(seq "$REPEATS"); do
        local out
        out=$($py scripts/subblock-trace.py "$uri" "$r" "$OPS" 4)
        echo "$name trace $r: $out"
    done
    echo "$name qd1 1k write/read MiB/s: $(qd1 "$uri" 1024)"
    echo "$name qd1 4k write/read MiB/s: $(qd1 "$uri" 4096)"
    kill -TERM $pid; wait $pid 2>/dev/null || true
}
{
    run sluice "nbd://127.0.0.1:$PORT/default" "$SLUICE" serve --config "$dir/sluice.toml"
    run nbdkit "nbd://127.0.0.1:$PORT" nbdkit --foreground --exit-with-parent -p "$PORT" -i 127.0.0.1 file "$dir/nbdkit.img"
} | tee "$OUT/subblock.txt"
$py - "$OUT/subblock.txt" <<'PY'
import re, statistics, sys
t = {"sluice": [], "nbdkit": []}
for line in open(sys.argv[1]):
    m = re.match(r"(\w+) trace \d+: OK ([\d.]+) s", line)
    if m: t[m[1]].append(float(m[2]))
s, n = statistics.median(t["sluice"]), statistics.median(t["nbdkit"])
print(f"trace median: sluice {s:.2f} s, nbdkit file {n:.2f} s: {s / n:.2f}x (goal <= 1.5x)")
PY
rm -rf "$dir"
