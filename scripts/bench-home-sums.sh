#!/usr/bin/env bash
# What checking home checksums costs a read (docs/caching.md, "Home
# checksums"): `sluice serve` in place on memory devices (no emulation, so
# the CRC is all that differs), the volume pass-through so every block goes
# home and every read comes from home. A 2 GiB region is written
# sequentially and flushed (its homes then carry sums), then fio
# ioengine=nbd reads it: 4 KiB at random, QD32, 1 and 2 jobs, and 128 KiB
# sequentially. Each row runs with `[engine] home_sums = true` and `false`
# (a fresh engine each), alternated over REPEATS; prints each run and the
# ratio of the medians on/off (with each side's range); writes target/bench/home-sums.json.
# Environment: RUNTIME (s per job, default 8), REPEATS (default 5), PORT
# (default 10815), SLUICE (binary under test).
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/bench-lib.sh
bench_init home-sums
RUNTIME=${RUNTIME:-8}
REPEATS=${REPEATS:-5}
PORT=${PORT:-10815}
uri="nbd://127.0.0.1:$PORT/default"

serve() { # home_sums
    rm -rf "$work/run"
    mkdir -p "$work/run"
    cat >"$work/run/sluice.toml" <<TOML
data_dir = "data"
listen = ["127.0.0.1:$PORT"]
unix_socket = ""
control_socket = ""
[cache]
kind = "memory"
size = "1g"
[capacity]
kind = "memory"
size = "4g"
[engine]
layout = "in-place"
home_sums = $1
[[volume]]
name = "default"
size = "3g"
mode = "pt"
TOML
    (cd "$work/run" && exec "$SLUICE" serve --config sluice.toml >/dev/null 2>"$work/run/err") &
    wait_nbd "$uri"
    fio --name=fill --ioengine=nbd --uri="$uri" --rw=write --bs=1m --iodepth=8 --size=2g --end_fsync=1 >/dev/null
}

job() { # name rw bs numjobs -> "iops"
    fio --name="$1" --ioengine=nbd --uri="$uri" --rw="$2" --bs="$3" --iodepth=32 --numjobs="$4" \
        --group_reporting --size=2g --time_based --runtime="$RUNTIME" --output-format=json \
        --output="$work/$1.json" >/dev/null
    python3 -c 'import json,sys; print(round(json.load(open(sys.argv[1]))["jobs"][0]["read"]["iops"]))' "$work/$1.json"
}

rows=()
for r in $(seq "$REPEATS"); do
    for sums in true false; do
        serve "$sums"
        a=$(job rr1 randread 4k 1)
        b=$(job rr2 randread 4k 2)
        c=$(job sr read 128k 1)
        kill -TERM %1
        wait || true
        row="{\"repeat\": $r, \"home_sums\": $sums, \"randread_4k_1job\": $a, \"randread_4k_2jobs\": $b, \"read_128k\": $c}"
        echo "$row" >&2
        rows+=("$row")
    done
done
echo "[$(IFS=,; echo "${rows[*]}")]" >"$OUT/home-sums.json"
python3 - "$OUT/home-sums.json" <<'PY'
import json, statistics, sys
rows = json.load(open(sys.argv[1]))
for k in ("randread_4k_1job", "randread_4k_2jobs", "read_128k"):
    on = [r[k] for r in rows if r["home_sums"]]
    off = [r[k] for r in rows if not r["home_sums"]]
    m_on, m_off = statistics.median(on), statistics.median(off)
    print(f"{k}: home_sums on {m_on:,.0f} IOPS (median; {min(on):,}-{max(on):,}), "
          f"off {m_off:,.0f} ({min(off):,}-{max(off):,}): on/off {m_on / m_off:.3f}")
PY
