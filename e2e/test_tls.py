"""`tessera up --tls`: a cluster whose gateway serves HTTPS with a certificate from a local CA,
used by boto3 and aws-cli trusting that CA (and refused by them without it). The CA lives in
the data directory and survives a restart, so clients keep trusting it. The same `up` also
serves every process's metrics (`--metrics-listen`), and runs the node protocol over TLS too
(`--node-tls on`): every byte from client to drive is encrypted."""

from __future__ import annotations

import http.client
import io
import os
import queue
import signal
import ssl
import stat
import subprocess
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import boto3
import pytest
from boto3.s3.transfer import TransferConfig
from botocore.config import Config
from botocore.exceptions import SSLError

from conftest import NODES, REGION, TESSERA, _aws_cli_path, _die_with_parent, _free_port_range
from s3check import MIB, data

UP_READY_TIMEOUT_S = 60.0
UP_STOP_TIMEOUT_S = 20.0
ACCESS_KEY = "E2ETLSACCESSKEY00001"
SECRET_KEY = "e2e-tls-secret-key-0123456789abcdefghijk"


class Up:
    """One `tessera up --tls` process; its stdout (the banner) is kept."""

    def __init__(self, data_dir: Path, base_port: int, s3_port: int, metrics_port: int):
        self.data_dir, self.base_port, self.s3_port = data_dir, base_port, s3_port
        self.metrics_port = metrics_port
        # The console on the port after the nodes' metrics ports.
        self.console_port = metrics_port + NODES + 1
        self.proc: subprocess.Popen | None = None
        self.banner: list[str] = []

    @property
    def endpoint(self) -> str:
        return f"https://127.0.0.1:{self.s3_port}"

    @property
    def ca(self) -> Path:
        return self.data_dir / "tls" / "ca.pem"

    def start(self) -> None:
        env = {**os.environ, "TESSERA_ACCESS_KEY": ACCESS_KEY, "TESSERA_SECRET_KEY": SECRET_KEY, "NO_COLOR": "1"}
        log = open(self.data_dir.parent / f"up-{self.s3_port}.log", "ab")
        self.proc = subprocess.Popen(
            [str(TESSERA), "up", "--tls", "--node-tls", "on", "--data", str(self.data_dir),
             "--base-port", str(self.base_port),
             "--s3", f"127.0.0.1:{self.s3_port}", "--metrics-listen", f"127.0.0.1:{self.metrics_port}",
             "--console", f"127.0.0.1:{self.console_port}"],
            stdout=subprocess.PIPE, stderr=log, stdin=subprocess.DEVNULL, env=env, text=True,
            preexec_fn=_die_with_parent)
        self.banner = []
        # `up` prints its banner once every node and the gateway accept connections. A thread
        # reads it, so a silent hang fails at the deadline instead of blocking the suite.
        lines: queue.Queue[str | None] = queue.Queue()

        def read(stdout) -> None:
            for line in stdout:
                lines.put(line)
            lines.put(None)

        threading.Thread(target=read, args=(self.proc.stdout,), daemon=True).start()
        deadline = time.monotonic() + UP_READY_TIMEOUT_S
        while True:
            try:
                line = lines.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                raise AssertionError(f"tessera up not ready in {UP_READY_TIMEOUT_S}s: {self.banner}") from None
            if line is None:
                raise AssertionError(f"tessera up exited ({self.proc.wait()}): {self.banner}")
            self.banner.append(line.rstrip("\n"))
            if line.startswith("Press Ctrl-C"):
                return

    def stop(self) -> None:
        if self.proc is None:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=UP_STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.proc = None


@pytest.fixture(scope="module")
def up(tmp_path_factory: pytest.TempPathFactory):
    root = tmp_path_factory.mktemp("tls-up")
    # Nodes, the gateway, the gateway's metrics port and one per node (`--metrics-listen`), the
    # console.
    base_port = _free_port_range(2 * NODES + 3)
    cluster = Up(root / "data", base_port, base_port + NODES, base_port + NODES + 1)
    cluster.start()
    try:
        yield cluster
    finally:
        cluster.stop()


def client(up: Up, verify):
    return boto3.client("s3", endpoint_url=up.endpoint, aws_access_key_id=ACCESS_KEY,
                        aws_secret_access_key=SECRET_KEY, region_name=REGION, verify=verify,
                        config=Config(retries={"max_attempts": 1}, s3={"addressing_style": "path"}))


def aws_env(up: Up, tmp_path: Path, ca: Path | None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    (tmp_path / "aws-config").write_text("")
    env.update({"AWS_ACCESS_KEY_ID": ACCESS_KEY, "AWS_SECRET_ACCESS_KEY": SECRET_KEY,
                "AWS_DEFAULT_REGION": REGION, "AWS_EC2_METADATA_DISABLED": "true",
                "AWS_CONFIG_FILE": str(tmp_path / "aws-config"),
                "AWS_SHARED_CREDENTIALS_FILE": str(tmp_path / "aws-config"), "AWS_PAGER": ""})
    if ca is not None:
        env["AWS_CA_BUNDLE"] = str(ca)
    return env


def test_up_prints_the_https_endpoint_and_the_ca_and_keeps_keys_private(up):
    banner = "\n".join(up.banner)
    assert f"S3 endpoint: {up.endpoint}" in banner, banner
    assert f"CA certificate: {up.ca.resolve()}" in banner, banner
    assert f"export AWS_CA_BUNDLE={up.ca.resolve()}" in banner, banner
    assert f"aws --endpoint-url {up.endpoint} " in banner, banner
    tls_dir = up.data_dir / "tls"
    assert stat.S_IMODE(tls_dir.stat().st_mode) == 0o700
    for key in ("ca-key.pem", "gateway-key.pem"):
        assert stat.S_IMODE((tls_dir / key).stat().st_mode) == 0o600, key
    # The CA's key never leaves the directory: the banner names only the certificate.
    assert "ca-key.pem" not in banner


def test_up_serves_the_metrics_of_the_gateway_and_of_every_node(up):
    banner = "\n".join(up.banner)
    gateway = f"http://127.0.0.1:{up.metrics_port}/metrics"
    assert f"metrics: {gateway}" in banner, banner
    with urllib.request.urlopen(gateway, timeout=10) as answer:
        text = answer.read().decode()
    assert "# TYPE tessera_s3_" in text, text[:2000]
    for i in range(NODES):
        url = f"http://127.0.0.1:{up.metrics_port + 1 + i}/metrics"
        assert f"(metrics {url})" in banner, banner
        with urllib.request.urlopen(url, timeout=10) as answer:
            text = answer.read().decode()
        assert "tessera_node_drive_capacity_bytes" in text, text[:2000]


def test_up_serves_the_web_console_over_https_with_the_printed_credentials(up):
    banner = "\n".join(up.banner)
    origin = f"https://127.0.0.1:{up.console_port}"
    assert f"Web console: {origin}/" in banner, banner
    # With the gateway's certificate: trusted through the CA, the session cookie `Secure`.
    context = ssl.create_default_context(cafile=str(up.ca))
    conn = http.client.HTTPSConnection("127.0.0.1", up.console_port, timeout=10, context=context)
    body = f"access_key={ACCESS_KEY}&secret_key={SECRET_KEY}"
    conn.request("POST", "/login", body=body, headers={
        "Content-Type": "application/x-www-form-urlencoded", "Origin": origin})
    answer = conn.getresponse()
    answer.read()
    assert answer.status == 303 and answer.getheader("location") == "/buckets"
    cookie = answer.getheader("set-cookie")
    assert "HttpOnly" in cookie and "; Secure" in cookie, cookie
    session = cookie.split(";")[0]
    conn.request("GET", "/cluster", headers={"Cookie": session})
    answer = conn.getresponse()
    page = answer.read()
    assert answer.status == 200 and b"6 of 6 nodes up" in page and b"node protocol over TLS" in page, page
    conn.close()

    # Without the CA the certificate is refused; plain HTTP gets no console page.
    refused = http.client.HTTPSConnection("127.0.0.1", up.console_port, timeout=10,
                                          context=ssl.create_default_context())
    with pytest.raises(ssl.SSLCertVerificationError):
        refused.request("GET", "/login")
    refused.close()
    plain = http.client.HTTPConnection("127.0.0.1", up.console_port, timeout=10)
    with pytest.raises((http.client.HTTPException, OSError)):
        plain.request("GET", "/login")
        plain.getresponse().read()
    plain.close()


def test_boto3_trusting_the_ca_round_trips_objects_over_https(up):
    s3 = client(up, str(up.ca))
    s3.create_bucket(Bucket="tls-boto3")
    small = data(100_000, seed=901)
    s3.put_object(Bucket="tls-boto3", Key="small", Body=small)
    assert s3.get_object(Bucket="tls-boto3", Key="small")["Body"].read() == small
    # A multipart upload and ranged reads, all over TLS.
    big = data(12 * MIB + 3, seed=902)
    config = TransferConfig(multipart_threshold=5 * MIB, multipart_chunksize=5 * MIB)
    s3.upload_fileobj(io.BytesIO(big), "tls-boto3", "big", Config=config)
    out = io.BytesIO()
    s3.download_fileobj("tls-boto3", "big", out, Config=config)
    assert out.getvalue() == big
    keys = [o["Key"] for o in s3.list_objects_v2(Bucket="tls-boto3")["Contents"]]
    assert keys == ["big", "small"]


def test_boto3_without_the_ca_refuses_the_gateway(up):
    # The system's CAs do not include the local CA: verification fails before any request.
    with pytest.raises(SSLError, match="CERTIFICATE_VERIFY_FAILED"):
        client(up, True).list_buckets()


def test_plain_http_to_the_https_port_gets_no_s3_answer(up):
    # The gateway answers a TLS alert (not HTTP) and closes: no status line comes back.
    with pytest.raises((urllib.error.URLError, http.client.HTTPException, OSError)) as info:
        urllib.request.urlopen(f"http://127.0.0.1:{up.s3_port}/", timeout=10)
    assert not isinstance(info.value, urllib.error.HTTPError), "an HTTP answer came back over plain HTTP"


def test_aws_cli_with_aws_ca_bundle_copies_both_ways_and_without_it_fails(up, tmp_path):
    aws = _aws_cli_path()
    src = tmp_path / "up.bin"
    body = data(7 * MIB + 11, seed=903)
    src.write_bytes(body)
    trusted = aws_env(up, tmp_path, up.ca)
    run = lambda *args, env: subprocess.run([aws, "--endpoint-url", up.endpoint, *args], env=env,  # noqa: E731
                                            capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)
    out = run("s3", "mb", "s3://tls-awscli", env=trusted)
    assert out.returncode == 0, out.stderr
    out = run("s3", "cp", str(src), "s3://tls-awscli/f.bin", env=trusted)
    assert out.returncode == 0, out.stderr
    dst = tmp_path / "down.bin"
    out = run("s3", "cp", "s3://tls-awscli/f.bin", str(dst), env=trusted)
    assert out.returncode == 0, out.stderr
    assert dst.read_bytes() == body
    out = run("s3", "ls", "s3://tls-awscli/", env=aws_env(up, tmp_path, None))
    assert out.returncode != 0
    assert "CERTIFICATE_VERIFY_FAILED" in out.stderr, out.stderr


def test_a_restart_keeps_the_ca_so_clients_keep_trusting_the_gateway(up):
    """Runs last in this module: it restarts the cluster."""
    s3 = client(up, str(up.ca))
    s3.create_bucket(Bucket="tls-restart")
    s3.put_object(Bucket="tls-restart", Key="k", Body=b"kept")
    ca_before = up.ca.read_bytes()
    gateway_before = (up.data_dir / "tls" / "gateway.pem").read_bytes()
    up.stop()
    up.start()
    assert up.ca.read_bytes() == ca_before, "the CA was replaced: clients would stop trusting the gateway"
    assert (up.data_dir / "tls" / "gateway.pem").read_bytes() != gateway_before, "a fresh gateway certificate"
    # The new certificate chains to the same CA, for Python's own TLS stack too.
    context = ssl.create_default_context(cafile=str(up.ca))
    with pytest.raises(urllib.error.HTTPError) as info:
        urllib.request.urlopen(f"{up.endpoint}/", context=context, timeout=10)
    assert info.value.code == 403, "the handshake succeeded and the anonymous request was refused"
    assert client(up, str(up.ca)).get_object(Bucket="tls-restart", Key="k")["Body"].read() == b"kept"


def test_up_with_node_tls_runs_the_node_protocol_over_tls(up):
    config = up.data_dir / "cluster.toml"
    assert "[node_tls]" in config.read_text()
    status = subprocess.run([str(TESSERA), "status", "--config", str(config)], capture_output=True, text=True,
                            timeout=60)
    assert status.returncode == 0, status.stderr
    assert "6 of 6 nodes up; node protocol over TLS" in status.stdout, status.stdout
