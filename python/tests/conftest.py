"""A real Tessera cluster for the whole session: `tessera init` (6 nodes, 4+2) and one
`tessera node` process per node on free 127.0.0.1 ports, killed by PID at the end."""

from __future__ import annotations

import itertools
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import tomllib
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
TESSERA_BIN = Path(os.environ.get("TESSERA_BIN", REPO / "target" / "release" / "tessera"))
NODES = 6
EC = "4+2"
#: Small chunks so that objects of a few hundred KiB already span several stripes.
CHUNK_SIZE = "64KiB"
READY_TIMEOUT_S = 30.0


def _ephemeral_floor() -> int:
    """First port of the kernel's ephemeral range (what outgoing connections take locally)."""
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32_768


def free_port_range(count: int) -> int:
    """The first of `count` consecutive free ports on 127.0.0.1.

    Below the ephemeral range: a node killed and restarted on its port must not find it taken
    as the local port of somebody's outgoing connection."""
    ceiling = _ephemeral_floor()
    rng = random.Random(os.getpid())
    for _ in range(200):
        base = rng.randrange(10_000, ceiling - count)
        socks = []
        try:
            for port in range(base, base + count):
                s = socket.socket()
                s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                s.bind(("127.0.0.1", port))
                socks.append(s)
            return base
        except OSError:
            continue
        finally:
            for s in socks:
                s.close()
    raise RuntimeError(f"no {count} consecutive free ports on 127.0.0.1 below {ceiling}")


class Cluster:
    def __init__(self, data_dir: Path, node_tls: bool = False):
        self.data_dir = data_dir
        self.config = data_dir / "cluster.toml"
        self.base_port = free_port_range(NODES)
        subprocess.run(
            [str(TESSERA_BIN), "init", "--nodes", str(NODES), "--ec", EC, "--chunk-size", CHUNK_SIZE,
             "--data", str(data_dir), "--base-port", str(self.base_port),
             "--node-tls", "on" if node_tls else "off"],
            check=True, capture_output=True,
        )
        self.secret = tomllib.loads(self.config.read_text())["secret"]
        self.procs: list[subprocess.Popen | None] = [None] * NODES

    def addr(self, idx: int) -> tuple[str, int]:
        return ("127.0.0.1", self.base_port + idx)

    def log_path(self, idx: int) -> Path:
        return self.data_dir / f"n{idx + 1}.log"

    def start(self, idx: int) -> None:
        assert self.procs[idx] is None, f"node n{idx + 1} is running"
        log = open(self.log_path(idx), "ab")
        self.procs[idx] = subprocess.Popen(
            [str(TESSERA_BIN), "node", "--config", str(self.config), "--id", f"n{idx + 1}"],
            stdout=log, stderr=subprocess.STDOUT, env={**os.environ, "TESSERA_LOG": "info", "NO_COLOR": "1"},
        )
        log.close()

    def kill(self, idx: int) -> None:
        proc = self.procs[idx]
        if proc is not None:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait()
            self.procs[idx] = None

    def wait_ready(self) -> None:
        deadline = time.monotonic() + READY_TIMEOUT_S
        for idx, proc in enumerate(self.procs):
            if proc is None:
                continue
            while True:
                try:
                    socket.create_connection(self.addr(idx), timeout=0.2).close()
                    break
                except OSError:
                    if proc.poll() is not None:
                        raise RuntimeError(f"node n{idx + 1} exited: {self.log_path(idx).read_text()}")
                    if time.monotonic() > deadline:
                        raise RuntimeError(f"node n{idx + 1} not ready in {READY_TIMEOUT_S} s")
                    time.sleep(0.02)

    def start_all(self) -> None:
        for idx in range(NODES):
            if self.procs[idx] is None:
                self.start(idx)
        self.wait_ready()

    def stop_all(self) -> None:
        for idx in range(NODES):
            self.kill(idx)


@pytest.fixture(scope="session")
def cluster():
    if not TESSERA_BIN.exists():
        pytest.fail(f"{TESSERA_BIN} is missing: run `cargo build --release -p cli` first")
    data_dir = Path(tempfile.mkdtemp(prefix="tessera-pytest-"))
    c = Cluster(data_dir)
    try:
        c.start_all()
        os.environ["TESSERA_CONFIG"] = str(c.config)
        yield c
    finally:
        c.stop_all()
        if os.environ.get("TESSERA_KEEP_DATA") != "1":
            shutil.rmtree(data_dir, ignore_errors=True)


@pytest.fixture(scope="session")
def client(cluster):
    import tessera

    return tessera.connect(str(cluster.config))


_bucket_ids = itertools.count()


@pytest.fixture
def bucket(client, request) -> str:
    """A fresh bucket for one test."""
    name = "t-" + "".join(c if c.isalnum() else "-" for c in request.node.name.lower())[:40].strip("-")
    name = f"{name}-{next(_bucket_ids)}"
    client.make_bucket(name)
    return name


def pytest_report_header(config):
    return f"tessera binary: {TESSERA_BIN}; python {sys.version.split()[0]}"


RECOVERY_TIMEOUT_S = 30.0
#: Where `nodes_down` writes to learn that the restarted nodes take writes again.
PROBE_BUCKET = "t-degraded-probe"


@pytest.fixture
def nodes_down(cluster, client):
    """Kills the given node indexes; restarts them (and waits until writes work) at teardown."""
    killed = []
    if not client.bucket_exists(PROBE_BUCKET):
        client.make_bucket(PROBE_BUCKET)

    def kill(*indexes):
        for idx in indexes:
            cluster.kill(idx)
            killed.append(idx)

    yield kill
    import tessera

    for idx in killed:
        cluster.start(idx)
    cluster.wait_ready()
    deadline = time.monotonic() + RECOVERY_TIMEOUT_S
    while True:  # the client plans around recently failed nodes for a short backoff
        try:
            client.put(PROBE_BUCKET, "probe", b"ok")
            break
        except (tessera.Unavailable, tessera.NodeUnavailable):
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)
