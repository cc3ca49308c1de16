"""Spark jobs for `sluice bench hadoop` (docs/hadoop.md): TeraSort-style
sort, a wide group-by aggregation and a join, each generating its input into
the data directory (HDFS's role), running with its temporary data (shuffle
files, sort spills) under spark.local.dir, writing its output to the data
directory, and validating it.

Prints one JSON object per job on stdout: the job, its phases' wall times,
and the validation (the job exits non-zero if validation fails).

TeraSort's record format: 100-byte records, a 10-byte key and a 90-byte
value. Keys come from a hash of the record number, so every run generates
the same input for the same size.
"""

import argparse
import json
import os
import sys
import time

from pyspark.sql import SparkSession
from pyspark.sql import functions as F


def session(args):
    b = (
        SparkSession.builder.master(f"local[{args.cores}]")
        .appName("sluice-hadoop")
        .config("spark.local.dir", args.tmp)
        .config("spark.driver.memory", args.memory)
        .config("spark.sql.shuffle.partitions", str(args.partitions))
        .config("spark.default.parallelism", str(args.partitions))
        # Fixed partitioning and no broadcast joins: every job shuffles
        # and spills the way a production job on big data does.
        .config("spark.sql.adaptive.enabled", "false")
        .config("spark.sql.autoBroadcastJoinThreshold", "-1")
        .config("spark.sql.files.maxPartitionBytes", str(32 << 20))
        # Small memory for execution: sorts and aggregations spill.
        .config("spark.memory.fraction", "0.2")
        .config("spark.sql.parquet.compression.codec", "uncompressed")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.eventLog.enabled", "false")
    )
    return b.getOrCreate()


def records(spark, n, parts, salt):
    """n TeraSort records: key = 10 bytes of a hash of the record number,
    value = 90 bytes derived from it (two hashes, 64 + 26 bytes)."""
    ids = spark.range(0, n, numPartitions=parts)
    h = F.sha2(F.concat(F.lit(salt), F.col("id").cast("string")), 256)
    key = F.unhex(F.substring(h, 1, 20))
    v1 = F.unhex(F.sha2(F.concat(F.lit("v"), F.col("id").cast("string")), 512))
    v2 = F.unhex(F.substring(F.sha2(F.concat(F.lit("w"), F.col("id").cast("string")), 256), 1, 52))
    return ids.select(key.alias("key"), F.concat(v1, v2).alias("value"))


def checksum(df):
    """Sum of the records' CRC32s (order-independent), and the count."""
    row = df.select(F.sum(F.crc32(F.concat("key", "value"))).alias("s"), F.count("*").alias("n")).first()
    return int(row["s"] or 0), int(row["n"])


# When each phase ran: (start, end) in seconds since the epoch, so that the
# caller can line them up with what it sampled meanwhile (the HDD's busy
# time over the job's main phase).
SPANS = {}


def timed(phases, name, f):
    t, at = time.monotonic(), time.time()
    r = f()
    phases[name] = round(time.monotonic() - t, 3)
    SPANS.setdefault(id(phases), {})[name] = [round(at, 3), round(time.time(), 3)]
    return r


def terasort(spark, args):
    phases = {}
    src, out = os.path.join(args.data, "tera-in"), os.path.join(args.data, "tera-out")
    timed(phases, "gen", lambda: records(spark, args.records, args.partitions, "t").write.mode("overwrite").parquet(src))
    inp = spark.read.parquet(src)
    timed(phases, "sort", lambda: inp.sort("key").write.mode("overwrite").parquet(out))

    def validate():
        res = spark.read.parquet(out)
        # Each output file sorted, and the files, in name order (part-00000,
        # ...), in key order: each file's first key no smaller than the last
        # key of the file before it.
        keys = res.select(F.input_file_name().alias("f"), "key").rdd.map(lambda r: (r[0], bytes(r[1])))

        def span(it):
            spans = {}
            for f, k in it:
                s = spans.get(f)
                if s is None:
                    spans[f] = [k, k, 0]
                else:
                    s[2] += k < s[1]
                    s[1] = k
            yield from ((f, tuple(s)) for f, s in spans.items())

        spans = sorted(keys.mapPartitions(span).collect())
        if len({f for f, _ in spans}) != len(spans):
            return {"unordered": -1, "why": "a file was split across partitions"}
        bad = sum(s[2] for _, s in spans) + sum(1 for (_, a), (_, b) in zip(spans, spans[1:]) if b[0] < a[1])
        return {"unordered": bad, "checksum_in": checksum(inp), "checksum_out": checksum(res)}

    v = timed(phases, "validate", validate)
    ok = v["unordered"] == 0 and v["checksum_in"] == v["checksum_out"] and v["checksum_in"][1] == args.records
    return phases, v, ok


def groupby(spark, args):
    """A wide aggregation: records grouped by one of records/8 keys."""
    phases = {}
    src, out = os.path.join(args.data, "agg-in"), os.path.join(args.data, "agg-out")
    groups = max(1, args.records // 8)
    gen = records(spark, args.records, args.partitions, "g").withColumn(
        "g", F.pmod(F.xxhash64("key"), F.lit(groups))
    )
    timed(phases, "gen", lambda: gen.write.mode("overwrite").parquet(src))
    inp = spark.read.parquet(src)
    agg = inp.groupBy("g").agg(
        F.count("*").alias("n"),
        F.sum(F.crc32("value")).alias("s"),
        F.max("key").alias("kmax"),
        F.collect_list(F.substring("value", 1, 8)).alias("heads"),
    )
    timed(phases, "aggregate", lambda: agg.write.mode("overwrite").parquet(out))

    def validate():
        res = spark.read.parquet(out)
        got = res.select(F.sum("n").alias("n"), F.sum("s").alias("s"), F.count("*").alias("g")).first()
        want = inp.select(F.count("*").alias("n"), F.sum(F.crc32("value")).alias("s")).first()
        distinct = inp.select("g").distinct().count()
        return {
            "records": [int(got["n"]), int(want["n"])],
            "crc_sum": [int(got["s"]), int(want["s"])],
            "groups": [int(got["g"]), distinct],
        }

    v = timed(phases, "validate", validate)
    ok = all(a == b for a, b in v.values())
    return phases, v, ok


def join(spark, args):
    """A sort-merge join of two tables on a shared key: both sides shuffle."""
    phases = {}
    a_src, b_src, out = (os.path.join(args.data, p) for p in ("join-a", "join-b", "join-out"))
    keys = max(1, args.records // 2)

    def gen():
        for salt, path in (("a", a_src), ("b", b_src)):
            t = records(spark, args.records // 2, args.partitions, salt)
            t = t.withColumn("k", F.pmod(F.xxhash64("key"), F.lit(keys)))
            t.write.mode("overwrite").parquet(path)

    timed(phases, "gen", gen)
    a, b = spark.read.parquet(a_src), spark.read.parquet(b_src)
    joined = a.alias("a").join(b.alias("b"), "k").select(
        "k", F.col("a.key").alias("ka"), F.col("b.key").alias("kb"), F.col("a.value").alias("va")
    )
    timed(phases, "join", lambda: joined.write.mode("overwrite").parquet(out))

    def validate():
        res = spark.read.parquet(out).count()
        ca = a.groupBy("k").count().withColumnRenamed("count", "ca")
        cb = b.groupBy("k").count().withColumnRenamed("count", "cb")
        want = ca.join(cb, "k").select(F.sum(F.col("ca") * F.col("cb"))).first()[0]
        return {"rows": [int(res), int(want or 0)]}

    v = timed(phases, "validate", validate)
    ok = v["rows"][0] == v["rows"][1]
    return phases, v, ok


JOBS = {"terasort": terasort, "groupby": groupby, "join": join}


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--jobs", default="terasort,groupby,join")
    p.add_argument("--data", required=True, help="the data directory (HDFS's role)")
    p.add_argument("--tmp", required=True, help="spark.local.dir (YARN's temporary data)")
    p.add_argument("--records", type=int, default=2_000_000)
    p.add_argument("--partitions", type=int, default=32)
    p.add_argument("--cores", type=int, default=2)
    p.add_argument("--memory", default="1g")
    args = p.parse_args()
    spark = session(args)
    spark.sparkContext.setLogLevel("ERROR")
    failed = False
    for name in args.jobs.split(","):
        t = time.monotonic()
        phases, v, ok = JOBS[name](spark, args)
        wall = round(time.monotonic() - t, 3)
        spans = SPANS.get(id(phases), {})
        print(json.dumps({"job": name, "seconds": wall, "phases": phases, "spans": spans, "validation": v, "ok": ok}), flush=True)
        failed |= not ok
    spark.stop()
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
