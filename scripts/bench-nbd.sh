#!/usr/bin/env bash
# Sluice's NBD server against its peers, back to back in one run: the same fio
# ioengine=nbd jobs (4 KiB randwrite and randread at iodepth 32, 128 KiB
# sequential write) against
#   - sluice serve on memory-backed devices, emulation off (examples/memory.toml)
#   - nbdkit memory
#   - qemu-nbd on a tmpfs file
# Prints a table and writes target/bench/nbd-peers.json.
# Environment: RUNTIME (s per job, default 10), SIZE (default 1g), PORT (default 10809).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
cargo build --release -q -p sluice
# SLUICE: the binary under test (default: the one just built), e.g. an older
# build to measure a change before and after.
SLUICE=$(realpath "${SLUICE:-target/release/sluice}")
RUNTIME=${RUNTIME:-10}
SIZE=${SIZE:-1g}
PORT=${PORT:-10809}
OUT=target/bench
mkdir -p "$OUT"
work=$(mktemp -d /dev/shm/sluice-bench-nbd.XXXXXX)
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$work"' EXIT

wait_port() { # up to 60 s: examples/memory.toml touches 7 GiB at start
    for _ in $(seq 600); do
        nbdinfo --size "nbd://127.0.0.1:$PORT/$1" >/dev/null 2>&1 && return 0
        sleep 0.1
    done
    echo "server on port $PORT did not come up" >&2
    return 1
}

run_fio() { # name export rw bs
    fio --name="$1" --ioengine=nbd --uri="nbd://127.0.0.1:$PORT/$2" --rw="$3" --bs="$4" \
        --iodepth=32 --size="$SIZE" --time_based --runtime="$RUNTIME" --numjobs=1 \
        --output-format=json --output="$work/$1.json" >/dev/null
    python3 - "$work/$1.json" "$3" <<'PY'
import json, sys
j = json.load(open(sys.argv[1]))["jobs"][0]
side = "read" if "read" in sys.argv[2] else "write"
print(f'{j[side]["iops"]:.0f} {j[side]["bw"] / 1024:.1f}')
PY
}

declare -A result
bench_server() { # label export
    for job in "randwrite 4k" "randread 4k" "write 128k"; do
        set -- $job
        r=$(run_fio "$LABEL-$1-$2" "$EXPORT" "$1" "$2")
        result["$LABEL,$1-$2"]="$r"
        echo "$LABEL $1 $2: $r (IOPS MiB/s)" >&2
    done
}

# sluice
LABEL=sluice EXPORT=default
sed "s/127.0.0.1:10809/127.0.0.1:$PORT/" examples/memory.toml > "$work/memory.toml"
(cd "$work" && exec "$SLUICE" serve --config "$work/memory.toml" >/dev/null 2>&1) &
pid=$!
wait_port default
# Fill the volume so reads hit written data.
fio --name=fill --ioengine=nbd --uri="nbd://127.0.0.1:$PORT/default" --rw=write --bs=1m --iodepth=8 --size="$SIZE" >/dev/null
bench_server
kill -TERM $pid; wait $pid || true

# nbdkit memory
LABEL=nbdkit EXPORT=""
nbdkit --foreground --exit-with-parent -p "$PORT" -i 127.0.0.1 memory 4G &
pid=$!
wait_port ""
fio --name=fill --ioengine=nbd --uri="nbd://127.0.0.1:$PORT/" --rw=write --bs=1m --iodepth=8 --size="$SIZE" >/dev/null
bench_server
kill $pid; wait $pid 2>/dev/null || true

# qemu-nbd on tmpfs
LABEL=qemu-nbd EXPORT=""
truncate -s 4G "$work/disk.raw"
qemu-nbd -t -f raw -b 127.0.0.1 -p "$PORT" --cache=none --aio=io_uring "$work/disk.raw" 2>/dev/null &
pid=$!
wait_port "" || { qemu-nbd -t -f raw -b 127.0.0.1 -p "$PORT" "$work/disk.raw" & pid=$!; wait_port ""; }
fio --name=fill --ioengine=nbd --uri="nbd://127.0.0.1:$PORT/" --rw=write --bs=1m --iodepth=8 --size="$SIZE" >/dev/null
bench_server
kill $pid; wait $pid 2>/dev/null || true

python3 - "$OUT/nbd-peers.json" <<PY
import json, sys
rows = []
data = """$(for k in "${!result[@]}"; do echo "$k ${result[$k]}"; done)"""
for line in data.strip().splitlines():
    key, iops, mib = line.split()
    server, job = key.split(",")
    rows.append({"server": server, "job": job, "iops": float(iops), "mib_per_s": float(mib)})
json.dump(rows, open(sys.argv[1], "w"), indent=1)
by = {(r["server"], r["job"]): r for r in rows}
print(f'{"job":<15}{"sluice":>12}{"nbdkit":>12}{"qemu-nbd":>12}{"vs nbdkit":>11}{"vs qemu-nbd":>13}')
for job in ["randwrite-4k", "randread-4k", "write-128k"]:
    s, n, q = (by[(x, job)] for x in ["sluice", "nbdkit", "qemu-nbd"])
    unit = "iops" if "4k" in job else "mib_per_s"
    print(f'{job:<15}{s[unit]:>12.0f}{n[unit]:>12.0f}{q[unit]:>12.0f}{s[unit]/n[unit]:>10.2f}x{s[unit]/q[unit]:>12.2f}x')
print("4 KiB rows in IOPS, 128 KiB row in MiB/s; goal: sluice >= 1.2x nbdkit and >= 1.5x qemu-nbd on 4 KiB IOPS")
PY
