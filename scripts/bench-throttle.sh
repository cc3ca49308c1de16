#!/usr/bin/env bash
# The set-point controller at work: sluice serve on an emulated Optane-like
# cache in front of an emulated QLC drive, in real time (memory-backed, so no
# disk is needed), under 4 KiB random writes at iodepth 32 that outrun
# compaction into the QLC. Every INTERVAL seconds it prints the free log
# chunks (the set point is 25 % of them), the chunks compacted in the
# background and in all, the writes the controller delayed, the measured
# drain bandwidth and the clients' write rate; at the end fio's latency
# percentiles. Expect the free chunks to settle at the set point with no
# inline compaction, and writes paced instead of stopped.
# Environment: RUNTIME (s, default 60), INTERVAL (s, default 3), PORT (default 10809).
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/bench-lib.sh
bench_init throttle
RUNTIME=${RUNTIME:-60}
INTERVAL=${INTERVAL:-3}
PORT=${PORT:-10809}
METRICS="127.0.0.1:$((PORT + 1))"
serve_emulated_qlc "$PORT" "$METRICS"
fio --name=throttle --ioengine=nbd --uri="nbd://127.0.0.1:$PORT/default" --rw=randwrite --bs=4k --iodepth=32 \
    --size=12g --time_based --runtime="$RUNTIME" --output-format=json --output="$work/fio.json" >/dev/null &
fio_pid=$!
python3 - "$METRICS" "$INTERVAL" "$fio_pid" <<'PY'
import os, sys, time, urllib.request
addr, interval, fio = sys.argv[1], float(sys.argv[2]), int(sys.argv[3])
def scrape():
    out = {}
    for line in urllib.request.urlopen(f"http://{addr}/metrics", timeout=5).read().decode().splitlines():
        if not line.startswith("#"):
            k, _, v = line.rpartition(" ")
            out[k] = float(v)
    return out
user = 'sluice_volume_bytes_total{volume="default",op="write"}'
print(f"{'t s':>5} {'free chunks':>11} {'of':>4} {'bg chunks':>9} {'all chunks':>10} {'paced writes':>12} "
      f"{'paced s':>8} {'drain MB/s':>10} {'write MB/s':>10}")
prev, t0 = scrape(), time.time()
while os.path.exists(f"/proc/{fio}"):
    time.sleep(interval)
    m = scrape()
    print(f"{time.time() - t0:>5.0f} {m['sluice_cache_log_chunks_free']:>11.0f} {m['sluice_cache_log_chunks']:>4.0f} "
          f"{m['sluice_compactor_chunks_total']:>9.0f} {m['sluice_engine_chunks_compacted_total']:>10.0f} "
          f"{m['sluice_compactor_throttled_writes_total']:>12.0f} {m['sluice_compactor_throttle_seconds_total']:>8.2f} "
          f"{m['sluice_compactor_bandwidth_bytes_per_second'] / 1e6:>10.1f} {(m[user] - prev[user]) / interval / 1e6:>10.1f}")
    prev = m
PY
wait "$fio_pid" || true
python3 - "$work/fio.json" <<'PY'
import json, sys
w = json.load(open(sys.argv[1]))["jobs"][0]["write"]
p = w["clat_ns"]["percentile"]
print(f"fio: {w['iops']:.0f} IOPS, latency p50 {p['50.000000'] / 1e3:.0f} us, p99 {p['99.000000'] / 1e3:.0f} us, "
      f"p99.9 {p['99.900000'] / 1e3:.0f} us, max {w['clat_ns']['max'] / 1e3:.0f} us")
PY
