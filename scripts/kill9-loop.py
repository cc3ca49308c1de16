#!/usr/bin/python3
"""kill -9 loop over NBD with a durability checker (run by scripts/faults.sh).

Starts `sluice serve` on file devices small enough that background
compaction and GC run all the time, writes 64 KiB extents at random over
the volume through libnbd (each extent's blocks stamped with its extent
number and a generation), flushes now and then and sends some writes with
FUA, and kills the server with SIGKILL at a random moment while the writer
is busy. It then restarts the server and reads every extent back.

What must hold after every kill, per extent:
  - durable generation d: the newest write acknowledged before a completed
    FLUSH, or acknowledged with FUA;
  - the extent reads back as generation d or as a generation written after
    it (acknowledged or still in flight at the kill): never older, never a
    mix of two writes within a block, never another extent's data, never
    bytes nobody wrote.
A violation prints the extent, what was read and what was allowed, and the
script exits 1. At the end it prints the kills, the restart times, and the
engine's compaction and GC counters (they must be above zero).

Environment: SLUICE (binary), KILLS (default 30), SEED (default 1),
WORKDIR (default a fresh directory under /dev/shm or /tmp).
"""
import os, random, shutil, signal, struct, subprocess, sys, tempfile, threading, time, urllib.request

import nbd

EXTENT = 64 << 10
VOLUME = 512 << 20
EXTENTS = VOLUME // EXTENT
MAGIC = 0x534C4B39  # "SLK9"

sluice = os.path.realpath(os.environ.get("SLUICE", "target/release/sluice"))
kills = int(os.environ.get("KILLS", "30"))
rng = random.Random(int(os.environ.get("SEED", "1")))
work = os.environ.get("WORKDIR") or tempfile.mkdtemp(prefix="sluice-kill9-", dir="/dev/shm" if os.path.isdir("/dev/shm") else None)
os.makedirs(work, exist_ok=True)
config = os.path.join(work, "sluice.toml")
with open(config, "w") as f:
    f.write(f"""data_dir = "{work}/data"
listen = ["127.0.0.1:0"]
unix_socket = ""
metrics_listen = "127.0.0.1:0"
[cache]
size = "64m"
[capacity]
size = "1g"
[engine]
chunk_size = "4m"
band_size = "32m"
[[volume]]
name = "default"
size = "512m"
""")


def block(extent, gen, i):
    """Block i of an extent's generation: a stamped header, then filler derived from it."""
    head = struct.pack("<IIQQ", MAGIC, i, extent, gen)
    seed = (extent * 1_000_003 + gen * 7919 + i) & 0xFFFFFFFF
    body = random.Random(seed).randbytes(4096 - len(head))
    return head + body


def extent_data(extent, gen):
    return b"".join(block(extent, gen, i) for i in range(EXTENT // 4096))


def decode(extent, data):
    """The generations an extent's blocks hold (0 = never written), or an error string."""
    gens = set()
    for i in range(EXTENT // 4096):
        b = data[i * 4096:(i + 1) * 4096]
        if b == bytes(4096):
            gens.add(0)  # never written
            continue
        magic, j, e, gen = struct.unpack_from("<IIQQ", b)
        if magic != MAGIC or j != i or e != extent:
            return f"block {i} is not this extent's (magic {magic:#x}, block {j}, extent {e})"
        if b != block(extent, gen, i):
            return f"block {i} of generation {gen} is torn or damaged"
        gens.add(gen)
    # A 64 KiB write may land partly before a crash (blocks are atomic, the
    # extent is not): several generations are fine if each is allowed.
    return gens


def start():
    t = time.time()
    p = subprocess.Popen([sluice, "serve", "--config", config], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    port = p.stdout.readline().strip().rsplit(":", 1)[-1]
    metrics = p.stdout.readline().strip().removeprefix("sluice: metrics on http://").removesuffix("/metrics")
    if not port.isdigit():
        p.kill()
        sys.exit(f"the server did not start: {p.stderr.read()}")
    return p, f"nbd://127.0.0.1:{port}/default", metrics, time.time() - t


base = [{0} for _ in range(EXTENTS)]  # generations the extent durably holds (per block, a set)
since = [set() for _ in range(EXTENTS)]  # generations written after it (acked or in flight)
next_gen = 1
violations = 0
restart_s = []
stop = threading.Event()


def writer(uri):
    """Writes until the server dies or `stop` is set."""
    global next_gen
    h = nbd.NBD()
    h.connect_uri(uri)
    acked = []  # (extent, gen) acknowledged since the last completed flush
    try:
        while not stop.is_set():
            e = rng.randrange(EXTENTS)
            gen = next_gen
            next_gen += 1
            since[e].add(gen)  # in flight: may or may not survive
            fua = rng.random() < 0.05
            h.pwrite(extent_data(e, gen), e * EXTENT, nbd.CMD_FLAG_FUA if fua else 0)
            if fua:
                durable_now(e, gen)
            else:
                acked.append((e, gen))
            if rng.random() < 0.02:
                h.flush()
                for e2, g2 in acked:
                    durable_now(e2, g2)
                acked.clear()
    except nbd.Error:
        pass  # the server was killed
    finally:
        try:
            h.shutdown()
        except Exception:
            pass


def durable_now(e, gen):
    if gen > max(base[e]):
        base[e] = {gen}
        since[e] = {g for g in since[e] if g > gen}


def verify(uri, kill_no):
    global violations
    h = nbd.NBD()
    h.connect_uri(uri)
    for e in range(EXTENTS):
        got = decode(e, h.pread(EXTENT, e * EXTENT))
        allowed = base[e] | since[e]
        if isinstance(got, str) or not got <= allowed:
            violations += 1
            print(f"VIOLATION after kill {kill_no}: extent {e}: read {got}, allowed {sorted(allowed)}", flush=True)
            continue
        # What survived is durable now (it is on the media).
        base[e] = got
        since[e] = set()
    h.shutdown()


def scrape(metrics):
    text = urllib.request.urlopen(f"http://{metrics}/metrics", timeout=10).read().decode()
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#") and "{" not in line:
            k, v = line.split()
            out[k] = float(v)
    return out


shutil.rmtree(os.path.join(work, "data"), ignore_errors=True)
p, uri, metrics, _ = start()
counters = {}
for k in range(1, kills + 1):
    stop.clear()
    t = threading.Thread(target=writer, args=(uri,))
    t.start()
    time.sleep(rng.uniform(2.0, 6.0))
    for name, v in scrape(metrics).items():
        if name.startswith("sluice_engine_"):
            counters[name] = counters.get(name, 0) + v
    p.send_signal(signal.SIGKILL)
    p.wait()
    stop.set()
    t.join()
    p, uri, metrics, took = start()
    restart_s.append(took)
    verify(uri, k)
    print(f"kill {k}/{kills}: restart {took:.2f} s, generations written {next_gen - 1}, violations so far {violations}", flush=True)
p.send_signal(signal.SIGTERM)
p.wait()
compacted = counters.get("sluice_engine_chunks_compacted_total", 0)
reclaimed = counters.get("sluice_engine_bands_reclaimed_total", 0)
print(f"kill9-loop: {kills} kills, {next_gen - 1} writes of 64 KiB, {violations} violations; "
      f"restart {min(restart_s):.2f}-{max(restart_s):.2f} s; "
      f"chunks compacted {compacted:.0f}, bands reclaimed {reclaimed:.0f} (summed over the runs before each kill)")
if compacted == 0 or reclaimed == 0:
    print("kill9-loop: compaction or GC did not run: the loop proves less than it should", file=sys.stderr)
    sys.exit(1)
shutil.rmtree(work, ignore_errors=True)
sys.exit(1 if violations else 0)
