#!/usr/bin/env bash
# Background compaction + set-point throttle against inline compaction, on the
# same server build and the same fio jobs, back to back:
#   - saturating: 4 KiB randwrite, iodepth 32, one NBD connection;
#   - paced: 4 KiB randwrite, iodepth 1, at RATE IOPS (a load the server can
#     sustain, where latency is what matters).
# Each runs RUNTIME seconds on examples/memory.toml (1 GiB cache log, 4 GiB
# volume), long enough for the log to wrap many times, with
# [engine] background_compaction = true, then = false.
# Prints IOPS, write latency percentiles (fio clat) and the compactor's
# counters from the metrics endpoint; writes target/bench/compaction.json.
# Environment: RUNTIME (s, default 30), RATE (default 20000), PORT (default 10809).
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/bench-lib.sh
bench_init compaction
RUNTIME=${RUNTIME:-30}
RATE=${RATE:-20000}
PORT=${PORT:-10809}
METRICS_PORT=$((PORT + 1))

metrics() { # the compactor's and engine's counters, as JSON
    python3 - "127.0.0.1:$METRICS_PORT" <<'PY'
import json, sys, urllib.request
body = urllib.request.urlopen(f"http://{sys.argv[1]}/metrics", timeout=5).read().decode()
want = ["sluice_compactor_chunks_total", "sluice_engine_chunks_compacted_total",
        "sluice_compactor_throttled_writes_total", "sluice_compactor_throttle_seconds_total",
        "sluice_compactor_bandwidth_bytes_per_second", "sluice_engine_bands_reclaimed_total"]
out = {}
for line in body.splitlines():
    name, _, value = line.rpartition(" ")
    if name in want:
        out[name] = float(value)
print(json.dumps(out))
PY
}

run_fio() { # name iodepth extra-args...
    local name=$1 qd=$2
    shift 2
    fio --name="$name" --ioengine=nbd --uri="nbd://127.0.0.1:$PORT/default" --rw=randwrite --bs=4k \
        --iodepth="$qd" --size=4g --time_based --runtime="$RUNTIME" "$@" \
        --output-format=json --output="$work/$name.json" >/dev/null
}

for mode in background inline; do
    bg=$([ "$mode" = background ] && echo true || echo false)
    sed "s/127.0.0.1:10809/127.0.0.1:$PORT/" examples/memory.toml > "$work/$mode.toml"
    printf 'metrics_listen = "127.0.0.1:%s"\n' "$METRICS_PORT" | cat - "$work/$mode.toml" > "$work/$mode.tmp"
    mv "$work/$mode.tmp" "$work/$mode.toml"
    printf '\n[engine]\nbackground_compaction = %s\n' "$bg" >> "$work/$mode.toml"
    (cd "$work" && exec "$SLUICE" serve --config "$work/$mode.toml" >/dev/null 2>&1) &
    pid=$!
    wait_nbd "nbd://127.0.0.1:$PORT/default"
    run_fio "$mode-qd32" 32
    metrics > "$work/$mode-qd32.metrics"
    run_fio "$mode-paced" 1 --rate_iops="$RATE"
    metrics > "$work/$mode-paced.metrics"
    kill -TERM $pid
    wait $pid || true
    echo "$mode done" >&2
done

python3 - "$work" "$OUT/compaction.json" "$RUNTIME" "$RATE" <<'PY'
import json, sys
work, out, runtime, rate = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
rows = []
for run in ["qd32", "paced"]:
    for mode in ["background", "inline"]:
        w = json.load(open(f"{work}/{mode}-{run}.json"))["jobs"][0]["write"]
        m = json.load(open(f"{work}/{mode}-{run}.metrics"))
        p = w["clat_ns"]["percentile"]
        rows.append({
            "run": run, "mode": mode, "iops": w["iops"],
            "p50_us": p["50.000000"] / 1e3, "p99_us": p["99.000000"] / 1e3,
            "p99_9_us": p["99.900000"] / 1e3, "p99_99_us": p["99.990000"] / 1e3,
            "max_us": w["clat_ns"]["max"] / 1e3, "metrics_cumulative": m,
        })
json.dump({"runtime_s": runtime, "paced_rate_iops": rate, "rows": rows}, open(out, "w"), indent=1)
print(f"{'run':<6} {'compaction':<11} {'IOPS':>8} {'p50 us':>8} {'p99 us':>8} {'p99.9 us':>9} {'p99.99 us':>10} {'max us':>9} {'bg chunks':>10} {'all chunks':>10} {'paced s':>8}")
for r in rows:
    m = r["metrics_cumulative"]
    print(f"{r['run']:<6} {r['mode']:<11} {r['iops']:>8.0f} {r['p50_us']:>8.1f} {r['p99_us']:>8.1f} {r['p99_9_us']:>9.1f} "
          f"{r['p99_99_us']:>10.1f} {r['max_us']:>9.0f} {m.get('sluice_compactor_chunks_total', 0):>10.0f} "
          f"{m.get('sluice_engine_chunks_compacted_total', 0):>10.0f} {m.get('sluice_compactor_throttle_seconds_total', 0):>8.2f}")
print(f"(counters cumulative per server; paced = iodepth 1 at {rate} IOPS; {runtime} s per run) -> {out}")
PY
