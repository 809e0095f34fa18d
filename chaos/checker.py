#!/usr/bin/env python3
"""Tessera's fault-injection checker: never lose an acknowledged version.

A real cluster (one `tessera node` per network namespace, joined to the test's bridge by veth
pairs that this script creates) serves a randomized workload of PUT, overwrite, DELETE, GET,
ranged GET and LIST (`tessera ls`) from several clients, some with skewed clocks (libfaketime),
while faults strike: SIGKILL and restart, SIGSTOP and SIGCONT, partitions (link down, or
node-to-node only: nftables drops a node's traffic with its peers, so repair loses them), lossy
links (nftables random drop: this kernel has no netem), slow links (tbf rate limits) and a full
disk (a small tmpfs drive). With `--readdress`, nodes also move to new addresses (a host replaced by one with
another IP: the node is killed, its namespace gets a new address, `tessera map push` makes the
edited map the next version, the node restarts there) while one client keeps planning with the
map of the start (stale: every operation must fetch the new map and still be correct). With
`--grow`, the cluster grows from 6 to 12 nodes during the run: `tessera pool add` of six more
namespaces' nodes, which are then started, and `tessera pool activate` (one client keeps the
start's map here too); with `--decommission` as well, the first pool is then emptied and
removed (`tessera pool decommission 1`, run again until it finishes) while the faults strike
it, and its nodes are killed before the final reads. Clients are `tessera` CLI processes, so the checker runs against any
build of the binary (`--tessera PATH`): that is how a bug is reproduced on the build before
its fix.

Every operation is recorded with its invocation and completion times; the checker verifies:
- no torn or corrupt bytes: every GET returns exactly the bytes one PUT wrote;
- no stale read: no read returns a version older than one whose write was acknowledged
  before the read began (a write X is older than Y when X was acknowledged before Y began);
- no lost write: after the faults stop, every key reads back as a write that no later
  acknowledged write replaced (a DELETE reads back as absent);
- listings agree with the history (`--list-checks`, the default): a listed key has a PUT that
  may be its state at some instant of the listing (no phantom from a failed PUT, no key
  resurrected after an acknowledged DELETE), with that PUT's size; a key whose state must be
  an acknowledged PUT throughout the listing is listed.

Seeded and bounded in time; prints its seed and fault schedule; the same seed replays the same
schedule and workload choices (timing on a shared machine still varies). Runs as root (network
namespaces, tmpfs); without root it fails and says why.

    sudo chaos/checker.py --seed 7 --duration 60

To look into a failure: TESSERA_CHAOS_KEEP=1 keeps the work directory (node logs n1.log...),
TESSERA_CHAOS_NODE_LOG sets the nodes' log filter (e.g. "info,node::repair=debug").
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import itertools
import json
import os
import random
import re
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
NODES = 6
EC = "4+2"
M = 2
KEYS = 8
CLIENTS = 4
# Clock offsets of the client threads (seconds); two clients lag or lead by a minute.
CLIENT_SKEWS_S = [0, -60, 60, 0]
VALUE_BYTES_MAX = 300_000
HEADER = struct.Struct("<QQ")  # op id, value length: every value names the PUT that wrote it
NODE_PORT = 7000
OP_TIMEOUT_S = 30.0
READY_TIMEOUT_S = 20.0
FULL_DRIVE_BYTES = 3 << 20
# A node counts as impaired for this long after its fault heals: a client that saw it down backs
# off from it for 2 s, and a restarted node needs a moment to listen.
IMPAIRED_GRACE_S = 3.0
# After the faults stop, background repair has this long to restore full redundancy (a holder
# that is not the designated repairer waits 30 s; retries back off from 1 s, doubling, so an
# entry that failed all through the faults may wait a minute more; a readable write of unknown
# outcome is completed 90 s after the scrubber first sees it, and may be written just before
# the faults stop).
REPAIR_WAIT_S = 180.0
FAKETIME_RETRIES = 5
# Scrub passes (every one deep) on builds that have a scrubber.
SCRUB_INTERVAL = "3s"
# The share of each client's operations that are listings (`tessera ls bkt`), with --list-checks.
LIST_FRACTION = 0.1
# Op ids: client c's n-th operation is (c + 1) * 1_000_000 + n, its n-th listing that plus
# LIST_OP_BASE; the final reads are FINAL_OP_BASE + n, the final listing FINAL_LIST_OP.
LIST_OP_BASE = 500_000
FINAL_OP_BASE = 9_000_000
FINAL_LIST_OP = 9_500_000
# With --aimed (issue 37, item 6): one key overwritten without pause by two writers at once
# while a reader takes seconds over each GET of it (a hot key with a slow reader; the writers
# overlap, and one whose commit lands after the other's re-stamps: item 9), and pairs of
# creators racing `put --if-absent` on fresh keys amid the faults. Their op ids: HOT_PUT_BASE +
# n (the second writer's from HOT_PUT_BASE + HOT_SECOND_WRITER), SLOW_READ_BASE + n,
# CREATOR_BASE + 2n (+1).
HOT_KEY = "hot"
HOT_VALUE_BYTES = 1 << 20  # four stripes at the checker's 64 KiB chunks, 4 + 2
HOT_PUT_BASE = 6_000_000
HOT_SECOND_WRITER = 250_000
HOT_WRITER_CLIENTS = (3, 0)
# The hot writers log the client's commit decisions, to count the writes that re-stamped.
HOT_WRITER_LOG = "error,client::put=debug"
RESTAMP_LOG = "re-stamping"
SLOW_READ_BASE = 6_500_000
CREATOR_BASE = 7_000_000
# The slow reader's GET holds 64 KiB at a time (`tessera get --buffer`) and takes 16 KiB from its
# output every 30 ms: a 1 MiB value takes about 2 s, over many acknowledged overwrites.
SLOW_READ_BUFFER = "64KiB"
SLOW_READ_PIECE = 16 << 10
SLOW_READ_PAUSE_S = 0.03
# A pair of creators starts this often; the two run on the clients whose clocks are 60 s behind
# and 60 s ahead.
CREATOR_PERIOD_S = 1.0
CREATOR_CLIENTS = (1, 2)
# A write error that proves the write did nothing visible (too few drives took it, so it was
# rolled back), unless it also says "may still take effect" (commit replies lost: the outcome is
# unknown). Every other error of a write (a timeout, a node error) leaves it indeterminate.
WRITE_REFUSED = re.compile(r"\b\d+ of \d+ drives accepted it, \d+ needed")
OUTCOME_UNKNOWN = "may still take effect"
# `put --if-absent` refused: the key held an object when it committed (nothing written).
ALREADY_EXISTS = "already exists"
# Node sets taken down together once repair has converged (every acknowledged write must
# survive each): all C(6, 2) = 15 pairs unless TESSERA_CHAOS_PROBES says fewer.
REDUNDANCY_PROBES = int(os.environ.get("TESSERA_CHAOS_PROBES", "15"))


class CheckerError(Exception):
    """The checker could not run (not root, no namespaces); not a finding about Tessera."""


def run(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(list(args), check=check, capture_output=True, text=True)


# ---------------------------------------------------------------------------------------------
# Topology: a bridge in the root namespace, one namespace per node.


class Topology:
    runs = 0  # topologies made by this process: each gets fresh interface names

    def __init__(self, nodes: int):
        Topology.runs += 1
        tag = (os.getpid() * 16 + Topology.runs) % 10000
        self.subnet = 100 + tag % 100  # 169.254.<subnet>.0/24: link-local, ours only
        self.prefix = f"tz{tag}"
        self.bridge = f"{self.prefix}br"
        self.nodes = nodes
        self.created: list[str] = []
        self.moved: dict[int, str] = {}  # node -> its address after a readdress
        self.moves = 0

    def ns(self, i: int) -> str:
        return f"{self.prefix}n{i}"

    def veth(self, i: int) -> str:
        return f"{self.prefix}v{i}"

    def ip(self, i: int) -> str:
        """Node i's address now."""
        return self.moved.get(i, f"169.254.{self.subnet}.{10 + i}")

    def add_ip(self, i: int) -> str:
        """A new address for node i, on its namespace's interface (the old one stays)."""
        self.moves += 1
        assert self.moves < 140, "out of addresses for readdressed nodes"
        ip = f"169.254.{self.subnet}.{100 + self.moves}"
        run("ip", "-n", self.ns(i), "addr", "add", f"{ip}/24", "dev", "eth0")
        return ip

    def create(self) -> None:
        if os.geteuid() != 0:
            raise CheckerError("the checker needs root: it creates network namespaces and mounts tmpfs")
        for tool in ("ip", "nft", "tc", "faketime"):
            if shutil.which(tool) is None:
                raise CheckerError(f"`{tool}` is missing: run scripts/install-deps.sh")
        try:
            run("ip", "link", "add", self.bridge, "type", "bridge")
        except subprocess.CalledProcessError as e:
            raise CheckerError(f"cannot create a bridge (network namespaces unavailable?): {e.stderr.strip()}")
        self.created.append("bridge")
        run("ip", "addr", "add", f"169.254.{self.subnet}.1/24", "dev", self.bridge)
        run("ip", "link", "set", self.bridge, "up")
        for i in range(1, self.nodes + 1):
            ns, veth, peer = self.ns(i), self.veth(i), f"{self.prefix}p{i}"
            run("ip", "netns", "add", ns)
            self.created.append(ns)
            run("ip", "link", "add", veth, "type", "veth", "peer", "name", peer)
            run("ip", "link", "set", peer, "netns", ns)
            run("ip", "link", "set", veth, "master", self.bridge)
            run("ip", "link", "set", veth, "up")
            run("ip", "-n", ns, "link", "set", peer, "name", "eth0")
            run("ip", "-n", ns, "addr", "add", f"{self.ip(i)}/24", "dev", "eth0")
            run("ip", "-n", ns, "link", "set", "eth0", "up")
            run("ip", "-n", ns, "link", "set", "lo", "up")
            run("ip", "netns", "exec", ns, "nft", "add", "table", "inet", "chaos")
            for hook in ("input", "output"):
                run("ip", "netns", "exec", ns, "nft", "add", "chain", "inet", "chaos", hook,
                    f"{{ type filter hook {hook} priority 0; policy accept; }}")

    def destroy(self) -> None:
        for name in reversed(self.created):
            if name == "bridge":
                run("ip", "link", "del", self.bridge, check=False)
            else:
                # The root side first: a namespace may outlive `netns del` for a moment.
                run("ip", "link", "del", self.veth(int(name[len(self.prefix) + 1:])), check=False)
                run("ip", "netns", "del", name, check=False)
        self.created.clear()

    # Faults on node i's link.
    def link(self, i: int, up: bool) -> None:
        run("ip", "link", "set", self.veth(i), "up" if up else "down")

    def loss(self, i: int, percent: int) -> None:
        self.clear_loss(i)
        for hook in ("input", "output"):
            run("ip", "netns", "exec", self.ns(i), "nft", "add", "rule", "inet", "chaos", hook,
                "numgen", "random", "mod", "100", "<", str(percent), "drop")

    def drop_replies(self, i: int) -> None:
        """Drops what node i sends from its node port (answers to clients and peers); what is
        sent to it, and its own connections to peers, still get through."""
        self.clear_loss(i)
        run("ip", "netns", "exec", self.ns(i), "nft", "add", "rule", "inet", "chaos", "output",
            "tcp", "sport", str(NODE_PORT), "drop")

    def cut_peer(self, i: int, peer: int) -> None:
        """Drops traffic between node i and node `peer` only (clients still reach both)."""
        for hook, field in (("input", "saddr"), ("output", "daddr")):
            run("ip", "netns", "exec", self.ns(i), "nft", "add", "rule", "inet", "chaos", hook,
                "ip", field, self.ip(peer), "drop")

    def clear_loss(self, i: int) -> None:
        for hook in ("input", "output"):
            run("ip", "netns", "exec", self.ns(i), "nft", "flush", "chain", "inet", "chaos", hook, check=False)

    def slow(self, i: int, mbit: int) -> None:
        for dev, ns in ((self.veth(i), None), ("eth0", self.ns(i))):
            cmd = ["tc", "qdisc", "replace", "dev", dev, "root", "tbf", "rate", f"{mbit}mbit",
                   "burst", "32kb", "latency", "400ms"]
            run(*(["ip", "netns", "exec", ns] + cmd if ns else cmd))

    def clear_slow(self, i: int) -> None:
        run("tc", "qdisc", "del", "dev", self.veth(i), "root", check=False)
        run("ip", "netns", "exec", self.ns(i), "tc", "qdisc", "del", "dev", "eth0", "root", check=False)


# ---------------------------------------------------------------------------------------------
# The cluster: nodes in their namespaces.


class Cluster:
    def __init__(self, tessera: Path, topo: Topology, work: Path, full_drive: bool):
        self.tessera = tessera
        self.topo = topo
        self.work = work
        self.data = work / "data"
        self.config = self.data / "cluster.toml"
        # The map as it was at the start, for a client that never reloads it (--readdress).
        self.stale_config = self.data / "stale.toml"
        self.procs: dict[int, subprocess.Popen] = {}
        self.mounted: list[Path] = []
        self.full_drive = full_drive
        self.scrubs: bool | None = None  # whether this build has a scrubber (feature-detected)
        self.nodes = NODES  # nodes in the map: more once a pool is added (--grow)

    def init(self) -> None:
        subprocess.run([str(self.tessera), "init", "--nodes", str(NODES), "--ec", EC, "--chunk-size", "64KiB",
                        "--data", str(self.data), "--base-port", str(NODE_PORT)], check=True, capture_output=True)
        text = self.config.read_text()
        for i in range(1, NODES + 1):
            text = text.replace(f'addr = "127.0.0.1:{NODE_PORT + i - 1}"', f'addr = "{self.topo.ip(i)}:{NODE_PORT}"')
        self.config.write_text(text)
        self.stale_config.write_text(text)
        self.stale_config.chmod(0o600)
        if self.full_drive:
            drive = self.data / f"n{NODES}" / "d1"
            marker = (drive / "tessera-drive").read_bytes()
            run("mount", "-t", "tmpfs", "-o", f"size={FULL_DRIVE_BYTES}", "tmpfs", str(drive))
            self.mounted.append(drive)
            (drive / "tessera-drive").write_bytes(marker)

    def log(self, i: int) -> Path:
        return self.work / f"n{i}.log"

    def address_in_map(self, i: int) -> str:
        """Node i's address in the shared cluster.toml."""
        text = self.config.read_text()
        found = re.search(rf'id = "n{i}"\naddr = "([0-9.]+):{NODE_PORT}"', text)
        assert found, f"n{i} has no address in {self.config}"
        return found.group(1)

    def start(self, i: int) -> None:
        assert i not in self.procs, f"n{i} is running"
        if self.scrubs is None:
            help_text = subprocess.run([str(self.tessera), "node", "--help"], capture_output=True, text=True).stdout
            self.scrubs = "--scrub-interval" in help_text
        # Scrub often, so that what the repair queue missed is found while the checker waits.
        scrub = ["--scrub-interval", SCRUB_INTERVAL, "--deep-scrub-interval", SCRUB_INTERVAL] if self.scrubs else []
        with open(self.log(i), "ab") as log:
            self.procs[i] = subprocess.Popen(
                ["ip", "netns", "exec", self.topo.ns(i), str(self.tessera), "node", "--config", str(self.config),
                 "--id", f"n{i}", *scrub],
                stdout=log, stderr=subprocess.STDOUT, env={**os.environ, "TESSERA_LOG": os.environ.get("TESSERA_CHAOS_NODE_LOG", "info"), "NO_COLOR": "1"})

    def wait_ready(self, i: int) -> None:
        deadline = time.monotonic() + READY_TIMEOUT_S
        while True:
            try:
                socket.create_connection((self.topo.ip(i), NODE_PORT), timeout=0.5).close()
                return
            except OSError:
                proc = self.procs.get(i)
                if proc is not None and proc.poll() is not None:
                    raise RuntimeError(f"n{i} exited ({proc.returncode}):\n{self.log(i).read_text()[-3000:]}")
                if time.monotonic() > deadline:
                    raise RuntimeError(f"n{i} not ready in {READY_TIMEOUT_S}s")
                time.sleep(0.05)

    def kill(self, i: int) -> None:
        proc = self.procs.pop(i, None)
        if proc is not None:
            proc.send_signal(signal.SIGCONT)
            proc.kill()
            proc.wait()

    def signal(self, i: int, sig: int) -> None:
        proc = self.procs.get(i)
        if proc is not None and proc.poll() is None:
            proc.send_signal(sig)

    def stop_all(self) -> None:
        for i in list(self.procs):
            self.kill(i)
        for drive in self.mounted:
            run("umount", "-l", str(drive), check=False)
        self.mounted.clear()

    def heals(self) -> bool:
        """Whether this build scrubs and rebuilds wiped drives (wipe and corrupt faults)."""
        help_text = subprocess.run([str(self.tessera), "--help"], capture_output=True, text=True).stdout
        return bool(re.search(r"^\s+drive\b", help_text, re.M))

    def rebuilding(self, i: int) -> bool:
        """Whether node i reports a drive being rebuilt (or does not answer)."""
        result = subprocess.run([str(self.tessera), "repair", "status", "--json", "--config", str(self.config)],
                                capture_output=True, text=True)
        for line in result.stdout.splitlines():
            if line.startswith("{") and f'"node":"n{i}"' in line:
                status = json.loads(line)
                return "drives" not in status or any(d.get("rebuilding") for d in status["drives"])
        return True

    def grow_full_drive(self) -> None:
        """The operator frees space: the full drive gets room, so repair can reach it."""
        for drive in self.mounted:
            run("mount", "-o", "remount,size=256m", str(drive))

    def error_lines(self) -> list[str]:
        lines = []
        for i in range(1, self.nodes + 1):
            if self.log(i).exists():
                lines += [f"n{i}: {line}" for line in self.log(i).read_text().splitlines() if " ERROR " in line]
        return lines


# ---------------------------------------------------------------------------------------------
# Values and operations.


def value_of(op_id: int, size: int) -> bytes:
    body = random.Random(op_id).randbytes(size - HEADER.size)
    return HEADER.pack(op_id, size) + body


@dataclasses.dataclass
class Op:
    op_id: int
    client: int
    kind: str  # put | delete | get | rget | list
    key: str  # "" for a listing (of the whole bucket)
    invoke: float
    complete: float = 0.0
    # put/delete: "ok" (acknowledged), "absent" (delete of a missing key), "error" (see `effect`).
    # get/rget: "value" (with `value`), "absent", "error", "past-end".
    # list: "ok" (with `listed`), "error", "garbled" (output that is not a listing: an anomaly).
    outcome: str = ""
    value: int | None = None  # the PUT op id whose bytes a read returned
    detail: str = ""
    size: int | None = None  # put: the bytes it wrote
    listed: dict[str, int] | None = None  # list: key -> size, as `tessera ls` printed them
    # put/delete with outcome "error": "none" when the error proves the write did nothing visible
    # (`write_error_effect`), else "unknown" (it may have taken effect, now or later).
    effect: str = ""


def write_error_effect(returncode: int, stderr: str) -> str:
    """What a failed `tessera put`/`rm` may have done: "none" when its error proves the write was
    refused (too few drives accepted it, and it does not say it may still take effect), else
    "unknown" (timed out, killed, lost replies, any other error)."""
    if returncode > 0 and WRITE_REFUSED.search(stderr) and OUTCOME_UNKNOWN not in stderr:
        return "none"
    return "unknown"


LISTING_LINE = re.compile(r"^\s*(\d+)\s+(\S+)\s+(\S+)$")


def parse_listing(stdout: str) -> dict[str, int]:
    """`tessera ls BUCKET` output (one `SIZE  MODIFIED  KEY` line per object) as key -> size;
    ValueError on a line of another shape or a key listed twice."""
    listed: dict[str, int] = {}
    for line in stdout.splitlines():
        if not line.strip():
            continue
        found = LISTING_LINE.match(line)
        if not found:
            raise ValueError(f"unexpected listing line {line!r}")
        size, _, key = found.groups()
        if key in listed:
            raise ValueError(f"{key} listed twice")
        listed[key] = int(size)
    return listed


class Workload:
    STALE_CLIENT = CLIENTS - 1  # with --readdress: plans with the start's map, always

    def __init__(self, cluster: Cluster, seed: int, deadline: float, ranged: bool, skews: list[int],
                 stale_client: bool = False, list_checks: bool = True):
        self.cluster = cluster
        self.list_checks = list_checks
        self.in_flight: dict[int, Op] = {}  # op id -> write invoked, not yet recorded
        self.skews = skews
        self.stale_client = stale_client
        self.seed = seed
        self.deadline = deadline
        self.ranged = ranged
        self.ops: list[Op] = []
        self.lock = threading.Lock()
        self.by_etag: dict[str, int] = {}
        self.sizes: dict[int, int] = {}
        self.corrupt: list[str] = []
        self.files = cluster.work / "values"
        self.files.mkdir(exist_ok=True)
        self.keys = KEYS  # keys in play: more once a second pool is active (--grow)
        # With --aimed: the creators' races (key, the two ops) and, per slow read that returned a
        # value, how many PUTs of the hot key were acknowledged while it ran.
        self.races: list[tuple[str, list[Op]]] = []
        self.slow_read_spans: list[int] = []
        self.restamped_writes = 0  # writes whose client logged a re-stamp

    def command(self, client: int, *args: str, log: str = "error") -> tuple[list[str], dict[str, str]]:
        """The command line and environment of `tessera ARGS` as client `client` runs it."""
        stale = self.stale_client and client == self.STALE_CLIENT
        config = self.cluster.stale_config if stale else self.cluster.config
        cmd = [str(self.cluster.tessera), *args, "--config", str(config)]
        skew = self.skews[client]
        env = {**os.environ, "NO_COLOR": "1", "TESSERA_LOG": log}
        if skew:
            # Shift the wall clock only: timeouts keep the real monotonic clock.
            cmd = ["faketime", "-f", f"{skew:+d}s", *cmd]
            env["FAKETIME_DONT_FAKE_MONOTONIC"] = "1"
        return cmd, env

    def cli(self, client: int, *args: str, data: Path | None = None, log: str = "error") -> subprocess.CompletedProcess:
        cmd, env = self.command(client, *args, log=log)
        for _ in range(FAKETIME_RETRIES):
            try:
                result = subprocess.run(cmd, capture_output=True, timeout=OP_TIMEOUT_S, env=env)
            except subprocess.TimeoutExpired as e:
                return subprocess.CompletedProcess(cmd, -9, e.stdout or b"", b"timed out")
            # libfaketime can fail to start when several processes start at once (its shared
            # semaphore); tessera never ran then, so run it again.
            if not (result.returncode != 0 and result.stderr.startswith(b"faketime:")):
                break
        return result

    def client_loop(self, client: int) -> None:
        rng = random.Random(self.seed * 1000 + client)
        # Listings draw from their own stream: the other operations' keys and kinds stay those of
        # the same seed without listings (`--no-list-checks`, and builds of the checker before them).
        list_rng = random.Random(self.seed * 1000 + 100 + client)
        seq = lists = 0
        while time.monotonic() < self.deadline:
            if self.list_checks and list_rng.random() < LIST_FRACTION:
                lists += 1
                self.list_keys(client, (client + 1) * 1_000_000 + LIST_OP_BASE + lists)
                continue
            seq += 1
            op_id = (client + 1) * 1_000_000 + seq
            key = f"k{rng.randrange(self.keys)}"
            roll = rng.random()
            if roll < 0.35:
                self.put(client, op_id, key, rng.randrange(HEADER.size, VALUE_BYTES_MAX))
            elif roll < 0.45:
                self.delete(client, op_id, key)
            elif roll < 0.85 or not self.ranged:
                self.get(client, op_id, key)
            else:
                self.ranged_get(client, op_id, key, rng.randrange(VALUE_BYTES_MAX), rng.randrange(1, 70_000))

    def invoked(self, op: Op) -> Op:
        if op.kind in ("put", "delete"):
            with self.lock:
                self.in_flight[op.op_id] = op
        return op

    def record(self, op: Op) -> None:
        op.complete = time.monotonic()
        with self.lock:
            self.ops.append(op)
            self.in_flight.pop(op.op_id, None)

    def history(self) -> list[Op]:
        """The operations recorded, and writes still in flight as ones whose outcome is unknown
        and that never complete."""
        with self.lock:
            unfinished = [dataclasses.replace(op, outcome="error", effect="unknown", complete=float("inf"),
                                              detail="still in flight") for op in self.in_flight.values()]
            return list(self.ops) + unfinished

    def put(self, client: int, op_id: int, key: str, size: int, if_absent: bool = False, log: str = "error") -> Op:
        data = value_of(op_id, size)
        with self.lock:
            self.by_etag[hashlib.md5(data).hexdigest()] = op_id
            self.sizes[op_id] = size
        path = self.files / f"{op_id}"
        path.write_bytes(data)
        op = self.invoked(Op(op_id, client, "put", key, time.monotonic(), size=size))
        result = self.cli(client, "put", str(path), f"bkt/{key}", *(["--if-absent"] if if_absent else []), log=log)
        stderr = result.stderr.decode(errors="replace")
        if RESTAMP_LOG in stderr:
            with self.lock:
                self.restamped_writes += 1
        op.outcome = "ok" if result.returncode == 0 else "error"
        if op.outcome == "error":
            # A creator refused because the key holds an object did nothing.
            exists = if_absent and result.returncode > 0 and ALREADY_EXISTS in stderr
            op.effect = "none" if exists else write_error_effect(result.returncode, stderr)
        op.detail = stderr.strip()[-300:]
        self.record(op)
        path.unlink()
        return op

    def hot_writer_loop(self, client: int, first_op: int) -> None:
        """Overwrites the hot key without pause until the deadline."""
        n = 0
        while time.monotonic() < self.deadline:
            n += 1
            self.put(client, first_op + n, HOT_KEY, HOT_VALUE_BYTES, log=HOT_WRITER_LOG)

    def slow_reader_loop(self, client: int) -> None:
        """GETs the hot key, taking its output slowly, until the deadline; each read is checked
        like any other, and how many overwrites were acknowledged while it ran is kept."""
        n = 0
        while time.monotonic() < self.deadline:
            n += 1
            op = Op(SLOW_READ_BASE + n, client, "get", HOT_KEY, time.monotonic())
            cmd, env = self.command(client, "get", f"bkt/{HOT_KEY}", "-", "--buffer", SLOW_READ_BUFFER)
            proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
            body = bytearray()
            give_up = time.monotonic() + OP_TIMEOUT_S
            while time.monotonic() < give_up:
                piece = proc.stdout.read1(SLOW_READ_PIECE)
                if not piece:
                    break
                body += piece
                time.sleep(SLOW_READ_PAUSE_S)
            if proc.poll() is None and time.monotonic() >= give_up:
                proc.kill()
            try:
                _, stderr = proc.communicate(timeout=OP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                proc.kill()
                _, stderr = proc.communicate()
            result = subprocess.CompletedProcess(cmd, proc.returncode, bytes(body), stderr)
            self.classify_read(op, result, None)
            if op.outcome == "value":
                self.check_value(op, bytes(body))
            self.record(op)
            if op.outcome == "value":
                with self.lock:
                    spanned = sum(1 for w in self.ops if w.key == HOT_KEY and w.kind == "put" and w.outcome == "ok"
                                  and op.invoke < w.complete < op.complete)
                self.slow_read_spans.append(spanned)

    def creators_loop(self) -> None:
        """Every CREATOR_PERIOD_S until the deadline, two clients create the same fresh key with
        `put --if-absent` at once: at most one may succeed, and one "already exists" needs an
        object that the other's write made."""
        n = 0
        while time.monotonic() < self.deadline:
            n += 1
            key = f"new{n}"
            pair: list[Op] = []
            racers = [threading.Thread(target=lambda c=c, i=i: pair.append(
                self.put(c, CREATOR_BASE + 2 * n + i, key, 10_000 + 1_000 * i, if_absent=True)), daemon=True)
                for i, c in enumerate(CREATOR_CLIENTS)]
            began = time.monotonic()
            for t in racers:
                t.start()
            for t in racers:
                t.join(timeout=2 * OP_TIMEOUT_S)
            with self.lock:
                self.races.append((key, list(pair)))
            time.sleep(max(0.0, CREATOR_PERIOD_S - (time.monotonic() - began)))

    def delete(self, client: int, op_id: int, key: str) -> None:
        op = self.invoked(Op(op_id, client, "delete", key, time.monotonic()))
        result = self.cli(client, "rm", f"bkt/{key}")
        stderr = result.stderr.decode(errors="replace")
        op.outcome = "ok" if result.returncode == 0 else "absent" if "no such object" in stderr else "error"
        if op.outcome == "error":
            op.effect = write_error_effect(result.returncode, stderr)
        op.detail = stderr.strip()[-300:]
        self.record(op)

    def list_keys(self, client: int, op_id: int) -> Op:
        """`tessera ls bkt`: records the keys and sizes listed, or the failure."""
        op = Op(op_id, client, "list", "", time.monotonic())
        result = self.cli(client, "ls", "bkt")
        stderr = result.stderr.decode(errors="replace")
        op.outcome = "ok" if result.returncode == 0 else "error"
        op.detail = stderr.strip()[-300:]
        if op.outcome == "ok":
            try:
                op.listed = parse_listing(result.stdout.decode(errors="replace"))
            except ValueError as e:
                op.outcome = "garbled"
                self.corrupt.append(f"op {op_id}: LIST printed what is not a listing: {e}")
        self.record(op)
        return op

    def get(self, client: int, op_id: int, key: str) -> None:
        op = Op(op_id, client, "get", key, time.monotonic())
        result = self.cli(client, "get", f"bkt/{key}", "-")
        self.classify_read(op, result, None)
        if op.outcome == "value":
            self.check_value(op, result.stdout)
        self.record(op)

    def check_value(self, op: Op, body: bytes) -> None:
        """Sets the read's value from the bytes a GET returned; whole values only."""
        if len(body) < HEADER.size:
            self.corrupt.append(f"op {op.op_id}: GET {op.key} returned {len(body)} bytes, not a value")
            return
        writer, size = HEADER.unpack_from(body)
        op.value = writer
        if size != len(body) or writer not in self.sizes or body != value_of(writer, size):
            self.corrupt.append(f"op {op.op_id}: GET {op.key} returned torn or corrupt bytes (header names op {writer})")

    def ranged_get(self, client: int, op_id: int, key: str, offset: int, length: int) -> None:
        op = Op(op_id, client, "rget", key, time.monotonic())
        result = self.cli(client, "get", f"bkt/{key}", "-", "--offset", str(offset), "--length", str(length))
        self.classify_read(op, result, offset)
        if op.outcome == "value":
            etag = re.search(r"etag ([0-9a-f]+)", result.stderr.decode(errors="replace"))
            writer = self.by_etag.get(etag.group(1)) if etag else None
            if writer is None:
                self.corrupt.append(f"op {op_id}: ranged GET {key} read a version no PUT wrote ({etag})")
            else:
                op.value = writer
                expected = value_of(writer, self.sizes[writer])[offset:offset + length]
                if result.stdout != expected:
                    self.corrupt.append(f"op {op_id}: ranged GET {key} at {offset}+{length} returned wrong bytes")
        self.record(op)

    @staticmethod
    def classify_read(op: Op, result: subprocess.CompletedProcess, offset: int | None) -> None:
        stderr = result.stderr.decode(errors="replace")
        if result.returncode == 0:
            op.outcome = "value"
        elif "no such object" in stderr:
            op.outcome = "absent"
        elif offset is not None and "past the end" in stderr:
            op.outcome = "past-end"
        else:
            op.outcome = "error"
        op.detail = stderr.strip()[-300:]


# ---------------------------------------------------------------------------------------------
# Faults.


class Faults:
    """A seeded schedule: at most M nodes impaired at any moment (what Tessera promises to
    survive); a full drive counts as one impairment for the whole run."""

    KINDS = ("kill", "stop", "partition", "loss", "slow", "peer-cut")
    # On builds with a scrubber and drive rebuild: a drive wiped under a restarted node, and a
    # chunk file truncated or bit-flipped. Both stay impairments until repair undid them.
    HEALING_KINDS = ("wipe", "corrupt")
    # Struck on two nodes at the same instant when the budget allows: a commit in flight then
    # fails on two drives at once (the review's failed-overwrite example).
    PAIR_KINDS = ("kill", "stop", "partition")
    PAIR_CHANCE = 0.3

    # With --readdress: how often a single fault is a move to a new address instead.
    READDRESS_CHANCE = 0.5

    # With --aimed (issue 37): faults aimed between a commit, its replies and its rollback.
    # `reply-drop`: the node's answers are dropped (nftables, output, from its port) while what
    # is sent to it still arrives: commits apply and their replies are lost, so writers decide
    # without them (and a failed write's rollback may be lost too). Aimed pairs strike two
    # nodes at one instant: two lost replies (W - 1 answers: the writer must ask before it
    # rolls back), or one node stalled in its commit (SIGSTOP) while another loses its reply.
    AIMED_KINDS = ("reply-drop",)
    AIMED_PAIRS = (("reply-drop", "reply-drop"), ("stop", "reply-drop"), ("kill", "reply-drop"))

    def __init__(self, cluster: Cluster, topo: Topology, seed: int, deadline: float, start: float,
                 readdress: bool = False, aimed: bool = False):
        self.cluster = cluster
        self.topo = topo
        self.readdress = readdress
        self.aimed = aimed
        self.readdressed = 0  # moves the cluster took (map pushed)
        self.rng = random.Random(seed)
        self.deadline = deadline
        self.start = start
        self.schedule: list[str] = []
        self.active: dict[int, tuple[str, float]] = {}  # node -> (kind, until)
        self.budget = M - (1 if cluster.full_drive else 0)
        # (node, from, to) in monotonic seconds: when each node was impaired.
        self.impaired: list[tuple[int, float, float]] = []
        if cluster.full_drive:
            self.impaired.append((NODES, float("-inf"), float("inf")))
        self.struck_at: dict[int, float] = {}
        self.pair_due = False
        self.corrupted: dict[int, tuple[Path, bytes]] = {}
        self.lock = threading.Lock()  # heal_all runs from the fault thread and the main thread
        self.kinds = self.KINDS + (self.HEALING_KINDS if cluster.heals() else ())
        if aimed:
            # Weighted: about a third of the single faults are aimed ones.
            self.kinds += self.AIMED_KINDS * (len(self.kinds) // 2)

    def log(self, text: str) -> None:
        line = f"{time.monotonic() - self.start:7.2f}s {text}"
        self.schedule.append(line)
        print("  fault", line, flush=True)

    def move(self, node: int) -> None:
        """Node `node` moves to a new address: killed, its namespace gets a new address, and
        `tessera map push` makes a map naming it the next version (the node restarts there when
        healed). A push the cluster refuses (too many nodes unreachable) leaves it where it was."""
        self.cluster.kill(node)
        old, new = self.topo.ip(node), self.topo.add_ip(node)
        text = self.cluster.config.read_text()
        edited = self.cluster.work / "readdress.toml"
        edited.write_text(text.replace(f'"{old}:{NODE_PORT}"', f'"{new}:{NODE_PORT}"'))
        edited.chmod(0o600)
        try:
            result = subprocess.run([str(self.cluster.tessera), "map", "push", str(edited), "--config",
                                     str(self.cluster.config)], capture_output=True, text=True, timeout=OP_TIMEOUT_S)
            pushed, why = result.returncode == 0, (result.stdout + result.stderr).strip()
        except subprocess.TimeoutExpired:
            pushed, why = False, "timed out"
        # Nodes that took the push rewrote the shared cluster.toml: the node restarts at the
        # address it names, whatever the push's outcome.
        now = self.cluster.address_in_map(node)
        if now == new:
            self.topo.moved[node] = new
            self.readdressed += 1
        self.log(f"  n{node} {old} -> {new}: {'moved' if now == new else 'not moved'} "
                 f"({'pushed' if pushed else 'push refused'}: {why.splitlines()[-1] if why else ''})")

    def inject(self, node: int, kind: str) -> None:
        if kind == "readdress":
            self.move(node)
        elif kind == "wipe":
            self.cluster.kill(node)
            drive = self.cluster.data / f"n{node}" / "d1"
            for entry in drive.iterdir():
                shutil.rmtree(entry) if entry.is_dir() else entry.unlink()
            self.cluster.start(node)
            self.cluster.wait_ready(node)
        elif kind == "corrupt":
            files = sorted((self.cluster.data / f"n{node}" / "d1" / "data").glob("*/*"))
            if files:
                victim = self.rng.choice(files)
                try:
                    original = victim.read_bytes()
                    if self.rng.random() < 0.5:
                        victim.write_bytes(original[: len(original) // 2])
                        how = "truncated"
                    else:
                        damaged = bytearray(original)
                        damaged[self.rng.randrange(len(damaged))] ^= 0x20
                        victim.write_bytes(bytes(damaged))
                        how = "bit-flipped"
                    self.corrupted[node] = (victim, original)
                    self.log(f"  {how} {victim.name} on n{node}")
                except (OSError, ValueError):
                    pass  # retired or empty meanwhile: no damage this time
        elif kind == "kill":
            self.cluster.kill(node)
        elif kind == "stop":
            self.cluster.signal(node, signal.SIGSTOP)
        elif kind == "partition":
            self.topo.link(node, up=False)
        elif kind == "loss":
            self.topo.loss(node, self.rng.choice((20, 40, 70)))
        elif kind == "slow":
            self.topo.slow(node, self.rng.choice((2, 8, 30)))
        elif kind == "reply-drop":
            self.topo.drop_replies(node)
        elif kind == "peer-cut":
            # Node-to-node only: repair traffic between this node and the others is dropped.
            for peer in range(1, NODES + 1):
                if peer != node:
                    self.topo.cut_peer(node, peer)

    def healed_by_repair(self, node: int, kind: str) -> bool:
        """Whether repair has undone a wipe (rebuild finished) or a corruption (file restored, or
        gone with its version)."""
        if kind == "wipe":
            return not self.cluster.rebuilding(node)
        if kind == "corrupt":
            if node not in self.corrupted:
                return True
            victim, original = self.corrupted[node]
            try:
                return victim.read_bytes() == original
            except OSError:
                return True
        return True

    def heal(self, node: int, kind: str) -> None:
        if kind in self.HEALING_KINDS:
            self.corrupted.pop(node, None)
        elif kind in ("kill", "readdress"):
            self.cluster.start(node)
            self.cluster.wait_ready(node)
        elif kind == "stop":
            self.cluster.signal(node, signal.SIGCONT)
        elif kind == "partition":
            self.topo.link(node, up=True)
        elif kind in ("loss", "peer-cut", "reply-drop"):
            self.topo.clear_loss(node)
        elif kind == "slow":
            self.topo.clear_slow(node)
        self.impaired.append((node, self.struck_at.pop(node), time.monotonic()))
        self.log(f"heal {kind} n{node}")

    def loop(self) -> None:
        try:
            self.strike_until_deadline()
        finally:
            self.heal_all()  # at the deadline, not when the last client operation ends

    def strike_until_deadline(self) -> None:
        while time.monotonic() < self.deadline:
            time.sleep(self.rng.uniform(0.3, 1.5))
            now = time.monotonic()
            for node, (kind, until) in list(self.active.items()):
                if now >= until:
                    if not self.healed_by_repair(node, kind):
                        self.active[node] = (kind, now + 1.0)
                        continue
                    del self.active[node]
                    self.heal(node, kind)
            if len(self.active) >= self.budget or now >= self.deadline:
                continue
            candidates = [i for i in range(1, NODES + 1) if i not in self.active
                          and not (self.cluster.full_drive and i == NODES)]
            if self.budget >= 2 and not self.pair_due:
                self.pair_due = self.rng.random() < self.PAIR_CHANCE
            if self.pair_due and self.active:
                continue  # a pair waits until no node is impaired
            if self.pair_due:
                self.pair_due = False
                nodes = sorted(self.rng.sample(candidates, 2))
                kind = self.rng.choice(self.PAIR_KINDS)
                kinds = [kind, kind]
                if self.aimed and self.rng.random() < 0.5:
                    kinds = list(self.rng.choice(self.AIMED_PAIRS))
            else:
                nodes = [self.rng.choice(candidates)]
                kind = self.rng.choice(self.kinds)
                if self.readdress and self.rng.random() < self.READDRESS_CHANCE:
                    kind = "readdress"
                kinds = [kind]
            until = now + self.rng.uniform(1.0, 5.0)
            for node, kind in zip(nodes, kinds):
                self.struck_at[node] = time.monotonic()
                self.inject(node, kind)
                self.active[node] = (kind, until)
            if len(set(kinds)) == 1:
                self.log(f"inject {kinds[0]} " + " ".join(f"n{node}" for node in nodes))
            else:
                self.log("inject " + " ".join(f"{kind} n{node}" for node, kind in zip(nodes, kinds)))

    def heal_all(self) -> None:
        """Heals what the checker can heal; wipes and corruptions are left to repair (the
        redundancy check after the faults waits for it)."""
        with self.lock:
            for node, (kind, _) in list(self.active.items()):
                del self.active[node]
                self.heal(node, kind)


# ---------------------------------------------------------------------------------------------
# The checks.


def check_history(ops: list[Op], finals: dict[str, Op]) -> list[str]:
    anomalies = []
    writes = [op for op in ops if op.kind in ("put", "delete") and op.outcome in ("ok", "error")]
    acked = [op for op in writes if op.outcome == "ok"]
    by_id = {op.op_id: op for op in writes}
    for key in sorted({op.key for op in ops if op.kind != "list"} | set(finals)):
        key_writes = [w for w in writes if w.key == key]
        key_acked = [w for w in acked if w.key == key]
        reads = [op for op in ops if op.key == key and op.kind in ("get", "rget") and op.outcome in ("value", "absent")]
        if key in finals:
            reads.append(finals[key])
        for read in reads:
            before = [y for y in key_acked if y.complete < read.invoke]
            if read.outcome == "value":
                x = by_id.get(read.value)
                if x is None or x.key != key:
                    anomalies.append(f"{read.kind} op {read.op_id} of {key} returned op {read.value}, not a PUT of {key}")
                    continue
                if x.invoke > read.complete:
                    anomalies.append(f"{read.kind} op {read.op_id} of {key} returned op {x.op_id} from the future")
                # (A read that overlaps the failed write may see it before its rollback.)
                if write_effect(x) == "none" and x.complete < read.invoke:
                    anomalies.append(f"failed write visible: {read.kind} op {read.op_id} of {key} returned op "
                                     f"{x.op_id}, whose error said it did nothing ({x.detail[-120:]})")
                newer = [y for y in before if x.complete < y.invoke]
                if newer:
                    y = newer[0]
                    anomalies.append(
                        f"stale read: {read.kind} op {read.op_id} of {key} (client {read.client}) returned op {x.op_id} "
                        f"({x.kind}, acked at {x.complete:.3f}) although {y.kind} op {y.op_id} was acknowledged at "
                        f"{y.complete:.3f}, before the read began at {read.invoke:.3f}")
            else:
                # Absent: some DELETE not before every acknowledged PUT must explain it.
                for y in (p for p in before if p.kind == "put"):
                    explains = [d for d in key_writes if d.kind == "delete" and not d.complete < y.invoke
                                and d.invoke < read.complete]
                    if not explains:
                        anomalies.append(
                            f"lost or stale: {read.kind} op {read.op_id} of {key} found it absent although PUT op "
                            f"{y.op_id} was acknowledged at {y.complete:.3f}, before the read began at "
                            f"{read.invoke:.3f}, and no later DELETE was issued")
                        break
    return anomalies


def check_races(races: list[tuple[str, list[Op]]]) -> list[str]:
    """Two creators of a fresh key (`put --if-absent`): never both acknowledged, and never both
    refused as "already exists" (nothing else writes the key), nor one so refused while the
    other's error proves it did nothing. The key's reads are checked with the history."""
    anomalies = []
    for key, pair in races:
        oks = [op.op_id for op in pair if op.outcome == "ok"]
        exists = [op for op in pair if op.outcome == "error" and op.effect == "none" and ALREADY_EXISTS in op.detail]
        if len(oks) > 1:
            anomalies.append(f"two creators of {key} with --if-absent were both acknowledged: ops {oks}")
        if exists and all(write_effect(op) == "none" for op in pair):
            anomalies.append(f"creators of {key}: " + "; ".join(f"op {op.op_id} {op.outcome} ({op.detail[-100:]})"
                                                               for op in pair)
                             + ": refused as existing although no write of it can have taken effect")
    return anomalies


def impaired_for_read(impaired: list[tuple[int, float, float]], key_writes: list[Op], start: float,
                      end: float) -> set[int]:
    """The nodes that may lack what a read of a key over [start, end] needs: those impaired at any
    time during it, and those impaired while a write that may be the key's current one was in
    flight (they may have missed it; repair needs a window to restore it). Each impairment is
    stretched by IMPAIRED_GRACE_S. `key_writes`: the key's PUTs and DELETEs, acknowledged or failed."""

    def impaired_during(a0: float, a1: float) -> set[int]:
        return {node for node, a, b in impaired if a < a1 and b + IMPAIRED_GRACE_S > a0}

    nodes = impaired_during(start, end)
    acked_before = [w for w in key_writes if w.outcome == "ok" and w.complete < start]
    last = max(acked_before, key=lambda w: w.complete, default=None)
    for w in key_writes:
        # The last write acknowledged before the read, and any write that may follow it.
        if w.invoke < end and (last is None or w.complete >= last.invoke):
            nodes |= impaired_during(w.invoke, w.complete)
    return nodes


def decided_writes_by_key(ops: list[Op]) -> dict[str, list[Op]]:
    """The PUTs and DELETEs that completed (acknowledged or failed), per key."""
    writes: dict[str, list[Op]] = {}
    for op in ops:
        if op.kind in ("put", "delete") and op.outcome in ("ok", "error"):
            writes.setdefault(op.key, []).append(op)
    return writes


def unavailable_reads(ops: list[Op], impaired: list[tuple[int, float, float]]) -> list[str]:
    """Reads that failed although at most M nodes lacked what they needed (`impaired_for_read`).
    The design promises such reads succeed."""
    writes = decided_writes_by_key(ops)
    found = []
    for op in ops:
        if op.kind not in ("get", "rget") or op.outcome != "error":
            continue
        nodes = impaired_for_read(impaired, writes.get(op.key, []), op.invoke, op.complete)
        if len(nodes) <= M:
            down = ", ".join(f"n{n}" for n in sorted(nodes)) or "none"
            found.append(f"unavailable: {op.kind} op {op.op_id} of {op.key} failed with at most {M} nodes impaired "
                         f"({down}): {op.detail}")
    return found


def unavailable_listings(ops: list[Op], impaired: list[tuple[int, float, float]]) -> list[str]:
    """Listings that failed at a time when a read of every key would have had to succeed: a
    listing may fail only when the read check would allow some read over its interval to fail
    (more than M nodes impaired for that key, `impaired_for_read`)."""
    writes = decided_writes_by_key(ops)
    found = []
    for op in ops:
        if op.kind != "list" or op.outcome != "error":
            continue
        worst = max((impaired_for_read(impaired, key_writes, op.invoke, op.complete)
                     for key_writes in [[], *writes.values()]), key=len)
        if len(worst) <= M:
            down = ", ".join(f"n{n}" for n in sorted(worst)) or "none"
            found.append(f"unavailable: listing op {op.op_id} (client {op.client}) failed with at most {M} nodes "
                         f"impaired for any key ({down}): {op.detail}")
    return found


def write_effect(op: Op) -> str:
    """What a PUT or DELETE may have done: "applied" (acknowledged), "unknown" (failed with an error
    that does not prove it did nothing, or still in flight: possibly applied, as the read check
    takes every failed write) or "none" (refused: too few drives accepted it; or a DELETE that
    found no object, which the read check does not count as a delete either)."""
    if op.outcome == "ok":
        return "applied"
    if op.outcome == "error" and op.effect != "none":
        return "unknown"
    return "none"


def possible_states(key_writes: list[Op], start: float, end: float) -> list[Op | None]:
    """The writes that may be a key's state at some instant of [start, end], as the read check
    decides which values a read may return: a PUT or DELETE acknowledged or of unknown outcome,
    invoked before `end`, that no write acknowledged before `start` follows (invoked after it
    completed). None stands for the key's initial absence, possible until a write is acknowledged
    before `start`."""
    # Followed by some such write y (w.complete < y.invoke) iff it completed before the latest of
    # their invocations.
    latest = max((y.invoke for y in key_writes if write_effect(y) == "applied" and y.complete < start),
                 default=None)
    states: list[Op | None] = [w for w in key_writes if write_effect(w) != "none" and w.invoke < end
                               and (latest is None or not w.complete < latest)]
    if latest is None:
        states.append(None)
    return states


def check_listings(ops: list[Op], t0: float = 0.0) -> tuple[list[str], int]:
    """Every successful listing against the history of PUTs and DELETEs; returns the anomalies and
    the number of listings checked. For every key ever written or listed:
    - listed: some possible state (`possible_states`) over the listing is a PUT, of the listed size
      (no phantom from a refused PUT, no key resurrected after an acknowledged DELETE);
    - not listed: some possible state is absent (a DELETE, or before any write): a key whose
      state is an acknowledged PUT throughout the listing must be listed.
    An anomaly repeated by later listings (the same key, the same cause) is reported once, with a
    count. `t0`: the time printed as 0."""
    listings = sorted((op for op in ops if op.kind == "list" and op.outcome == "ok" and op.listed is not None),
                      key=lambda op: op.invoke)
    writes: dict[str, list[Op]] = {}
    for op in ops:
        if op.kind in ("put", "delete"):
            writes.setdefault(op.key, []).append(op)
    keys = sorted(set(writes) | {key for listing in listings for key in listing.listed})
    found: dict[tuple, list[str]] = {}

    def at(t: float) -> str:
        return f"{t - t0:.3f}s"

    for listing in listings:
        where = f"listing op {listing.op_id} (client {listing.client}, {at(listing.invoke)}-{at(listing.complete)})"
        for key in keys:
            key_writes = writes.get(key, [])
            states = possible_states(key_writes, listing.invoke, listing.complete)
            if key in listing.listed:
                size = listing.listed[key]
                puts = [w for w in states if w is not None and w.kind == "put"]
                if any(p.size is None or p.size == size for p in puts):
                    continue
                # A PUT in flight during the listing may show, as it may to a GET overlapping its
                # commit, even if it then fails (its rollback comes after): the same rule as reads.
                if any(w.kind == "put" and w.size == size and w.invoke < listing.complete
                       and w.complete > listing.invoke for w in key_writes):
                    continue
                cause, text = phantom(key, size, key_writes, listing, at)
                if not puts or cause[0] == "refused":
                    found.setdefault(("phantom", key, cause), []).append(f"phantom: {where} {text}")
                else:
                    maybe = ", ".join(f"op {p.op_id} ({p.size} B)" for p in puts)
                    found.setdefault(("size", key, size), []).append(
                        f"wrong size: {where} listed {key} with {size} bytes, which no PUT that may be its state "
                        f"then wrote (those: {maybe})")
            elif not any(w is None or w.kind == "delete" for w in states):
                acked = [w for w in key_writes if write_effect(w) == "applied" and w.complete < listing.invoke]
                last = max(acked, key=lambda w: w.complete)
                refused = [w.op_id for w in key_writes if w.kind == "delete" and write_effect(w) == "none"
                           and w.invoke < listing.complete and w.complete > last.invoke]
                note = (f"; DELETE op(s) {', '.join(map(str, refused))} failed in a way that proves they did "
                        f"nothing, or found no object" if refused else "")
                found.setdefault(("missing", key, last.op_id), []).append(
                    f"missing: {where} did not list {key} although PUT op {last.op_id} was acknowledged at "
                    f"{at(last.complete)}, before the listing began, and no DELETE that may have taken effect "
                    f"followed it{note}")
    anomalies = []
    for texts in found.values():
        more = f" (and {len(texts) - 1} later listing(s) the same)" if len(texts) > 1 else ""
        anomalies.append(texts[0] + more)
    return anomalies, len(listings)


def phantom(key: str, size: int, key_writes: list[Op], listing: Op, at) -> tuple[tuple, str]:
    """Why a listed key has no PUT of its listed size that may be its state then: (a cause to
    group by, the text)."""
    start, end = listing.invoke, listing.complete
    refused = [w for w in key_writes if w.kind == "put" and write_effect(w) == "none" and w.invoke < end]
    same_size = [w for w in refused if w.size == size]
    if same_size:
        w = same_size[-1]
        when = ("before the listing began" if w.complete < start else "while the listing ran" if w.complete <= end
                else "after the listing ended")
        return ("refused", w.op_id), (f"listed {key} ({size} B, the size PUT op {w.op_id} wrote) although that PUT failed "
                         f"{when}, at {at(w.complete)}, with an error that proves it did nothing: {w.detail[-200:]!r}")
    if not any(w.kind == "put" and w.invoke < end for w in key_writes):
        return ("unwritten",), f"listed {key} ({size} B), which no PUT started before the listing ended wrote"
    acked = [w for w in key_writes if write_effect(w) == "applied" and w.complete < start]
    last = max(acked, key=lambda w: w.complete, default=None)
    if last is not None and last.kind == "delete":
        return ("deleted", last.op_id), (f"listed {key} ({size} B) although DELETE op {last.op_id} was acknowledged at "
                            f"{at(last.complete)}, before the listing began, and no PUT that may have taken "
                            f"effect followed it (a resurrected key)")
    return ("other",), f"listed {key} ({size} B), which no PUT that may be its state then wrote"


def final_reads(workload: Workload) -> tuple[dict[str, Op], list[str]]:
    finals, problems = {}, []
    keys = sorted({op.key for op in workload.ops if op.kind != "list"})
    for n, key in enumerate(keys):
        op = Op(FINAL_OP_BASE + n, 0, "get", key, time.monotonic())
        result = workload.cli(0, "get", f"bkt/{key}", "-")
        Workload.classify_read(op, result, None)
        if op.outcome == "value" and len(result.stdout) >= HEADER.size:
            writer, size = HEADER.unpack_from(result.stdout)
            op.value = writer
            if writer not in workload.sizes or result.stdout != value_of(writer, size):
                problems.append(f"final GET of {key}: torn or corrupt bytes")
        elif op.outcome == "error":
            problems.append(f"final GET of {key} failed with every fault healed: {op.detail}")
        op.complete = time.monotonic()
        finals[key] = op
    return finals, problems


def wait_repaired(workload: Workload, unscrubbed: frozenset[str] = frozenset()) -> list[str]:
    """Waits for every node's repair queue to drain (and, with a scrubber, for two more scrub
    passes on every node but `unscrubbed`: a removed pool's nodes neither scrub nor repair);
    returns a problem if it does not."""
    cluster = workload.cluster
    help_text = subprocess.run([str(cluster.tessera), "--help"], capture_output=True, text=True).stdout
    if not re.search(r"^\s+repair\b", help_text, re.M):
        print("checker: this build has no background repair; probing redundancy as it stands", flush=True)
        return []
    started = time.monotonic()
    deadline = started + REPAIR_WAIT_S
    queued, last = -1, ""
    passes_at_start: dict[str, int] | None = None
    while time.monotonic() < deadline:
        result = workload.cli(0, "repair", "status", "--json")
        last = (result.stdout + result.stderr).decode(errors="replace").strip()
        lines = [json.loads(line) for line in result.stdout.decode().splitlines() if line.startswith("{")]
        if len(lines) == cluster.nodes and all("drives" in line for line in lines):
            # What is left, per node, for the report if it does not drain.
            last = "; ".join(f"{line['node']}: {[d['queued_versions'] for d in line['drives']]} queued"
                             f"{' (rebuilding)' if any(d.get('rebuilding') for d in line['drives']) else ''}"
                             for line in lines)
            queued = sum(d["queued_versions"] for line in lines for d in line["drives"])
            queued += sum(1 for line in lines for d in line["drives"] if d.get("rebuilding"))
            # With a scrubber: two passes more on every node, so one began after the faults.
            passes = {line["node"]: line.get("scrub", {}).get("passes", 0) for line in lines}
            if passes_at_start is None:
                passes_at_start = passes
            scrubbed = not cluster.scrubs or all(passes[n] >= passes_at_start[n] + 2 for n in passes
                                                 if n not in unscrubbed)
            if queued == 0 and scrubbed:
                print(f"checker: repair converged {time.monotonic() - started:.1f} s after the faults stopped", flush=True)
                return []
        time.sleep(1.0)
    # The repairers' last words on what they could not do (the node logs are gone after the run).
    notes = []
    for i in range(1, cluster.nodes + 1):
        if cluster.log(i).exists():
            said = [line for line in cluster.log(i).read_text(errors="replace").splitlines()
                    if "repair failed" in line or "repair entry dropped" in line or "cannot" in line]
            notes += [f"n{i}: {line[-300:]}" for line in said[-3:]]
    return [f"repair did not restore full redundancy within {REPAIR_WAIT_S:.0f} s after the faults stopped "
            f"({queued} versions still queued; last status: {last[-1500:]})" + "".join(f"\n    {n}" for n in notes)]


class Growth:
    """--grow: a second pool of NODES nodes (namespaces NODES+1..2*NODES, created with the
    others and idle until then) is added at `at` seconds into the run, its nodes started, and
    the pool activated, while the workload and the faults (on the first pool) go on. With
    `decommission_at`, the first pool is then decommissioned from that time on: the command
    is run again (it resumes) until it finishes or `until` passes."""

    ACTIVATE_TRIES = 60  # one a second: the new nodes take the buckets within moments
    DECOMMISSION_TIMEOUT_S = 300.0  # one run of `pool decommission` (a few dozen small keys)

    def __init__(self, cluster: Cluster, topo: Topology, workload: Workload, start: float, at: float,
                 decommission_at: float | None = None, until: float = 0.0):
        self.cluster, self.topo, self.workload, self.start, self.at = cluster, topo, workload, start, at
        self.decommission_at, self.until = decommission_at, until
        self.events: list[str] = []
        self.added_at: float | None = None
        self.active_at: float | None = None
        self.removed_at: float | None = None
        self.decommission_runs = 0

    def log(self, text: str) -> None:
        line = f"{time.monotonic() - self.start:7.2f}s {text}"
        self.events.append(line)
        print("  grow", line, flush=True)

    def tessera(self, *args: str, timeout: float = OP_TIMEOUT_S) -> subprocess.CompletedProcess:
        return subprocess.run([str(self.cluster.tessera), *args, "--config", str(self.cluster.config)],
                              capture_output=True, text=True, timeout=timeout)

    def decommission(self) -> bool:
        """One run of `tessera pool decommission 1`; whether pool 1 is removed."""
        self.decommission_runs += 1
        try:
            result = self.tessera("pool", "decommission", "1", timeout=self.DECOMMISSION_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            self.log("pool decommission 1: timed out (run again)")
            return False
        lines = (result.stdout + result.stderr).strip().splitlines()
        self.log(f"pool decommission 1 (run {self.decommission_runs}): {lines[-1:]}")
        if result.returncode == 0:
            self.removed_at = time.monotonic() - self.start
            return True
        return False

    def run(self) -> None:
        time.sleep(max(0.0, self.start + self.at - time.monotonic()))
        new = range(NODES + 1, 2 * NODES + 1)
        nodes = [arg for i in new for arg in ("--node", f"{self.topo.ip(i)}:{NODE_PORT}=1")]
        # A push the faults cut short is run again: `pool add` then finishes it.
        for _ in range(5):
            result = self.tessera("pool", "add", *nodes)
            self.log(f"pool add: {(result.stdout + result.stderr).strip().splitlines()[-1:]}")
            if result.returncode == 0:
                break
            time.sleep(2)
        else:
            return
        self.added_at = time.monotonic() - self.start
        self.cluster.nodes = 2 * NODES
        for i in new:
            formatted = self.tessera("drive", "format", "--node", f"n{i}")
            assert formatted.returncode == 0, formatted.stderr
            self.cluster.start(i)
        for i in new:
            self.cluster.wait_ready(i)
        for _ in range(self.ACTIVATE_TRIES):
            result = self.tessera("pool", "activate", "2")
            if result.returncode == 0:
                self.active_at = time.monotonic() - self.start
                # New keys from now on: their first versions go to either pool, by free space.
                self.workload.keys = 2 * KEYS
                self.log(f"pool 2 active; keys k{KEYS}..k{2 * KEYS - 1} in play from now on")
                break
            time.sleep(1)
        else:
            self.log(f"pool 2 never became active: {result.stderr.strip()}")
            return
        if self.decommission_at is None:
            return
        time.sleep(max(0.0, self.start + self.decommission_at - time.monotonic()))
        # Under the faults, a run may leave keys it could not move: run it again (it resumes).
        while time.monotonic() < self.until and not self.decommission():
            time.sleep(2)


def probe_redundancy(workload: Workload, finals: dict[str, Op], rng: random.Random, first: int = 1) -> list[str]:
    """With repair converged, takes M nodes of the pool whose nodes are `first`.. down at a
    time: every key must read as it did."""
    cluster, problems = workload.cluster, []
    for key, final in sorted(finals.items()):
        if final.outcome != "value":
            continue
        result = workload.cli(0, "stat", f"bkt/{key}")
        text = result.stdout.decode(errors="replace")
        positions = text.count("position ")
        if result.returncode != 0 or positions != NODES or "(no metadata)" in text:
            problems.append(f"lost redundancy: after repair, {key} is not on all {NODES} drives:\n{text}"
                            f"{result.stderr.decode(errors='replace')}")
    sets = list(itertools.combinations(range(first, first + NODES), M))
    if REDUNDANCY_PROBES < len(sets):
        sets = rng.sample(sets, REDUNDANCY_PROBES)
    for down in sets:
        print(f"checker: probing redundancy with {', '.join(f'n{i}' for i in down)} down", flush=True)
        for i in down:
            cluster.kill(i)
        for key, final in sorted(finals.items()):
            op = Op(0, 0, "get", key, time.monotonic())
            result = workload.cli(0, "get", f"bkt/{key}", "-")
            Workload.classify_read(op, result, None)
            if op.outcome == "value" and len(result.stdout) >= HEADER.size:
                op.value = HEADER.unpack_from(result.stdout)[0]
            if (op.outcome, op.value) != (final.outcome, final.value):
                got = f"op {op.value}" if op.outcome == "value" else f"{op.outcome} ({op.detail})"
                want = f"op {final.value}" if final.outcome == "value" else final.outcome
                problems.append(f"lost redundancy: with {', '.join(f'n{i}' for i in down)} down after repair, "
                                f"GET of {key} returned {got}, not {want}")
        for i in down:
            cluster.start(i)
        for i in down:
            cluster.wait_ready(i)
    return problems


# ---------------------------------------------------------------------------------------------


@dataclasses.dataclass
class Report:
    seed: int
    duration: float
    schedule: list[str]
    counts: dict[str, int]
    anomalies: list[str]
    errors_logged: list[str]
    read_errors: list[str] = dataclasses.field(default_factory=list)
    readdressed: int = 0  # nodes moved to a new address (with --readdress)
    stale_client_done: int = 0  # operations the stale-map client completed (with --readdress or --grow)
    grown: list[str] = dataclasses.field(default_factory=list)  # with --grow: what the growth did
    grown_active_at: float | None = None  # with --grow: when pool 2 became active (s into the run)
    removed_at: float | None = None  # with --decommission: when pool 1 was removed (s into the run)
    decommission_runs: int = 0  # with --decommission: runs of `pool decommission 1` it took
    ops_after_growth: int = 0  # with --grow: acknowledged PUTs of the keys put in play after pool 2 was active
    keys_in_second_pool: int = 0  # with --grow: keys whose final version is in pool 2
    list_errors: list[str] = dataclasses.field(default_factory=list)  # listings that failed
    verified_reads: int = 0  # reads (and final reads) checked against the history
    verified_listings: int = 0  # listings checked against the history (with list checks)
    list_checks: bool = True
    hot_and_creators: bool = False  # with --aimed: the hot key, its slow reader and the creators ran
    slow_read_spans: list[int] = dataclasses.field(default_factory=list)  # overwrites acked during each slow read
    races: int = 0  # creator pairs run
    races_overlapped: int = 0  # of them, pairs whose two PUTs ran at once
    race_outcomes: dict[str, int] = dataclasses.field(default_factory=dict)  # e.g. "exists+ok": 12
    restamped_writes: int = 0  # hot-key writes that re-stamped (their commit met a newer version)

    def verified_line(self) -> str:
        if not self.list_checks:
            return f"seed {self.seed}: {self.verified_reads} reads verified against the history (list checks off)"
        return (f"seed {self.seed}: {self.verified_reads} reads and {self.verified_listings} listings verified "
                f"against the history")

    def text(self) -> str:
        lines = [f"seed {self.seed}, {self.duration:.0f} s of faults, {sum(self.counts.values())} operations",
                 "operations: " + ", ".join(f"{k} {v}" for k, v in sorted(self.counts.items())),
                 self.verified_line(),
                 f"faults: {len(self.schedule)} events"]
        lines += [f"  {line}" for line in self.schedule]
        if self.readdressed:
            lines.append(f"nodes moved to new addresses: {self.readdressed}; operations completed by the client "
                         f"with the start's map: {self.stale_client_done}")
        if self.grown:
            lines.append(f"growth to a second pool: {len(self.grown)} events; PUTs acknowledged of the keys new since: "
                         f"{self.ops_after_growth}; keys read back from the second pool: {self.keys_in_second_pool}; "
                         f"operations completed by the client with the start's map: {self.stale_client_done}")
            if self.removed_at is not None:
                lines.append(f"pool 1 decommissioned and removed at {self.removed_at:.1f} s "
                             f"({self.decommission_runs} run(s) of the command); its nodes were down for the final reads")
            lines += [f"  {line}" for line in self.grown]
        if self.hot_and_creators:
            spans = self.slow_read_spans
            lines.append(f"hot key: {len(spans)} slow reads returned a value, spanning up to "
                         f"{max(spans, default=0)} acknowledged overwrites each (median "
                         f"{sorted(spans)[len(spans) // 2] if spans else 0}); creators: {self.races} races "
                         f"({self.races_overlapped} overlapping), outcomes "
                         + ", ".join(f"{k} {v}" for k, v in sorted(self.race_outcomes.items()))
                         + f"; hot-key writes that re-stamped: {self.restamped_writes}")
        lines.append(f"anomalies: {len(self.anomalies)}")
        lines += [f"  {a}" for a in self.anomalies[:50]]
        if self.read_errors:
            lines.append(f"reads that failed: {len(self.read_errors)} (those with at most {M} nodes impaired are anomalies)")
            lines += [f"  {e}" for e in self.read_errors[:10]]
        if self.list_errors:
            lines.append(f"listings that failed: {len(self.list_errors)} (those with at most {M} nodes impaired are "
                         f"anomalies)")
            lines += [f"  {e}" for e in self.list_errors[:10]]
        if self.errors_logged:
            lines.append(f"node ERROR lines: {len(self.errors_logged)}")
            lines += [f"  {line}" for line in self.errors_logged[:20]]
        return "\n".join(lines)


def supports(tessera: Path, command: str, flag: str) -> bool:
    """Whether this build's `tessera COMMAND` takes FLAG (older builds, replayed, may not)."""
    return flag in subprocess.run([str(tessera), command, "--help"], capture_output=True, text=True).stdout


def run_checker(seed: int, duration: float, tessera: Path, skew: bool = True, faults_on: bool = True,
                readdress: bool = False, grow: bool = False, decommission: bool = False,
                list_checks: bool = True, aimed: bool = False) -> Report:
    """One seeded run. Without faults (`faults_on=False`) the workload races reads against
    overwrites on a healthy cluster: every read must then succeed. With `readdress`, nodes move
    to new addresses too, and one client plans with the start's map throughout. With `grow`, a
    second pool joins a third of the way in (and one client keeps the start's map); with
    `decommission` too, the first pool is decommissioned from two thirds of the way in, and
    its nodes are down for the final reads. With `list_checks`, a tenth of the operations are
    listings (and one more follows the final reads), checked against the history. With
    `aimed`, the faults also include those aimed at commits (`Faults.AIMED_KINDS`)."""
    grow = grow or decommission
    rng = random.Random(seed)
    full_drive = faults_on and rng.random() < 0.3
    topo = Topology(2 * NODES if grow else NODES)
    work = Path(tempfile.mkdtemp(prefix=f"tessera-chaos-{seed}-"))
    cluster = Cluster(tessera, topo, work, full_drive)
    print(f"checker: seed {seed}, {duration:.0f} s, faults: {faults_on}, full drive on n{NODES}: {full_drive}, "
          f"clock skew: {skew}, aimed faults: {aimed}, work dir {work}", flush=True)
    try:
        topo.create()
        cluster.init()
        for i in range(1, NODES + 1):
            cluster.start(i)
        for i in range(1, NODES + 1):
            cluster.wait_ready(i)
        ranged = "--offset" in subprocess.run([str(tessera), "get", "--help"], capture_output=True, text=True).stdout
        subprocess.run([str(tessera), "mb", "bkt", "--config", str(cluster.config)], check=True, capture_output=True)
        start = time.monotonic()
        deadline = start + duration
        skews = CLIENT_SKEWS_S if skew else [0] * CLIENTS
        workload = Workload(cluster, seed, deadline, ranged, skews, stale_client=readdress or grow,
                            list_checks=list_checks)
        faults = Faults(cluster, topo, seed, deadline, start, readdress=readdress, aimed=aimed)
        threads = [threading.Thread(target=workload.client_loop, args=(c,), daemon=True) for c in range(CLIENTS)]
        growth = None
        if grow:
            growth = Growth(cluster, topo, workload, start, duration / 3,
                            decommission_at=2 * duration / 3 if decommission else None, until=deadline + 60)
        if growth is not None:
            threads.append(threading.Thread(target=growth.run, daemon=True))
        if faults_on:
            threads.append(threading.Thread(target=faults.loop, daemon=True))
        hot_and_creators = aimed and supports(tessera, "get", "--buffer") and supports(tessera, "put", "--if-absent")
        if aimed and not hot_and_creators:
            print("checker: this build has no `get --buffer` or `put --if-absent`: no hot key, slow reader or "
                  "creators", flush=True)
        if hot_and_creators:
            threads += [threading.Thread(target=workload.hot_writer_loop, args=(client, HOT_PUT_BASE + i * HOT_SECOND_WRITER),
                                         daemon=True) for i, client in enumerate(HOT_WRITER_CLIENTS)]
            threads += [
                        threading.Thread(target=workload.slow_reader_loop, args=(0,), daemon=True),
                        threading.Thread(target=workload.creators_loop, daemon=True)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=duration + 4 * OP_TIMEOUT_S)
        faults.heal_all()
        for i in range(1, NODES + 1):
            if i not in cluster.procs:
                cluster.start(i)
            cluster.wait_ready(i)
        decommission_problems = []
        if decommission and growth is not None and growth.removed_at is None:
            # The faults are healed: a last run must finish the move.
            if growth.active_at is None or not growth.decommission():
                decommission_problems.append("pool 1 was not removed, even once every fault was healed:\n"
                                             + "\n".join(growth.events[-5:]))
        removed = growth is not None and growth.removed_at is not None
        if removed:
            # Nothing acknowledged may need the removed pool: its nodes are gone for the reads.
            for i in range(1, NODES + 1):
                cluster.kill(i)
        finals, problems = final_reads(workload)
        if list_checks:
            final_listing = workload.list_keys(0, FINAL_LIST_OP)
            if final_listing.outcome == "error":
                problems.append(f"final listing failed with every fault healed: {final_listing.detail}")
        anomalies = workload.corrupt + problems + check_history(workload.ops, finals) + decommission_problems
        anomalies += check_races(workload.races)
        anomalies += unavailable_reads(workload.ops, faults.impaired)
        verified_listings = 0
        if list_checks:
            listing_anomalies, verified_listings = check_listings(workload.history(), start)
            anomalies += listing_anomalies + unavailable_listings(workload.ops, faults.impaired)
        # The operator frees space before restarting anything: a node whose only drive is full
        # to the last byte refuses to start (it cannot prove the drive writable).
        cluster.grow_full_drive()
        if removed:
            for i in range(1, NODES + 1):
                cluster.start(i)
            for i in range(1, NODES + 1):
                cluster.wait_ready(i)
        anomalies += wait_repaired(workload, frozenset(f"n{i}" for i in range(1, NODES + 1)) if removed else frozenset())
        anomalies += probe_redundancy(workload, finals, rng, first=NODES + 1 if removed else 1)
        counts: dict[str, int] = {}
        for op in workload.ops:
            counts[f"{op.kind}:{op.outcome}"] = counts.get(f"{op.kind}:{op.outcome}", 0) + 1
        if os.environ.get("TESSERA_CHAOS_HISTORY"):
            with open(os.environ["TESSERA_CHAOS_HISTORY"], "w") as f:
                json.dump([dataclasses.asdict(op) | {"t0": op.invoke - start, "t1": op.complete - start}
                           for op in workload.ops + list(finals.values())], f)
        read_errors = [f"{op.kind} op {op.op_id} of {op.key} at {op.invoke - start:.2f}s "
                       f"(took {op.complete - op.invoke:.2f}s): {op.detail}"
                       for op in workload.ops if op.kind in ("get", "rget") and op.outcome == "error"]
        stale_done = sum(1 for op in workload.ops if (readdress or grow) and op.client == Workload.STALE_CLIENT
                         and op.outcome in ("ok", "value", "absent", "past-end"))
        report = Report(seed, duration, faults.schedule, counts, anomalies, cluster.error_lines(), read_errors,
                        faults.readdressed, stale_done)
        report.list_checks = list_checks
        report.verified_listings = verified_listings
        report.hot_and_creators = hot_and_creators
        report.slow_read_spans = list(workload.slow_read_spans)
        report.restamped_writes = workload.restamped_writes
        report.races = len(workload.races)
        # Races whose two creators ran at once (each began before the other ended).
        report.races_overlapped = sum(1 for _, pair in workload.races if len(pair) == 2
                                      and pair[0].invoke < pair[1].complete and pair[1].invoke < pair[0].complete)
        report.race_outcomes = {}
        for _, pair in workload.races:
            outcome = "+".join(sorted("exists" if ALREADY_EXISTS in op.detail and op.effect == "none" else op.outcome
                                      for op in pair))
            report.race_outcomes[outcome] = report.race_outcomes.get(outcome, 0) + 1
        report.verified_reads = len(finals) + sum(1 for op in workload.ops if op.kind in ("get", "rget")
                                                  and op.outcome in ("value", "absent"))
        report.list_errors = [f"listing op {op.op_id} (client {op.client}) at {op.invoke - start:.2f}s "
                              f"(took {op.complete - op.invoke:.2f}s): {op.detail}"
                              for op in workload.ops if op.kind == "list" and op.outcome == "error"]
        if growth is not None:
            report.grown = growth.events
            report.grown_active_at = growth.active_at
            report.removed_at = growth.removed_at
            report.decommission_runs = growth.decommission_runs
            report.ops_after_growth = sum(1 for op in workload.ops if op.kind == "put" and op.outcome == "ok"
                                          and re.fullmatch(r"k\d+", op.key) and int(op.key[1:]) >= KEYS)
            # The second pool's one set is set 1 (the first pool has set 0).
            report.keys_in_second_pool = sum(
                1 for key, final in finals.items() if final.outcome == "value"
                and "erasure set:  1 " in workload.cli(0, "stat", f"bkt/{key}").stdout.decode(errors="replace"))
        return report
    finally:
        cluster.stop_all()
        topo.destroy()
        if os.environ.get("TESSERA_CHAOS_KEEP") is None:
            shutil.rmtree(work, ignore_errors=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seed", type=int, action="append", help="seed to run (repeatable; default: random)")
    parser.add_argument("--duration", type=float, default=60.0, help="seconds of faults per seed")
    parser.add_argument("--tessera", type=Path, default=REPO / "target" / "release" / "tessera")
    parser.add_argument("--no-skew", action="store_true", help="every client on the machine's clock")
    parser.add_argument("--no-faults", action="store_true",
                        help="no faults: reads race overwrites on a healthy cluster, and every read must succeed")
    parser.add_argument("--readdress", action="store_true",
                        help="nodes also move to new addresses (map pushes); one client keeps the start's map")
    parser.add_argument("--grow", action="store_true",
                        help="a second pool of 6 nodes is added and activated a third of the way in")
    parser.add_argument("--decommission", action="store_true",
                        help="--grow, then the first pool is decommissioned two thirds of the way in")
    parser.add_argument("--list-checks", action=argparse.BooleanOptionalAction, default=True,
                        help="a tenth of the operations are listings (`tessera ls`), checked against the history "
                             "(default: on; --no-list-checks replays the workload without them)")
    parser.add_argument("--aimed", action=argparse.BooleanOptionalAction, default=False,
                        help="faults aimed at commits too: replies dropped (nftables, reply direction only), "
                             "alone or with a node stalled or killed at the same instant")
    args = parser.parse_args()
    seeds = args.seed or [random.SystemRandom().randrange(1, 1 << 31)]
    failed = 0
    verified: list[str] = []
    for seed in seeds:
        try:
            report = run_checker(seed, args.duration, args.tessera, skew=not args.no_skew,
                                 faults_on=not args.no_faults, readdress=args.readdress, grow=args.grow,
                                 decommission=args.decommission, list_checks=args.list_checks,
                                 aimed=args.aimed)
        except CheckerError as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
        print(report.text(), flush=True)
        failed += bool(report.anomalies)
        verified.append(report.verified_line())
    for line in verified:
        print(f"checker: {line}")
    print(f"checker: {len(seeds)} seed(s), {failed} with anomalies")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
