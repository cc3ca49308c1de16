#!/usr/bin/env bash
# Sluice over NBD in real time, beside the bare drive, on the same workload:
# fio (ioengine=nbd) 4 KiB random writes at queue depth 32 over 2 GiB, for
# RUNTIME seconds (default 20), against
#   - sluice: the write-shaping log on an emulated Optane-like SCM (1 GiB)
#     in front of an emulated 16 GiB QLC (64 KiB IU), both memory-backed
#     and timed in real time (docs/media.md);
#   - bare qlc: the same emulated QLC behind a pass-through volume (an
#     in-place engine whose every write goes straight to the drive).
# Per system: MiB/s, write latency p50/p99 (fio's completion latency), and
# the QLC's media bytes programmed per byte the client wrote during the run
# (its write amplification as the client sees it: the bare drive turns each
# 4 KiB write into a 64 KiB read-modify-write of an IU; Sluice writes it
# whole IUs, later). Writes target/bench/realtime.json.
# Environment: RUNTIME (s, default 20), PORT (default 10809), SLUICE (the
# binary under test, scripts/bench-lib.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/bench-lib.sh
bench_init realtime
RUNTIME=${RUNTIME:-20}
PORT=${PORT:-10809}
MPORT=$((PORT + 1))

# metric NAME: its value on the running server's metrics endpoint.
metric() {
    python3 - "$MPORT" "$1" <<'PY'
import sys, urllib.request
body = urllib.request.urlopen(f"http://127.0.0.1:{sys.argv[1]}/metrics", timeout=10).read().decode()
print(next((l.rsplit(" ", 1)[1] for l in body.splitlines() if l.startswith(sys.argv[2] + " ")), "0"))
PY
}

# run SYSTEM: fio against the server on $PORT, one line of results.
run() {
    local media='sluice_device_media_program_bytes_total{device="capacity"}' m0 m1
    m0=$(metric "$media")
    fio --name="$1" --ioengine=nbd --uri="nbd://127.0.0.1:$PORT/default" --rw=randwrite --bs=4k \
        --iodepth=32 --size=2g --time_based --runtime="$RUNTIME" --randseed=42 \
        --output-format=json --output="$work/$1.json" >/dev/null
    m1=$(metric "$media")
    python3 - "$work/$1.json" "$1" "$m0" "$m1" <<'PY' | tee -a "$work/rows"
import json, sys
j = json.load(open(sys.argv[1]))["jobs"][0]["write"]
pct = j["clat_ns"]["percentile"]
written = j["io_bytes"] or 1
programmed = float(sys.argv[4]) - float(sys.argv[3])
print(json.dumps({"system": sys.argv[2], "mib_per_s": j["bw"] / 1024, "p50_us": pct["50.000000"] / 1e3,
                  "p99_us": pct["99.000000"] / 1e3, "written_mib": written / 2**20,
                  "qlc_programmed_mib": programmed / 2**20, "qlc_bytes_per_byte": programmed / written}))
PY
}

: >"$work/rows"
serve_emulated_qlc "$PORT" "127.0.0.1:$MPORT"
run sluice+qlc
kill -TERM %1; wait || true

cat >"$work/bare.toml" <<TOML
data_dir = "data-bare"
listen = ["127.0.0.1:$PORT"]
unix_socket = ""
metrics_listen = "127.0.0.1:$MPORT"
[cache]
kind = "memory"
size = "64m"
[capacity]
kind = "memory"
size = "16g"
emulate = "qlc"
[engine]
layout = "in-place"
chunk_size = "4m"
[[volume]]
name = "default"
size = "12g"
mode = "pt"
TOML
(cd "$work" && exec "$SLUICE" serve --config bare.toml >/dev/null 2>&1) &
wait_nbd "nbd://127.0.0.1:$PORT/default"
run qlc
kill -TERM %1; wait || true

python3 - "$work/rows" "$OUT/realtime.json" "$RUNTIME" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
json.dump(rows, open(sys.argv[2], "w"), indent=1)
by = {r["system"]: r for r in rows}
print(f"4 KiB random writes, queue depth 32, {sys.argv[3]} s each, over NBD in real time (emulated media):")
print(f'{"system":<12}{"MiB/s":>9}{"p50 us":>10}{"p99 us":>10}{"QLC MiB programmed":>20}{"per MiB written":>17}')
for s in ["sluice+qlc", "qlc"]:
    r = by[s]
    print(f'{s:<12}{r["mib_per_s"]:>9.1f}{r["p50_us"]:>10.0f}{r["p99_us"]:>10.0f}{r["qlc_programmed_mib"]:>20.1f}'
          f'{r["qlc_bytes_per_byte"]:>17.2f}')
s, q = by["sluice+qlc"], by["qlc"]
print(f'sluice+qlc: {s["mib_per_s"] / max(q["mib_per_s"], 1e-9):.1f}x the bare drive\'s MiB/s, '
      f'p99 {q["p99_us"] / max(s["p99_us"], 1e-9):.1f}x lower; the QLC programmed '
      f'{s["qlc_bytes_per_byte"]:.2f} bytes per byte written against {q["qlc_bytes_per_byte"]:.2f}')
PY
