#!/usr/bin/env bash
# Fuzzes the NBD wire format (fuzz/fuzz_targets/proto.rs) and the TLS record
# reader (fuzz/fuzz_targets/tls_records.rs) with cargo-fuzz (libFuzzer), each
# for FUZZ_SECONDS (default 30). Installs cargo-fuzz if missing.
# cargo-fuzz needs a nightly compiler: the machine's nightly toolchain if it
# has one, else the stable one with RUSTC_BOOTSTRAP=1 (nightly flags only for
# this build). A finding fails the script and leaves its input in
# fuzz/artifacts/<target>/; replay it with
#   cargo +nightly fuzz run <target> fuzz/artifacts/<target>/<file>
set -euo pipefail
cd "$(dirname "$0")/.."
SECONDS_MAX=${FUZZ_SECONDS:-30}
command -v cargo-fuzz >/dev/null 2>&1 || cargo install -q cargo-fuzz --locked
if rustup run nightly rustc --version >/dev/null 2>&1; then
    toolchain=(+nightly)
else
    toolchain=()
    export RUSTC_BOOTSTRAP=1
fi
cd fuzz
log=$(mktemp)
trap 'rm -f "$log"' EXIT
for target in proto tls_records; do
    rc=0
    cargo "${toolchain[@]}" fuzz run "$target" -- -max_total_time="$SECONDS_MAX" -print_final_stats=1 >"$log" 2>&1 || rc=$?
    grep -E '^(Done|stat::number_of_executed_units)' "$log" || true
    if [ "$rc" -ne 0 ]; then
        tail -40 "$log" >&2
        echo "fuzz: $target failed (exit $rc); a finding's input is in fuzz/artifacts/$target/" >&2
        exit 1
    fi
    echo "fuzz: $target ran ${SECONDS_MAX}s, no findings"
done
