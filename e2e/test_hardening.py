"""Gateway hardening: SigV4 only by default, a request id on every answer, errors that name no
node, address or path, S3's ACL rules for "BucketOwnerEnforced" buckets, and `If-None-Match: *`
checked atomically at commit.

Raw requests are signed here (SigV2 by hand, following AWS's RESTAuthentication spec; SigV4 with
botocore's signer) and sent with http.client, so the tests see the exact status, headers and body.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import hmac
import http.client
import os
import re
import socket
import subprocess
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from email.utils import formatdate
from pathlib import Path
from urllib.parse import quote, urlencode, urlparse

import boto3
import pytest
from botocore.auth import S3SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.config import Config
from botocore.credentials import Credentials
from botocore.exceptions import ClientError

from s3check import KIB, MIB, data, etag, s3_error, sha

TESSERA = Path(__file__).resolve().parent.parent / "target" / "release" / "tessera"

REGION = "us-east-1"
REQUEST_ID = re.compile(r"[0-9A-F]{16}")
NODE_ID = re.compile(r"\bn[1-6]\b")
GATEWAY_READY_TIMEOUT_S = 20.0
LOG_WAIT_S = 10.0
RACE_WRITERS = 8
RACE_ROUNDS = 4
RACE_TIMEOUT_S = 120.0


# --- raw HTTP ---------------------------------------------------------------------------------


def _send(endpoint: str, method: str, target: str, headers: dict[str, str], body: bytes = b""):
    """(status, lower-cased headers, body) of one request; `target` is the path and query as sent."""
    url = urlparse(endpoint)
    conn = http.client.HTTPConnection(url.hostname, url.port, timeout=60)
    try:
        conn.request(method, target, body=body, headers=headers)
        resp = conn.getresponse()
        return resp.status, {k.lower(): v for k, v in resp.getheaders()}, resp.read()
    finally:
        conn.close()


def _sigv4(cluster, method: str, path: str, body: bytes = b"", *, endpoint: str | None = None,
           secret_key: str | None = None, unsigned_headers: dict[str, str] | None = None):
    """A SigV4-signed request (botocore's S3 signer, signed payload) to `path` (not yet quoted)."""
    endpoint = endpoint or cluster.endpoint
    request = AWSRequest(method=method, url=endpoint + quote(path, safe="/~"), data=body)
    S3SigV4Auth(Credentials(cluster.access_key, secret_key or cluster.secret_key), "s3", REGION).add_auth(request)
    headers = {**dict(request.headers.items()), **(unsigned_headers or {})}
    return _send(endpoint, method, quote(path, safe="/~"), headers, body)


def _sigv2_signature(secret_key: str, string_to_sign: str) -> str:
    return base64.b64encode(hmac.new(secret_key.encode(), string_to_sign.encode(), hashlib.sha1).digest()).decode()


def _sigv2_headers(cluster, method: str, path: str, *, date: str | None = None, content_type: str = "",
                   content_md5: str = "") -> dict[str, str]:
    """Headers of a request signed with Signature Version 2 header auth (`Authorization: AWS key:sig`).
    StringToSign = VERB, Content-MD5, Content-Type, Date, then the resource (no x-amz-* headers)."""
    date = date or formatdate(usegmt=True)
    string_to_sign = f"{method}\n{content_md5}\n{content_type}\n{date}\n{path}"
    headers = {"Date": date, "Authorization": f"AWS {cluster.access_key}:{_sigv2_signature(cluster.secret_key, string_to_sign)}"}
    if content_type:
        headers["Content-Type"] = content_type
    if content_md5:
        headers["Content-MD5"] = content_md5
    return headers


def _sigv2_presigned_target(cluster, method: str, path: str, expires_in_s: int = 300) -> str:
    """Path and query of a SigV2 presigned URL (`AWSAccessKeyId`, `Expires`, `Signature`)."""
    expires = str(int(time.time()) + expires_in_s)
    signature = _sigv2_signature(cluster.secret_key, f"{method}\n\n\n{expires}\n{path}")
    query = urlencode({"AWSAccessKeyId": cluster.access_key, "Expires": expires, "Signature": signature})
    return f"{quote(path, safe='/~')}?{query}"


def _xml_field(body: bytes, name: str) -> str | None:
    match = re.search(rf"<{name}>(.*?)</{name}>", body.decode("utf-8", "replace"), re.S)
    return match.group(1) if match else None


def _assert_error(status: int, headers: dict[str, str], body: bytes, want_status: int, want_code: str) -> str:
    """Checks an S3 error answer and that its body's RequestId is the header's; returns the id."""
    assert (status, _xml_field(body, "Code")) == (want_status, want_code), body
    request_id = headers.get("x-amz-request-id", "")
    assert REQUEST_ID.fullmatch(request_id), f"x-amz-request-id {request_id!r}, body {body!r}"
    assert _xml_field(body, "RequestId") == request_id, body
    return request_id


def _header_request_id(response: dict) -> str:
    request_id = response["ResponseMetadata"]["HTTPHeaders"].get("x-amz-request-id", "")
    assert REQUEST_ID.fullmatch(request_id), f"x-amz-request-id {request_id!r}"
    return request_id


# --- SigV2 ------------------------------------------------------------------------------------


def test_sigv2_header_auth_is_refused_by_default(cluster, s3, bucket):
    s3.put_object(Bucket=bucket, Key="obj", Body=b"stored with sigv4")
    path = f"/{bucket}/obj"

    status, headers, body = _send(cluster.endpoint, "GET", path, _sigv2_headers(cluster, "GET", path))
    _assert_error(status, headers, body, 400, "InvalidRequest")
    assert "AWS4-HMAC-SHA256" in _xml_field(body, "Message"), body
    assert b"stored with sigv4" not in body

    # A write signed with SigV2 stores nothing.
    path = f"/{bucket}/written-with-sigv2"
    put_headers = {**_sigv2_headers(cluster, "PUT", path, content_type="text/plain"), "Content-Length": "5"}
    status, headers, body = _send(cluster.endpoint, "PUT", path, put_headers, b"hello")
    _assert_error(status, headers, body, 400, "InvalidRequest")
    with s3_error("404"):
        s3.head_object(Bucket=bucket, Key="written-with-sigv2")


def test_sigv2_presigned_url_is_refused_by_default(cluster, s3, bucket):
    s3.put_object(Bucket=bucket, Key="obj", Body=b"stored with sigv4")
    target = _sigv2_presigned_target(cluster, "GET", f"/{bucket}/obj")
    status, headers, body = _send(cluster.endpoint, "GET", target, {})
    _assert_error(status, headers, body, 400, "InvalidRequest")
    assert "AWS4-HMAC-SHA256" in _xml_field(body, "Message"), body


def test_sigv2_presigned_url_with_encoded_parameter_names_is_refused_by_default(cluster, s3, bucket):
    # s3s decodes parameter names: `%41WSAccessKeyId` is `AWSAccessKeyId`, and on 2862b84 such a
    # URL, expiring in 2100, returned the object from a gateway without --allow-sigv2.
    s3.put_object(Bucket=bucket, Key="obj", Body=b"stored with sigv4")
    path = f"/{bucket}/obj"
    expires = "4102444800"  # 2100-01-01
    signature = _sigv2_signature(cluster.secret_key, f"GET\n\n\n{expires}\n{path}")
    for query in (
        f"%41WSAccessKeyId={cluster.access_key}&Expires={expires}&Signature={quote(signature, safe='')}",
        f"AWSAccessKeyId={cluster.access_key}&Expires={expires}&%53ignature={quote(signature, safe='')}",
    ):
        status, headers, body = _send(cluster.endpoint, "GET", f"{path}?{query}", {})
        _assert_error(status, headers, body, 400, "InvalidRequest")


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@contextlib.contextmanager
def _extra_gateway(cluster, *flags: str):
    """A second `tessera gateway` on the session cluster, with extra `flags`; stopped on exit.

    Spawned through the Cluster so that it dies with pytest and is stopped with the session even
    if this context's exit is never reached."""
    port = _free_port()
    name = f"gateway-{port}"
    proc = cluster.spawn_extra(
        name,
        ["gateway", "--config", str(cluster.config), "--listen", f"127.0.0.1:{port}", *flags],
        {"TESSERA_ACCESS_KEY": cluster.access_key, "TESSERA_SECRET_KEY": cluster.secret_key},
    )
    try:
        deadline = time.monotonic() + GATEWAY_READY_TIMEOUT_S
        while True:  # ready when it answers HTTP (403 for this unsigned request)
            try:
                _send(f"http://127.0.0.1:{port}", "GET", "/", {})
                break
            except OSError:
                pass
            assert proc.poll() is None, f"{name} exited ({proc.returncode}):\n{cluster.log_path(name).read_text()}"
            assert time.monotonic() < deadline, f"{name} gave no HTTP answer:\n{cluster.log_path(name).read_text()}"
            time.sleep(0.05)
        yield f"http://127.0.0.1:{port}"
    finally:
        cluster.stop_extra(name)


@pytest.fixture
def sigv2_gateway(cluster):
    """Endpoint of a second gateway started with --allow-sigv2 for this test only."""
    with _extra_gateway(cluster, "--allow-sigv2") as endpoint:
        yield endpoint


def test_a_gateway_outside_us_east_1_answers_bucket_conflicts_and_locations_as_s3_does(cluster, s3, bucket):
    # us-east-1 (the default gateway) answers CreateBucket of an owned bucket with 200
    # (test_boto3.py); every other region with 409 BucketAlreadyOwnedByYou.
    s3.put_object(Bucket=bucket, Key="k", Body=b"kept")
    with _extra_gateway(cluster, "--region", "eu-west-1") as endpoint:
        eu = boto3.session.Session().client(
            "s3", endpoint_url=endpoint, aws_access_key_id=cluster.access_key,
            aws_secret_access_key=cluster.secret_key,
            config=Config(region_name="eu-west-1", s3={"addressing_style": "path"}, retries={"max_attempts": 1}),
        )
        with s3_error("BucketAlreadyOwnedByYou", 409):
            eu.create_bucket(Bucket=bucket, CreateBucketConfiguration={"LocationConstraint": "eu-west-1"})
        assert eu.get_bucket_location(Bucket=bucket)["LocationConstraint"] == "eu-west-1"
        listed = {b["Name"]: b for b in eu.list_buckets()["Buckets"]}
        assert listed[bucket]["BucketRegion"] == "eu-west-1"
    assert s3.get_object(Bucket=bucket, Key="k")["Body"].read() == b"kept"


def test_a_gateway_domain_serves_virtual_hosted_requests_under_it(cluster, s3, bucket, monkeypatch):
    # On 2862b84 only `BUCKET.localhost` was virtual-hosted: SDKs that default to that style
    # (JavaScript v3, Go v2) could not use a real host name.
    real_getaddrinfo = socket.getaddrinfo

    def resolve(host, *args, **kwargs):
        if isinstance(host, str) and host.endswith("s3.example.test"):
            host = "127.0.0.1"
        return real_getaddrinfo(host, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", resolve)
    s3.put_object(Bucket=bucket, Key="obj", Body=b"by host name")
    with _extra_gateway(cluster, "--domain", "s3.example.test") as endpoint:
        port = endpoint.rsplit(":", 1)[1]
        virtual = boto3.session.Session().client(
            "s3", endpoint_url=f"http://s3.example.test:{port}", aws_access_key_id=cluster.access_key,
            aws_secret_access_key=cluster.secret_key,
            config=Config(region_name="us-east-1", s3={"addressing_style": "virtual"}, retries={"max_attempts": 1}),
        )
        got = virtual.get_object(Bucket=bucket, Key="obj")
        assert got["Body"].read() == b"by host name"
        virtual.put_object(Bucket=bucket, Key="written", Body=b"virtual")
        assert [o["Key"] for o in virtual.list_objects_v2(Bucket=bucket)["Contents"]] == ["obj", "written"]
        # The bare domain is path-style.
        path = boto3.session.Session().client(
            "s3", endpoint_url=f"http://s3.example.test:{port}", aws_access_key_id=cluster.access_key,
            aws_secret_access_key=cluster.secret_key,
            config=Config(region_name="us-east-1", s3={"addressing_style": "path"}, retries={"max_attempts": 1}),
        )
        assert path.get_object(Bucket=bucket, Key="written")["Body"].read() == b"virtual"


def test_a_bad_gateway_domain_is_a_one_line_error_at_start(cluster):
    out = subprocess.run(
        [str(TESSERA), "gateway", "--config", str(cluster.config), "--domain", "example.com:9000"],
        capture_output=True, text=True, timeout=30, stdin=subprocess.DEVNULL,
        env={**os.environ, "TESSERA_ACCESS_KEY": cluster.access_key, "TESSERA_SECRET_KEY": cluster.secret_key},
    )
    assert out.returncode != 0 and "is not a domain name" in out.stderr, out.stderr


def test_a_bad_region_name_is_a_one_line_error_at_start(cluster):
    out = subprocess.run(
        [str(TESSERA), "gateway", "--config", str(cluster.config), "--region", "US_EAST"],
        capture_output=True, text=True, timeout=30, stdin=subprocess.DEVNULL,
    )
    assert out.returncode != 0 and "not a region name" in out.stderr, out.stderr


def test_allow_sigv2_serves_sigv2_header_auth_with_a_current_date(cluster, s3, bucket, sigv2_gateway):
    s3.put_object(Bucket=bucket, Key="obj", Body=b"stored with sigv4")
    path = f"/{bucket}/obj"
    status, headers, body = _send(sigv2_gateway, "GET", path, _sigv2_headers(cluster, "GET", path))
    assert (status, body) == (200, b"stored with sigv4"), body
    assert REQUEST_ID.fullmatch(headers.get("x-amz-request-id", ""))

    path = f"/{bucket}/written-with-sigv2"
    put_headers = {**_sigv2_headers(cluster, "PUT", path, content_type="text/plain"), "Content-Length": "5"}
    status, _, body = _send(sigv2_gateway, "PUT", path, put_headers, b"hello")
    assert status == 200, body
    assert s3.get_object(Bucket=bucket, Key="written-with-sigv2")["Body"].read() == b"hello"


def test_allow_sigv2_serves_a_sigv2_presigned_url(cluster, s3, bucket, sigv2_gateway):
    s3.put_object(Bucket=bucket, Key="obj", Body=b"stored with sigv4")
    target = _sigv2_presigned_target(cluster, "GET", f"/{bucket}/obj")
    status, _, body = _send(sigv2_gateway, "GET", target, {})
    assert (status, body) == (200, b"stored with sigv4"), body


def test_allow_sigv2_refuses_a_presigned_url_expiring_more_than_7_days_ahead(cluster, s3, bucket, sigv2_gateway):
    s3.put_object(Bucket=bucket, Key="obj", Body=b"stored with sigv4")
    target = _sigv2_presigned_target(cluster, "GET", f"/{bucket}/obj", expires_in_s=8 * 86_400)
    status, headers, body = _send(sigv2_gateway, "GET", target, {})
    _assert_error(status, headers, body, 403, "AccessDenied")
    assert "7 days" in _xml_field(body, "Message"), body
    # Within the bound it still serves.
    target = _sigv2_presigned_target(cluster, "GET", f"/{bucket}/obj", expires_in_s=6 * 86_400)
    status, _, body = _send(sigv2_gateway, "GET", target, {})
    assert (status, body) == (200, b"stored with sigv4"), body


@pytest.mark.parametrize("offset_s", [-20 * 60, 20 * 60], ids=["20min-old", "20min-ahead"])
def test_allow_sigv2_refuses_a_date_outside_15_minutes(cluster, s3, bucket, sigv2_gateway, offset_s):
    """Correctly signed, but dated outside the 15 minutes S3 allows: a captured request cannot be replayed."""
    s3.put_object(Bucket=bucket, Key="obj", Body=b"stored with sigv4")
    path = f"/{bucket}/obj"
    date = formatdate(time.time() + offset_s, usegmt=True)
    status, headers, body = _send(sigv2_gateway, "GET", path, _sigv2_headers(cluster, "GET", path, date=date))
    _assert_error(status, headers, body, 403, "RequestTimeTooSkewed")
    assert b"stored with sigv4" not in body


def test_allow_sigv2_refuses_a_wrong_sigv2_signature(cluster, s3, bucket, sigv2_gateway):
    s3.put_object(Bucket=bucket, Key="obj", Body=b"stored with sigv4")
    path = f"/{bucket}/obj"
    headers = _sigv2_headers(cluster, "GET", path)
    headers["Authorization"] = f"AWS {cluster.access_key}:{_sigv2_signature('not the secret', 'GET')}"
    status, got_headers, body = _send(sigv2_gateway, "GET", path, headers)
    _assert_error(status, got_headers, body, 403, "SignatureDoesNotMatch")


# --- request ids ------------------------------------------------------------------------------


def test_every_response_carries_a_distinct_request_id(s3, bucket):
    ids = [
        _header_request_id(s3.put_object(Bucket=bucket, Key="obj", Body=b"x")),
        _header_request_id(s3.get_object(Bucket=bucket, Key="obj")),
        _header_request_id(s3.head_object(Bucket=bucket, Key="obj")),
        _header_request_id(s3.list_objects_v2(Bucket=bucket)),
        _header_request_id(s3.list_buckets()),
        _header_request_id(s3.delete_object(Bucket=bucket, Key="obj")),
    ]
    with s3_error("404") as info:
        s3.head_object(Bucket=bucket, Key="obj")  # an error with no body still has the header
    ids.append(_header_request_id(info.value.response))
    assert len(set(ids)) == len(ids), ids


def test_error_bodies_carry_the_request_id_of_the_header(cluster, s3, bucket):
    s3.put_object(Bucket=bucket, Key="obj", Body=b"x")
    ids = [
        _assert_error(*_sigv4(cluster, "GET", f"/{bucket}/missing"), 404, "NoSuchKey"),
        _assert_error(*_sigv4(cluster, "GET", f"/{bucket}-nope/obj"), 404, "NoSuchBucket"),
        _assert_error(*_sigv4(cluster, "GET", f"/{bucket}-nope"), 404, "NoSuchBucket"),
        _assert_error(*_sigv4(cluster, "GET", f"/{bucket}/obj", secret_key=cluster.secret_key + "x"),
                      403, "SignatureDoesNotMatch"),
        _assert_error(*_send(cluster.endpoint, "GET", f"/{bucket}/obj", {}), 403, "AccessDenied"),
    ]
    assert len(set(ids)) == len(ids), ids


def test_request_id_sent_by_the_client_is_replaced(cluster, bucket, s3):
    s3.put_object(Bucket=bucket, Key="obj", Body=b"x")
    status, headers, body = _sigv4(cluster, "GET", f"/{bucket}/obj",
                                   unsigned_headers={"x-amz-request-id": "0123456789ABCDEF"})
    assert (status, body) == (200, b"x")
    assert REQUEST_ID.fullmatch(headers["x-amz-request-id"])
    assert headers["x-amz-request-id"] != "0123456789ABCDEF"


# --- errors name no node, address or path -----------------------------------------------------


def _assert_names_no_internals(cluster, body: bytes) -> None:
    text = body.decode("utf-8", "replace")
    assert "127.0.0.1" not in text and "localhost" not in text, text
    for path in {str(cluster.dir), str(cluster.dir.resolve()), str(cluster.config.parent)}:
        assert path not in text, text
    assert not NODE_ID.search(text), text
    ports = [cluster.base_port + i for i in range(6)]
    assert not [p for p in ports if re.search(rf"\b{p}\b", text)], text


def _gateway_log_lines_for(cluster, offsets: dict[str, int], request_id: str) -> list[str]:
    """The gateway's log lines in the span of `request_id` (`request{id=...}`), waited for."""
    tag = f"request{{id={request_id}}}"
    deadline = time.monotonic() + LOG_WAIT_S
    while True:
        lines = [line for line in cluster.log_since(offsets).get("gateway", []) if tag in line]
        if lines or time.monotonic() > deadline:
            return lines
        time.sleep(0.05)


def _request_with_three_nodes_down(cluster, s3, bucket: str, method: str):
    """GET of a stored object, or PUT of a new one, with 3 of 6 nodes down (more than m = 2):
    (status, headers, body, the gateway's log lines of this request, all its lines meanwhile)."""
    # A PUT refused before its body is read gets its answer and a closed connection: a body that
    # fits in the socket buffers lets http.client read that answer (it has no Expect: 100-continue).
    body = data(5 * MIB + 17 if method == "GET" else 64 * KIB, seed=70)
    if method == "GET":
        s3.put_object(Bucket=bucket, Key="obj", Body=body)
    offsets = cluster.log_offsets()
    with cluster.nodes_down(1, 3, 5):
        status, headers, resp = _sigv4(cluster, method, f"/{bucket}/obj", body if method == "PUT" else b"")
        request_id = headers.get("x-amz-request-id", "")
        lines = _gateway_log_lines_for(cluster, offsets, request_id) if request_id else []
        all_lines = cluster.log_since(offsets).get("gateway", [])
    if method == "GET":
        assert sha(s3.get_object(Bucket=bucket, Key="obj")["Body"].read()) == sha(body)
    else:
        with s3_error("404"):
            s3.head_object(Bucket=bucket, Key="obj")
    return status, headers, resp, lines, all_lines


@pytest.mark.parametrize("method", ["GET", "PUT"])
def test_request_short_of_nodes_is_503_naming_no_node_address_or_path(cluster, s3, bucket, method):
    status, headers, body, _, _ = _request_with_three_nodes_down(cluster, s3, bucket, method)
    _assert_error(status, headers, body, 503, "ServiceUnavailable")
    _assert_names_no_internals(cluster, body)


@pytest.mark.parametrize("method", ["GET", "PUT"])
def test_request_short_of_nodes_is_logged_with_its_reason_under_its_request_id(cluster, s3, bucket, method):
    status, headers, body, lines, all_lines = _request_with_three_nodes_down(cluster, s3, bucket, method)
    request_id = _assert_error(status, headers, body, 503, "ServiceUnavailable")
    everything = "\n".join(all_lines)
    assert lines, f"no gateway log line carries request{{id={request_id}}}:\n{everything}"
    # The log has what the client was not told: which nodes could not be reached.
    assert any(NODE_ID.search(line) for line in lines), (
        f"no log line of request {request_id} names the unreachable nodes:\n{everything}"
    )


# --- ACLs: buckets are "BucketOwnerEnforced" --------------------------------------------------

ALL_USERS = 'uri="http://acs.amazonaws.com/groups/global/AllUsers"'


def _acl_id(acl: dict[str, str]) -> str:
    (name, value), = acl.items()
    return f"{name}={'AllUsers' if value == ALL_USERS else value}"


@pytest.mark.parametrize("acl", [
    {"ACL": "public-read"},
    {"ACL": "public-read-write"},
    {"ACL": "authenticated-read"},
    {"GrantRead": ALL_USERS},
    {"GrantFullControl": ALL_USERS},
    {"GrantWrite": ALL_USERS},
], ids=_acl_id)
def test_create_bucket_with_an_acl_or_grant_is_refused_and_creates_nothing(s3, bucket_name, acl):
    with s3_error("InvalidBucketAclWithObjectOwnership", 400):
        s3.create_bucket(Bucket=bucket_name, **acl)
    with s3_error("404"):
        s3.head_bucket(Bucket=bucket_name)
    assert bucket_name not in [b["Name"] for b in s3.list_buckets()["Buckets"]]


def test_create_bucket_with_private_acl_succeeds(s3, bucket_name):
    s3.create_bucket(Bucket=bucket_name, ACL="private")
    s3.head_bucket(Bucket=bucket_name)
    s3.put_object(Bucket=bucket_name, Key="obj", Body=b"x")
    assert s3.get_object(Bucket=bucket_name, Key="obj")["Body"].read() == b"x"


@pytest.mark.parametrize("acl", ["public-read", "public-read-write", "authenticated-read"])
def test_put_object_with_a_public_acl_is_refused_and_stores_nothing(s3, bucket, acl):
    with s3_error("AccessControlListNotSupported", 400):
        s3.put_object(Bucket=bucket, Key="obj", Body=b"must not be stored", ACL=acl)
    with s3_error("404"):
        s3.head_object(Bucket=bucket, Key="obj")
    assert s3.list_objects_v2(Bucket=bucket)["KeyCount"] == 0


@pytest.mark.parametrize("acl", ["private", "bucket-owner-full-control"])
def test_put_object_with_an_owner_only_acl_succeeds(s3, bucket, acl):
    s3.put_object(Bucket=bucket, Key="obj", Body=b"stored", ACL=acl)
    assert s3.get_object(Bucket=bucket, Key="obj")["Body"].read() == b"stored"


def test_multipart_and_copy_with_a_public_acl_are_refused(s3, bucket):
    with s3_error("AccessControlListNotSupported", 400):
        s3.create_multipart_upload(Bucket=bucket, Key="mp", ACL="public-read")
    assert s3.list_multipart_uploads(Bucket=bucket).get("Uploads", []) == []

    s3.put_object(Bucket=bucket, Key="src", Body=b"source")
    with s3_error("AccessControlListNotSupported", 400):
        s3.copy_object(Bucket=bucket, Key="copy", CopySource={"Bucket": bucket, "Key": "src"}, ACL="public-read")
    with s3_error("404"):
        s3.head_object(Bucket=bucket, Key="copy")
    s3.copy_object(Bucket=bucket, Key="copy", CopySource={"Bucket": bucket, "Key": "src"}, ACL="private")
    assert s3.get_object(Bucket=bucket, Key="copy")["Body"].read() == b"source"


# --- If-None-Match: * -------------------------------------------------------------------------


def _put_if_absent(client, bucket: str, key: str, body: bytes, barrier: threading.Barrier) -> tuple[str, int]:
    """(outcome, HTTP status) of one racing create: ("ok", 200) or (error code, status)."""
    barrier.wait()
    try:
        resp = client.put_object(Bucket=bucket, Key=key, Body=body, IfNoneMatch="*")
    except ClientError as e:
        return e.response["Error"].get("Code", "?"), e.response["ResponseMetadata"]["HTTPStatusCode"]
    assert resp["ETag"] == etag(body)
    return "ok", resp["ResponseMetadata"]["HTTPStatusCode"]


def _key_state(cluster, s3, bucket: str, key: str) -> str:
    """What HEAD and `tessera stat` say about a key, for failure messages."""
    try:
        head = s3.head_object(Bucket=bucket, Key=key)
        state = f"HEAD: 200, ETag {head['ETag']}, {head['ContentLength']} bytes"
    except ClientError as e:
        state = f"HEAD: {e.response['ResponseMetadata']['HTTPStatusCode']} {e.response['Error'].get('Code')}"
    out = subprocess.run([str(TESSERA), "stat", f"{bucket}/{key}", "--config", str(cluster.config)],
                         capture_output=True, text=True, timeout=30, stdin=subprocess.DEVNULL)
    return f"{state}\ntessera stat:\n{out.stdout}{out.stderr}"


def _race_creates(cluster, s3, clients: list, bucket: str) -> None:
    """RACE_ROUNDS rounds of every client PUTting its own body to one new key with If-None-Match: *
    at once: exactly one wins each round, the rest get 412, and the key holds the winner's body."""
    with ThreadPoolExecutor(max_workers=len(clients)) as pool:
        for round_ in range(RACE_ROUNDS):
            key = f"race-{round_}"
            bodies = [data(MIB + i * KIB, seed=1000 * round_ + i) for i in range(len(clients))]
            barrier = threading.Barrier(len(clients), timeout=RACE_TIMEOUT_S)
            futures = [pool.submit(_put_if_absent, c, bucket, key, b, barrier) for c, b in zip(clients, bodies)]
            outcomes = [f.result(timeout=RACE_TIMEOUT_S) for f in futures]

            winners = [i for i, outcome in enumerate(outcomes) if outcome == ("ok", 200)]
            losers = [o for i, o in enumerate(outcomes) if i not in winners]
            assert len(winners) == 1 and losers == [("PreconditionFailed", 412)] * (len(clients) - 1), (
                f"round {round_}: {outcomes}\nafter the race, {_key_state(cluster, s3, bucket, key)}"
            )
            got = s3.get_object(Bucket=bucket, Key=key)
            assert (got["ETag"], sha(got["Body"].read())) == (etag(bodies[winners[0]]), sha(bodies[winners[0]]))


def test_concurrent_if_none_match_puts_create_the_key_exactly_once(cluster, make_client, s3, bucket):
    # boto3 clients are thread-safe once made, but are made here, in one thread.
    _race_creates(cluster, s3, [make_client() for _ in range(RACE_WRITERS)], bucket)


def test_concurrent_if_none_match_puts_through_two_gateways_create_the_key_exactly_once(
        cluster, make_client, s3, bucket):
    """Half the writers go through a gateway started for this test: two gateways share no state,
    and the new one's first writes also open its node connections while they race."""
    with _extra_gateway(cluster) as endpoint:
        clients = [make_client(endpoint_url=endpoint if i % 2 else None) for i in range(RACE_WRITERS)]
        _race_creates(cluster, s3, clients, bucket)


def test_if_none_match_put_on_an_existing_key_is_412_until_the_key_is_deleted(s3, bucket):
    s3.put_object(Bucket=bucket, Key="obj", Body=b"first")
    with s3_error("PreconditionFailed", 412):
        s3.put_object(Bucket=bucket, Key="obj", Body=b"second", IfNoneMatch="*")
    got = s3.get_object(Bucket=bucket, Key="obj")
    assert (got["ETag"], got["Body"].read()) == (etag(b"first"), b"first")

    s3.delete_object(Bucket=bucket, Key="obj")
    assert s3.put_object(Bucket=bucket, Key="obj", Body=b"third", IfNoneMatch="*")["ETag"] == etag(b"third")
    assert s3.get_object(Bucket=bucket, Key="obj")["Body"].read() == b"third"
    with s3_error("PreconditionFailed", 412):
        s3.put_object(Bucket=bucket, Key="obj", Body=b"fourth", IfNoneMatch="*")
    assert s3.get_object(Bucket=bucket, Key="obj")["Body"].read() == b"third"
