#!/usr/bin/python3
"""Drives a Sluice NBD server with libnbd (python3-libnbd) and checks every
answer. Usage: nbd_client.py URI EXPORT_SIZE_BYTES. Exits non-zero with a
message on the first mismatch. Run with /usr/bin/python3 (Debian's)."""

import errno
import sys

import nbd

uri, size = sys.argv[1], int(sys.argv[2])
MIB = 1 << 20
BLOCK = 4096


def check(cond, what):
    if not cond:
        sys.exit("FAILED: " + what)


def extents(h, off, count, flags=0):
    """base:allocation descriptors as a list of (len, flags)."""
    got = []

    def cb(metacontext, offset, entries, err):
        check(metacontext == nbd.CONTEXT_BASE_ALLOCATION, "context " + metacontext)
        check(offset == off, "block status offset %d != %d" % (offset, off))
        got.extend(zip(entries[0::2], entries[1::2]))
        return 0

    h.block_status(count, off, cb, flags=flags)
    return got


def status_at(h, off, count):
    """Flags of every block in [off, off+count), walking the extents."""
    out = []
    pos = off
    while pos < off + count:
        ext = extents(h, pos, off + count - pos)
        check(len(ext) >= 1, "no extents")
        for length, fl in ext:
            length = min(length, off + count - pos)
            out.extend([fl] * (length // BLOCK))
            pos += length
            if pos >= off + count:
                break
    return out


def expect_errno(fn, want, what):
    try:
        fn()
    except nbd.Error as e:
        got = getattr(errno, e.errno, None) if isinstance(e.errno, str) else e.errno
        check(got == want, "%s: errno %s (%s), want %s" % (what, e.errno, e, want))
        return
    sys.exit("FAILED: %s succeeded, want errno %d" % (what, want))


# --- option haggling in opt mode: LIST, INFO, LIST_META_CONTEXT ---------
h = nbd.NBD()
h.set_opt_mode(True)
h.connect_uri(uri)
names = []
h.opt_list(lambda name, desc: names.append(name) or 0)
check("default" in names and "second" in names, "opt_list gave %r" % names)
contexts = []
h.opt_list_meta_context(lambda ctx: contexts.append(ctx) or 0)
check(contexts == ["base:allocation"], "opt_list_meta_context gave %r" % contexts)
h.set_export_name("second")
h.opt_info()
check(h.get_size() == 8 * MIB, "second export size %d" % h.get_size())
h.set_export_name("nonexistent")
try:
    h.opt_info()
    sys.exit("FAILED: opt_info on a missing export succeeded")
except nbd.Error:
    pass
h.opt_abort()

# --- the data path --------------------------------------------------------
h = nbd.NBD()
h.add_meta_context(nbd.CONTEXT_BASE_ALLOCATION)
h.connect_uri(uri)
check(h.get_size() == size, "size %d != %d" % (h.get_size(), size))
check(h.get_structured_replies_negotiated(), "structured replies not negotiated")
check(h.can_meta_context(nbd.CONTEXT_BASE_ALLOCATION), "no base:allocation")
for cap in ("can_flush", "can_fua", "can_trim", "can_zero", "can_fast_zero", "can_cache", "can_multi_conn", "can_df"):
    check(getattr(h, cap)(), cap)
check(not h.is_read_only(), "read only")
check(h.get_block_size(nbd.SIZE_MINIMUM) == 4096, "min block %d" % h.get_block_size(nbd.SIZE_MINIMUM))
check(h.get_block_size(nbd.SIZE_PREFERRED) == 4096, "preferred block")
check(h.get_block_size(nbd.SIZE_MAXIMUM) == 64 * MIB, "max block %d" % h.get_block_size(nbd.SIZE_MAXIMUM))

# Never written: a hole that reads as zeros.
check(h.pread(64 * 1024, 0) == bytes(64 * 1024), "fresh volume not zero")
check(extents(h, 0, size) == [(size, nbd.STATE_HOLE | nbd.STATE_ZERO)], "fresh extents %r" % extents(h, 0, size))

# Write with and without FUA, read back, with DF too.
a = bytes((i * 7 + 1) % 251 for i in range(MIB))
h.pwrite(a, 0)
h.pwrite(a[: 64 * 1024], 4 * MIB, flags=nbd.CMD_FLAG_FUA)
check(h.pread(MIB, 0) == a, "read back 1M")
check(h.pread(64 * 1024, 4 * MIB) == a[: 64 * 1024], "read back FUA write")
chunks = []


def chunk_cb(subbuf, offset, status, err):
    chunks.append((bytes(subbuf), offset, status))
    return 0


buf = h.pread_structured(64 * 1024, 4 * MIB, chunk_cb, flags=nbd.CMD_FLAG_DF)
check(len(chunks) == 1 and chunks[0][1:] == (4 * MIB, nbd.READ_DATA), "DF read chunks %r" % [c[1:] for c in chunks])
check(chunks[0][0] == a[: 64 * 1024] and bytes(buf) == a[: 64 * 1024], "DF read data")
h.flush()

# Block status: allocated [0,1M), hole [1M,4M), allocated [4M,4M+64k), hole after.
ext = extents(h, 0, 8 * MIB)
check(ext[0] == (MIB, 0), "first extent %r" % (ext,))
check(ext[1] == (3 * MIB, nbd.STATE_HOLE | nbd.STATE_ZERO), "second extent %r" % (ext,))
check(ext[2] == (64 * 1024, 0), "third extent %r" % (ext,))
one = extents(h, 0, 8 * MIB, flags=nbd.CMD_FLAG_REQ_ONE)
check(one == [(MIB, 0)], "REQ_ONE gave %r" % one)
check(sum(l for l, _ in extents(h, 512 * 1024, 16 * 1024)) == 16 * 1024, "extents exceed the request")

# Trim: the range becomes a hole that reads zero.
h.trim(256 * 1024, 256 * 1024)
check(h.pread(256 * 1024, 256 * 1024) == bytes(256 * 1024), "trimmed range not zero")
check(h.pread(256 * 1024, 0) == a[:256 * 1024], "data before the trim changed")
st = status_at(h, 0, MIB)
check(all(f == 0 for f in st[:64]) and all(f == 3 for f in st[64:128]) and all(f == 0 for f in st[128:]),
      "status after trim %r" % st)
h.trim(BLOCK, 2 * MIB, flags=nbd.CMD_FLAG_FUA)

# Write zeroes: plain, FUA, fast (punches a hole: fast), NO_HOLE (allocated).
h.pwrite(a, 0)
h.zero(128 * 1024, 0)
check(h.pread(128 * 1024, 0) == bytes(128 * 1024), "zeroed range not zero")
h.zero(64 * 1024, 128 * 1024, flags=nbd.CMD_FLAG_FUA)
h.zero(64 * 1024, 192 * 1024, flags=nbd.CMD_FLAG_FAST_ZERO)
check(h.pread(256 * 1024, 0) == bytes(256 * 1024), "zeroes not zero")
check(h.pread(MIB - 256 * 1024, 256 * 1024) == a[256 * 1024:], "zero touched neighbours")
check(status_at(h, 0, 256 * 1024) == [3] * 64, "zeroed range not a hole")
h.zero(64 * 1024, 512 * 1024, flags=nbd.CMD_FLAG_NO_HOLE)
check(h.pread(64 * 1024, 512 * 1024) == bytes(64 * 1024), "NO_HOLE zero not zero")
check(status_at(h, 512 * 1024, 64 * 1024) == [0] * 16, "NO_HOLE zero left a hole")
expect_errno(lambda: h.zero(64 * 1024, 0, flags=nbd.CMD_FLAG_NO_HOLE | nbd.CMD_FLAG_FAST_ZERO),
             errno.ENOTSUP, "fast zero without holes")
check(h.pread(64 * 1024, 0) == bytes(64 * 1024), "refused fast zero changed data")

# Cache: a valid hint.
h.cache(MIB, 0)

# Many requests in flight at once, completed in any order.
cookies = []
bufs = []
for i in range(64):
    data = bytes([i + 1]) * (16 * 1024)
    cookies.append(h.aio_pwrite(data, 2 * MIB + i * 16 * 1024))
while h.aio_in_flight() > 0:
    h.poll(-1)
for c in cookies:
    check(h.aio_command_completed(c), "aio write not completed")
for i in range(64):
    buf = nbd.Buffer(16 * 1024)
    bufs.append((i, buf, h.aio_pread(buf, 2 * MIB + i * 16 * 1024)))
while h.aio_in_flight() > 0:
    h.poll(-1)
for i, buf, c in bufs:
    check(h.aio_command_completed(c), "aio read not completed")
    check(buf.to_bytearray() == bytes([i + 1]) * (16 * 1024), "aio read %d mismatch" % i)

# Errors, with libnbd's own client-side checks off so the server sees them.
h.set_strict_mode(0)
expect_errno(lambda: h.pread(BLOCK, size), errno.EINVAL, "read past the end")
expect_errno(lambda: h.pread(2 * BLOCK, size - BLOCK), errno.EINVAL, "read across the end")
expect_errno(lambda: h.pwrite(bytes(BLOCK), size), errno.ENOSPC, "write past the end")
expect_errno(lambda: h.zero(BLOCK, size), errno.ENOSPC, "zero past the end")
expect_errno(lambda: h.trim(BLOCK, size), errno.EINVAL, "trim past the end")
expect_errno(lambda: h.pread(512, 0), errno.EINVAL, "misaligned read length")
expect_errno(lambda: h.pread(BLOCK, 512), errno.EINVAL, "misaligned read offset")
expect_errno(lambda: h.pwrite(bytes(512), 0), errno.EINVAL, "misaligned write")
expect_errno(lambda: h.pread(33 * MIB, 0), errno.EINVAL, "read beyond the maximum block size")
check(h.pread(BLOCK, 0) == bytes(BLOCK), "connection unusable after errors")
h.shutdown()
print("OK")
