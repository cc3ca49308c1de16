#!/usr/bin/env bash
# Reads outside the engine lock, measured: `sluice serve` on emulated SCM +
# QLC in memory, timed in real time. A 2 GiB region is written sequentially
# (it passes through the SCM log and compaction moves most of it to the
# QLC), then fio ioengine=nbd reads 4 KiB at random, QD32, with 1 and with 2
# jobs (connections), and 64 KiB at QD32 with 1 job. Before this change every
# device read ran under the engine lock, so reads of the QLC waited for each
# other. Prints IOPS and latency; writes target/bench/nbd-reads.json.
# Environment: RUNTIME (s per job, default 10), PORT (default 10813),
# SLUICE (binary under test, e.g. an older build).
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/bench-lib.sh
bench_init reads
RUNTIME=${RUNTIME:-10}
PORT=${PORT:-10813}
serve_emulated_qlc "$PORT" ""
uri="nbd://127.0.0.1:$PORT/default"
fio --name=fill --ioengine=nbd --uri="$uri" --rw=write --bs=1m --iodepth=8 --size=2g >/dev/null
rows=()
run() { # name bs numjobs
    fio --name="$1" --ioengine=nbd --uri="$uri" --rw=randread --bs="$2" --iodepth=32 --numjobs="$3" \
        --group_reporting --size=2g --time_based --runtime="$RUNTIME" --output-format=json \
        --output="$work/$1.json" >/dev/null
    local row
    row=$(python3 - "$work/$1.json" "$1" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))["jobs"][0]["read"]
p = r["clat_ns"]["percentile"]
print(json.dumps({"job": sys.argv[2], "iops": round(r["iops"]), "p50_us": round(p["50.000000"] / 1e3),
                  "p99_us": round(p["99.000000"] / 1e3)}))
PY
)
    echo "$row" >&2
    rows+=("$row")
}
run randread-4k-1job 4k 1
run randread-4k-2jobs 4k 2
run randread-64k-1job 64k 1
kill -TERM %1
wait || true
echo "[$(IFS=,; echo "${rows[*]}")]" >"$OUT/nbd-reads.json"
