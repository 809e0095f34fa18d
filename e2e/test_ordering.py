"""Of two overlapping PUTs of one key through the gateway, the one acknowledged last wins.

Issue 37, item 9, as it was reported: PUT B of a large body starts; while its body is still on
the wire a whole PUT A of the same key runs and is acknowledged; then B is acknowledged. On
2862b84 every later GET returned A (the version was taken when B began). S3 returns B, and
Ceph's s3-tests `test_atomic_dual_write_*` check it.

The overlap is real, not a race the test hopes for: the gateway streams a PUT's body into the
smart client (`s3::object::put_object`), which takes its version once it has the first stripe
(4 MiB here: 4 + 2, 1 MiB chunks) and writes each stripe's chunks into staging files on the
drives. B's body is sent by hand over a socket (a presigned URL: the body is not hashed before
it is sent, as boto3 would) up to past its second stripe, and A starts only once B's staging
files are on the drives.
"""

from __future__ import annotations

import socket
import time
from pathlib import Path
from urllib.parse import urlparse

from s3check import MIB, data, etag

B_SIZE = 16 * MIB
# Past the second stripe: the writer has sent its first stripe and waits for the third.
B_GATE = 9 * MIB
WAIT_S = 30


def _staging_files(cluster) -> set[Path]:
    return set((cluster.dir / "data").glob("n*/d*/tmp/*"))


def _read_status(sock: socket.socket) -> tuple[int, bytes]:
    """The status code and the rest of a response whose headers fit what it sends (small)."""
    sock.settimeout(60)
    answer = b""
    while b"\r\n\r\n" not in answer:
        piece = sock.recv(65536)
        if not piece:
            break
        answer += piece
    return int(answer.split(b" ", 2)[1]), answer


def test_overlapping_puts_over_raw_http_the_one_acknowledged_last_wins(cluster, s3, bucket):
    key = "dual-write"
    body_a, body_b = data(MIB, seed=71), data(B_SIZE, seed=72)
    url = urlparse(s3.generate_presigned_url("put_object", Params={"Bucket": bucket, "Key": key}, ExpiresIn=300))
    before = _staging_files(cluster)
    with socket.create_connection((url.hostname, url.port), timeout=60) as sock:
        sock.sendall((f"PUT {url.path}?{url.query} HTTP/1.1\r\nHost: {url.netloc}\r\n"
                      f"Content-Length: {B_SIZE}\r\n\r\n").encode())
        sock.sendall(body_b[:B_GATE])
        # B has taken its version and is writing: its first stripe's staging files are there.
        deadline = time.monotonic() + WAIT_S
        while not _staging_files(cluster) - before:
            assert time.monotonic() < deadline, f"PUT B wrote no staging file in {WAIT_S} s"
            time.sleep(0.05)

        s3.put_object(Bucket=bucket, Key=key, Body=body_a)  # A, whole, while B is on the wire

        sock.sendall(body_b[B_GATE:])
        status, answer = _read_status(sock)
    assert status == 200, f"PUT B must be acknowledged after A: {answer[:500]!r}"
    for attempt in range(3):
        got = s3.get_object(Bucket=bucket, Key=key)["Body"].read()
        which = "B's" if got == body_b else "A's" if got == body_a else f"{len(got)} unknown"
        assert got == body_b, f"the PUT acknowledged last (B) must win: GET #{attempt + 1} read {which} bytes"
    head = s3.head_object(Bucket=bucket, Key=key)
    assert head["ContentLength"] == B_SIZE, head
    assert head["ETag"] == etag(body_b), "the ETag is B's"
