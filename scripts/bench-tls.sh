#!/usr/bin/env bash
# TLS cost on NBD: 128 KiB sequential write and read at iodepth 32 over
# plaintext and over TLS 1.3, alternating plain/TLS twice, against `sluice
# serve` (memory devices, [tls] mode = "allow") and, as the peer, `nbdkit
# --tls=on memory` (GnuTLS) with the same certificate, from two clients: fio
# ioengine=nbd (libnbd + GnuTLS) and `sluice bench nbd-load` (a lean client
# whose TLS is ring's AES-GCM sealing and opening in place, as kTLS would).
# Besides MiB/s it reports the CPU each side spent per MiB (server:
# utime+stime from /proc; client: its own usr+sys), because on this 2-core
# machine the client shares the CPU: fio's single thread saturates a core
# under TLS, and then the ratio measures the client; the server's CPU per
# MiB, TLS against plain, is what the server adds.
# Prints a table, writes target/bench/nbd-tls.json. Certificates: a
# throwaway CA made with openssl. Environment: RUNTIME (s per job, default
# 10), SIZE (default 1g), PORT (default 10811).
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/bench-lib.sh
bench_init tls
RUNTIME=${RUNTIME:-10}
SIZE=${SIZE:-1g}
PORT=${PORT:-10811}

pki="$work/pki"
mkdir -p "$pki"
(
    cd "$pki"
    ec=(-newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes)
    openssl req -x509 "${ec[@]}" -keyout ca-key.pem -out ca-cert.pem -subj "/CN=sluice bench CA" -days 2 2>/dev/null
    openssl req "${ec[@]}" -keyout server-key.pem -out server.csr -subj /CN=localhost 2>/dev/null
    printf 'subjectAltName=IP:127.0.0.1,DNS:localhost\nbasicConstraints=CA:FALSE\nextendedKeyUsage=serverAuth\n' >ext.cnf
    openssl x509 -req -in server.csr -CA ca-cert.pem -CAkey ca-key.pem -CAcreateserial \
        -out server-cert.pem -days 2 -extfile ext.cnf 2>/dev/null
)
# fio's nbd engine refuses local files in URIs (tls-certificates=), so the CA
# goes where libnbd looks by default: $HOME/.pki/libnbd/ca-cert.pem.
mkdir -p "$work/home/.pki/libnbd"
cp "$pki/ca-cert.pem" "$work/home/.pki/libnbd/"

run_fio() { # name uri rw -> "MiB/s client-CPU-ms/MiB server-CPU-ms/MiB"
    local t0 t1
    t0=$(cpu_ticks "$pid")
    HOME="$work/home" fio --name="$1" --ioengine=nbd --uri="$2" --rw="$3" --bs=128k --iodepth=32 --size="$SIZE" \
        --time_based --runtime="$RUNTIME" --output-format=json --output="$work/$1.json" >/dev/null
    t1=$(cpu_ticks "$pid")
    python3 - "$work/$1.json" "$3" "$((t1 - t0))" "$(getconf CLK_TCK)" <<'PY'
import json, sys
j = json.load(open(sys.argv[1]))["jobs"][0]
mib = j[sys.argv[2]]["io_bytes"] / 2**20
secs = j["job_runtime"] / 1000
client_ms = (j["usr_cpu"] + j["sys_cpu"]) / 100 * secs * 1000 / mib
server_ms = int(sys.argv[3]) / int(sys.argv[4]) * 1000 / mib
print(f"{mib / secs:.1f} {client_ms:.3f} {server_ms:.3f}")
PY
}

# run_load name uri rw -> the same three numbers, from `sluice bench nbd-load`
run_load() {
    local t0 t1 tls=() addr=${2#*://}
    addr=${addr%%/*}
    [[ $2 == nbds://* ]] && tls=(--tls-ca "$pki/ca-cert.pem")
    t0=$(cpu_ticks "$pid")
    "$SLUICE" bench nbd-load --addr "$addr" --export "${2##*/}" --rw "$3" --bs 128k --iodepth 32 \
        --span "$SIZE" --seconds "$RUNTIME" "${tls[@]}" --json "$work/$1.json" >/dev/null
    t1=$(cpu_ticks "$pid")
    python3 - "$work/$1.json" "$((t1 - t0))" "$(getconf CLK_TCK)" <<'PY'
import json, sys
j = json.load(open(sys.argv[1]))
mib = j["mib_per_s"] * j["seconds"]
server_ms = int(sys.argv[2]) / int(sys.argv[3]) * 1000 / mib
print(f"{j['mib_per_s']:.1f} {j['client_cpu_ms_per_mib']:.3f} {server_ms:.3f}")
PY
}

rows=()
bench_server() { # label export
    local plain="nbd://127.0.0.1:$PORT/$2" tls="nbds://127.0.0.1:$PORT/$2"
    wait_nbd "$plain"
    fio --name=fill --ioengine=nbd --uri="$plain" --rw=write --bs=1m --iodepth=8 --size="$SIZE" >/dev/null
    for round in 1 2; do
        for rw in write read; do for client in fio nbd-load; do
            local run=run_fio
            [[ $client == nbd-load ]] && run=run_load
            read -r p pc ps < <($run "$1-$client-plain-$rw-$round" "$plain" "$rw")
            read -r t tc ts < <($run "$1-$client-tls-$rw-$round" "$tls" "$rw")
            echo "$1 round $round 128k seq $rw, $client: plain $p MiB/s, TLS $t MiB/s" >&2
            rows+=("{\"server\": \"$1\", \"client\": \"$client\", \"round\": $round, \"rw\": \"$rw\", \"plain_mib_per_s\": $p, \"tls_mib_per_s\": $t,
 \"plain_client_cpu_ms_per_mib\": $pc, \"tls_client_cpu_ms_per_mib\": $tc,
 \"plain_server_cpu_ms_per_mib\": $ps, \"tls_server_cpu_ms_per_mib\": $ts}")
        done; done
    done
}

sed "s/127.0.0.1:10809/127.0.0.1:$PORT/" examples/memory.toml >"$work/tls.toml"
sed -i 's/^unix_socket = ""/unix_socket = ""\nmetrics_listen = ""/' "$work/tls.toml"
printf '\n[tls]\nmode = "allow"\ncert = "%s"\nkey = "%s"\n' "$pki/server-cert.pem" "$pki/server-key.pem" >>"$work/tls.toml"
(cd "$work" && exec "$SLUICE" serve --config "$work/tls.toml" >/dev/null 2>&1) &
pid=$!
bench_server sluice default
kill -TERM $pid
wait $pid || true

nbdkit --foreground --exit-with-parent -p "$PORT" -i 127.0.0.1 --tls=on --tls-certificates="$pki" memory 4G 2>/dev/null &
pid=$!
bench_server nbdkit ""
kill $pid
wait $pid 2>/dev/null || true

json="[$(IFS=,; echo "${rows[*]}")]"
echo "$json" | python3 -c '
import json, sys
rows = json.load(sys.stdin)
print("%-34s %9s %9s %9s   %-17s %-17s" % ("server, job, client", "plain", "TLS", "TLS/plain",
      "client ms/MiB", "server ms/MiB"))
print("%-34s %9s %9s %9s   %-17s %-17s" % ("", "MiB/s", "MiB/s", "", "plain -> TLS", "plain -> TLS"))
for r in rows:
    job = "%s, %s round %d, %s" % (r["server"], r["rw"], r["round"], r["client"])
    p, t = r["plain_mib_per_s"], r["tls_mib_per_s"]
    print("%-34s %9.1f %9.1f %9.2f   %6.3f -> %6.3f   %6.3f -> %6.3f" % (job, p, t, t / p,
          r["plain_client_cpu_ms_per_mib"], r["tls_client_cpu_ms_per_mib"],
          r["plain_server_cpu_ms_per_mib"], r["tls_server_cpu_ms_per_mib"]))
print("client ms/MiB near 1000/MiB-per-s means the client was at 100 % of a core")
'
echo "$json" >"$OUT/nbd-tls.json"
grep -m1 -o -w -E 'vaes|aes|pclmulqdq' /proc/cpuinfo | sort -u | tr '\n' ' ' | sed 's/^/CPU flags: /' >&2
echo >&2
