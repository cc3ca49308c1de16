#!/bin/bash
# Warm and clean across kill -9 (docs/caching.md, "Crash safety"): an
# in-place server caches 64 MiB of random 64 KiB writes, cleans them home in
# the background (ACP), takes 4 MiB more writes (dirty), and is killed with
# SIGKILL. `sluice clean` then writes home what the restart counts dirty:
# at most the dirty bytes at the crash, not the whole cache again.
# Usage: scripts/bench-warm-restart.sh [SLUICE_BINARY ...] (default: the
# release build); each binary in turn.
set -euo pipefail
cd "$(dirname "$0")/.."
[ $# -gt 0 ] || { cargo build --release -q; set -- target/release/sluice; }
command -v qemu-io > /dev/null && command -v curl > /dev/null || { echo "run scripts/setup.sh" >&2; exit 1; }
W=$(mktemp -d /tmp/sluice-warm.XXXXXX)
trap 'rm -rf "$W"' EXIT
metric() { curl -s "127.0.0.1:10938/metrics" | awk -v k="$1" '$1 ~ "^"k {s += $2} END {print s + 0}'; }
for BIN in "$@"; do
    BIN=$(realpath "$BIN"); D="$W/d"; rm -rf "$D"; mkdir -p "$D"
    cat > "$D/s.toml" <<EOT
data_dir = "$D"
listen = ["127.0.0.1:10937"]
unix_socket = ""
metrics_listen = "127.0.0.1:10938"
[cache]
kind = "file"
size = "256m"
[capacity]
kind = "file"
size = "1g"
[engine]
layout = "in-place"
chunk_size = "4m"
cleaning = "acp"
[[volume]]
name = "v"
size = "768m"
seq_cutoff = "never"
EOT
    "$BIN" serve --config "$D/s.toml" > "$D/log" 2>&1 & SP=$!
    sleep 1.5
    cmds=(); for i in $(seq 0 1023); do cmds+=(-c "write -P $((i % 250 + 1)) $(( (i * 7919 % 12288) * 65536 )) 64k"); done
    qemu-io -f raw "${cmds[@]}" nbd://127.0.0.1:10937/v > /dev/null
    for _ in $(seq 1 100); do [ "$(metric sluice_cache_dirty_bytes)" = 0 ] && break; sleep 0.2; done
    qemu-io -f raw -c "write -P 7 700m 4m" -c flush nbd://127.0.0.1:10937/v > /dev/null
    CACHED=$(metric sluice_cache_cached_bytes); DIRTY=$(metric sluice_cache_dirty_bytes)
    kill -9 $SP; wait $SP 2> /dev/null || true
    HOME_BYTES=$("$BIN" clean --config "$D/s.toml" | sed -n 's/sluice: wrote \([0-9]*\) bytes home.*/\1/p')
    echo "$BIN: at the kill $CACHED bytes cached, $DIRTY dirty; the restart wrote $HOME_BYTES bytes home"
done
