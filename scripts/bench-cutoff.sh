#!/bin/bash
# The sequential cutoff through real clients (docs/caching.md, "Sequential
# cutoff"): bytes promoted into the cache by
#  1. `nbdcopy` of a whole 768 MiB in-place volume (random data at home)
#     into a 256 MiB cache, and
#  2. a 512 MiB file read back through nbdfuse + losetup --direct-io=on +
#     ext4 (needs root, /dev/fuse and a loop device), and
#  3. temporary files on the same ext4: 4 writers at once, 100 files each
#     of 64 KiB-1 MiB (random sizes, as Spark's shuffle files), then sync:
#     the share of the bytes written that the cutoff sent past the cache.
# Usage: scripts/bench-cutoff.sh [SLUICE_BINARY ...]  (default: the release
# build). Each binary is measured in turn, so two builds compare in one run.
set -euo pipefail
cd "$(dirname "$0")/.."
[ $# -gt 0 ] || { cargo build --release -q; set -- target/release/sluice; }
for bin in nbdcopy nbdfuse losetup mkfs.ext4 curl; do
    command -v $bin > /dev/null || { echo "$bin is missing: run scripts/setup.sh" >&2; exit 1; }
done
W=$(mktemp -d /tmp/sluice-cutoff.XXXXXX)
trap 'umount "$W/mnt" 2>/dev/null || true; rm -rf "$W"' EXIT
promoted() { curl -s "127.0.0.1:$1/metrics" | awk '/^sluice_cache_promoted_bytes_total/ {print $2}'; }
metric() { curl -s "127.0.0.1:$1/metrics" | awk -v m="$2" '$1 ~ "^"m"[{]" {s += $2} END {printf "%d", s}'; }
written() { # every byte the volume was asked to write, however routed
    local t=0 k
    for k in write_back write_through write_past cutoff_bypass spill class_bypass; do
        t=$((t + $(metric "$1" "sluice_cache_${k}_bytes_total")))
    done
    echo $t
}
config() { # dir port metrics cache capacity volume
    cat > "$1/s.toml" <<EOT
data_dir = "$1"
listen = ["127.0.0.1:$2"]
unix_socket = ""
metrics_listen = "127.0.0.1:$3"
[cache]
kind = "file"
size = "$4"
[capacity]
kind = "file"
size = "$5"
[engine]
layout = "in-place"
chunk_size = "4m"
[[volume]]
name = "v"
size = "$6"
EOT
}
for BIN in "$@"; do
    BIN=$(realpath "$BIN")
    # 1. nbdcopy of the whole volume.
    D="$W/copy"; rm -rf "$D"; mkdir -p "$D"
    config "$D" 10933 10934 256m 1g 768m
    "$BIN" format --config "$D/s.toml" > /dev/null
    head -c $((768 << 20)) /dev/urandom | dd of="$D/capacity.img" conv=notrunc bs=1M status=none
    "$BIN" serve --config "$D/s.toml" > "$D/log" 2>&1 & SP=$!
    sleep 1.5
    nbdcopy nbd://127.0.0.1:10933/v null:
    COPY=$(promoted 10934)
    kill -INT $SP; wait $SP || true
    # 2. a 512 MiB file through nbdfuse + loop + ext4.
    D="$W/fuse"; rm -rf "$D"; mkdir -p "$D/fuse" "$D/mnt"; ln -sfn "$D/mnt" "$W/mnt"
    config "$D" 10935 10936 256m 2g 1536m
    "$BIN" serve --config "$D/s.toml" > "$D/log" 2>&1 & SP=$!
    sleep 1.5
    nbdfuse "$D/fuse" nbd://127.0.0.1:10935/v & FP=$!
    sleep 1
    LOOP=$(losetup --direct-io=on --sector-size 4096 -f --show "$D/fuse/nbd")
    mkfs.ext4 -q "$LOOP" && mount "$LOOP" "$D/mnt"
    dd if=/dev/urandom of="$D/mnt/big" bs=1M count=512 status=none; sync
    P0=$(promoted 10936)
    echo 3 > /proc/sys/vm/drop_caches
    cat "$D/mnt/big" > /dev/null
    READ=$(( $(promoted 10936) - P0 ))
    # 3. temporary files.
    rm "$D/mnt/big"; sync; sleep 1
    head -c $((1 << 20)) /dev/urandom > "$W/rand"
    mkdir "$D/mnt/tmp"
    W0=$(written 10936); C0=$(metric 10936 sluice_cache_cutoff_bypass_bytes_total)
    WP=""
    for w in 1 2 3 4; do
        ( RANDOM=$w; for f in $(seq 100); do head -c $(( (1 + RANDOM % 16) * 65536 )) "$W/rand" > "$D/mnt/tmp/w$w-$f"; done ) &
        WP="$WP $!"
    done
    wait $WP; sync; sleep 1
    TW=$(( $(written 10936) - W0 )); TC=$(( $(metric 10936 sluice_cache_cutoff_bypass_bytes_total) - C0 ))
    umount "$D/mnt"; losetup -d "$LOOP"; kill $FP; sleep 0.5; kill -INT $SP; wait $SP || true
    printf '%s: nbdcopy of 768 MiB promoted %d bytes (%.1f %% of the 256 MiB cache); 512 MiB file read promoted %d bytes (%.2f %% of it); temp files: %d bytes written, %d past the cache by the cutoff (%.1f %%)\n' \
        "$BIN" "$COPY" "$(echo "$COPY * 100 / 268435456" | bc -l)" "$READ" "$(echo "$READ * 100 / 536870912" | bc -l)" \
        "$TW" "$TC" "$(echo "$TC * 100 / ($TW + 1)" | bc -l)"
done
