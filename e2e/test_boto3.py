"""boto3 against the gateway: the S3 API surface applications use, with S3's exact answers."""

from __future__ import annotations

import base64
import datetime as dt
import hashlib
import re
import threading
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import boto3
import pytest
from boto3.s3.transfer import TransferConfig
from botocore.config import Config
from botocore.exceptions import ClientError
from botocore.httpchecksum import AwsChunkedWrapper

from s3check import KIB, MIB, data, etag, multipart_etag, s3_error, sha, split, unique_bucket_name

# ---------------------------------------------------------------------------------------------
# Objects: uploads, downloads, checksums


@pytest.mark.parametrize("checksums", ["header", "trailer"])
def test_upload_file_and_download_file_multipart_are_byte_exact(make_client, bucket, tmp_path, checksums):
    s3 = make_client(checksums=checksums)
    body = data(17 * MIB + 3, seed=10)
    src, dst = tmp_path / "src", tmp_path / "dst"
    src.write_bytes(body)
    config = TransferConfig(multipart_threshold=5 * MIB, multipart_chunksize=5 * MIB, max_concurrency=4)

    s3.upload_file(str(src), bucket, "big/object", Config=config)
    head = s3.head_object(Bucket=bucket, Key="big/object")
    assert head["ContentLength"] == len(body)
    assert head["ETag"] == multipart_etag(split(body, 5 * MIB))
    assert "ContentEncoding" not in head

    s3.download_file(bucket, "big/object", str(dst), Config=config)
    got = dst.read_bytes()
    assert (len(got), sha(got)) == (len(body), sha(body))


CHECKSUM_CASES = [
    ("header", None),  # botocore's default over http: CRC32 in a header, signed payload
    ("header", "CRC64NVME"),
    ("trailer", None),  # the default over https: CRC32 in an aws-chunked trailer
    ("trailer", "CRC32C"),
    ("trailer", "CRC64NVME"),
    ("trailer", "SHA256"),
    ("when_required", None),  # no flexible checksum at all (older SDKs)
]


@pytest.mark.parametrize(("checksums", "algorithm"), CHECKSUM_CASES)
def test_put_object_with_flexible_checksums_round_trips(make_client, bucket, checksums, algorithm):
    s3 = make_client(checksums=checksums)
    body = data(3 * MIB + 17, seed=11)
    extra = {"ChecksumAlgorithm": algorithm} if algorithm else {}
    put = s3.put_object(Bucket=bucket, Key="obj", Body=body, **extra)
    assert put["ETag"] == etag(body)
    got = s3.get_object(Bucket=bucket, Key="obj")
    assert sha(got["Body"].read()) == sha(body)
    # aws-chunked is how the request body travelled, not how the object is encoded: S3 drops it.
    assert "ContentEncoding" not in got, got["ContentEncoding"]


def test_put_object_with_wrong_trailing_checksum_is_rejected_and_not_stored(make_client, bucket, monkeypatch):
    real_make_chunk = AwsChunkedWrapper._make_chunk

    def corrupt_trailer(self):
        chunk = real_make_chunk(self)
        if chunk.startswith(b"0\r\n") and b":" in chunk:  # the last chunk: "0", then the trailer
            name = chunk.split(b"\r\n")[1].split(b":")[0]
            return b"0\r\n" + name + b":AAAAAA==\r\n\r\n"
        return chunk

    monkeypatch.setattr(AwsChunkedWrapper, "_make_chunk", corrupt_trailer)
    with s3_error("BadDigest", 400):
        make_client(checksums="trailer").put_object(Bucket=bucket, Key="obj", Body=b"y" * 1000)
    monkeypatch.undo()
    with s3_error("404"):
        make_client().head_object(Bucket=bucket, Key="obj")


def test_put_object_with_wrong_checksum_is_rejected_and_not_stored(s3, bucket):
    crc32_of_other_bytes = base64.b64encode(b"\x00\x00\x00\x00").decode()
    with s3_error("BadDigest", 400):
        s3.put_object(Bucket=bucket, Key="obj", Body=b"hello", ChecksumCRC32=crc32_of_other_bytes)
    # Not the base64 of a 4-byte digest: S3's InvalidRequest, before the body is read.
    for malformed in ("not base64!", base64.b64encode(b"\x00" * 8).decode()):
        with s3_error("InvalidRequest", 400):
            s3.put_object(Bucket=bucket, Key="obj", Body=b"hello", ChecksumCRC32=malformed)
    with s3_error("404"):
        s3.head_object(Bucket=bucket, Key="obj")


def test_content_md5_mismatch_is_bad_digest_and_object_not_created(s3, bucket):
    body = b"the real body"
    wrong = base64.b64encode(hashlib.md5(b"another body").digest()).decode()
    with s3_error("BadDigest", 400):
        s3.put_object(Bucket=bucket, Key="obj", Body=body, ContentMD5=wrong)
    with s3_error("404"):
        s3.head_object(Bucket=bucket, Key="obj")

    right = base64.b64encode(hashlib.md5(body).digest()).decode()
    assert s3.put_object(Bucket=bucket, Key="obj", Body=body, ContentMD5=right)["ETag"] == etag(body)


def test_concurrent_puts_and_gets_are_byte_exact(s3, bucket):
    bodies = {f"c/{i}": data(MIB + i * 97_001, seed=100 + i) for i in range(12)}
    with ThreadPoolExecutor(max_workers=6) as pool:
        list(pool.map(lambda kv: s3.put_object(Bucket=bucket, Key=kv[0], Body=kv[1]), bodies.items()))
        got = dict(pool.map(lambda k: (k, s3.get_object(Bucket=bucket, Key=k)["Body"].read()), list(bodies) * 2))
    assert {k: sha(v) for k, v in got.items()} == {k: sha(v) for k, v in bodies.items()}


def test_empty_object_round_trips(s3, bucket):
    assert s3.put_object(Bucket=bucket, Key="empty", Body=b"")["ETag"] == etag(b"")
    got = s3.get_object(Bucket=bucket, Key="empty")
    assert got["ContentLength"] == 0 and got["Body"].read() == b""
    assert s3.head_object(Bucket=bucket, Key="empty")["ETag"] == etag(b"")


def test_overwrite_returns_the_newest_body(s3, bucket):
    s3.put_object(Bucket=bucket, Key="k", Body=b"first version")
    s3.put_object(Bucket=bucket, Key="k", Body=b"second")
    assert s3.get_object(Bucket=bucket, Key="k")["Body"].read() == b"second"
    assert [o["Key"] for o in s3.list_objects_v2(Bucket=bucket)["Contents"]] == ["k"]


GATE_TIMEOUT_S = 30


class _GatedBody:
    """A PUT body that hands out its first `gate` bytes, then blocks in read() until `released`
    (at most GATE_TIMEOUT_S): its request stays open with the rest of the body still to send."""

    def __init__(self, body: bytes, gate: int):
        self._body, self._gate, self._pos = body, gate, 0
        self.reached = threading.Event()  # every byte before the gate was handed out
        self.released = threading.Event()

    def __len__(self) -> int:  # botocore sends it as X-Amz-Decoded-Content-Length
        return len(self._body)

    def read(self, size: int | None = -1) -> bytes:
        if self._pos == self._gate and not self.released.is_set():
            self.reached.set()
            if not self.released.wait(GATE_TIMEOUT_S):
                raise TimeoutError(f"the body was not released within {GATE_TIMEOUT_S}s")
        limit = self._gate if self._pos < self._gate else len(self._body)
        end = limit if size is None or size < 0 else min(limit, self._pos + size)
        chunk = self._body[self._pos:end]
        self._pos = end
        return chunk


def _gateway_bytes_received(cluster) -> int:
    """The gateway's count of object bytes its PutObject/UploadPart handlers have read so far."""
    url = f"http://127.0.0.1:{cluster.metrics_port('gateway')}/metrics"
    with urllib.request.urlopen(url, timeout=10) as resp:
        text = resp.read().decode()
    found = re.search(r"^tessera_s3_object_received_bytes_total(?:\{[^}]*\})? (\S+)$", text, re.MULTILINE)
    assert found, f"no tessera_s3_object_received_bytes_total in the gateway's /metrics:\n{text}"
    return int(float(found.group(1)))


def test_of_two_overlapping_puts_the_one_acknowledged_last_wins(make_client, s3, cluster, bucket):
    """Issue 37 item 9: PUT B starts; while its body is still on the wire a whole PUT A of the
    same key runs and is acknowledged; then B is acknowledged. B, acknowledged last, must be the
    object (S3; Ceph s3-tests test_atomic_dual_write_*), not A.

    Why the two writes really overlap: the gateway does not buffer bodies. s3s hands PutObject its
    body as a stream and `client.put` stamps the version (`write_target`) while it reads the first
    stripe (k x chunk = 4 x 1 MiB here); it reads the next stripe only after both are done. So
    once the gateway has read more than 4 MiB of B (its `object_received` bytes count what the
    handler read), B's version is stamped and its first stripe is on its way to the nodes, and B
    cannot end before the rest of its body arrives, held back until A is acknowledged.

    B's client sends aws-chunked trailers (STREAMING-UNSIGNED-PAYLOAD-TRAILER, as SDKs do over
    https): over plain http botocore would otherwise read the whole body before sending it, to
    sign its SHA-256 and to put its CRC32 in a header, and the gate would hold the request back.
    botocore cuts the body into 1 MiB aws-chunks and keeps the tail of the last one until it can
    read the next, so the gateway gets the whole chunks before the gate but the last one.
    """
    key = "contended"
    body_b = data(8 * MIB, seed=37)  # two stripes
    body_a = data(MIB, seed=38)
    gate = 6 * MIB
    past_first_stripe = 5 * MIB  # what the gateway reads of B before the gate (see above)
    gated = _GatedBody(body_b, gate)
    writer_b = make_client(checksums="trailer")
    received_before = _gateway_bytes_received(cluster)

    with ThreadPoolExecutor(max_workers=1) as pool:
        try:
            put_b = pool.submit(writer_b.put_object, Bucket=bucket, Key=key, Body=gated)
            assert gated.reached.wait(GATE_TIMEOUT_S) or put_b.done(), "PUT B never read its body up to the gate"
            if put_b.done():
                put_b.result()  # raises what PUT B failed with
                pytest.fail("PUT B ended before its body was released")
            deadline = time.monotonic() + GATE_TIMEOUT_S
            while (received := _gateway_bytes_received(cluster) - received_before) < past_first_stripe:
                assert time.monotonic() < deadline and not put_b.done(), (
                    f"the gateway read {received} bytes of PUT B, not {past_first_stripe}: B's write has not started")
                time.sleep(0.02)

            put_a = s3.put_object(Bucket=bucket, Key=key, Body=body_a)
            assert put_a["ResponseMetadata"]["HTTPStatusCode"] == 200
            assert put_a["ETag"] == etag(body_a)
            assert not put_b.done(), "PUT B was acknowledged before its body was released"
        finally:
            gated.released.set()
        put_b = put_b.result(timeout=GATE_TIMEOUT_S)
    assert put_b["ResponseMetadata"]["HTTPStatusCode"] == 200
    assert put_b["ETag"] == etag(body_b)

    names = {sha(body_b): "B's (acknowledged last)", sha(body_a): "A's (acknowledged first)"}
    for attempt in range(3):
        got = s3.get_object(Bucket=bucket, Key=key)
        body = got["Body"].read()
        read = names.get(sha(body), f"neither write's ({len(body)} bytes)")
        assert sha(body) == sha(body_b), f"GET {attempt + 1} read {read} bytes, not B's, which was acknowledged last"
        assert got["ETag"] == put_b["ETag"], f"GET {attempt + 1}: ETag {got['ETag']}, B's is {put_b['ETag']}"
    versions = s3.list_object_versions(Bucket=bucket)["Versions"]
    assert [(v["Key"], v["Size"], v["ETag"], v["IsLatest"]) for v in versions] == [
        (key, len(body_b), etag(body_b), True)
    ]


def test_keys_with_special_characters_round_trip_through_put_get_list(s3, bucket):
    keys = sorted([
        "dir with spaces/file name.txt",
        "plus+sign&ampersand=equals?question",
        "percent%20literal",
        "unicode/ünïcödé/日本語.txt",
        "tilde~and'quote\"(parens)*star",
        "trailing/slash/",
        "double//slash",
    ])
    for i, key in enumerate(keys):
        s3.put_object(Bucket=bucket, Key=key, Body=key.encode() + bytes([i]))
    for i, key in enumerate(keys):
        assert s3.get_object(Bucket=bucket, Key=key)["Body"].read() == key.encode() + bytes([i])
    # botocore asks for EncodingType=url and decodes: a gateway that does not encode breaks '+' and '%'.
    assert [o["Key"] for o in s3.list_objects_v2(Bucket=bucket)["Contents"]] == keys


def test_virtual_hosted_style_requests_address_the_bucket_by_host(make_client, cluster, bucket, localhost_subdomains):
    """`BUCKET.localhost:PORT` names the bucket (the gateway's base domain is localhost)."""
    port = cluster.endpoint.rsplit(":", 1)[1]
    s3v = make_client(endpoint_url=f"http://localhost:{port}", addressing_style="virtual")
    body = data(300 * KIB, seed=15)
    s3v.put_object(Bucket=bucket, Key="vhost/obj", Body=body)
    assert s3v.get_object(Bucket=bucket, Key="vhost/obj")["Body"].read() == body
    assert [o["Key"] for o in s3v.list_objects_v2(Bucket=bucket)["Contents"]] == ["vhost/obj"]
    url = s3v.generate_presigned_url("get_object", Params={"Bucket": bucket, "Key": "vhost/obj"}, ExpiresIn=60)
    assert url.startswith(f"http://{bucket}.localhost:{port}/vhost/obj?")
    assert _http("GET", url) == (200, body)
    s3v.delete_object(Bucket=bucket, Key="vhost/obj")
    assert make_client().list_objects_v2(Bucket=bucket)["KeyCount"] == 0


# ---------------------------------------------------------------------------------------------
# Metadata and headers


@pytest.mark.parametrize("checksums", ["header", "trailer"])
def test_user_metadata_and_standard_headers_round_trip(make_client, bucket, checksums):
    s3 = make_client(checksums=checksums)  # with trailers the request says Content-Encoding: gzip,aws-chunked
    headers = {
        "ContentType": "application/vnd.apache.parquet",
        "ContentEncoding": "gzip",
        "ContentDisposition": 'attachment; filename="report.parquet"',
        "CacheControl": "max-age=3600, must-revalidate",
    }
    body = data(5000, seed=12)
    s3.put_object(Bucket=bucket, Key="obj", Body=body, Metadata={"Owner": "alice", "run-id": "42 x"}, **headers)

    for got in (s3.head_object(Bucket=bucket, Key="obj"), s3.get_object(Bucket=bucket, Key="obj")):
        for name, value in headers.items():
            assert got.get(name) == value, f"{name}: {got.get(name)!r} != {value!r}"
        # S3 lowercases user metadata names.
        assert got["Metadata"] == {"owner": "alice", "run-id": "42 x"}
    assert s3.get_object(Bucket=bucket, Key="obj")["Body"].read() == body


def test_get_response_header_overrides(s3, bucket):
    s3.put_object(Bucket=bucket, Key="obj", Body=b"x", ContentType="application/octet-stream")
    got = s3.get_object(
        Bucket=bucket, Key="obj",
        ResponseContentType="text/plain",
        ResponseContentDisposition='attachment; filename="x.txt"',
        ResponseCacheControl="no-cache",
    )
    assert got["ContentType"] == "text/plain"
    assert got["ContentDisposition"] == 'attachment; filename="x.txt"'
    assert got["CacheControl"] == "no-cache"


# ---------------------------------------------------------------------------------------------
# Ranges and conditional requests


def test_range_reads_within_and_across_stripes(s3, bucket):
    body = data(9 * MIB + 123, seed=13)  # 3 stripes of 4 x 1 MiB chunks
    s3.put_object(Bucket=bucket, Key="obj", Body=body)
    n = len(body)
    cases = {
        "bytes=0-9": (0, 9),
        "bytes=100-": (100, n - 1),
        "bytes=-50": (n - 50, n - 1),
        f"bytes={MIB - 1}-{MIB}": (MIB - 1, MIB),  # across a chunk boundary
        f"bytes={4 * MIB - 5}-{8 * MIB + 5}": (4 * MIB - 5, 8 * MIB + 5),  # across two stripe boundaries
        f"bytes={n - 10}-{n + 1000}": (n - 10, n - 1),  # an end past the object is clamped
    }
    for header, (first, last) in cases.items():
        got = s3.get_object(Bucket=bucket, Key="obj", Range=header)
        assert got["ResponseMetadata"]["HTTPStatusCode"] == 206, header
        assert got["ContentRange"] == f"bytes {first}-{last}/{n}", header
        assert got["ContentLength"] == last - first + 1, header
        assert sha(got["Body"].read()) == sha(body[first:last + 1]), header


def test_range_starting_past_the_end_is_invalid_range(s3, bucket):
    s3.put_object(Bucket=bucket, Key="obj", Body=b"0123456789")
    with s3_error("InvalidRange", 416):
        s3.get_object(Bucket=bucket, Key="obj", Range="bytes=10-20")


def test_conditional_gets_follow_s3_precedence(s3, bucket):
    s3.put_object(Bucket=bucket, Key="obj", Body=b"conditional")
    head = s3.head_object(Bucket=bucket, Key="obj")
    tag, modified = head["ETag"], head["LastModified"]
    day = dt.timedelta(days=1)

    def status(**conditions) -> int:
        try:
            return s3.get_object(Bucket=bucket, Key="obj", **conditions)["ResponseMetadata"]["HTTPStatusCode"]
        except ClientError as e:
            return e.response["ResponseMetadata"]["HTTPStatusCode"]

    assert status(IfMatch=tag) == 200
    assert status(IfMatch='"0123456789abcdef0123456789abcdef"') == 412
    assert status(IfNoneMatch=tag) == 304
    assert status(IfNoneMatch='"0123456789abcdef0123456789abcdef"') == 200
    # Last-Modified has whole seconds: the object is not modified since its own Last-Modified.
    assert status(IfModifiedSince=modified) == 304
    assert status(IfModifiedSince=modified - day) == 200
    assert status(IfUnmodifiedSince=modified) == 200
    assert status(IfUnmodifiedSince=modified - day) == 412
    # S3: If-Match true wins over If-Unmodified-Since false; If-None-Match false wins over If-Modified-Since true.
    assert status(IfMatch=tag, IfUnmodifiedSince=modified - day) == 200
    assert status(IfNoneMatch=tag, IfModifiedSince=modified - day) == 304

    with s3_error("PreconditionFailed", 412):
        s3.get_object(Bucket=bucket, Key="obj", IfMatch='"0123456789abcdef0123456789abcdef"')
    with s3_error("412"):
        s3.head_object(Bucket=bucket, Key="obj", IfMatch='"0123456789abcdef0123456789abcdef"')
    with s3_error("304"):
        s3.head_object(Bucket=bucket, Key="obj", IfNoneMatch=tag)


def test_conditional_puts_create_only_or_replace_only_the_expected_version(s3, bucket):
    first = s3.put_object(Bucket=bucket, Key="obj", Body=b"first", IfNoneMatch="*")
    with s3_error("PreconditionFailed", 412):
        s3.put_object(Bucket=bucket, Key="obj", Body=b"second", IfNoneMatch="*")
    with s3_error("PreconditionFailed", 412):
        s3.put_object(Bucket=bucket, Key="obj", Body=b"third", IfMatch='"0123456789abcdef0123456789abcdef"')
    assert s3.get_object(Bucket=bucket, Key="obj")["Body"].read() == b"first"
    s3.put_object(Bucket=bucket, Key="obj", Body=b"fourth", IfMatch=first["ETag"])
    assert s3.get_object(Bucket=bucket, Key="obj")["Body"].read() == b"fourth"


# ---------------------------------------------------------------------------------------------
# Listings


def _put_keys(s3, bucket, keys):
    with ThreadPoolExecutor(max_workers=8) as pool:
        list(pool.map(lambda k: s3.put_object(Bucket=bucket, Key=k, Body=k.encode()), keys))


def test_list_objects_v2_paginates_with_continuation_tokens(s3, bucket):
    keys = sorted(f"k/{i:03d}" for i in range(25))
    _put_keys(s3, bucket, keys)

    seen, token, pages = [], None, 0
    for _ in range(10):
        kwargs = {"ContinuationToken": token} if token else {}
        page = s3.list_objects_v2(Bucket=bucket, MaxKeys=7, **kwargs)
        pages += 1
        seen += [o["Key"] for o in page.get("Contents", [])]
        assert page["KeyCount"] == len(page.get("Contents", []))
        if not page["IsTruncated"]:
            assert "NextContinuationToken" not in page
            break
        token = page["NextContinuationToken"]
    assert (seen, pages) == (keys, 4)

    after = s3.list_objects_v2(Bucket=bucket, StartAfter="k/019")
    assert [o["Key"] for o in after["Contents"]] == keys[20:]

    paginated = s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, PaginationConfig={"PageSize": 10})
    assert [o["Key"] for page in paginated for o in page.get("Contents", [])] == keys


def test_list_objects_v2_delimiter_groups_common_prefixes(s3, bucket):
    keys = ["photos/2024/a.jpg", "photos/2024/b.jpg", "photos/2025/c.jpg", "photos/top.jpg", "readme"]
    _put_keys(s3, bucket, keys)

    root = s3.list_objects_v2(Bucket=bucket, Delimiter="/")
    assert [o["Key"] for o in root["Contents"]] == ["readme"]
    assert [p["Prefix"] for p in root["CommonPrefixes"]] == ["photos/"]

    photos = s3.list_objects_v2(Bucket=bucket, Prefix="photos/", Delimiter="/")
    assert [o["Key"] for o in photos["Contents"]] == ["photos/top.jpg"]
    assert [p["Prefix"] for p in photos["CommonPrefixes"]] == ["photos/2024/", "photos/2025/"]
    assert photos["KeyCount"] == 3

    # A prefix need not end at a delimiter.
    partial = s3.list_objects_v2(Bucket=bucket, Prefix="photos/20", Delimiter="/")
    assert [p["Prefix"] for p in partial["CommonPrefixes"]] == ["photos/2024/", "photos/2025/"]
    assert "Contents" not in partial

    # CommonPrefixes count toward MaxKeys, and pagination never repeats a prefix.
    entries, token = [], None
    for _ in range(10):
        kwargs = {"ContinuationToken": token} if token else {}
        page = s3.list_objects_v2(Bucket=bucket, Prefix="photos/", Delimiter="/", MaxKeys=1, **kwargs)
        got = [p["Prefix"] for p in page.get("CommonPrefixes", [])] + [o["Key"] for o in page.get("Contents", [])]
        assert len(got) == 1, page
        entries += got
        if not page["IsTruncated"]:
            break
        token = page["NextContinuationToken"]
    assert entries == ["photos/2024/", "photos/2025/", "photos/top.jpg"]


def test_list_objects_v2_default_page_is_1000_keys(s3, bucket):
    keys = sorted(f"many/{i:04d}" for i in range(1001))
    _put_keys(s3, bucket, keys)
    first = s3.list_objects_v2(Bucket=bucket)
    assert (first["KeyCount"], first["IsTruncated"]) == (1000, True)
    rest = s3.list_objects_v2(Bucket=bucket, ContinuationToken=first["NextContinuationToken"])
    assert (rest["KeyCount"], rest["IsTruncated"]) == (1, False)
    assert [o["Key"] for o in first["Contents"] + rest["Contents"]] == keys


def test_list_objects_v1_pages_with_markers(s3, bucket):
    keys = sorted(f"m/{i:02d}" for i in range(12)) + ["n/a", "n/b"]
    _put_keys(s3, bucket, keys)

    seen, marker = [], ""
    for _ in range(10):
        page = s3.list_objects(Bucket=bucket, MaxKeys=5, Marker=marker)
        seen += [o["Key"] for o in page.get("Contents", [])]
        if not page["IsTruncated"]:
            break
        marker = seen[-1]  # without a delimiter S3 need not send NextMarker: the last key is the marker
    assert seen == keys

    # With a delimiter, a truncated page carries NextMarker.
    page = s3.list_objects(Bucket=bucket, Delimiter="/", MaxKeys=1)
    assert page["IsTruncated"] and page["NextMarker"] == "m/"
    assert [p["Prefix"] for p in page["CommonPrefixes"]] == ["m/"]
    rest = s3.list_objects(Bucket=bucket, Delimiter="/", Marker=page["NextMarker"])
    assert [p["Prefix"] for p in rest["CommonPrefixes"]] == ["n/"]
    assert not rest["IsTruncated"]


def test_list_object_versions_shows_one_latest_version_per_key(s3, bucket):
    s3.put_object(Bucket=bucket, Key="a", Body=b"1")
    s3.put_object(Bucket=bucket, Key="a", Body=b"22")
    s3.put_object(Bucket=bucket, Key="b", Body=b"333")
    versions = s3.list_object_versions(Bucket=bucket)["Versions"]
    assert [(v["Key"], v["Size"], v["ETag"], v["IsLatest"]) for v in versions] == [
        ("a", 2, etag(b"22"), True),
        ("b", 3, etag(b"333"), True),
    ]
    assert all(v.get("VersionId") for v in versions)


def test_buckets_create_head_list_delete(s3, bucket_name):
    s3.create_bucket(Bucket=bucket_name)
    s3.head_bucket(Bucket=bucket_name)
    listed = {b["Name"]: b for b in s3.list_buckets()["Buckets"]}
    assert bucket_name in listed and isinstance(listed[bucket_name]["CreationDate"], dt.datetime)
    created = listed[bucket_name]["CreationDate"]
    age = dt.datetime.now(dt.timezone.utc) - created
    assert dt.timedelta(seconds=-5) <= age < dt.timedelta(minutes=10), f"creation date {created} is not the real one"
    s3.get_bucket_location(Bucket=bucket_name)
    s3.delete_bucket(Bucket=bucket_name)
    with s3_error("404"):
        s3.head_bucket(Bucket=bucket_name)
    assert bucket_name not in {b["Name"] for b in s3.list_buckets()["Buckets"]}


# ---------------------------------------------------------------------------------------------
# Presigned URLs (plain HTTP, no SDK)


def _http(method, url, body=None):
    # urllib would send Content-Type: application/x-www-form-urlencoded with a body.
    headers = {"Content-Type": "application/octet-stream"} if body is not None else {}
    req = urllib.request.Request(url, data=body, method=method, headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def _xml_code(body: bytes) -> str:
    text = body.decode("utf-8", "replace")
    start = text.find("<Code>")
    return text[start + 6:text.find("</Code>")] if start >= 0 else text[:200]


def test_presigned_put_and_get_urls_work_without_an_sdk(s3, bucket):
    body = data(100 * KIB, seed=14)
    put_url = s3.generate_presigned_url("put_object", Params={"Bucket": bucket, "Key": "pre/signed"}, ExpiresIn=300)
    status, _ = _http("PUT", put_url, body)
    assert status == 200
    get_url = s3.generate_presigned_url("get_object", Params={"Bucket": bucket, "Key": "pre/signed"}, ExpiresIn=300)
    status, got = _http("GET", get_url)
    assert status == 200 and got == body


def test_presigned_sigv2_url_from_a_default_boto3_client_is_refused_with_a_hint(cluster, bucket, s3):
    """boto3 without signature_version="s3v4" presigns S3 URLs with SigV2 (AWSAccessKeyId, Signature).

    SigV2 is off by default (the gateway serves it only with --allow-sigv2): the URL gets S3's
    answer for an unsupported signature, with a hint; the same client with s3v4 works.
    """
    s3.put_object(Bucket=bucket, Key="obj", Body=b"presigned by default")
    session = boto3.session.Session()
    credentials = dict(aws_access_key_id=cluster.access_key, aws_secret_access_key=cluster.secret_key)
    default = session.client("s3", endpoint_url=cluster.endpoint, region_name="us-east-1", **credentials)
    url = default.generate_presigned_url("get_object", Params={"Bucket": bucket, "Key": "obj"}, ExpiresIn=300)
    assert "Signature=" in url and "X-Amz-Signature" not in url, url
    status, body = _http("GET", url)
    assert (status, _xml_code(body)) == (400, "InvalidRequest"), body
    assert b"signature_version='s3v4'" in body, body
    v4 = session.client(
        "s3", endpoint_url=cluster.endpoint, region_name="us-east-1",
        config=Config(signature_version="s3v4"), **credentials,
    )
    url = v4.generate_presigned_url("get_object", Params={"Bucket": bucket, "Key": "obj"}, ExpiresIn=300)
    assert (_http("GET", url)) == (200, b"presigned by default"), url


def test_presigned_url_with_a_changed_signature_is_rejected(s3, bucket):
    s3.put_object(Bucket=bucket, Key="obj", Body=b"x")
    url = s3.generate_presigned_url("get_object", Params={"Bucket": bucket, "Key": "obj"}, ExpiresIn=300)
    sig_at = url.index("X-Amz-Signature=") + len("X-Amz-Signature=")
    flipped = "0" if url[sig_at] != "0" else "1"
    status, body = _http("GET", url[:sig_at] + flipped + url[sig_at + 1:])
    assert (status, _xml_code(body)) == (403, "SignatureDoesNotMatch")


def test_expired_presigned_url_is_access_denied(s3, bucket):
    s3.put_object(Bucket=bucket, Key="obj", Body=b"x")
    url = s3.generate_presigned_url("get_object", Params={"Bucket": bucket, "Key": "obj"}, ExpiresIn=1)
    signed_at = time.time()
    while time.time() < signed_at + 2.1:  # bounded: at most ~2 s
        time.sleep(0.1)
    status, body = _http("GET", url)
    assert (status, _xml_code(body)) == (403, "AccessDenied")


# ---------------------------------------------------------------------------------------------
# Error codes (the ones S3 returns)


def test_missing_keys_and_buckets_have_s3_error_codes(s3, bucket):
    missing_bucket = unique_bucket_name("never-created")
    with s3_error("NoSuchKey", 404):
        s3.get_object(Bucket=bucket, Key="nope")
    with s3_error("404"):
        s3.head_object(Bucket=bucket, Key="nope")
    with s3_error("NoSuchBucket", 404):
        s3.get_object(Bucket=missing_bucket, Key="k")
    with s3_error("NoSuchBucket", 404):
        s3.put_object(Bucket=missing_bucket, Key="k", Body=b"x")
    with s3_error("NoSuchBucket", 404):
        s3.list_objects_v2(Bucket=missing_bucket)
    with s3_error("NoSuchBucket", 404):
        s3.delete_bucket(Bucket=missing_bucket)
    with s3_error("404"):
        s3.head_bucket(Bucket=missing_bucket)
    # Deleting a key that does not exist succeeds (204), as on S3.
    assert s3.delete_object(Bucket=bucket, Key="nope")["ResponseMetadata"]["HTTPStatusCode"] == 204


def test_key_longer_than_1024_bytes_is_key_too_long(s3, bucket):
    s3.put_object(Bucket=bucket, Key="k" * 1024, Body=b"x")
    with s3_error("KeyTooLongError", 400):
        s3.put_object(Bucket=bucket, Key="k" * 1025, Body=b"x")


def test_copy_object_with_special_characters_in_the_source_key(s3, bucket):
    source = "dir with space/ünï+plus%25&=?.bin"
    body = data(3 * MIB, seed=16)
    s3.put_object(Bucket=bucket, Key=source, Body=body)
    s3.copy_object(Bucket=bucket, Key="copied", CopySource={"Bucket": bucket, "Key": source})
    assert sha(s3.get_object(Bucket=bucket, Key="copied")["Body"].read()) == sha(body)


def test_copy_object_onto_itself_needs_replace_and_then_updates_metadata(s3, bucket):
    s3.put_object(Bucket=bucket, Key="obj", Body=b"same body", ContentType="text/plain", Metadata={"v": "1"})
    with s3_error("InvalidRequest", 400):
        s3.copy_object(Bucket=bucket, Key="obj", CopySource={"Bucket": bucket, "Key": "obj"})
    s3.copy_object(Bucket=bucket, Key="obj", CopySource={"Bucket": bucket, "Key": "obj"},
                   MetadataDirective="REPLACE", ContentType="text/csv", Metadata={"v": "2"})
    got = s3.get_object(Bucket=bucket, Key="obj")
    assert (got["ContentType"], got["Metadata"], got["Body"].read()) == ("text/csv", {"v": "2"}, b"same body")


def test_bucket_conflicts_have_s3_error_codes(s3, bucket):
    # S3 answers CreateBucket of a bucket you own with 200 in us-east-1 (this gateway's default
    # region), leaving the bucket as it is; 409 BucketAlreadyOwnedByYou elsewhere
    # (test_hardening.py, a gateway started with --region).
    s3.put_object(Bucket=bucket, Key="k", Body=b"x")
    assert s3.create_bucket(Bucket=bucket)["ResponseMetadata"]["HTTPStatusCode"] == 200
    assert s3.get_object(Bucket=bucket, Key="k")["Body"].read() == b"x", "the bucket is untouched"
    assert s3.get_bucket_location(Bucket=bucket).get("LocationConstraint") is None
    with s3_error("BucketNotEmpty", 409):
        s3.delete_bucket(Bucket=bucket)
    s3.delete_object(Bucket=bucket, Key="k")
    s3.delete_bucket(Bucket=bucket)


def test_delete_bucket_aborts_its_multipart_uploads_in_progress(s3, bucket):
    # S3 deletes a bucket with incomplete uploads and them with it (on 2862b84: BucketNotEmpty,
    # so `aws s3 rb --force` failed after an interrupted upload).
    upload = s3.create_multipart_upload(Bucket=bucket, Key="interrupted")["UploadId"]
    s3.upload_part(Bucket=bucket, Key="interrupted", UploadId=upload, PartNumber=1, Body=b"p" * 1000)
    assert s3.delete_bucket(Bucket=bucket)["ResponseMetadata"]["HTTPStatusCode"] == 204
    with s3_error("NoSuchBucket", 404):
        s3.list_objects_v2(Bucket=bucket)
    s3.create_bucket(Bucket=bucket)
    assert s3.list_multipart_uploads(Bucket=bucket).get("Uploads", []) == [], "the old upload went with the bucket"
    with s3_error("NoSuchUpload", 404):
        s3.list_parts(Bucket=bucket, Key="interrupted", UploadId=upload)


def test_list_buckets_paginates_by_prefix_max_buckets_and_continuation_token(s3, bucket_name):
    prefix = bucket_name[:40] + "-p"
    names = sorted(f"{prefix}-{i}" for i in range(5))
    for name in names:
        s3.create_bucket(Bucket=name)
    try:
        seen, token, pages = [], None, 0
        while True:
            args = {"Prefix": prefix, "MaxBuckets": 2, **({"ContinuationToken": token} if token else {})}
            page = s3.list_buckets(**args)
            pages += 1
            assert page["Prefix"] == prefix
            assert len(page["Buckets"]) <= 2 and all(b["BucketRegion"] == "us-east-1" for b in page["Buckets"])
            seen += [b["Name"] for b in page["Buckets"]]
            token = page.get("ContinuationToken")
            if not token:
                break
        assert (seen, pages) == (names, 3)
        # Without max-buckets: every bucket at once, no token; another region's: none.
        assert [b["Name"] for b in s3.list_buckets(Prefix=prefix)["Buckets"]] == names
        assert "ContinuationToken" not in s3.list_buckets(Prefix=prefix)
        assert s3.list_buckets(Prefix=prefix, BucketRegion="eu-west-1")["Buckets"] == []
        for bad in ({"MaxBuckets": 10_001}, {"ContinuationToken": "not*a*token"}):  # botocore refuses 0 itself
            with s3_error("InvalidArgument", 400):
                s3.list_buckets(**bad)
    finally:
        for name in names:
            s3.delete_bucket(Bucket=name)


@pytest.mark.parametrize("name", ["ab", "Upper-Case", "under_score", "-leading-dash", "double..dots", "a" * 64])
def test_invalid_bucket_names_are_refused(s3, name):
    with s3_error("InvalidBucketName", 400):
        s3.create_bucket(Bucket=name)


def test_wrong_secret_key_is_signature_does_not_match(make_client, cluster, bucket):
    wrong = make_client(secret_key=cluster.secret_key[:-4] + "AAAA")
    with s3_error("SignatureDoesNotMatch", 403):
        wrong.list_buckets()
    with s3_error("SignatureDoesNotMatch", 403):
        wrong.put_object(Bucket=bucket, Key="k", Body=b"x")
    with s3_error("NoSuchKey"):
        make_client().get_object(Bucket=bucket, Key="k")


def test_unknown_access_key_is_invalid_access_key_id(make_client, bucket):
    stranger = make_client(access_key="AKIAIOSFODNN7EXAMPLE", secret_key="wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY")
    with s3_error("InvalidAccessKeyId", 403):
        stranger.list_buckets()
    with s3_error("InvalidAccessKeyId", 403):
        stranger.get_object(Bucket=bucket, Key="k")


# ---------------------------------------------------------------------------------------------
# Multipart uploads, by hand


def test_multipart_upload_lifecycle(s3, bucket):
    parts = [data(5 * MIB, seed=20), data(5 * MIB, seed=21), data(MIB + 1, seed=22)]
    up = s3.create_multipart_upload(Bucket=bucket, Key="mp/obj", ContentType="text/x-parts", Metadata={"a": "b"})
    upload_id = up["UploadId"]

    etags = {}
    for number in (3, 1, 2):  # parts may arrive in any order
        resp = s3.upload_part(Bucket=bucket, Key="mp/obj", UploadId=upload_id, PartNumber=number, Body=parts[number - 1])
        etags[number] = resp["ETag"]
        assert resp["ETag"] == etag(parts[number - 1])

    listed = s3.list_parts(Bucket=bucket, Key="mp/obj", UploadId=upload_id)
    assert [(p["PartNumber"], p["Size"], p["ETag"]) for p in listed["Parts"]] == [
        (n, len(parts[n - 1]), etag(parts[n - 1])) for n in (1, 2, 3)
    ]
    uploads = s3.list_multipart_uploads(Bucket=bucket).get("Uploads", [])
    assert [(u["Key"], u["UploadId"]) for u in uploads] == [("mp/obj", upload_id)]
    with s3_error("404"):
        s3.head_object(Bucket=bucket, Key="mp/obj")  # not visible before completion

    done = s3.complete_multipart_upload(
        Bucket=bucket, Key="mp/obj", UploadId=upload_id,
        MultipartUpload={"Parts": [{"PartNumber": n, "ETag": etags[n]} for n in (1, 2, 3)]},
    )
    assert done["ETag"] == multipart_etag(parts)
    got = s3.get_object(Bucket=bucket, Key="mp/obj")
    assert got["ETag"] == multipart_etag(parts)
    assert (got["ContentType"], got["Metadata"]) == ("text/x-parts", {"a": "b"})
    assert sha(got["Body"].read()) == sha(b"".join(parts))
    assert s3.list_multipart_uploads(Bucket=bucket).get("Uploads", []) == []

    # Part-number reads (parallel downloaders): each part with its Content-Range and the parts
    # count; a part past the end is S3's 416 InvalidPartNumber, never the whole object.
    total, offset = sum(len(p) for p in parts), 0
    for number, part in enumerate(parts, start=1):
        got = s3.get_object(Bucket=bucket, Key="mp/obj", PartNumber=number)
        assert sha(got["Body"].read()) == sha(part)
        assert (got["PartsCount"], got["ContentLength"]) == (3, len(part))
        assert got["ContentRange"] == f"bytes {offset}-{offset + len(part) - 1}/{total}"
        head = s3.head_object(Bucket=bucket, Key="mp/obj", PartNumber=number)
        assert (head["PartsCount"], head["ContentLength"]) == (3, len(part))
        offset += len(part)
    with s3_error("InvalidPartNumber", 416):
        s3.get_object(Bucket=bucket, Key="mp/obj", PartNumber=4)
    with s3_error("416"):  # a HEAD answer has no body to carry the code
        s3.head_object(Bucket=bucket, Key="mp/obj", PartNumber=4)
    # A single-piece object is one part.
    s3.put_object(Bucket=bucket, Key="single", Body=b"one piece")
    single = s3.get_object(Bucket=bucket, Key="single", PartNumber=1)  # a ranged read of all of it
    assert (single["ResponseMetadata"]["HTTPStatusCode"], single["ContentRange"]) == (206, "bytes 0-8/9")
    assert single["Body"].read() == b"one piece"
    with s3_error("InvalidPartNumber", 416):
        s3.get_object(Bucket=bucket, Key="single", PartNumber=2)


def test_upload_part_copy_takes_a_range_inside_the_source_and_refuses_others(s3, bucket):
    source = data(MIB, seed=31)
    s3.put_object(Bucket=bucket, Key="src", Body=source)
    upload_id = s3.create_multipart_upload(Bucket=bucket, Key="dst")["UploadId"]
    copy = {"Bucket": bucket, "Key": "dst", "UploadId": upload_id, "PartNumber": 1,
            "CopySource": {"Bucket": bucket, "Key": "src"}}
    with s3_error("InvalidRange", 416):  # well formed, past the source's end
        s3.upload_part_copy(**copy, CopySourceRange=f"bytes=0-{MIB}")
    with s3_error("InvalidArgument", 400):  # not bytes=first-last
        s3.upload_part_copy(**copy, CopySourceRange="bytes=100-")
    tag = s3.upload_part_copy(**copy, CopySourceRange="bytes=100-1099")["CopyPartResult"]["ETag"]
    s3.complete_multipart_upload(Bucket=bucket, Key="dst", UploadId=upload_id,
                                 MultipartUpload={"Parts": [{"PartNumber": 1, "ETag": tag}]})
    assert s3.get_object(Bucket=bucket, Key="dst")["Body"].read() == source[100:1100]


def test_url_encoding_type_encodes_every_name_in_every_listing(s3, bucket):
    """`EncodingType=url` (which botocore decodes only when it set it itself): keys, prefixes,
    delimiters, markers and common prefixes come back form-encoded, as S3 and MinIO encode
    them: a space as `+`, `/` and `*` kept, the rest `%XX`."""
    keys = ["dir a/b+c%d~e", "dir a/plain*", "dir b/x y"]
    for key in keys:
        s3.put_object(Bucket=bucket, Key=key, Body=b"x")
    listed = s3.list_objects_v2(Bucket=bucket, Prefix="dir ", Delimiter=" ", EncodingType="url")
    assert (listed["EncodingType"], listed["Prefix"], listed["Delimiter"]) == ("url", "dir+", "+")
    assert listed["CommonPrefixes"] == [{"Prefix": "dir+b/x+"}]
    assert [o["Key"] for o in listed["Contents"]] == ["dir+a/b%2Bc%25d%7Ee", "dir+a/plain*"]
    page = s3.list_objects_v2(Bucket=bucket, StartAfter="dir a/b", MaxKeys=1, EncodingType="url")
    assert (page["StartAfter"], [o["Key"] for o in page["Contents"]]) == ("dir+a/b", ["dir+a/b%2Bc%25d%7Ee"])
    v1 = s3.list_objects(Bucket=bucket, Marker="dir a/b+", MaxKeys=1, EncodingType="url")
    assert (v1["Marker"], [o["Key"] for o in v1["Contents"]]) == ("dir+a/b%2B", ["dir+a/b%2Bc%25d%7Ee"])
    assert v1["NextMarker"] == "dir+a/b%2Bc%25d%7Ee"
    versions = s3.list_object_versions(Bucket=bucket, Prefix="dir b", EncodingType="url")
    assert [v["Key"] for v in versions["Versions"]] == ["dir+b/x+y"]
    # Without it, names come back as they are (botocore decodes what it asked encoded).
    assert [o["Key"] for o in s3.list_objects_v2(Bucket=bucket)["Contents"]] == sorted(keys)

    ids = [s3.create_multipart_upload(Bucket=bucket, Key=key)["UploadId"] for key in keys]
    try:
        uploads = s3.list_multipart_uploads(Bucket=bucket, Prefix="dir a/", MaxUploads=1, EncodingType="url")
        assert (uploads["EncodingType"], uploads["Prefix"]) == ("url", "dir+a/")
        assert [u["Key"] for u in uploads["Uploads"]] == ["dir+a/b%2Bc%25d%7Ee"]
        assert uploads["NextKeyMarker"] == "dir+a/b%2Bc%25d%7Ee"
        grouped = s3.list_multipart_uploads(Bucket=bucket, Delimiter="/", KeyMarker="dir a", EncodingType="url")
        assert (grouped["Delimiter"], grouped["KeyMarker"]) == ("/", "dir+a")
        assert grouped["CommonPrefixes"] == [{"Prefix": "dir+a/"}, {"Prefix": "dir+b/"}]
        plain = s3.list_multipart_uploads(Bucket=bucket, Prefix="dir b/")
        assert [u["Key"] for u in plain["Uploads"]] == ["dir b/x y"]
        with s3_error("InvalidArgument", 400):
            s3.list_multipart_uploads(Bucket=bucket, EncodingType="base64")
    finally:
        for key, upload_id in zip(keys, ids):
            s3.abort_multipart_upload(Bucket=bucket, Key=key, UploadId=upload_id)


def test_complete_multipart_upload_honours_if_none_match_and_if_match(s3, bucket):
    """Conditional Complete, as a conditional PUT: a failed condition is 412 and leaves the
    upload to complete later; a Complete retried after it succeeded (its answer lost) succeeds
    again with the same ETag, whatever the condition."""
    parts = [data(MIB, seed=40 + i) for i in range(3)]

    def upload(key, seed):
        upload_id = s3.create_multipart_upload(Bucket=bucket, Key=key)["UploadId"]
        tag = s3.upload_part(Bucket=bucket, Key=key, UploadId=upload_id, PartNumber=1, Body=parts[seed])["ETag"]
        return {"Bucket": bucket, "Key": key, "UploadId": upload_id,
                "MultipartUpload": {"Parts": [{"PartNumber": 1, "ETag": tag}]}}

    first = upload("cond", 0)
    created = s3.complete_multipart_upload(**first, IfNoneMatch="*")
    assert s3.complete_multipart_upload(**first, IfNoneMatch="*")["ETag"] == created["ETag"]  # a retry

    second = upload("cond", 1)
    with s3_error("PreconditionFailed", 412):
        s3.complete_multipart_upload(**second, IfNoneMatch="*")
    with s3_error("PreconditionFailed", 412):
        s3.complete_multipart_upload(**second, IfMatch='"0123456789abcdef0123456789abcdef-1"')
    assert [p["PartNumber"] for p in s3.list_parts(**{k: second[k] for k in ("Bucket", "Key", "UploadId")})["Parts"]] == [1]
    assert s3.head_object(Bucket=bucket, Key="cond")["ETag"] == created["ETag"]  # untouched
    replaced = s3.complete_multipart_upload(**second, IfMatch=created["ETag"])
    assert replaced["ETag"] != created["ETag"]
    assert s3.head_object(Bucket=bucket, Key="cond")["ETag"] == replaced["ETag"]
    assert s3.get_object(Bucket=bucket, Key="cond")["Body"].read() == parts[1]

    third = upload("absent", 2)
    with s3_error("NoSuchKey", 404):  # If-Match needs an object, as S3 answers
        s3.complete_multipart_upload(**third, IfMatch=created["ETag"])
    s3.abort_multipart_upload(**{k: third[k] for k in ("Bucket", "Key", "UploadId")})


def test_aborted_multipart_upload_leaves_nothing(s3, bucket):
    upload_id = s3.create_multipart_upload(Bucket=bucket, Key="obj")["UploadId"]
    s3.upload_part(Bucket=bucket, Key="obj", UploadId=upload_id, PartNumber=1, Body=data(MIB, seed=23))
    s3.abort_multipart_upload(Bucket=bucket, Key="obj", UploadId=upload_id)
    with s3_error("NoSuchUpload", 404):
        s3.list_parts(Bucket=bucket, Key="obj", UploadId=upload_id)
    with s3_error("NoSuchUpload", 404):
        s3.upload_part(Bucket=bucket, Key="obj", UploadId=upload_id, PartNumber=2, Body=b"x")
    assert s3.list_multipart_uploads(Bucket=bucket).get("Uploads", []) == []
    with s3_error("404"):
        s3.head_object(Bucket=bucket, Key="obj")


def _upload_parts(s3, bucket, key, bodies):
    upload_id = s3.create_multipart_upload(Bucket=bucket, Key=key)["UploadId"]
    tags = [
        s3.upload_part(Bucket=bucket, Key=key, UploadId=upload_id, PartNumber=n, Body=b)["ETag"]
        for n, b in enumerate(bodies, start=1)
    ]
    return upload_id, tags


def test_complete_multipart_upload_refuses_bad_part_lists(s3, bucket):
    # Both parts are 5 MiB so that no order of them is EntityTooSmall.
    upload_id, tags = _upload_parts(s3, bucket, "obj", [data(5 * MIB, seed=24), data(5 * MIB, seed=25)])

    def complete(parts):
        s3.complete_multipart_upload(Bucket=bucket, Key="obj", UploadId=upload_id, MultipartUpload={"Parts": parts})

    with s3_error("InvalidPart", 400):
        complete([{"PartNumber": 1, "ETag": tags[0]}, {"PartNumber": 2, "ETag": etag(b"not this part")}])
    with s3_error("InvalidPart", 400):
        complete([{"PartNumber": 1, "ETag": tags[0]}, {"PartNumber": 7, "ETag": tags[1]}])
    with s3_error("InvalidPartOrder", 400):
        complete([{"PartNumber": 2, "ETag": tags[1]}, {"PartNumber": 1, "ETag": tags[0]}])
    # The upload survives refused completions.
    complete([{"PartNumber": 1, "ETag": tags[0]}, {"PartNumber": 2, "ETag": tags[1]}])
    assert s3.head_object(Bucket=bucket, Key="obj")["ContentLength"] == 10 * MIB


def test_multipart_part_smaller_than_5_mib_before_the_last_is_entity_too_small(s3, bucket):
    upload_id, tags = _upload_parts(s3, bucket, "obj", [data(MIB, seed=26), data(MIB, seed=27)])
    with s3_error("EntityTooSmall", 400):
        s3.complete_multipart_upload(
            Bucket=bucket, Key="obj", UploadId=upload_id,
            MultipartUpload={"Parts": [{"PartNumber": n, "ETag": t} for n, t in enumerate(tags, start=1)]},
        )
    with s3_error("404"):
        s3.head_object(Bucket=bucket, Key="obj")


def test_upload_part_to_unknown_upload_is_no_such_upload(s3, bucket):
    with s3_error("NoSuchUpload", 404):
        s3.upload_part(Bucket=bucket, Key="obj", UploadId="no-such-upload", PartNumber=1, Body=b"x")


# ---------------------------------------------------------------------------------------------
# Batch delete


def test_delete_objects_quiet_reports_nothing_and_deletes(s3, bucket):
    keys = [f"q/{i}" for i in range(5)]
    _put_keys(s3, bucket, keys + ["keep"])
    out = s3.delete_objects(
        Bucket=bucket, Delete={"Objects": [{"Key": k} for k in keys + ["never-existed"]], "Quiet": True}
    )
    assert not out.get("Deleted") and not out.get("Errors")
    assert [o["Key"] for o in s3.list_objects_v2(Bucket=bucket)["Contents"]] == ["keep"]


def test_delete_objects_verbose_lists_deleted_keys(s3, bucket):
    _put_keys(s3, bucket, ["a", "b"])
    out = s3.delete_objects(Bucket=bucket, Delete={"Objects": [{"Key": "a"}, {"Key": "b"}]})
    assert sorted(d["Key"] for d in out["Deleted"]) == ["a", "b"]
    assert s3.list_objects_v2(Bucket=bucket)["KeyCount"] == 0
