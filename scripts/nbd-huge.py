#!/usr/bin/python3
"""Large requests, model-checked: a libnbd client that never negotiates
block sizes sends reads, writes, write-zeroes and trims of up to 64 MiB
(4 KiB to 64 MiB, at random block-aligned offsets, overlapping) to an NBD
export and checks every read against a model of the whole export, then
reads it all back. As upstream's `integrityhuge` test does (requests up
to ~48 MiB), without its harness.

Usage: nbd-huge.py URI [SEED] [OPS] [no-trims]
  no-trims: leave trims out (a trimmed block of an in-place Sluice volume
  may read as an older version, as NBD allows). Prints OK or FAILED: ...
"""
import nbd, random, sys, time
h = nbd.NBD()
h.set_request_block_size(False)  # a client that never negotiates block sizes
h.connect_uri(sys.argv[1])
size = h.get_size()
print("max block size", h.get_block_size(nbd.SIZE_MAXIMUM), "size", size)
MIB = 1 << 20
model = bytearray(size)
rng = random.Random(int(sys.argv[2]) if len(sys.argv) > 2 else 1)
t0 = time.time()
trims = len(sys.argv) <= 4 or sys.argv[4] != 'no-trims'  # in place a trimmed block may read as an old version
for i in range(int(sys.argv[3]) if len(sys.argv) > 3 else 40):
    op = rng.choice(["w", "w", "r", "z", "t"] if trims else ["w", "w", "r", "z"])
    n = rng.choice([4096, 64 << 10, MIB, 31 * MIB, 33 * MIB, 48 * MIB, 64 * MIB])
    off = rng.randrange(0, (size - n) // 4096 + 1) * 4096
    if op == "w":
        b = bytes([rng.randrange(256)]) * 4096
        data = b * (n // 4096)
        h.pwrite(data, off); model[off:off + n] = data
    elif op == "z":
        h.zero(n, off); model[off:off + n] = bytes(n)
    elif op == "t":
        h.trim(n, off); model[off:off + n] = bytes(n)
    got = h.pread(n, off)
    if got != bytes(model[off:off + n]):
        sys.exit(f"FAILED: op {i} {op} {n} at {off}: read back differs")
for off in range(0, size, 64 * MIB):
    n = min(64 * MIB, size - off)
    if h.pread(n, off) != bytes(model[off:off + n]):
        sys.exit(f"FAILED: final read at {off}")
h.flush()
h.shutdown()
print("OK", round(time.time() - t0, 1), "s")
