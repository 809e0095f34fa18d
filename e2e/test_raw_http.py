"""Raw HTTP against the gateway: what the Python SDKs never send over http, and connection rules.

Request bodies other clients send, signed by hand:

Java SDK v1 and Hadoop s3a send STREAMING-AWS4-HMAC-SHA256-PAYLOAD (every chunk signed); Java
and Go SDK v2 send the -TRAILER variant with a signed checksum trailer; curl-style tools send
UNSIGNED-PAYLOAD. The signer here follows the SigV4 spec directly (not botocore) so it checks the
gateway against the spec rather than against one SDK's reading of it.
"""


from __future__ import annotations

import base64
import datetime as dt
import hashlib
import hmac
import http.client
import socket
import time
import zlib
from urllib.parse import quote, urlparse

import pytest
from s3check import KIB, MIB, data, etag, s3_error, sha

REGION = "us-east-1"
EMPTY_SHA256 = hashlib.sha256(b"").hexdigest()


def _hmac(key: bytes, msg: str) -> bytes:
    return hmac.new(key, msg.encode(), hashlib.sha256).digest()


class Signer:
    def __init__(self, access_key: str, secret_key: str, now: dt.datetime | None = None):
        now = now or dt.datetime.now(dt.timezone.utc)
        self.access_key = access_key
        self.amz_date = now.strftime("%Y%m%dT%H%M%SZ")
        self.scope = f"{now:%Y%m%d}/{REGION}/s3/aws4_request"
        key = _hmac(f"AWS4{secret_key}".encode(), f"{now:%Y%m%d}")
        for part in (REGION, "s3", "aws4_request"):
            key = _hmac(key, part)
        self.key = key

    def _sign(self, string_to_sign: str) -> str:
        return hmac.new(self.key, string_to_sign.encode(), hashlib.sha256).hexdigest()

    def authorization(self, method: str, path: str, headers: dict[str, str]) -> tuple[str, str]:
        """(Authorization header, seed signature) for a request with no query string."""
        headers["x-amz-date"] = self.amz_date
        names = sorted(h.lower() for h in headers)
        lower = {k.lower(): v.strip() for k, v in headers.items()}
        canonical = "\n".join([
            method, quote(path, safe="/~"), "",
            "".join(f"{n}:{lower[n]}\n" for n in names), ";".join(names), lower["x-amz-content-sha256"],
        ])
        signature = self._sign("\n".join([
            "AWS4-HMAC-SHA256", self.amz_date, self.scope, hashlib.sha256(canonical.encode()).hexdigest(),
        ]))
        auth = (f"AWS4-HMAC-SHA256 Credential={self.access_key}/{self.scope}, "
                f"SignedHeaders={';'.join(names)}, Signature={signature}")
        return auth, signature

    def chunk_signature(self, previous: str, chunk: bytes) -> str:
        return self._sign("\n".join([
            "AWS4-HMAC-SHA256-PAYLOAD", self.amz_date, self.scope, previous, EMPTY_SHA256,
            hashlib.sha256(chunk).hexdigest(),
        ]))

    def trailer_signature(self, previous: str, trailer: bytes) -> str:
        """`trailer` is sent as CRLF-terminated lines and signed as LF-terminated ones."""
        canonical = trailer.replace(b"\r\n", b"\n")
        return self._sign("\n".join([
            "AWS4-HMAC-SHA256-TRAILER", self.amz_date, self.scope, previous, hashlib.sha256(canonical).hexdigest(),
        ]))


def _crc32_b64(body: bytes) -> str:
    return base64.b64encode(zlib.crc32(body).to_bytes(4, "big")).decode()


def _signed_chunks(signer: Signer, seed: str, body: bytes, chunk_size: int, trailer: bytes | None,
                   tamper_chunk: int | None = None) -> bytes:
    out, previous = [], seed
    chunks = [body[i:i + chunk_size] for i in range(0, len(body), chunk_size)] + [b""]
    for index, chunk in enumerate(chunks):
        previous = signer.chunk_signature(previous, chunk)
        sent = chunk
        if index == tamper_chunk:
            sent = bytes([chunk[0] ^ 1]) + chunk[1:]
        out.append(b"%x;chunk-signature=%s\r\n%s" % (len(chunk), previous.encode(), sent))
        if chunk or trailer is None:
            out.append(b"\r\n")
    if trailer is not None:
        out.append(trailer)
        out.append(b"x-amz-trailer-signature:%s\r\n\r\n" % signer.trailer_signature(previous, trailer).encode())
    return b"".join(out)


def _send(endpoint: str, method: str, path: str, headers: dict[str, str], body: bytes) -> tuple[int, bytes]:
    url = urlparse(endpoint)
    conn = http.client.HTTPConnection(url.hostname, url.port, timeout=60)
    try:
        conn.request(method, quote(path, safe="/~"), body=body, headers=headers)
        resp = conn.getresponse()
        return resp.status, resp.read()
    finally:
        conn.close()


def _put_streaming(cluster, bucket, key, body, *, chunk_size=64 * KIB, with_trailer=False, tamper_chunk=None,
                   secret_key=None, send_trailer=True):
    """`send_trailer=False`: announces the checksum trailer, then sends an empty trailer section."""
    signer = Signer(cluster.access_key, secret_key or cluster.secret_key)
    path = f"/{bucket}/{key}"
    trailer = f"x-amz-checksum-crc32:{_crc32_b64(body)}\r\n".encode() if with_trailer else None
    if trailer is not None and not send_trailer:
        trailer = b""
    headers = {
        "host": urlparse(cluster.endpoint).netloc,
        "content-encoding": "aws-chunked",
        "x-amz-decoded-content-length": str(len(body)),
        "x-amz-content-sha256": "STREAMING-AWS4-HMAC-SHA256-PAYLOAD" + ("-TRAILER" if with_trailer else ""),
    }
    if with_trailer:
        headers["x-amz-trailer"] = "x-amz-checksum-crc32"
    auth, seed = signer.authorization("PUT", path, headers)
    encoded = _signed_chunks(signer, seed, body, chunk_size, trailer, tamper_chunk)
    headers.update({"authorization": auth, "content-length": str(len(encoded))})
    return _send(cluster.endpoint, "PUT", path, headers, encoded)


def _code(body: bytes) -> str:
    text = body.decode("utf-8", "replace")
    start = text.find("<Code>")
    return text[start + 6:text.find("</Code>")] if start >= 0 else text[:200]


def test_signed_chunked_upload_stores_the_decoded_body(cluster, s3, bucket):
    body = data(200 * KIB + 5, seed=50)
    status, resp = _put_streaming(cluster, bucket, "chunked", body)
    assert status == 200, resp
    got = s3.get_object(Bucket=bucket, Key="chunked")
    assert (got["ETag"], sha(got["Body"].read())) == (etag(body), sha(body))
    assert "ContentEncoding" not in got


def test_signed_chunked_upload_with_signed_checksum_trailer(cluster, s3, bucket):
    body = data(150 * KIB, seed=51)
    status, resp = _put_streaming(cluster, bucket, "chunked-trailer", body, with_trailer=True)
    assert status == 200, resp
    got = s3.get_object(Bucket=bucket, Key="chunked-trailer")
    assert sha(got["Body"].read()) == sha(body)
    assert "ContentEncoding" not in got


def test_a_checksum_trailer_announced_but_not_sent_is_refused_and_nothing_stored(cluster, s3, bucket):
    body = data(100 * KIB, seed=54)
    status, resp = _put_streaming(cluster, bucket, "no-trailer", body, with_trailer=True, send_trailer=False)
    assert (status, _code(resp)) == (400, "InvalidRequest"), resp
    with s3_error("404"):
        s3.head_object(Bucket=bucket, Key="no-trailer")


def test_signed_chunked_upload_with_a_changed_chunk_is_refused(cluster, s3, bucket):
    body = data(200 * KIB, seed=52)
    status, resp = _put_streaming(cluster, bucket, "tampered", body, tamper_chunk=1)
    assert (status, _code(resp)) == (403, "SignatureDoesNotMatch")
    with s3_error("404"):
        s3.head_object(Bucket=bucket, Key="tampered")


def test_unsigned_payload_put_is_accepted(cluster, s3, bucket):
    body = data(70 * KIB, seed=53)
    signer = Signer(cluster.access_key, cluster.secret_key)
    path = f"/{bucket}/unsigned"
    headers = {"host": urlparse(cluster.endpoint).netloc, "x-amz-content-sha256": "UNSIGNED-PAYLOAD"}
    auth, _ = signer.authorization("PUT", path, headers)
    headers.update({"authorization": auth, "content-length": str(len(body))})
    status, resp = _send(cluster.endpoint, "PUT", path, headers, body)
    assert status == 200, resp
    assert sha(s3.get_object(Bucket=bucket, Key="unsigned")["Body"].read()) == sha(body)


def test_payload_not_matching_its_signed_sha256_is_refused(cluster, s3, bucket):
    body = b"the body that is sent"
    signer = Signer(cluster.access_key, cluster.secret_key)
    path = f"/{bucket}/mismatch"
    headers = {
        "host": urlparse(cluster.endpoint).netloc,
        "x-amz-content-sha256": hashlib.sha256(b"the body that was signed").hexdigest(),
    }
    auth, _ = signer.authorization("PUT", path, headers)
    headers.update({"authorization": auth, "content-length": str(len(body))})
    status, resp = _send(cluster.endpoint, "PUT", path, headers, body)
    assert (status, _code(resp)) == (400, "XAmzContentSHA256Mismatch")
    with s3_error("404"):
        s3.head_object(Bucket=bucket, Key="mismatch")


def _send_full(url: str, method: str = "GET", headers: dict[str, str] | None = None,
               body: bytes = b"") -> tuple[int, dict[str, str], bytes]:
    """Status, lower-cased headers and body of one request to an absolute URL."""
    parsed = urlparse(url)
    conn = http.client.HTTPConnection(parsed.hostname, parsed.port, timeout=60)
    try:
        target = parsed.path + (f"?{parsed.query}" if parsed.query else "")
        conn.request(method, target, body=body, headers=headers or {})
        resp = conn.getresponse()
        return resp.status, {k.lower(): v for k, v in resp.getheaders()}, resp.read()
    finally:
        conn.close()


def _request_id(body: bytes) -> str:
    text = body.decode("utf-8", "replace")
    start = text.find("<RequestId>")
    return text[start + 11:text.find("</RequestId>")] if start >= 0 else ""


@pytest.mark.parametrize("expires, code", [
    (604800, None),  # a week: the longest S3 allows
    (604801, "AuthorizationQueryParametersError"),
    (-1, "AuthorizationQueryParametersError"),
])
def test_presigned_url_validity_is_bounded_as_s3_bounds_it(s3, bucket, expires, code):
    """X-Amz-Expires must be 0..604800 (checked before the signature, as S3): a URL presigned
    for longer would otherwise work for as long as it says."""
    s3.put_object(Bucket=bucket, Key="presigned", Body=b"bounded")
    # botocore (with awscrt) presigns only positive validities: a negative one is written in.
    url = s3.generate_presigned_url("get_object", Params={"Bucket": bucket, "Key": "presigned"},
                                    ExpiresIn=max(expires, 60))
    url = url.replace(f"X-Amz-Expires={max(expires, 60)}", f"X-Amz-Expires={expires}")
    assert f"X-Amz-Expires={expires}" in url, url
    status, headers, body = _send_full(url)
    if code is None:
        assert (status, body) == (200, b"bounded")
    else:
        assert (status, _code(body)) == (400, code), body
        assert _request_id(body) == headers["x-amz-request-id"], body


def _put_signed_ago(endpoint: str, access_key: str, secret_key: str, path: str, body: bytes,
                    age: dt.timedelta) -> tuple[int, dict[str, str], bytes]:
    """A header-signed PUT whose signature (x-amz-date) is `age` old."""
    signer = Signer(access_key, secret_key, dt.datetime.now(dt.timezone.utc) - age)
    headers = {"host": urlparse(endpoint).netloc, "x-amz-content-sha256": hashlib.sha256(body).hexdigest()}
    auth, _ = signer.authorization("PUT", path, headers)
    headers.update({"authorization": auth, "content-length": str(len(body))})
    return _send_full(endpoint + path, "PUT", headers, body)


def test_a_put_signed_too_long_ago_is_refused_and_stores_nothing(cluster, s3, bucket):
    """A header-signed request whose x-amz-date is more than 15 minutes old is S3's 403
    RequestTimeTooSkewed (a captured request cannot be replayed later); every error body's
    RequestId is the x-amz-request-id header."""
    status, answer_headers, answer = _put_signed_ago(cluster.endpoint, cluster.access_key, cluster.secret_key,
                                                     f"/{bucket}/stale", b"signed twenty minutes ago",
                                                     dt.timedelta(minutes=20))
    assert (status, _code(answer)) == (403, "RequestTimeTooSkewed"), answer
    assert _request_id(answer) == answer_headers["x-amz-request-id"] != "", answer
    with s3_error("404"):
        s3.head_object(Bucket=bucket, Key="stale")


def _put_chunked(url: str, path: str, headers: dict[str, str], pieces: list[bytes]) -> tuple[int, bytes]:
    """A PUT with `Transfer-Encoding: chunked` and no Content-Length (http.client frames it)."""
    parsed = urlparse(url)
    conn = http.client.HTTPConnection(parsed.hostname, parsed.port, timeout=60)
    try:
        conn.request("PUT", path, body=iter(pieces), headers=headers, encode_chunked=True)
        resp = conn.getresponse()
        return resp.status, resp.read()
    finally:
        conn.close()


def test_put_without_content_length_is_stored_whole(cluster, s3, bucket):
    """Transfer-Encoding: chunked and no Content-Length (streaming clients, `curl -T -`): AWS
    answers 411, Tessera stores the body whole (as Ceph RGW), header-signed with an unsigned
    payload, presigned, and as a multipart part; Content-Encoding is kept as sent."""
    pieces = [data(300 * KIB, seed=60), data(5 * MIB, seed=61), b"tail"]
    body = b"".join(pieces)
    signer = Signer(cluster.access_key, cluster.secret_key)
    path = f"/{bucket}/streamed"
    headers = {"host": urlparse(cluster.endpoint).netloc, "x-amz-content-sha256": "UNSIGNED-PAYLOAD",
               "content-encoding": "gzip", "transfer-encoding": "chunked"}
    auth, _ = signer.authorization("PUT", path, headers)
    headers["authorization"] = auth
    assert _put_chunked(cluster.endpoint, path, headers, pieces)[0] == 200
    got = s3.get_object(Bucket=bucket, Key="streamed")
    assert (got["ContentLength"], got["ContentEncoding"]) == (len(body), "gzip")
    assert sha(got["Body"].read()) == sha(body)

    url = s3.generate_presigned_url("put_object", Params={"Bucket": bucket, "Key": "presigned"}, ExpiresIn=300)
    parsed = urlparse(url)
    status, answer = _put_chunked(url, f"{parsed.path}?{parsed.query}", {}, pieces)
    assert status == 200, answer
    assert sha(s3.get_object(Bucket=bucket, Key="presigned")["Body"].read()) == sha(body)

    upload_id = s3.create_multipart_upload(Bucket=bucket, Key="parts")["UploadId"]
    url = s3.generate_presigned_url("upload_part", ExpiresIn=300, Params={
        "Bucket": bucket, "Key": "parts", "UploadId": upload_id, "PartNumber": 1})
    parsed = urlparse(url)
    assert _put_chunked(url, f"{parsed.path}?{parsed.query}", {}, pieces)[0] == 200
    part = s3.list_parts(Bucket=bucket, Key="parts", UploadId=upload_id)["Parts"][0]
    assert (part["Size"], part["ETag"]) == (len(body), etag(body))
    s3.abort_multipart_upload(Bucket=bucket, Key="parts", UploadId=upload_id)


def test_a_chunked_put_that_ends_early_stores_nothing(cluster, s3, bucket):
    """The connection closes in the middle of a chunk: the PUT fails and nothing is stored
    (the gateway had started reading: its first chunk arrived)."""
    url = s3.generate_presigned_url("put_object", Params={"Bucket": bucket, "Key": "cut"}, ExpiresIn=300)
    parsed = urlparse(url)
    with socket.create_connection((parsed.hostname, parsed.port), timeout=30) as sock:
        sock.sendall((f"PUT {parsed.path}?{parsed.query} HTTP/1.1\r\nHost: {parsed.netloc}\r\n"
                      "Transfer-Encoding: chunked\r\n\r\n").encode())
        first = data(64 * KIB, seed=62)
        sock.sendall(b"%x\r\n%s\r\n" % (len(first), first))
        sock.sendall(b"%x\r\n" % (64 * KIB) + first[:1000])  # a chunk cut short, then gone
        sock.shutdown(socket.SHUT_WR)
        sock.settimeout(30)
        answer = sock.recv(65536)  # the gateway's error, or nothing (it may just close)
    assert not answer.startswith(b"HTTP/1.1 200"), answer
    with s3_error("404"):
        s3.head_object(Bucket=bucket, Key="cut")


def _read_response(sock: socket.socket, deadline: float) -> tuple[int, dict[str, str], bytes]:
    """One HTTP/1.1 response with a Content-Length body (what the gateway sends for errors)."""
    buf = b""
    while b"\r\n\r\n" not in buf:
        sock.settimeout(max(0.01, deadline - time.monotonic()))
        chunk = sock.recv(65536)
        assert chunk, f"connection closed before a full response: {buf!r}"
        buf += chunk
    head, body = buf.split(b"\r\n\r\n", 1)
    lines = head.decode("latin-1").split("\r\n")
    headers = {k.strip().lower(): v.strip() for k, v in (line.split(":", 1) for line in lines[1:])}
    while len(body) < int(headers.get("content-length", "0")):
        sock.settimeout(max(0.01, deadline - time.monotonic()))
        chunk = sock.recv(65536)
        assert chunk, "connection closed inside a response body"
        body += chunk
    return int(lines[0].split()[1]), headers, body


def test_early_error_to_expect_continue_put_closes_with_connection_close_or_keeps_serving(cluster, s3, bucket):
    """A PUT refused before its body was sent (Expect: 100-continue, If-None-Match: * on an
    existing key) leaves unread body bytes. The gateway may close the connection, but then its
    response must say `Connection: close`: botocore and urllib3 return connections without it to
    the pool and read the stale response for the next request (boto/botocore#1863)."""
    s3.put_object(Bucket=bucket, Key="exists", Body=b"x")
    netloc = urlparse(cluster.endpoint).netloc
    signer = Signer(cluster.access_key, cluster.secret_key)
    headers = {"host": netloc, "x-amz-content-sha256": "UNSIGNED-PAYLOAD", "if-none-match": "*"}
    auth, _ = signer.authorization("PUT", f"/{bucket}/exists", headers)
    headers.update({"authorization": auth, "content-length": "5", "expect": "100-continue"})
    request = f"PUT /{bucket}/exists HTTP/1.1\r\n" + "".join(f"{k}: {v}\r\n" for k, v in headers.items()) + "\r\n"

    deadline = time.monotonic() + 10
    with socket.create_connection(("127.0.0.1", int(netloc.rsplit(":", 1)[1])), timeout=10) as sock:
        sock.sendall(request.encode())
        status, got_headers, body = _read_response(sock, deadline)
        assert (status, _code(body)) == (412, "PreconditionFailed")
        if got_headers.get("connection", "").lower() == "close":
            return
        # Kept alive: the connection must serve the next request (the 5 body bytes never come).
        get_headers = {"host": netloc, "x-amz-content-sha256": EMPTY_SHA256}
        auth, _ = Signer(cluster.access_key, cluster.secret_key).authorization("GET", f"/{bucket}/exists", get_headers)
        get_headers["authorization"] = auth
        sock.sendall((f"GET /{bucket}/exists HTTP/1.1\r\n"
                      + "".join(f"{k}: {v}\r\n" for k, v in get_headers.items()) + "\r\n").encode())
        try:
            status, _, body = _read_response(sock, deadline)
        except AssertionError as e:
            raise AssertionError(f"the gateway closed the connection after an early 412 without Connection: close ({e})")
        assert (status, body) == (200, b"x")
