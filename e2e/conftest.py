"""One Tessera cluster for the whole end-to-end session.

Six `tessera node` processes (4+2, 1 MiB chunks) and one `tessera gateway` run as separate
processes on free 127.0.0.1 ports, with logs in the session's temp dir. The suite builds nothing:
it runs target/release/tessera. Each test gets its own bucket, so tests are independent; tests that
kill nodes restart them before they end.

After each test, new ERROR lines in the node or gateway logs fail it (ERROR means "a human must
look", ARCHITECTURE.md); `@pytest.mark.allow_log_errors(regex)` lists expected ones. A failed test
gets the log lines written while it ran appended to its report.
"""

from __future__ import annotations

import base64
import contextlib
import ctypes
import json
import http.client
import os
import random
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import boto3
import pytest
from botocore.config import Config
from botocore.exceptions import ClientError

from s3check import unique_bucket_name

REPO = Path(__file__).resolve().parent.parent
TESSERA = REPO / "target" / "release" / "tessera"
NODES = 6
EC = "4+2"
CHUNK_SIZE = "1MiB"
REGION = "us-east-1"
READY_TIMEOUT_S = 20.0
STOP_TIMEOUT_S = 10.0
HEAL_TIMEOUT_S = 20.0
PROBE_BUCKET = "e2e-health-probe"
LOG_EXCERPT_LINES_MAX = 200
# tracing's fmt layer: "2026-01-01T00:00:00.000000Z ERROR target: message".
ERROR_LINE = re.compile(r"^\S+\s+ERROR\s")

_PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:
    """Runs in the child before exec: SIGKILL it if pytest dies, so no node outlives the run."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


def _port_is_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _ephemeral_floor() -> int:
    """First port of the kernel's ephemeral range (what outgoing connections take locally)."""
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32_768


def _free_port_range(count: int) -> int:
    """First of `count` consecutive ports free on 127.0.0.1 (node i listens on base + i - 1).

    Below the ephemeral range: a node killed and restarted on its port must not find it taken
    as the local port of somebody's outgoing connection."""
    ceiling = _ephemeral_floor()
    rng = random.Random(os.getpid())
    for _ in range(200):
        base = rng.randrange(10_000, ceiling - count)
        if all(_port_is_free(base + i) for i in range(count)):
            return base
    raise RuntimeError(f"no {count} consecutive free ports on 127.0.0.1 below {ceiling}")


def _wait_tcp(port: int, proc: subprocess.Popen, name: str, log: Path, deadline: float) -> None:
    while True:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                return
        except OSError:
            pass
        if proc.poll() is not None:
            raise RuntimeError(f"{name} exited during startup ({proc.returncode}):\n{log.read_text()}")
        if time.monotonic() > deadline:
            raise RuntimeError(f"{name} not accepting on 127.0.0.1:{port} in {READY_TIMEOUT_S}s:\n{log.read_text()}")
        time.sleep(0.02)


@dataclass
class Cluster:
    """The processes of one test cluster. Nodes are numbered 1..NODES like their ids (n1..n6)."""

    dir: Path
    base_port: int
    gateway_port: int
    access_key: str
    secret_key: str
    procs: dict[str, subprocess.Popen] = field(default_factory=dict)

    @property
    def config(self) -> Path:
        return self.dir / "data" / "cluster.toml"

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.gateway_port}"

    @property
    def console_url(self) -> str:
        """The gateway's web console: the port after the metrics ports."""
        return f"http://127.0.0.1:{self.gateway_port + NODES + 2}"

    def metrics_port(self, name: str) -> int:
        """Where `name` ("gateway" or "n1".."n6") serves /metrics: the ports after the gateway's."""
        return self.gateway_port + 1 + (0 if name == "gateway" else int(name[1:]))

    def log_path(self, name: str) -> Path:
        return self.dir / f"{name}.log"

    def log_names(self) -> list[str]:
        return [f"n{i}" for i in range(1, NODES + 1)] + ["gateway"]

    def init(self) -> None:
        out = subprocess.run(
            [str(TESSERA), "init", "--nodes", str(NODES), "--ec", EC, "--chunk-size", CHUNK_SIZE,
             "--base-port", str(self.base_port), "--data", str(self.dir / "data")],
            capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL,
        )
        assert out.returncode == 0, f"tessera init failed:\n{out.stdout}{out.stderr}"

    def _spawn(self, name: str, args: list[str], extra_env: dict[str, str]) -> subprocess.Popen:
        assert name not in self.procs, f"{name} is already running"
        env = {**os.environ, "TESSERA_LOG": "info", "NO_COLOR": "1", **extra_env}
        with open(self.log_path(name), "ab") as log:
            proc = subprocess.Popen(
                [str(TESSERA), *args], stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                env=env, preexec_fn=_die_with_parent,
            )
        self.procs[name] = proc
        return proc

    def start_node(self, i: int) -> None:
        """Starts node n{i} and waits until it accepts connections."""
        name = f"n{i}"
        metrics = f"127.0.0.1:{self.metrics_port(name)}"
        proc = self._spawn(name, ["node", "--config", str(self.config), "--id", name, "--metrics-listen", metrics], {})
        _wait_tcp(self.base_port + i - 1, proc, name, self.log_path(name), time.monotonic() + READY_TIMEOUT_S)

    def spawn_extra(self, name: str, args: list[str], extra_env: dict[str, str]) -> subprocess.Popen:
        """Another tessera process (an extra gateway, say) that dies with pytest and is stopped
        with the session; stop it earlier with `stop_extra(name)`. Logs go to `log_path(name)`."""
        return self._spawn(name, args, extra_env)

    def stop_extra(self, name: str) -> None:
        self._kill(name)

    def kill_node(self, i: int) -> None:
        """SIGKILL node n{i} (by PID) and reap it."""
        self._kill(f"n{i}")

    def restart_node(self, i: int) -> None:
        self._kill(f"n{i}")
        self.start_node(i)

    def node_running(self, i: int) -> bool:
        proc = self.procs.get(f"n{i}")
        return proc is not None and proc.poll() is None

    @contextlib.contextmanager
    def nodes_down(self, *ids: int):
        """SIGKILLs nodes `ids` for the body of the with, then starts them again (even on failure)
        and waits until the gateway writes to every node again."""
        try:
            for i in ids:
                self.kill_node(i)
            yield
        finally:
            for i in ids:
                if not self.node_running(i):
                    self.start_node(i)
            self.wait_gateway_writes_every_node()

    def probe_client(self):
        return boto3.session.Session().client(
            "s3", endpoint_url=self.endpoint, aws_access_key_id=self.access_key, aws_secret_access_key=self.secret_key,
            config=Config(region_name=REGION, s3={"addressing_style": "path"}, retries={"max_attempts": 1}),
        )

    def wait_gateway_writes_every_node(self) -> None:
        """Polls until a PUT through the gateway lands on all NODES drives (`tessera stat` shows
        every position with its metadata), so the next test starts from a healthy cluster: the
        gateway's client skips nodes that failed in the last seconds."""
        client = self.probe_client()
        deadline = time.monotonic() + HEAL_TIMEOUT_S
        last = ""
        while time.monotonic() < deadline:
            try:
                client.put_object(Bucket=PROBE_BUCKET, Key="probe", Body=b"probe")
            except ClientError as e:
                last = str(e)
                time.sleep(0.25)
                continue
            out = subprocess.run(
                [str(TESSERA), "stat", f"{PROBE_BUCKET}/probe", "--config", str(self.config)],
                capture_output=True, text=True, timeout=30, stdin=subprocess.DEVNULL,
            )
            last = out.stdout + out.stderr
            written = [line for line in out.stdout.splitlines() if line.strip().startswith("position ")]
            if out.returncode == 0 and len(written) == NODES and "(no metadata)" not in out.stdout:
                return
            time.sleep(0.1)
        raise RuntimeError(f"the gateway did not write to all {NODES} nodes within {HEAL_TIMEOUT_S}s:\n{last}")

    def start_gateway(self) -> None:
        proc = self._spawn(
            "gateway",
            ["gateway", "--config", str(self.config), "--listen", f"127.0.0.1:{self.gateway_port}",
             "--metrics-listen", f"127.0.0.1:{self.metrics_port('gateway')}",
             "--console-listen", self.console_url.removeprefix("http://")],
            {"TESSERA_ACCESS_KEY": self.access_key, "TESSERA_SECRET_KEY": self.secret_key},
        )
        deadline = time.monotonic() + READY_TIMEOUT_S
        log = self.log_path("gateway")
        _wait_tcp(self.gateway_port, proc, "gateway", log, deadline)
        # Accepting is not serving: wait for an HTTP answer (403 for this unsigned request).
        while True:
            conn = http.client.HTTPConnection("127.0.0.1", self.gateway_port, timeout=2)
            try:
                conn.request("GET", "/")
                conn.getresponse().read()
                return
            except OSError:
                pass
            finally:
                conn.close()
            if proc.poll() is not None:
                raise RuntimeError(f"gateway exited during startup ({proc.returncode}):\n{log.read_text()}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"gateway gave no HTTP answer in {READY_TIMEOUT_S}s:\n{log.read_text()}")
            time.sleep(0.05)

    def _kill(self, name: str) -> None:
        proc = self.procs.pop(name, None)
        if proc is None:
            return
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=STOP_TIMEOUT_S)

    def stop(self) -> None:
        for name in list(self.procs):
            self._kill(name)

    def log_offsets(self) -> dict[str, int]:
        return {name: (p.stat().st_size if (p := self.log_path(name)).exists() else 0) for name in self.log_names()}

    def log_since(self, offsets: dict[str, int]) -> dict[str, list[str]]:
        """Lines each process logged after `offsets` (from log_offsets)."""
        lines = {}
        for name in self.log_names():
            path = self.log_path(name)
            if not path.exists():
                continue
            with open(path, "rb") as f:
                f.seek(offsets.get(name, 0))
                lines[name] = f.read().decode("utf-8", "replace").splitlines()
        return lines


def _gateway_missing_reason() -> str | None:
    if not TESSERA.is_file():
        return f"{TESSERA} is missing: build it first (make build, or cargo build --release --workspace)"
    out = subprocess.run([str(TESSERA), "gateway", "--help"], capture_output=True, text=True, timeout=30)
    if out.returncode != 0:
        first_line = (out.stderr.strip().splitlines() or ["no output"])[0]
        return f"{TESSERA} has no working `gateway` subcommand (rebuild it): {first_line}"
    return None


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "allow_log_errors(regex): ERROR log lines this test may cause")


_CLUSTER: Cluster | None = None
_LOG_OFFSETS = pytest.StashKey[dict]()


@pytest.fixture(scope="session")
def cluster(tmp_path_factory: pytest.TempPathFactory):
    global _CLUSTER
    reason = _gateway_missing_reason()
    if reason:
        pytest.exit(reason, returncode=2)
    root = tmp_path_factory.mktemp("tessera")
    access_key = "E2E" + secrets.token_hex(8).upper()
    # 40 characters with '+' and '/', like AWS secrets: they must survive signing and env passing.
    secret_key = base64.b64encode(secrets.token_bytes(30)).decode()
    base_port = _free_port_range(2 * NODES + 3)  # nodes, gateway, their metrics, the console
    c = Cluster(root, base_port, base_port + NODES, access_key, secret_key)
    c.init()
    with pytest.MonkeyPatch.context() as mp:
        _isolate_aws_env(mp, root)
        try:
            for i in range(1, NODES + 1):
                c.start_node(i)
            c.start_gateway()
            # Created while every node is up (see wait_gateway_writes_every_node).
            c.probe_client().create_bucket(Bucket=PROBE_BUCKET)
            _CLUSTER = c
            yield c
        finally:
            _CLUSTER = None
            c.stop()


def _isolate_aws_env(mp: pytest.MonkeyPatch, root: Path) -> dict[str, str]:
    """Keeps the home dir's ~/.aws and any AWS_* variables away from every client, in and out of process."""
    config_file = root / "aws-config"
    credentials_file = root / "aws-credentials"
    config_file.write_text("")
    credentials_file.write_text("")
    for name in list(os.environ):
        if name.startswith("AWS_"):
            mp.delenv(name)
    values = {
        "AWS_CONFIG_FILE": str(config_file),
        "AWS_SHARED_CREDENTIALS_FILE": str(credentials_file),
        "AWS_DEFAULT_REGION": REGION,
        "AWS_EC2_METADATA_DISABLED": "true",
    }
    for name, value in values.items():
        mp.setenv(name, value)
    return values


@pytest.fixture(scope="session")
def endpoint(cluster: Cluster) -> str:
    return cluster.endpoint


@pytest.fixture(scope="session")
def aws_env(cluster: Cluster) -> dict[str, str]:
    """Environment for aws-cli and other subprocess clients: this cluster's keys, no home-dir config."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    env.update({
        "AWS_ACCESS_KEY_ID": cluster.access_key,
        "AWS_SECRET_ACCESS_KEY": cluster.secret_key,
        "AWS_DEFAULT_REGION": REGION,
        "AWS_EC2_METADATA_DISABLED": "true",
        "AWS_CONFIG_FILE": str(cluster.dir / "aws-config"),
        "AWS_SHARED_CREDENTIALS_FILE": str(cluster.dir / "aws-credentials"),
        "AWS_PAGER": "",
    })
    venv_bin = str(Path(sys.executable).parent)
    env["PATH"] = venv_bin + os.pathsep + env.get("PATH", "")
    return env


def _send_checksums_as_trailers(params, **_kwargs) -> None:
    """botocore puts flexible checksums in aws-chunked trailers only over https; do it over http too.

    This is byte for byte what current SDKs send to an https endpoint: Content-Encoding aws-chunked,
    x-amz-content-sha256 STREAMING-UNSIGNED-PAYLOAD-TRAILER, x-amz-trailer x-amz-checksum-<alg>.
    """
    algorithm = params.get("context", {}).get("checksum", {}).get("request_algorithm")
    if isinstance(algorithm, dict) and algorithm.get("in") == "header":
        algorithm["in"] = "trailer"


ClientFactory = Callable[..., object]


@pytest.fixture(scope="session")
def make_client(cluster: Cluster) -> ClientFactory:
    """boto3 S3 client factory. checksums: "header" (botocore's default over http: CRC32 header),
    "trailer" (aws-chunked trailers, as over https) or "when_required" (no flexible checksums)."""

    session = boto3.session.Session()  # loads the S3 model once; clients are cheap after that

    def make(access_key: str | None = None, secret_key: str | None = None, *, endpoint_url: str | None = None,
             addressing_style: str = "path", checksums: str = "header", **config):
        assert checksums in ("header", "trailer", "when_required")
        cfg = Config(
            region_name=REGION,
            signature_version="s3v4",
            s3={"addressing_style": addressing_style},
            retries={"max_attempts": 1, "mode": "standard"},
            connect_timeout=5,
            read_timeout=60,
            request_checksum_calculation="when_required" if checksums == "when_required" else "when_supported",
            **config,
        )
        client = session.client(
            "s3",
            endpoint_url=endpoint_url or cluster.endpoint,
            aws_access_key_id=access_key or cluster.access_key,
            aws_secret_access_key=secret_key or cluster.secret_key,
            config=cfg,
        )
        if checksums == "trailer":
            for op in ("PutObject", "UploadPart"):
                client.meta.events.register(f"before-call.s3.{op}", _send_checksums_as_trailers)
        return client

    return make


@pytest.fixture
def localhost_subdomains(monkeypatch: pytest.MonkeyPatch) -> None:
    """`BUCKET.localhost` resolves to 127.0.0.1 in this test (virtual-host style addressing
    against the gateway, whose base domain is localhost)."""
    real_getaddrinfo = socket.getaddrinfo

    def resolve(host, *args, **kwargs):
        if isinstance(host, str) and host.endswith(".localhost"):
            host = "127.0.0.1"
        return real_getaddrinfo(host, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", resolve)


@pytest.fixture
def s3(make_client: ClientFactory):
    """A boto3 client of its own per test, so no pooled connection outlives a test."""
    return make_client()


@pytest.fixture
def bucket_name(request: pytest.FixtureRequest) -> str:
    """A fresh bucket name for this test (not created)."""
    return unique_bucket_name(request.node.name)


@pytest.fixture
def bucket(s3, bucket_name: str) -> str:
    """A fresh, created bucket for this test."""
    s3.create_bucket(Bucket=bucket_name)
    return bucket_name


@pytest.fixture(autouse=True)
def _watch_logs(request: pytest.FixtureRequest, cluster: Cluster):
    offsets = cluster.log_offsets()
    request.node.stash[_LOG_OFFSETS] = offsets
    yield
    allowed = [re.compile(m.args[0]) for m in request.node.iter_markers("allow_log_errors")]
    errors = [
        f"{name}: {line}"
        for name, lines in cluster.log_since(offsets).items()
        for line in lines
        if ERROR_LINE.match(line) and not any(a.search(line) for a in allowed)
    ]
    if errors:
        pytest.fail("ERROR lines in the cluster logs during this test:\n" + "\n".join(errors[:50]), pytrace=False)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo):
    report = yield
    offsets = item.stash.get(_LOG_OFFSETS, None)
    if report.failed and _CLUSTER is not None and offsets is not None:
        for name, lines in _CLUSTER.log_since(offsets).items():
            if lines:
                tail = lines[-LOG_EXCERPT_LINES_MAX:]
                report.sections.append((f"{name} log ({len(lines)} lines during this test)", "\n".join(tail)))
    return report


def _aws_cli_path() -> str:
    """The `aws` command of this Python's environment (the suite's venv), else the one on PATH."""
    local = Path(sys.executable).parent / "aws"
    if local.is_file():
        return str(local)
    found = shutil.which("aws")
    assert found, "aws-cli is not installed: run e2e/run.sh (it installs e2e/requirements.txt)"
    return found


AWS_CLI_TIMEOUT_S = 120


class AwsCli:
    """Runs aws-cli v1 against the gateway: `aws("s3", "ls")`, `aws.json("s3api", "head-object", ...)`."""

    def __init__(self, env: dict[str, str], endpoint: str):
        self.env = env
        self.endpoint = endpoint
        self.path = _aws_cli_path()

    def __call__(self, *args, check: bool = True, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
        cmd = [self.path, "--endpoint-url", self.endpoint, *map(str, args)]
        out = subprocess.run(cmd, env=env or self.env, capture_output=True, text=True,
                             timeout=AWS_CLI_TIMEOUT_S, stdin=subprocess.DEVNULL)
        if check and out.returncode != 0:
            pytest.fail(f"{' '.join(cmd[1:])} exited {out.returncode}:\n{out.stdout}{out.stderr}", pytrace=False)
        return out

    def json(self, *args, env: dict[str, str] | None = None):
        out = self(*args, "--output", "json", env=env)
        return json.loads(out.stdout) if out.stdout.strip() else {}


@pytest.fixture(scope="session")
def aws(aws_env: dict[str, str], endpoint: str) -> AwsCli:
    return AwsCli(aws_env, endpoint)
