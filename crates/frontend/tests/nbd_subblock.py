#!/usr/bin/python3
"""Sub-block requests through libnbd (python3-libnbd). A handle that does not
ask for block sizes is told a minimum of 1 and may write, zero and read at
any byte offset: 512-byte- and 1-byte-granular patterns are checked against
a model. A handle that asks is held to 4096 (EINVAL). Usage:
nbd_subblock.py URI SEED. Prints OK; exits non-zero with a message on the
first mismatch."""

import errno
import random
import sys

import nbd

uri, seed = sys.argv[1], int(sys.argv[2])
SPAN = 256 << 10


def check(cond, what):
    if not cond:
        sys.exit("FAILED (seed %d): %s" % (seed, what))


h = nbd.NBD()
h.set_request_block_size(False)
h.connect_uri(uri)
check(h.get_block_size(nbd.SIZE_MINIMUM) == 1, "minimum block size %d" % h.get_block_size(nbd.SIZE_MINIMUM))
rng = random.Random(seed)
model = bytearray(h.pread(SPAN, 0))
for i in range(600):
    gran = 512 if i % 2 == 0 else 1
    off = rng.randrange(SPAN // gran) * gran
    length = min(rng.randrange(1, 20) * gran if gran == 512 else rng.randrange(1, 9000), SPAN - off)
    op = rng.random()
    if op < 0.55:
        data = rng.randbytes(length)
        h.pwrite(data, off, flags=nbd.CMD_FLAG_FUA if rng.random() < 0.2 else 0)
        model[off:off + length] = data
    elif op < 0.65:
        h.zero(length, off)
        model[off:off + length] = bytes(length)
    else:
        got = h.pread(length, off)
        check(got == model[off:off + length], "op %d: read %d+%d differs from the model" % (i, off, length))
h.flush()
check(h.pread(SPAN, 0) == model, "the whole span differs from the model at the end")
h.shutdown()

# Asking for block sizes means being held to them.
h = nbd.NBD()
h.connect_uri(uri)
check(h.get_block_size(nbd.SIZE_MINIMUM) == 4096, "negotiated minimum %d" % h.get_block_size(nbd.SIZE_MINIMUM))
h.set_strict_mode(0)
try:
    h.pwrite(b"x", 1)
    check(False, "a misaligned write was accepted after block sizes were negotiated")
except nbd.Error as e:
    # The binding gives the errno by name.
    check(e.errno in (errno.EINVAL, "EINVAL"), "misaligned write: errno %s" % e.errno)
check(h.pread(4096, 0) == model[:4096], "the refused write changed data")
h.shutdown()
print("OK")
