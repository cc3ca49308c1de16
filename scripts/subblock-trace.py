#!/usr/bin/python3
"""A byte-granular integrity trace, timed: CONNS libnbd clients that never
negotiate block sizes (so any offset and length is allowed) each own a
region of the export and send it a seeded mix of 512-byte-granular writes
(512 B to 8 KiB, some with FUA), reads checked against a model, zeroes,
trims and flushes; at the end every region is read back whole and checked.
Each write's bytes repeat its connection, length and generation, ending in
a CRC32 of the rest, so a hex dump of a mismatching range shows which write
the bytes came from (the failure names the first bad byte and its region).

Usage: subblock-trace.py URI [SEED] [OPS_PER_CONN] [CONNS] [REGION_MIB]
Prints `OK <seconds> s <ops> ops` or `FAILED: ...` (exit 1). A trimmed
range reads back as zeros or as what it held (a trim is a hint), so the
model stops checking trimmed bytes until they are written again.
"""
import nbd, random, struct, sys, threading, time, zlib

uri = sys.argv[1]
seed = int(sys.argv[2]) if len(sys.argv) > 2 else 1
ops = int(sys.argv[3]) if len(sys.argv) > 3 else 5000
conns = int(sys.argv[4]) if len(sys.argv) > 4 else 4
region = (int(sys.argv[5]) if len(sys.argv) > 5 else 16) << 20
SECTOR = 512
failures = []


def payload(conn, gen, n):
    head = struct.pack("<IIQ", conn, n, gen)
    body = (head * (n // len(head) + 1))[: n - 4]
    return body + struct.pack("<I", zlib.crc32(body))


def client(i):
    h = nbd.NBD()
    h.set_request_block_size(False)
    h.connect_uri(uri)
    base = i * region
    model = bytearray(region)
    known = bytearray(b"\x01") * region  # 0: trimmed, either zeros or old data
    rng = random.Random(seed * 1000 + i)
    # Start from zeros everywhere in the region (the export may hold anything).
    h.zero(region, base)
    try:
        for gen in range(ops):
            op = rng.choices("wrztf", weights=[50, 30, 8, 7, 5])[0]
            n = rng.randrange(1, 17) * SECTOR
            off = rng.randrange(0, (region - n) // SECTOR + 1) * SECTOR
            if op == "w":
                data = payload(i, gen, n)
                fua = rng.random() < 0.1
                h.pwrite(data, base + off, nbd.CMD_FLAG_FUA if fua else 0)
                model[off : off + n] = data
                known[off : off + n] = b"\x01" * n
            elif op == "r":
                got = h.pread(n, base + off)
                check(i, gen, got, model, known, off, n)
            elif op == "z":
                h.zero(n, base + off)
                model[off : off + n] = bytes(n)
                known[off : off + n] = b"\x01" * n
            elif op == "t":
                h.trim(n, base + off)
                known[off : off + n] = bytes(n)
            else:
                h.flush()
        for off in range(0, region, 1 << 20):
            n = min(1 << 20, region - off)
            check(i, "final", h.pread(n, base + off), model, known, off, n)
        h.flush()
    except Exception as e:  # a refused or failed request
        failures.append(f"connection {i}: {e}")
    h.shutdown()


def check(i, when, got, model, known, off, n):
    if got == bytes(model[off : off + n]):
        return
    for k in range(n):
        if known[off + k] and got[k] != model[off + k]:
            raise RuntimeError(f"op {when}: byte {off + k} of region {i} reads {got[k]}, wrote {model[off + k]}")


t0 = time.time()
threads = [threading.Thread(target=client, args=(i,)) for i in range(conns)]
for t in threads:
    t.start()
for t in threads:
    t.join()
if failures:
    sys.exit("FAILED: " + "; ".join(failures))
print("OK", round(time.time() - t0, 2), "s", ops * conns, "ops")
