#!/usr/bin/env bash
# Sluice's io_uring path vs fio on the same file in the same run.
#
# 4 KiB random writes, O_DIRECT, iodepth 32, 10 s per run, on a 1 GiB tmpfs file,
# alternating fio / sluice ROUNDS times (so background load hits both alike).
# Prints a table and writes target/bench/uring-vs-fio.json. Goal: sluice >= 0.8x fio.
#
# Environment overrides: FILE, SIZE (fio syntax, default 1g), IODEPTH, RUNTIME, ROUNDS,
# SLUICE (binary to use instead of building target/release/sluice), STRICT=1 (exit 1 below goal).
set -euo pipefail

cd "$(dirname "$0")/.."
FILE=${FILE:-/dev/shm/sluice-bench-uring}
SIZE=${SIZE:-1g}
IODEPTH=${IODEPTH:-32}
RUNTIME=${RUNTIME:-10}
ROUNDS=${ROUNDS:-2}
GOAL=0.8
OUT=target/bench
mkdir -p "$OUT"

if ! command -v fio >/dev/null 2>&1; then
    echo "installing fio" >&2
    export DEBIAN_FRONTEND=noninteractive
    apt-get -o DPkg::Lock::Timeout=600 install -y -q fio >/dev/null || { apt-get -o DPkg::Lock::Timeout=600 update -q && apt-get -o DPkg::Lock::Timeout=600 install -y -q fio; }
fi

if [[ -z "${SLUICE:-}" ]]; then
    cargo build --release -p sluice
    SLUICE=target/release/sluice
fi

SIZE_BYTES=$(python3 -c 'import sys; s=sys.argv[1].lower(); m={"k":1<<10,"m":1<<20,"g":1<<30,"t":1<<40}; print(int(s[:-1])*m[s[-1]] if s[-1] in m else int(s))' "$SIZE")
created=0
if [[ ! -e "$FILE" ]]; then
    created=1
fi
# Fully allocate the file up front so neither tool pays for page allocation on first touch.
fallocate -l "$SIZE_BYTES" "$FILE" 2>/dev/null ||
    dd if=/dev/zero of="$FILE" bs=1M count=$((SIZE_BYTES >> 20)) conv=fsync status=none
cleanup() { if [[ $created == 1 ]]; then rm -f "$FILE"; fi; }
trap cleanup EXIT

fio_iops=()
sluice_iops=()
for round in $(seq 1 "$ROUNDS"); do
    echo "round $round/$ROUNDS: fio ..." >&2
    fio --name=w --filename="$FILE" --ioengine=io_uring --direct=1 --rw=randwrite --bs=4k \
        --iodepth="$IODEPTH" --size="$SIZE" --time_based --runtime="$RUNTIME" \
        --output-format=json >"$OUT/fio-round$round.json"
    fio_iops+=("$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["jobs"][0]["write"]["iops"])' "$OUT/fio-round$round.json")")

    echo "round $round/$ROUNDS: sluice ..." >&2
    "$SLUICE" bench uring --path "$FILE" --iodepth "$IODEPTH" --seconds "$RUNTIME" --json "$OUT/uring.json" >&2
    cp "$OUT/uring.json" "$OUT/uring-round$round.json"
    sluice_iops+=("$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["iops"])' "$OUT/uring.json")")
done

python3 - "$OUT/uring-vs-fio.json" "$GOAL" "$FILE" "$IODEPTH" "$RUNTIME" "${fio_iops[*]}" "${sluice_iops[*]}" <<'EOF'
import json, statistics, sys
out, goal, path, iodepth, runtime = sys.argv[1], float(sys.argv[2]), sys.argv[3], int(sys.argv[4]), float(sys.argv[5])
fio = [float(x) for x in sys.argv[6].split()]
slu = [float(x) for x in sys.argv[7].split()]
rounds = [{"round": i + 1, "fio_iops": f, "sluice_iops": s, "ratio": s / f} for i, (f, s) in enumerate(zip(fio, slu))]
print(f"{'round':>5}  {'fio IOPS':>12}  {'sluice IOPS':>12}  {'ratio':>6}")
for r in rounds:
    print(f"{r['round']:>5}  {r['fio_iops']:>12.0f}  {r['sluice_iops']:>12.0f}  {r['ratio']:>6.2f}")
fm, sm = statistics.median(fio), statistics.median(slu)
ratio = sm / fm
print(f"{'median':>5}  {fm:>12.0f}  {sm:>12.0f}  {ratio:>6.2f}   goal >= {goal}: {'PASS' if ratio >= goal else 'FAIL'}")
summary = {
    "workload": {"path": path, "rw": "randwrite", "bs": 4096, "iodepth": iodepth, "runtime_s": runtime, "direct": True},
    "rounds": rounds,
    "fio_iops_median": fm,
    "sluice_iops_median": sm,
    "ratio": ratio,
    "goal": goal,
    "pass": ratio >= goal,
}
with open(out, "w") as f:
    json.dump(summary, f, indent=2)
print(f"wrote {out}")
sys.exit(0)
EOF

if [[ "${STRICT:-0}" == 1 ]]; then
    python3 -c 'import json,sys; sys.exit(0 if json.load(open(sys.argv[1]))["pass"] else 1)' "$OUT/uring-vs-fio.json"
fi
