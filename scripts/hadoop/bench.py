"""`sluice bench hadoop`: Spark jobs (jobs.py) with their data on an ext4
file system over an emulated 7200 rpm HDD served by `sluice serve` in real
time, and their temporary data (spark.local.dir) placed case by case
(docs/hadoop.md):

  a-hdd        temp on the same HDD as the data (the volume pass-through)
  b-class      Sluice: SCM cache in front of that HDD, the temp directory
               selected by a directory class on the one file system
  b2-volume    Sluice: temp on a cached volume of its own, mounted at the
               temp directory; the data volume pass-through
  c-scm        temp on an SCM-only volume (the "fast SSD" bound)
  d-half       as b2-volume, the cache half the peak of temporary data
  e-all        one cached volume that admits everything, data included

Every case runs on fresh emulated devices, through nbdfuse + a loop device
+ ext4 mounted with `discard`, set up and torn down here. Cases alternate
across repeats. Per case: job runtimes (median and spread), HDD bytes read
and written and average MB/s, the cache's hits, spill and discarded-dirty
bytes, and CPU utilisation. Writes target/bench/hadoop.json, a table on
stdout, and target/bench/hadoop.svg.
"""

import argparse
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import threading
import time
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))
CASES = ["a-hdd", "b-class", "b2-volume", "c-scm", "d-half", "e-all"]
MIB = 1 << 20
JOBS_ALL = "terasort,groupby,join"
TRACE = "temp-trace.csv"


def sh(*args, check=True):
    r = subprocess.run(args, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=120)
    if check and r.returncode != 0:
        raise RuntimeError(f"{' '.join(args)}: {r.stderr.strip()}")
    return r.stdout.strip()


def cgroup(controller, name, settings=()):
    """A cgroup (v1) of `controller` named `name`, created if missing, with
    `settings` [(file, value)] written."""
    cg = os.path.join("/sys/fs/cgroup", controller, name)
    os.makedirs(cg, exist_ok=True)
    for k, v in settings:
        with open(os.path.join(cg, k), "w") as f:
            f.write(str(v))
    return cg


class Side:
    """One side of the machine — the jobs, or the storage path (the sluice
    servers and nbdfuse) — in a CPU set of its own (`cpus`, e.g. "1"; None:
    every CPU) with its CPU time accounted (cpuacct)."""

    def __init__(self, name, cpus):
        self.groups = [cgroup("cpuacct", name)]
        if cpus:
            mems = open("/sys/fs/cgroup/cpuset/cpuset.mems").read().strip()
            self.groups.append(cgroup("cpuset", name, [("cpuset.mems", mems), ("cpuset.cpus", cpus)]))
        self.usage = os.path.join(self.groups[0], "cpuacct.usage")

    def join(self):
        """Put the calling process in the side's groups (a `preexec_fn`)."""
        for g in self.groups:
            with open(os.path.join(g, "cgroup.procs"), "w") as f:
                f.write(str(os.getpid()))

    def cpu_s(self):
        with open(self.usage) as f:
            return int(f.read()) / 1e9


# The emulated HDD's media rate ("" the profile's; set by main).
HDD_RATE = ""
# The storage path's side (set by main; None: no CPU sets).
STORAGE = None


def storage_preexec():
    if STORAGE:
        STORAGE.join()


class Server:
    """One `sluice serve` on a config of its own; stops with SIGTERM."""

    def __init__(self, sluice, workdir, text):
        os.makedirs(workdir, exist_ok=True)
        self.config = os.path.join(workdir, "sluice.toml")
        with open(self.config, "w") as f:
            f.write(text)
        self.log = open(os.path.join(workdir, "serve.log"), "w")
        self.proc = subprocess.Popen(
            [sluice, "serve", "--config", self.config], stdout=subprocess.PIPE, stderr=self.log, text=True,
            preexec_fn=storage_preexec,
        )
        first = self.proc.stdout.readline()
        m = re.search(r":(\d+)\s*$", first)
        if not m:
            raise RuntimeError(f"sluice serve did not start: {first!r}; see {self.log.name}")
        self.port = int(m.group(1))
        second = self.proc.stdout.readline()
        m = re.search(r"http://([^/]+)/metrics", second)
        self.metrics_addr = m.group(1) if m else None

    def metrics(self):
        with urllib.request.urlopen(f"http://{self.metrics_addr}/metrics", timeout=10) as r:
            text = r.read().decode()
        out = {}
        for line in text.splitlines():
            if line and not line.startswith("#"):
                k, _, v = line.rpartition(" ")
                try:
                    out[k] = float(v)
                except ValueError:
                    pass
        return out

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=120)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()


# `--ext4-commit`: the file systems' journal commit interval in seconds
# (mount -o commit=N; 0: ext4's default, 5 s).
EXT4_COMMIT = 0


class Mount:
    """An export as ext4 (mounted with discard): nbdfuse, a loop device with
    4 KiB sectors, mkfs.ext4, mount. `close` undoes it in order."""

    def __init__(self, workdir, port, export, size):
        self.fuse = os.path.join(workdir, f"fuse-{export}")
        self.mnt = os.path.join(workdir, f"mnt-{export}")
        os.makedirs(self.fuse, exist_ok=True)
        os.makedirs(self.mnt, exist_ok=True)
        self.nbdfuse = subprocess.Popen(
            ["nbdfuse", self.fuse, f"nbd://127.0.0.1:{port}/{export}"],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            preexec_fn=storage_preexec,
        )
        self.loop = None
        self.mounted = False
        node = os.path.join(self.fuse, "nbd")
        deadline = time.monotonic() + 30
        while not (os.path.exists(node) and os.path.getsize(node) == size):
            if time.monotonic() > deadline:
                raise RuntimeError(f"nbdfuse did not expose {node}")
            time.sleep(0.05)
        # Direct I/O: the file system's page cache is the only one (the
        # loop device's backing file would cache the same data again).
        self.loop = sh("losetup", "-f", "--show", "--direct-io=on", "--sector-size", "4096", node)
        sh("mkfs.ext4", "-q", "-F", "-E", "nodiscard", self.loop)
        opts = "discard" + (f",commit={EXT4_COMMIT}" if EXT4_COMMIT else "")
        sh("mount", "-o", opts, self.loop, self.mnt)
        self.mounted = True

    def close(self):
        if self.mounted:
            sh("umount", self.mnt)
            self.mounted = False
        if self.loop:
            sh("losetup", "-d", self.loop)
            self.loop = None
        deadline = time.monotonic() + 30
        while subprocess.run(["umount", self.fuse], capture_output=True).returncode != 0:
            if time.monotonic() > deadline:
                break
            time.sleep(0.1)
        try:
            self.nbdfuse.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.nbdfuse.kill()


def devices(cache_bytes, capacity_bytes, disks):
    rate = f'hdd_rate = "{HDD_RATE}"\n' if HDD_RATE else ""
    return (
        f'[cache]\nkind = "memory"\nsize = "{cache_bytes // MIB}m"\nemulate = "scm"\n'
        f'[capacity]\nkind = "memory"\nsize = "{capacity_bytes // MIB}m"\nemulate = "hdd"\ndisks = {disks}\n{rate}'
    )


def config(workdir, case, o, cache_bytes, disks, trace=False):
    """The server config(s) of a case: [(name, toml, [(export, size, role)])]."""
    head = (
        'data_dir = "{dir}"\nlisten = ["127.0.0.1:0"]\nunix_socket = ""\n'
        'metrics_listen = "127.0.0.1:0"\n'
    )
    head = head.replace("{dir}", "@DIR@")
    data, temp = o.data_volume, o.temp_volume
    # No background cleaning: temporary data lives until the job deletes
    # it; a cache sized for it never needs to write it home.
    engine = '[engine]\nlayout = "in-place"\nchunk_size = "4m"\n'
    if o.reclaim_at is not None:
        # Reclaim (clean live data home) only this close to a full log,
        # and pace writers at half of it.
        engine += f"compaction_start = {o.reclaim_at}\ncompaction_setpoint = {o.reclaim_at / 2}\n"
    cap = data + temp + 512 * MIB
    if case in ("a-hdd", "b-class", "e-all"):
        cap = data + 512 * MIB
        vol = f'[[volume]]\nname = "data"\nsize = "{data // MIB}m"\n'
        if case == "a-hdd":
            vol += 'mode = "pt"\n'
        elif case == "b-class":
            # Everything is cached first (a new file's blocks are known only
            # once its metadata is committed); the temp directory's blocks
            # are the class's, kept at reclaim; everything else the
            # metadata names is written home at once (clean_others), so a
            # reclaim drops it without a disk write (docs/caching.md).
            vol += 'seq_cutoff = "never"\n'
            vol += '[[volume.class]]\nname = "temp"\ndirectory = "/tmp"\nrefresh = "1s"\nshare = 1.0\npinned = true\n'
            vol += f'clean_others = true\npredict = {"true" if o.predict else "false"}\n'
        else:
            vol += 'seq_cutoff = "never"\n'
        return [("hdd", head + devices(cache_bytes, cap, disks) + engine + vol, [("data", data, "both")])]
    if case in ("b2-volume", "d-half"):
        vols = (
            f'[[volume]]\nname = "data"\nsize = "{data // MIB}m"\nmode = "pt"\n'
            f'[[volume]]\nname = "temp"\nsize = "{temp // MIB}m"\nseq_cutoff = "never"\npromote_after = 0\n'
        )
        if trace:
            # The temp volume's I/O, for `sluice advise` (docs/advise.md).
            vols += f'trace = "{TRACE}"\ntrace_max = "4g"\n'
        # The whole volume is temporary data, kept in the cache: a full
        # cache spills new writes home instead of cleaning what it holds
        # (docs/caching.md, "Pinned classes").
        vols += '[[volume.class]]\nname = "temp"\nshare = 1.0\npinned = true\n'

        return [
            ("hdd", head + devices(cache_bytes, cap, disks) + engine + vols, [("data", data, "data"), ("temp", temp, "temp")])
        ]
    # c-scm: the data on the HDD (pass-through), the temp data on a second
    # server whose capacity is emulated SCM as well.
    hdd = head + devices(64 * MIB, data + 512 * MIB, disks) + engine
    hdd += f'[[volume]]\nname = "data"\nsize = "{data // MIB}m"\nmode = "pt"\n'
    scm = (
        head
        + f'[cache]\nkind = "memory"\nsize = "256m"\nemulate = "scm"\n'
        + f'[capacity]\nkind = "memory"\nsize = "{(temp * 3 // 2) // MIB}m"\nemulate = "scm"\n'
        + '[engine]\nchunk_size = "4m"\nband_size = "64m"\n'
        + f'[[volume]]\nname = "temp"\nsize = "{temp // MIB}m"\n'
    )
    return [("hdd", hdd, [("data", data, "data")]), ("scm", scm, [("temp", temp, "temp")])]


def memory_cgroup(name, limit):
    """A cgroup (v1 memory controller) capped at `limit` bytes; emptied and
    reused if it exists."""
    return cgroup("memory", name, [("memory.limit_in_bytes", limit)])


def cpu_times():
    with open("/proc/stat") as f:
        parts = [int(x) for x in f.readline().split()[1:]]
    idle = parts[3] + parts[4]
    return sum(parts) - idle, sum(parts)


def sample_peak(path, stop, out):
    """The largest `du` of `path` seen every half second until `stop`."""
    while not stop.is_set():
        r = subprocess.run(["du", "-sb", path], capture_output=True, text=True)
        if r.returncode == 0 and r.stdout:
            out[0] = max(out[0], int(r.stdout.split()[0]))
        stop.wait(0.5)


# Each job's own phase — what Twitter timed as the job: TeraSort without
# TeraGen and TeraValidate (generating and checking the data are phases of
# their own here, reported apart).
MAIN_PHASE = {"terasort": "sort", "groupby": "aggregate", "join": "join"}


def sample_busy(server, stop, out):
    """(time, HDD busy ns) every half second until `stop`."""
    while not stop.is_set():
        try:
            m = server.metrics()
            out.append((time.time(), m.get('sluice_device_busy_ns_total{device="capacity"}', 0.0)))
        except Exception:
            pass
        stop.wait(0.5)


def busy_over(samples, a, b):
    """The HDD's busy share over [a, b], from samples (linear between them)."""
    def at(t):
        if not samples:
            return 0.0
        if t <= samples[0][0]:
            return samples[0][1]
        for (t0, x0), (t1, x1) in zip(samples, samples[1:]):
            if t0 <= t <= t1:
                return x0 + (x1 - x0) * (t - t0) / max(1e-9, t1 - t0)
        return samples[-1][1]
    return max(0.0, min(1.0, (at(b) - at(a)) / 1e9 / max(1e-9, b - a)))


def capacity_stats(metrics):
    g = lambda k: metrics.get(f'sluice_device_{k}_total{{device="capacity"}}', 0.0)
    return {"hdd_write_bytes": g("host_write_bytes"), "hdd_read_bytes": g("host_read_bytes"), "hdd_busy_ns": g("busy_ns")}


def cache_stats(metrics):
    out = {}
    for k in ("spill_bytes", "discarded_dirty_bytes", "read_hit_bytes", "read_miss_bytes", "cleaned_bytes"):
        out[k] = sum(v for m, v in metrics.items() if m.startswith(f"sluice_cache_{k}_total{{"))
    for k in ("reclassified_bytes", "class_in_time_bytes", "class_missed_bytes", "other_kept_out_bytes", "other_admitted_bytes"):
        out[k] = sum(v for m, v in metrics.items() if m.startswith(f"sluice_cache_class_{k}{{"))
    return out


def run_case(case, o, cache_bytes, disks, rep, trace_to=None):
    """One run; with `trace_to`, the temp volume's trace and its server
    config are kept as `trace_to` + ".csv" / ".toml"."""
    workdir = os.path.join(o.workdir, f"{case}-{disks}d-{rep}")
    shutil.rmtree(workdir, ignore_errors=True)
    servers, mounts = [], []
    try:
        roles = {}
        for name, text, exports in config(workdir, case, o, cache_bytes, disks, trace=trace_to is not None):
            text = text.replace("@DIR@", os.path.join(workdir, name, "data"))
            s = Server(o.sluice, os.path.join(workdir, name), text)
            servers.append((name, s))
            for export, size, role in exports:
                m = Mount(os.path.join(workdir, name), s.port, export, size)
                mounts.append(m)
                roles[role] = m.mnt
        if "both" in roles:
            data_dir, tmp_dir = os.path.join(roles["both"], "data"), os.path.join(roles["both"], "tmp")
        else:
            data_dir, tmp_dir = os.path.join(roles["data"], "data"), os.path.join(roles["temp"], "tmp")
        os.makedirs(data_dir)
        os.makedirs(tmp_dir)
        before = {n: s.metrics() for n, s in servers}
        stop, peak = threading.Event(), [0]
        sampler = threading.Thread(target=sample_peak, args=(tmp_dir, stop, peak))
        sampler.start()
        busy_samples = []
        hdd_server = dict(servers)["hdd"]
        busy_sampler = threading.Thread(target=sample_busy, args=(hdd_server, stop, busy_samples))
        busy_sampler.start()
        busy0, total0 = cpu_times()
        jobs_side = Side("sluice-hadoop-jobs", o.cpus_jobs)
        side0 = (jobs_side.cpu_s(), STORAGE.cpu_s() if STORAGE else 0.0)
        t0 = time.monotonic()
        env = dict(os.environ, PYSPARK_PYTHON=o.python)
        # The jobs run in a memory cgroup of `job_memory` (page cache
        # included), as on a node whose data outgrows its RAM: without it
        # this machine's RAM would cache every byte and the disks would see
        # next to nothing.
        cg = memory_cgroup(f"sluice-hadoop-{os.getpid()}", o.job_memory)
        cmd = [o.python, os.path.join(HERE, "jobs.py"), "--jobs", o.jobs, "--data", data_dir, "--tmp", tmp_dir,
               "--records", str(o.records), "--partitions", str(o.partitions), "--memory", o.memory,
               "--cores", str(o.cores)]
        r = subprocess.run(
            ["sh", "-c", f'echo $$ > {cg}/cgroup.procs && exec "$@"', "sh", *cmd],
            capture_output=True, text=True, env=env, preexec_fn=jobs_side.join,
        )
        wall = time.monotonic() - t0
        side1 = (jobs_side.cpu_s(), STORAGE.cpu_s() if STORAGE else 0.0)
        busy1, total1 = cpu_times()
        stop.set()
        sampler.join()
        busy_sampler.join()
        jobs = [json.loads(line) for line in r.stdout.splitlines() if line.startswith("{")]
        errors = [] if r.returncode == 0 else [r.stderr.strip().splitlines()[-1:] or ["failed"]]
        after = {n: s.metrics() for n, s in servers}
        hdd = {k: after["hdd"].get(k, 0) for k in after["hdd"]}
        cap = {k: v - capacity_stats(before["hdd"])[k] for k, v in capacity_stats(hdd).items()}
        cache = {k: v - cache_stats(before["hdd"])[k] for k, v in cache_stats(hdd).items()}
        return {
            "case": case,
            "disks": disks,
            "repeat": rep,
            "cache_bytes": cache_bytes if case not in ("a-hdd", "c-scm") else 0,
            "wall_s": round(wall, 2),
            # The job's own phase (MAIN_PHASE), and the whole run of it.
            "jobs": {j["job"]: j["phases"].get(MAIN_PHASE.get(j["job"], ""), j["seconds"]) for j in jobs},
            "jobs_wall": {j["job"]: j["seconds"] for j in jobs},
            "phases": {j["job"]: j["phases"] for j in jobs},
            "job_hdd_busy_share": {
                j["job"]: round(busy_over(busy_samples, *j["spans"][MAIN_PHASE[j["job"]]]), 3)
                for j in jobs if MAIN_PHASE.get(j["job"]) in j.get("spans", {})
            },
            "jobs_ok": all(j["ok"] for j in jobs) and len(jobs) == len(o.jobs.split(",")),
            "hdd_write_bytes": cap["hdd_write_bytes"],
            "hdd_read_bytes": cap["hdd_read_bytes"],
            "hdd_write_mb_per_s": round(cap["hdd_write_bytes"] / 1e6 / wall, 2),
            "hdd_read_mb_per_s": round(cap["hdd_read_bytes"] / 1e6 / wall, 2),
            "hdd_busy_share": round(min(1.0, cap["hdd_busy_ns"] / 1e9 / wall), 3),
            "cpu_utilisation": round((busy1 - busy0) / max(1, total1 - total0), 3),
            # CPUs each side kept busy on average (cpuacct), and how many
            # it had.
            "jobs_cpus_used": round((side1[0] - side0[0]) / wall, 3),
            "storage_cpus_used": round((side1[1] - side0[1]) / wall, 3) if STORAGE else None,
            "peak_temp_bytes": peak[0],
            **cache,
            "errors": errors,
        }
    finally:
        for m in reversed(mounts):
            try:
                m.close()
            except Exception as e:  # keep tearing down
                print(f"teardown: {e}", file=sys.stderr)
        for _, s in servers:
            s.stop()
        if trace_to:
            os.makedirs(os.path.dirname(trace_to), exist_ok=True)
            shutil.copy(os.path.join(workdir, "hdd", "data", TRACE), trace_to + ".csv")
            shutil.copy(os.path.join(workdir, "hdd", "sluice.toml"), trace_to + ".toml")
        shutil.rmtree(workdir, ignore_errors=True)


def med_share(rs, hit, miss):
    xs = [r.get(hit, 0) / (r.get(hit, 0) + r.get(miss, 0)) for r in rs if r.get(hit, 0) + r.get(miss, 0) > 0]
    return round(statistics.median(xs), 3) if xs else None


def summarize(rows):
    by = {}
    for r in rows:
        by.setdefault((r["case"], r["disks"]), []).append(r)
    out = []
    for (case, disks), rs in by.items():
        jobs = {}
        for j in rs[0]["jobs"]:
            xs = [r["jobs"].get(j, 0.0) for r in rs]
            jobs[j] = {"median_s": statistics.median(xs), "min_s": min(xs), "max_s": max(xs)}
        med = lambda k: statistics.median(r[k] for r in rs)
        out.append({
            "case": case, "disks": disks, "repeats": len(rs), "jobs": jobs,
            "total_s": statistics.median(sum(r["jobs"].values()) for r in rs),
            "hdd_write_mb_per_s": med("hdd_write_mb_per_s"), "hdd_read_mb_per_s": med("hdd_read_mb_per_s"),
            "hdd_write_mib": med("hdd_write_bytes") / MIB, "hdd_read_mib": med("hdd_read_bytes") / MIB,
            "cpu_utilisation": med("cpu_utilisation"), "peak_temp_mib": med("peak_temp_bytes") / MIB,
            "spill_mib": med("spill_bytes") / MIB, "discarded_dirty_mib": med("discarded_dirty_bytes") / MIB,
            "read_hit_mib": med("read_hit_bytes") / MIB, "reclassified_mib": med("reclassified_bytes") / MIB,
            "hdd_busy_share": med("hdd_busy_share"),
            # Over the jobs' own phases (the time-weighted mean of the jobs).
            "job_hdd_busy_share": statistics.median(
                sum(r["job_hdd_busy_share"].get(j, 0) * r["jobs"][j] for j in r["jobs"]) / max(1e-9, sum(r["jobs"].values()))
                for r in rs
            ),
            "jobs_cpus_used": med("jobs_cpus_used"),
            "storage_cpus_used": statistics.median(r["storage_cpus_used"] or 0.0 for r in rs),
            # Write-time classification (directory classes): the class's
            # bytes taken in, and others' kept out, when written.
            "class_in_time_share": med_share(rs, "class_in_time_bytes", "class_missed_bytes"),
            "other_kept_out_share": med_share(rs, "other_kept_out_bytes", "other_admitted_bytes"),
            "cache_mib": rs[0]["cache_bytes"] / MIB,
            "all_ok": all(r["jobs_ok"] and not r["errors"] for r in rs),
        })
    return out


def table(summary):
    jobs = list(summary[0]["jobs"]) if summary else []
    head = f"{'case':<11} {'disks':>5} " + " ".join(f"{j + ' s':>14}" for j in jobs)
    head += f" {'total s':>8} {'hdd w MB/s':>10} {'hdd r MB/s':>10} {'hdd busy':>8} {'cpu':>5} {'jobs/stor':>9} {'peak tmp':>9} {'spill':>7} {'discard':>8} {'ok':>3}"
    lines = [head]
    for s in summary:
        cells = " ".join(
            f"{s['jobs'][j]['median_s']:>6.1f} ({s['jobs'][j]['max_s'] - s['jobs'][j]['min_s']:>4.1f})" for j in jobs
        )
        lines.append(
            f"{s['case']:<11} {s['disks']:>5} {cells} {s['total_s']:>8.1f} {s['hdd_write_mb_per_s']:>10.1f} "
            f"{s['hdd_read_mb_per_s']:>10.1f} {s['job_hdd_busy_share'] * 100:>7.0f}% {s['cpu_utilisation'] * 100:>4.0f}% {s['jobs_cpus_used']:>4.2f}/{s['storage_cpus_used']:<4.2f} {s['peak_temp_mib']:>8.0f}M "
            f"{s['spill_mib']:>6.0f}M {s['discarded_dirty_mib']:>7.0f}M {'yes' if s['all_ok'] else 'NO':>3}"
        )
    for s in summary:
        if s.get("class_in_time_share") is not None:
            lines.append(
                f"{s['case']}: at write time {s['class_in_time_share'] * 100:.1f} % of the temp data taken in, "
                f"{(s['other_kept_out_share'] or 0) * 100:.1f} % of other data kept out"
            )
    return "\n".join(lines)


def svg(summary, path):
    """Three bar charts: runtime per case, HDD MB/s per case (one disk), and
    runtime against the number of disks."""
    one = [s for s in summary if s["disks"] == 1]
    many = [s for s in summary if s["case"] in ("a-hdd", "b2-volume", "b-class")]
    charts = [
        ("Job runtime, s (sum of jobs, median)", [(s["case"], s["total_s"]) for s in one]),
        ("HDD MB/s written + read (median)", [(s["case"], s["hdd_write_mb_per_s"] + s["hdd_read_mb_per_s"]) for s in one]),
        ("Runtime, s, by disks", [(f"{s['case']} x{s['disks']}", s["total_s"]) for s in many]),
    ]
    w, bar, gap = 640, 18, 6
    y = 10
    parts = []
    for title, bars in charts:
        parts.append(f'<text x="10" y="{y + 14}" font-size="14" font-family="sans-serif">{title}</text>')
        y += 24
        top = max([v for _, v in bars] + [1e-9])
        for label, v in bars:
            bw = int((w - 220) * v / top)
            parts.append(f'<text x="10" y="{y + 13}" font-size="12" font-family="monospace">{label}</text>')
            parts.append(f'<rect x="170" y="{y}" width="{bw}" height="{bar}" fill="#4a7ab5"/>')
            parts.append(f'<text x="{175 + bw}" y="{y + 13}" font-size="12" font-family="monospace">{v:.1f}</text>')
            y += bar + gap
        y += 16
    with open(path, "w") as f:
        f.write(f'<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{y}">' + "".join(parts) + "</svg>\n")


def advise(o, rows):
    """`sluice advise` on the temp volume's recorded trace, if there is one:
    its report is printed; the essentials, with the cache b2-volume ran
    with, go into the JSON."""
    base = os.path.splitext(o.json)[0] + "-temp-trace"
    if o.no_advise or not os.path.exists(base + ".csv"):
        return None
    out = os.path.splitext(o.json)[0] + "-advise.json"
    r = subprocess.run(
        [o.sluice, "advise", "--trace", base + ".csv", "--config", base + ".toml", "--volume", "temp",
         "--capacity", "hdd", "--json", out],
        capture_output=True, text=True,
    )
    print(r.stdout + r.stderr, file=sys.stderr)
    if r.returncode != 0:
        return {"error": r.stderr.strip()}
    with open(out) as f:
        a = json.load(f)
    used = [x["cache_bytes"] for x in rows if x["case"] == "b2-volume" and x["disks"] == 1]
    return {
        "trace": base + ".csv",
        "peak_live_mib": a["profile"]["peak_live_bytes"] / MIB,
        "p95_live_mib": a["profile"]["p95_live_bytes"] / MIB,
        "recommended_mib": (a["recommended_bytes"] or 0) / MIB,
        "reason": a["reason"],
        "b2_volume_cache_mib": used[0] / MIB if used else None,
        "curve": [
            {k: c[k] for k in ("cache_bytes", "capacity_write_bytes", "spill_bytes", "read_hit_fraction", "dirty_end_bytes")}
            for c in a["curve"]
        ],
        "endurance": a["endurance"],
    }


def expand_cpus(spec):
    """The CPUs of a cpuset.cpus list such as "0-2,5"."""
    out = []
    for part in spec.split(","):
        a, _, b = part.partition("-")
        out.extend(range(int(a), int(b or a) + 1))
    return out


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--sluice", default=os.path.join(ROOT, "target", "release", "sluice"))
    p.add_argument("--python", default=os.path.join(ROOT, "target", "hadoop-venv", "bin", "python"))
    p.add_argument("--quick", action="store_true")
    p.add_argument("--cases", default=",".join(CASES))
    p.add_argument("--disks", default="1", help="comma-separated disk counts for a-hdd, b-class and b2-volume")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--reclaim-at", type=float, default=None, help="[engine] compaction_start of the cached cases (default: the server's, 0.5)")
    p.add_argument("--cache-factor", type=float, default=1.5, help="cache size / peak of temporary data (d-half: 0.5)")
    p.add_argument("--jobs", default=JOBS_ALL, help="default: all (--quick: terasort)")
    p.add_argument("--workdir", default="/tmp/sluice-hadoop")
    p.add_argument("--json", default=os.path.join(ROOT, "target", "bench", "hadoop.json"))
    p.add_argument("--no-advise", action="store_true", help="do not record b2-volume's temp trace and run sluice advise on it")
    p.add_argument("--predict", action="store_true", help="b-class: predict the temp class at write time (docs/caching.md)")
    p.add_argument("--cpus-jobs", default="1", help="CPU set of the jobs (cpuset.cpus syntax; 'all': no CPU sets)")
    p.add_argument("--cpus-storage", default="0", help="CPU set of the storage path: sluice serve and nbdfuse")
    p.add_argument("--ext4-commit", type=int, default=0, help="mount the file systems with commit=N seconds (0: ext4's default 5 s; docs/hadoop.md)")
    p.add_argument("--hdd-rate", default="25m", help="the emulated HDD's media rate ('' the 7200 rpm profile's 200m; docs/hadoop.md)")
    o = p.parse_args()
    global STORAGE, HDD_RATE, EXT4_COMMIT
    HDD_RATE = o.hdd_rate
    if o.ext4_commit < 0:
        p.error("--ext4-commit is a number of seconds, 0 for ext4's default")
    EXT4_COMMIT = o.ext4_commit
    if o.cpus_jobs == "all":
        o.cpus_jobs = o.cpus_storage = None
    STORAGE = Side("sluice-hadoop-storage", o.cpus_storage)
    # Spark's cores: the CPUs of its set.
    o.cores = len(expand_cpus(o.cpus_jobs)) if o.cpus_jobs else os.cpu_count()
    o.records = 3_000_000 if o.quick else 6_000_000
    if o.quick and o.jobs == JOBS_ALL:
        o.jobs = "terasort"
    o.partitions = 16 if o.quick else 32
    o.memory = "768m" if o.quick else "1g"
    o.job_memory = (1280 if o.quick else 1792) * MIB
    o.data_volume = (4 if o.quick else 16) << 30
    o.temp_volume = (2 if o.quick else 8) << 30
    cases = o.cases.split(",")
    disk_counts = [int(d) for d in o.disks.split(",")]
    rows = []
    # The peak of temporary data, from the first case's first run: the
    # cache is sized --cache-factor times it (d-half: half of it), as
    # Twitter sized theirs from the peak (docs/hadoop.md).
    peak = None
    for rep in range(o.repeats):
        for case in cases:
            for disks in disk_counts if case in ("a-hdd", "b-class", "b2-volume") else [1]:
                base = peak if peak else 256 * MIB
                size = int(base * (0.5 if case == "d-half" else o.cache_factor))
                cache = max(64 * MIB, (size + 16 * MIB - 1) // (16 * MIB) * 16 * MIB)
                print(f"run {rep + 1}/{o.repeats}: {case} on {disks} disk(s), cache {cache // MIB} MiB", file=sys.stderr, flush=True)
                trace_to = None
                if case == "b2-volume" and disks == 1 and rep == 0 and not o.no_advise:
                    trace_to = os.path.splitext(o.json)[0] + "-temp-trace"
                r = run_case(case, o, cache, disks, rep, trace_to)
                rows.append(r)
                if peak is None and r["peak_temp_bytes"]:
                    peak = r["peak_temp_bytes"]
                print(json.dumps(r), file=sys.stderr, flush=True)
    summary = summarize(rows)
    advice = advise(o, rows)
    os.makedirs(os.path.dirname(o.json), exist_ok=True)
    with open(o.json, "w") as f:
        out = {"settings": {k: v for k, v in vars(o).items()}, "summary": summary, "runs": rows}
        if advice:
            out["advice"] = advice
        json.dump(out, f, indent=1)
    svg(summary, os.path.splitext(o.json)[0] + ".svg")
    print(table(summary))
    sys.exit(0 if all(s["all_ok"] for s in summary) else 1)


if __name__ == "__main__":
    main()
