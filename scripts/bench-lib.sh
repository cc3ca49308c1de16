# Sourced by the scripts/bench-*.sh that run `sluice serve` against fio: the
# shared preamble and the wait for a server.

# bench_init NAME: the peers and tools installed, a release build, $SLUICE
# (the binary under test: the one just built unless SLUICE names another,
# e.g. an older build to measure a change before and after), $OUT, and a
# scratch directory $work in /dev/shm, removed with any background job on exit.
bench_init() {
    scripts/setup.sh
    cargo build --release -q -p sluice
    SLUICE=$(realpath "${SLUICE:-target/release/sluice}")
    OUT=target/bench
    mkdir -p "$OUT"
    work=$(mktemp -d "/dev/shm/sluice-bench-$1.XXXXXX")
    trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$work"' EXIT
}

# wait_nbd URI: until an NBD server answers at URI, up to 60 s
# (examples/memory.toml touches 7 GiB at start); fails if none does.
wait_nbd() {
    for _ in $(seq 600); do
        nbdinfo --size "$1" >/dev/null 2>&1 && return 0
        sleep 0.1
    done
    echo "no NBD server answered at $1" >&2
    return 1
}

# cpu_ticks PID: the process's utime + stime so far, in clock ticks.
cpu_ticks() {
    awk '{print $14 + $15}' "/proc/$1/stat"
}

# serve_emulated_qlc PORT METRICS: start `sluice serve` (in the background,
# config and data in $work) on an emulated Optane-like SCM cache (1 GiB) in
# front of an emulated 16 GiB QLC, both memory-backed and timed in real
# time, one 12 GiB volume "default" on 127.0.0.1:PORT, metrics on METRICS
# ("" for none); returns once it answers.
serve_emulated_qlc() {
    cat >"$work/sluice.toml" <<TOML
data_dir = "data"
listen = ["127.0.0.1:$1"]
unix_socket = ""
metrics_listen = "$2"
[cache]
kind = "memory"
size = "1g"
emulate = "scm"
[capacity]
kind = "memory"
size = "16g"
emulate = "qlc"
[engine]
chunk_size = "16m"
band_size = "128m"
write_unit = "64k"
[[volume]]
name = "default"
size = "12g"
TOML
    (cd "$work" && exec "$SLUICE" serve --config sluice.toml >/dev/null 2>&1) &
    wait_nbd "nbd://127.0.0.1:$1/default"
}
