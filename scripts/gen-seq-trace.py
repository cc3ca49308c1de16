#!/usr/bin/env python3
"""A sequential-overwrite block trace (the `csv` layout, docs/workloads.md):
1 MiB writes from byte 0 to SIZE, in order, at RATE, the whole device
written once per pass (`sluice bench trace --passes N` repeats it).

usage: scripts/gen-seq-trace.py OUT [--size 2g] [--write 1m] [--rate 200m]

The stream a backup, a log or a file copy writes: each block written once
per pass, sequentially. A write-shaping cache should program no more
capacity bytes for it than the bare drive does (issue 41).
"""
import argparse


def bytes_of(s):
    s = s.strip().lower()
    mult = {"k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}
    return int(float(s[:-1]) * mult[s[-1]]) if s[-1] in mult else int(s)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("out")
    p.add_argument("--size", default="2g", help="bytes written per pass (default 2g)")
    p.add_argument("--write", default="1m", help="bytes per write (default 1m)")
    p.add_argument("--rate", default="200m", help="bytes per second the trace's timestamps give (default 200m)")
    o = p.parse_args()
    size, write, rate = bytes_of(o.size), bytes_of(o.write), bytes_of(o.rate)
    if write <= 0 or size < write or rate <= 0:
        p.error("need 0 < --write <= --size and --rate > 0")
    gap_us = write * 1_000_000 / rate
    with open(o.out, "w") as f:
        f.write("timestamp_us,op,offset,size\n")
        for i in range(size // write):
            f.write(f"{int(i * gap_us)},W,{i * write},{write}\n")


if __name__ == "__main__":
    main()
