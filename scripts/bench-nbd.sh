#!/usr/bin/env bash
# Sluice's NBD server against its peers, back to back in one run: the same fio
# ioengine=nbd jobs (4 KiB randwrite and randread at iodepth 32, with one and
# with two fio jobs — one NBD connection each —, and 128 KiB sequential write)
# against
#   - sluice serve on memory-backed devices, emulation off (examples/memory.toml)
#   - nbdkit memory
#   - qemu-nbd on a tmpfs file
# Prints a table and writes target/bench/nbd-peers.json. Besides IOPS it
# reports the server's CPU time per request (utime+stime from /proc over the
# run): with one job the fio client saturates a core before the servers do
# on this 2-core machine, so IOPS alone hides the servers' own cost.
# The flush row: fio 4 KiB randwrite, iodepth 32, a flush after every 4
# writes (fsync=4), against `sluice serve` on its default file-backed config
# and `nbdkit file` on a file in the same directory, on the disk under
# target/bench (not /dev/shm: a flush must reach a disk to cost anything).
# Environment: RUNTIME (s per job, default 10), SIZE (default 1g), PORT (default 10809),
# ONLY=flush (just the flush row), FLUSH_DIR (default target/bench/flush).
# SLUICE: the binary under test (scripts/bench-lib.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/bench-lib.sh
bench_init nbd
RUNTIME=${RUNTIME:-10}
SIZE=${SIZE:-1g}
PORT=${PORT:-10809}

wait_port() { # export
    wait_nbd "nbd://127.0.0.1:$PORT/$1"
}

run_fio() { # name export rw bs numjobs [more fio options]
    local t0 t1
    t0=$(cpu_ticks "$pid")
    fio --name="$1" --ioengine=nbd --uri="nbd://127.0.0.1:$PORT/$2" --rw="$3" --bs="$4" \
        --iodepth=32 --size="$SIZE" --time_based --runtime="$RUNTIME" --numjobs="$5" --group_reporting \
        --output-format=json --output="$work/$1.json" "${@:6}" >/dev/null
    t1=$(cpu_ticks "$pid")
    python3 - "$work/$1.json" "$3" "$((t1 - t0))" "$(getconf CLK_TCK)" <<'PY'
import json, sys
j = json.load(open(sys.argv[1]))["jobs"][0]
side = "read" if "read" in sys.argv[2] else "write"
ios = j[side]["total_ios"] or 1
cpu_us = int(sys.argv[3]) / int(sys.argv[4]) * 1e6 / ios
print(f'{j[side]["iops"]:.0f} {j[side]["bw"] / 1024:.1f} {cpu_us:.2f}')
PY
}

declare -A result

# The flush row (see the header): sluice on its default config, nbdkit file.
flush_row() {
    local dir=${FLUSH_DIR:-$OUT/flush}
    rm -rf "$dir" && mkdir -p "$dir"
    dir=$(realpath "$dir")
    printf 'data_dir = "%s/sluice-data"\nlisten = ["127.0.0.1:%s"]\nmetrics_listen = ""\n' "$dir" "$PORT" >"$dir/sluice.toml"
    "$SLUICE" serve --config "$dir/sluice.toml" >/dev/null 2>&1 &
    pid=$!
    wait_port default
    result["sluice,randwrite-4k-fsync4"]=$(run_fio flush-sluice default randwrite 4k 1 --fsync=4)
    kill -TERM $pid; wait $pid || true
    truncate -s 4G "$dir/nbdkit.img"
    nbdkit --foreground --exit-with-parent -p "$PORT" -i 127.0.0.1 file "$dir/nbdkit.img" &
    pid=$!
    wait_port ""
    result["nbdkit,randwrite-4k-fsync4"]=$(run_fio flush-nbdkit "" randwrite 4k 1 --fsync=4)
    kill $pid; wait $pid 2>/dev/null || true
    echo "flush row: sluice ${result["sluice,randwrite-4k-fsync4"]}, nbdkit file ${result["nbdkit,randwrite-4k-fsync4"]} (IOPS MiB/s server-CPU-us/IO)" >&2
    rm -rf "$dir"
}

if [ "${ONLY:-}" = flush ]; then
    flush_row
    exit 0
fi

bench_server() { # label export
    for job in "randwrite 4k 1" "randread 4k 1" "randwrite 4k 2" "randread 4k 2" "write 128k 1"; do
        set -- $job
        r=$(run_fio "$LABEL-$1-$2-$3" "$EXPORT" "$1" "$2" "$3")
        result["$LABEL,$1-$2-j$3"]="$r"
        echo "$LABEL $1 $2 x$3: $r (IOPS MiB/s server-CPU-us/IO)" >&2
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

flush_row

python3 - "$OUT/nbd-peers.json" <<PY
import json, sys
rows = []
data = """$(for k in "${!result[@]}"; do echo "$k ${result[$k]}"; done)"""
for line in data.strip().splitlines():
    key, iops, mib, cpu_us = line.split()
    server, job = key.split(",")
    rows.append({"server": server, "job": job, "iops": float(iops), "mib_per_s": float(mib),
                 "server_cpu_us_per_io": float(cpu_us)})
json.dump(rows, open(sys.argv[1], "w"), indent=1)
by = {(r["server"], r["job"]): r for r in rows}
print(f'{"job (x fio jobs)":<18}{"sluice":>10}{"nbdkit":>10}{"qemu-nbd":>10}{"vs nbdkit":>11}{"vs qemu-nbd":>13}'
      f'   server CPU us/IO: sluice / nbdkit / qemu-nbd')
for job in ["randwrite-4k-j1", "randread-4k-j1", "randwrite-4k-j2", "randread-4k-j2", "write-128k-j1"]:
    s, n, q = (by[(x, job)] for x in ["sluice", "nbdkit", "qemu-nbd"])
    unit = "iops" if "4k" in job else "mib_per_s"
    cpu = " / ".join(f'{r["server_cpu_us_per_io"]:.1f}' for r in (s, n, q))
    print(f'{job:<18}{s[unit]:>10.0f}{n[unit]:>10.0f}{q[unit]:>10.0f}{s[unit]/n[unit]:>10.2f}x{s[unit]/q[unit]:>12.2f}x   {cpu}')
s, n = by[("sluice", "randwrite-4k-fsync4")], by[("nbdkit", "randwrite-4k-fsync4")]
print(f'{"randwrite-4k-fsync4":<18}{s["iops"]:>10.0f}{n["iops"]:>10.0f}{"-":>10}{s["iops"]/n["iops"]:>10.2f}x{"":>13}   '
      f'{s["server_cpu_us_per_io"]:.1f} / {n["server_cpu_us_per_io"]:.1f} (default file config vs nbdkit file, on disk)')
print("4 KiB rows in IOPS, 128 KiB row in MiB/s; goal: sluice >= 1.2x nbdkit and >= 1.5x qemu-nbd on 4 KiB IOPS;")
print("flush row: sluice on its default file config >= 1.0x nbdkit file")
PY
