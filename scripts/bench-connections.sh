#!/usr/bin/env bash
# Connection scaling: start `sluice serve` on memory-backed devices and hold
# COUNT idle NBD connections to it (full handshake each), then read once on
# every one. Reports the server's resident memory and threads per idle
# connection, and the machine-wide memory per connection (kernel sockets and
# stacks included). Writes target/bench/connections.json.
# Environment: COUNT (default 10000), PORT (default 10909).
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release -q -p sluice
COUNT=${COUNT:-10000}
PORT=${PORT:-10909}
OUT=target/bench
mkdir -p "$OUT"
work=$(mktemp -d /dev/shm/sluice-bench-conns.XXXXXX)
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$work"' EXIT
cat > "$work/conns.toml" <<TOML
data_dir = "$work"
listen = ["127.0.0.1:$PORT"]
unix_socket = ""
metrics_listen = ""
[cache]
kind = "memory"
size = "256m"
[capacity]
kind = "memory"
size = "2g"
[server]
connections_max = $((COUNT + 100))
[[volume]]
name = "default"
size = "512m"
TOML
target/release/sluice serve --config "$work/conns.toml" >"$work/serve.log" 2>&1 &
pid=$!
for _ in $(seq 100); do
    grep -q serving "$work/serve.log" && break
    sleep 0.1
done
target/release/sluice bench connections --addr "127.0.0.1:$PORT" --count "$COUNT" \
    --server-pid "$pid" --json "$OUT/connections.json"
kill -TERM "$pid"
wait "$pid"
