#!/usr/bin/env python3
"""Tessera vs MinIO on one machine, same shape, same load generator, alternating turns.

Starts on 127.0.0.1 a MinIO cluster (6 server processes, 1 drive each, EC:2) and a Tessera
cluster (6 nodes, 1 drive each, 4+2, plus its S3 gateway), then runs each scenario against MinIO
and Tessera turn by turn so machine noise hits both alike:
  S3 PUT and GET of 1 MiB objects at concurrency 8 and 32, Tessera's smart client GET, 4 KiB
  GETs (objects/s), and GETs with one server process killed (SIGKILL) on both systems.
Every run records throughput, objects/s, p50/p99 latency, and CPU seconds per GB for the load
generator and for all server processes together (from /proc/<pid>/stat). Prints one table with
the ratio Tessera/MinIO per row, writes results JSON and PNG plots.

Usage: bench/compare-minio.sh [--quick | --full] [--out DIR]
Every process started here is stopped by PID on exit, Ctrl-C included. Only 127.0.0.1 is used.
"""

import argparse
import datetime
import json
import os
import platform
import secrets
import shutil
import signal
import socket
import string
import subprocess
import sys
import tempfile
import time
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TESSERA = os.path.join(ROOT, "target", "release", "tessera")
CACHE = os.path.join(ROOT, "bench", ".cache")
MINIO_VERSION = "v0.0.0-20260212201848-7aac2a2c5b7c"
MINIO = os.path.join(CACHE, "bin", "minio")
CLK_TCK = os.sysconf("SC_CLK_TCK")
READY_TIMEOUT_S = 60

processes = []  # every child we start: stopped by PID in stop_all()


def log(msg):
    print(msg, file=sys.stderr, flush=True)


def stop_all(*_):
    for proc in processes:
        if proc.poll() is None:
            proc.kill()
    for proc in processes:
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass


def on_signal(signum, _frame):
    stop_all()
    sys.exit(128 + signum)


claimed = []  # port ranges handed out in this run, free or not yet bound


def free_port_block(count):
    """`count` consecutive free ports on 127.0.0.1, none handed out before in this run."""
    for base in range(30000, 60000, 97):
        if any(base < end and start < base + count for start, end in claimed):
            continue
        ok = True
        for port in range(base, base + count):
            with socket.socket() as s:
                try:
                    s.bind(("127.0.0.1", port))
                except OSError:
                    ok = False
                    break
        if ok:
            claimed.append((base, base + count))
            return base
    raise SystemExit("error: no free port block on 127.0.0.1")


def wait_until(check, what, deadline_s=READY_TIMEOUT_S):
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(0.2)
    raise SystemExit(f"error: {what} not ready within {deadline_s} s")


def port_open(port):
    with socket.socket() as s:
        s.settimeout(0.2)
        return s.connect_ex(("127.0.0.1", port)) == 0


def spawn(cmd, env=None, log_path=None):
    out = open(log_path, "ab") if log_path else subprocess.DEVNULL
    proc = subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    processes.append(proc)
    return proc


def cpu_seconds(pids):
    """User + system CPU seconds of live processes (dead ones count what /proc last showed)."""
    total = 0.0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            total += (int(fields[11]) + int(fields[12])) / CLK_TCK
        except (FileNotFoundError, ProcessLookupError):
            pass
    return total


def ensure_minio():
    if os.path.exists(MINIO):
        return
    log(f"== installing MinIO {MINIO_VERSION} with go install (about 5 minutes, cached in bench/.cache)")
    env = dict(os.environ, GOBIN=os.path.join(CACHE, "bin"))
    subprocess.run(["go", "install", f"github.com/minio/minio@{MINIO_VERSION}"], check=True, env=env)


class MinioCluster:
    name = "minio"

    def __init__(self, work, access, secret):
        self.work, self.access, self.secret = work, access, secret
        self.base = free_port_block(12)
        self.ports = [self.base + i for i in range(6)]
        self.procs = []

    def endpoints(self):
        return [f"http://127.0.0.1:{p}{self.work}/minio/n{i + 1}/d1" for i, p in enumerate(self.ports)]

    def start(self):
        for i in range(6):
            os.makedirs(f"{self.work}/minio/n{i + 1}/d1", exist_ok=True)
        for i, port in enumerate(self.ports):
            env = dict(os.environ, MINIO_ROOT_USER=self.access, MINIO_ROOT_PASSWORD=self.secret,
                       MINIO_STORAGE_CLASS_STANDARD="EC:2", _MINIO_SERVER_LOCAL=f"127.0.0.1:{port}",
                       MINIO_ROOTDRIVE_THRESHOLD_SIZE="1", MINIO_BROWSER="off", MINIO_UPDATE="off")
            cmd = [MINIO, "server", "--quiet", "--address", f"127.0.0.1:{port}",
                   "--console-address", f"127.0.0.1:{self.base + 6 + i}"] + self.endpoints()
            self.procs.append(spawn(cmd, env, f"{self.work}/minio-n{i + 1}.log"))

        def healthy():
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.ports[0]}/minio/health/cluster", timeout=1) as r:
                    return r.status == 200
            except OSError:
                return False

        wait_until(healthy, "MinIO cluster")

    @property
    def url(self):
        return f"http://127.0.0.1:{self.ports[0]}"

    def pids(self):
        return [p.pid for p in self.procs]

    def kill_one(self):
        self.procs[1].kill()
        self.procs[1].wait()


class TesseraCluster:
    name = "tessera"

    def __init__(self, work, access, secret):
        self.work, self.access, self.secret = work, access, secret
        self.base = free_port_block(8)
        self.s3_port = self.base + 7
        self.config = f"{work}/tessera/cluster.toml"
        self.procs = []

    def start(self):
        subprocess.run([TESSERA, "init", "--nodes", "6", "--ec", "4+2", "--data", f"{self.work}/tessera",
                        "--base-port", str(self.base)], check=True, stdout=subprocess.DEVNULL)
        env = dict(os.environ, TESSERA_LOG="warn")
        for i in range(6):
            cmd = [TESSERA, "node", "--config", self.config, "--id", f"n{i + 1}"]
            self.procs.append(spawn(cmd, env, f"{self.work}/tessera-n{i + 1}.log"))
        for i in range(6):
            wait_until(lambda p=self.base + i: port_open(p), f"tessera node n{i + 1}")
        genv = dict(env, TESSERA_ACCESS_KEY=self.access, TESSERA_SECRET_KEY=self.secret)
        cmd = [TESSERA, "gateway", "--config", self.config, "--listen", f"127.0.0.1:{self.s3_port}"]
        self.procs.append(spawn(cmd, genv, f"{self.work}/tessera-gateway.log"))
        wait_until(lambda: port_open(self.s3_port), "tessera gateway")

    @property
    def url(self):
        return f"http://127.0.0.1:{self.s3_port}"

    def pids(self):
        return [p.pid for p in self.procs]

    def kill_one(self):
        self.procs[1].kill()
        self.procs[1].wait()


def bench(system, op, size, objects, concurrency, duration, bucket, smart=False, prefill=True):
    cmd = [TESSERA, "bench", op, "--size", size, "--objects", str(objects), "--concurrency", str(concurrency),
           "--duration", duration, "--bucket", bucket, "--json"]
    env = dict(os.environ)
    if smart:
        env["TESSERA_CONFIG"] = system.config
    else:
        cmd += ["--s3", system.url]
        env["TESSERA_ACCESS_KEY"], env["TESSERA_SECRET_KEY"] = system.access, system.secret
    if op == "get" and prefill:
        # Write the objects in a run of its own, so the measured window holds only GETs.
        warm = [c if c != duration else "1ms" for c in cmd]
        run = subprocess.run(warm, env=env, capture_output=True, text=True)
        if run.returncode != 0:
            raise SystemExit(f"error: {system.name} prefill failed: {run.stderr.strip()}")
    if op == "get":
        cmd.append("--no-prefill")
    before = cpu_seconds(system.pids())
    run = subprocess.run(cmd, env=env, capture_output=True, text=True)
    after = cpu_seconds(system.pids())
    if run.returncode != 0:
        raise SystemExit(f"error: {system.name} {op} failed: {run.stderr.strip()}")
    result = json.loads(run.stdout)
    gb = result["bytes"] / 1e9
    result["server_cpu_s"] = after - before
    result["server_cpu_s_per_gb"] = (after - before) / gb if gb else 0.0
    return result


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--quick", action="store_true", help="about 2 minutes (default)")
    mode.add_argument("--full", action="store_true", help="longer runs, more objects")
    parser.add_argument("--out", default=os.path.join(ROOT, "bench", "results"), help="results directory")
    parser.add_argument("--python-loader", action="store_true",
                        help="instead: DataLoader images/s over 100 KiB objects (bench/python_loader.py) with "
                             "tessera.torch, boto3 via Tessera's gateway and boto3 via MinIO")
    args = parser.parse_args()
    if args.python_loader:
        return python_loader(args)
    duration, objects, small_objects = ("20s", 256, 2000) if args.full else ("5s", 64, 500)

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    if not os.path.exists(TESSERA):
        raise SystemExit("error: build first: make build")
    ensure_minio()
    work = tempfile.mkdtemp(prefix="tessera-vs-minio-")
    access = "".join(secrets.choice(string.ascii_uppercase + string.digits) for _ in range(20))
    secret = secrets.token_hex(20)
    minio, tessera = MinioCluster(work, access, secret), TesseraCluster(work, access, secret)
    rows = []
    try:
        log("== starting MinIO and Tessera")
        minio.start()
        tessera.start()
        prefix = f"{int(time.time())}"

        def pair(label, op, size, count, concurrency, bucket, prefill=True, smart=False):
            result = {"label": label}
            for system in (minio, tessera):
                log(f"== {label}: {system.name}")
                result[system.name] = bench(system, op, size, count, concurrency, duration,
                                            f"{bucket}-{prefix}", prefill=prefill)
            if smart:
                log(f"== {label}: tessera smart client")
                result["tessera_smart"] = bench(tessera, op, size, count, concurrency, duration,
                                                f"{bucket}-{prefix}", smart=True, prefill=False)
            rows.append(result)

        pair("PUT 1 MiB c=8", "put", "1MiB", objects, 8, "put8")
        pair("PUT 1 MiB c=32", "put", "1MiB", objects, 32, "put32")
        pair("GET 1 MiB c=8", "get", "1MiB", objects, 8, "get")
        pair("GET 1 MiB c=32", "get", "1MiB", objects, 32, "get", prefill=False, smart=True)
        pair("GET 4 KiB c=32", "get", "4KiB", small_objects, 32, "small")
        log("== killing one server process of each system")
        minio.kill_one()
        tessera.kill_one()
        pair("GET 1 MiB c=32, 1 down", "get", "1MiB", objects, 32, "get", prefill=False, smart=True)
    finally:
        stop_all()
    report(rows, args.out, duration, objects)
    shutil.rmtree(work, ignore_errors=True)


def python_loader(args):
    """Issue-5 benchmark: images/s of a DataLoader, tessera.torch vs boto3 (Tessera gateway, MinIO)."""
    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    ensure_minio()
    objects = "10000" if args.full else "2000"
    work = tempfile.mkdtemp(prefix="tessera-loader-")
    access = "".join(secrets.choice(string.ascii_uppercase + string.digits) for _ in range(20))
    secret = secrets.token_hex(20)
    minio, tessera = MinioCluster(work, access, secret), TesseraCluster(work, access, secret)
    loader = os.path.join(ROOT, "bench", "python_loader.py")
    python = os.path.join(ROOT, ".venv", "bin", "python")
    env = dict(os.environ, AWS_ACCESS_KEY_ID=access, AWS_SECRET_ACCESS_KEY=secret)
    common = [python, loader, "--config", tessera.config, "--objects", objects, "--json"]
    results = {}
    try:
        minio.start()
        tessera.start()
        runs = [
            ("tessera.torch", ["--bucket", "loader", "--populate"]),
            ("boto3 via Tessera gateway", ["--bucket", "loader", "--skip-tessera", "--s3-endpoint", tessera.url,
                                           "--s3-bucket", "loader-s3", "--populate"]),
            ("boto3 via MinIO", ["--bucket", "loader", "--skip-tessera", "--s3-endpoint", minio.url,
                                 "--s3-bucket", "loader-s3", "--populate"]),
        ]
        for label, extra in runs:
            log(f"== {label}")
            run = subprocess.run(common + extra, env=env, capture_output=True, text=True)
            if run.returncode != 0:
                raise SystemExit(f"error: {label}: {run.stderr.strip()[-2000:]}")
            results[label] = json.loads(run.stdout.strip().splitlines()[-1])
    finally:
        stop_all()
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "python-loader.json"), "w") as f:
        json.dump(results, f, indent=1)
    print(json.dumps(results, indent=1))


def report(rows, out, duration, objects):
    os.makedirs(out, exist_ok=True)
    cpu = subprocess.run(["sh", "-c", "lscpu | sed -n 's/^Model name: *//p'"], capture_output=True, text=True)
    meta = {"date": datetime.date.today().isoformat(), "cpu": cpu.stdout.strip(), "nproc": os.cpu_count(),
            "kernel": platform.release(), "duration": duration, "objects": objects}
    with open(os.path.join(out, "compare-minio.json"), "w") as f:
        json.dump({"meta": meta, "rows": rows}, f, indent=1)
    print(f"date {meta['date']}  cpu {meta['cpu']}  nproc {meta['nproc']}  duration {duration}  objects {objects}")
    header = f"{'run':<24} {'system':<14} {'MB/s':>8} {'obj/s':>8} {'p50 ms':>7} {'p99 ms':>7} " \
             f"{'cli s/GB':>8} {'srv s/GB':>8} {'tot s/GB':>8} {'ratio':>6}"
    print(header)
    for row in rows:
        base = row["minio"]
        for name in ("minio", "tessera", "tessera_smart"):
            r = row.get(name)
            if not r:
                continue
            total = r["client_cpu_s_per_gb"] + r["server_cpu_s_per_gb"]
            ratio = "" if name == "minio" else f"{r['throughput_bytes_per_s'] / base['throughput_bytes_per_s']:.2f}"
            print(f"{row['label']:<24} {name:<14} {r['throughput_bytes_per_s'] / 1e6:>8.1f} "
                  f"{r['objects_per_s']:>8.1f} {r['p50_ms']:>7.2f} {r['p99_ms']:>7.2f} "
                  f"{r['client_cpu_s_per_gb']:>8.2f} {r['server_cpu_s_per_gb']:>8.2f} {total:>8.2f} {ratio:>6}")
    plot(rows, out)


def plot(rows, out):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        log("matplotlib not installed: no plots (pip install matplotlib)")
        return
    labels = [r["label"] for r in rows if "4 KiB" not in r["label"]]
    series = {"minio": [], "tessera": [], "tessera_smart": []}
    for row in rows:
        if "4 KiB" in row["label"]:
            continue
        for name in series:
            r = row.get(name)
            series[name].append(r["throughput_bytes_per_s"] / 1e9 if r else 0.0)
    fig, ax = plt.subplots(figsize=(10, 4.5))
    width = 0.27
    for offset, (name, label) in enumerate([("minio", "MinIO (S3)"), ("tessera", "Tessera gateway (S3)"),
                                            ("tessera_smart", "Tessera smart client")]):
        xs = [i + (offset - 1) * width for i in range(len(labels))]
        ax.bar(xs, series[name], width, label=label)
    ax.set_xticks(range(len(labels)), labels, rotation=15, fontsize=8)
    ax.set_ylabel("GB/s")
    ax.set_title("Tessera vs MinIO, 6 processes x 1 drive, 4+2 / EC:2, one 2-core machine")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(os.path.join(out, "compare-minio.png"), dpi=110)
    log(f"plot: {os.path.join(out, 'compare-minio.png')}")


if __name__ == "__main__":
    try:
        main()
    finally:
        stop_all()
