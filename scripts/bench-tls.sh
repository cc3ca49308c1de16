#!/usr/bin/env bash
# TLS cost on Sluice's NBD server: the same fio ioengine=nbd jobs (128 KiB
# sequential write and read, iodepth 32) over plaintext and over TLS 1.3
# against one `sluice serve` (memory devices, [tls] mode = "allow"),
# alternating plain/TLS twice. Prints MiB/s per run and TLS/plain ratios,
# writes target/bench/nbd-tls.json. Certificates: a throwaway CA made with
# openssl. Environment: RUNTIME (s per job, default 10), SIZE (default 1g),
# PORT (default 10811).
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
sed "s/127.0.0.1:10809/127.0.0.1:$PORT/" examples/memory.toml >"$work/tls.toml"
sed -i 's/^unix_socket = ""/unix_socket = ""\nmetrics_listen = ""/' "$work/tls.toml"
printf '\n[tls]\nmode = "allow"\ncert = "%s"\nkey = "%s"\n' "$pki/server-cert.pem" "$pki/server-key.pem" >>"$work/tls.toml"
(cd "$work" && exec "$SLUICE" serve --config "$work/tls.toml" >/dev/null 2>&1) &
pid=$!
plain="nbd://127.0.0.1:$PORT/default"
# fio's nbd engine refuses local files in URIs (tls-certificates=), so the CA
# goes where libnbd looks by default: $HOME/.pki/libnbd/ca-cert.pem.
mkdir -p "$work/home/.pki/libnbd"
cp "$pki/ca-cert.pem" "$work/home/.pki/libnbd/"
tls="nbds://127.0.0.1:$PORT/default"
wait_nbd "$plain"
fio --name=fill --ioengine=nbd --uri="$plain" --rw=write --bs=1m --iodepth=8 --size="$SIZE" >/dev/null

run_fio() { # name uri rw
    HOME="$work/home" fio --name="$1" --ioengine=nbd --uri="$2" --rw="$3" --bs=128k --iodepth=32 --size="$SIZE" \
        --time_based --runtime="$RUNTIME" --output-format=json --output="$work/$1.json" >/dev/null
    python3 -c 'import json,sys; j=json.load(open(sys.argv[1]))["jobs"][0]; print("%.1f" % (j[sys.argv[2]]["bw"]/1024))' \
        "$work/$1.json" "$3"
}

rows=()
for round in 1 2; do
    for rw in write read; do
        p=$(run_fio "plain-$rw-$round" "$plain" "$rw")
        t=$(run_fio "tls-$rw-$round" "$tls" "$rw")
        echo "round $round 128k seq $rw: plain $p MiB/s, TLS $t MiB/s" >&2
        rows+=("{\"round\": $round, \"rw\": \"$rw\", \"plain_mib_per_s\": $p, \"tls_mib_per_s\": $t}")
    done
done
kill -TERM $pid
wait $pid || true
json="[$(IFS=,; echo "${rows[*]}")]"
echo "$json" | python3 -c '
import json, sys
rows = json.load(sys.stdin)
print("%-16s %12s %10s %10s" % ("job", "plain MiB/s", "TLS MiB/s", "TLS/plain"))
for r in rows:
    job = "%s round %d" % (r["rw"], r["round"])
    p, t = r["plain_mib_per_s"], r["tls_mib_per_s"]
    print("%-16s %12.1f %10.1f %10.2f" % (job, p, t, t / p))
'
echo "$json" >"$OUT/nbd-tls.json"
grep -m1 -o -w -E 'vaes|aes|pclmulqdq' /proc/cpuinfo | sort -u | tr '\n' ' ' | sed 's/^/CPU flags: /' >&2
echo >&2
