"""Differential conformance (issue 15, item 8): the same S3 requests against Tessera's gateway
and a MinIO server started here, comparing what each answers (status, error code, and the
fields a client acts on).

`make conformance` runs it: it builds MinIO once (`go install`, cached in bench/.cache, as the
benchmarks do) and sets TESSERA_MINIO to the binary. Without it every case is skipped, with
that reason, so the normal e2e run does not need Go.

Where Tessera answers differently on purpose, `DIFFERENCES` names the case, both answers and
why; such a case checks that the difference is still exactly that, so a change on either side
shows. The rule: AWS's documented behaviour wins over MinIO's; accepting more than AWS is fine
where it loses nothing, and is documented.
"""

from __future__ import annotations

import datetime as dt
import os
import secrets
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlparse

import boto3
import pytest
from botocore.config import Config
from botocore.exceptions import ClientError
from s3check import KIB, MIB, data, unique_bucket_name
from test_raw_http import _put_chunked, _put_signed_ago, _request_id, _send_full

MINIO = os.environ.get("TESSERA_MINIO", "")
READY_TIMEOUT_S = 30.0

pytestmark = pytest.mark.skipif(
    not (MINIO and os.access(MINIO, os.X_OK)),
    reason="differential suite: run `make conformance` (builds MinIO and sets TESSERA_MINIO)",
)


@dataclass
class Side:
    """One S3 endpoint under test."""

    name: str
    endpoint: str
    access_key: str
    secret_key: str

    def client(self, **config) -> boto3.client:
        cfg = Config(region_name="us-east-1", signature_version="s3v4", s3={"addressing_style": "path"},
                     retries={"max_attempts": 1, "mode": "standard"}, connect_timeout=5, read_timeout=60, **config)
        return boto3.session.Session().client("s3", endpoint_url=self.endpoint, aws_access_key_id=self.access_key,
                                              aws_secret_access_key=self.secret_key, config=cfg)


@pytest.fixture(scope="session")
def minio_side():
    work = Path(tempfile.mkdtemp(prefix="tessera-differential-minio-"))
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        console = s.getsockname()[1]
    access, secret = "DIFFMINIO" + secrets.token_hex(4).upper(), secrets.token_hex(20)
    env = dict(os.environ, MINIO_ROOT_USER=access, MINIO_ROOT_PASSWORD=secret, MINIO_BROWSER="off",
               MINIO_UPDATE="off", MINIO_REGION="us-east-1")
    log = open(work / "minio.log", "wb")
    proc = subprocess.Popen([MINIO, "server", "--quiet", "--address", f"127.0.0.1:{port}",
                             "--console-address", f"127.0.0.1:{console}", str(work / "data")],
                            env=env, stdout=log, stderr=subprocess.STDOUT)
    side = Side("minio", f"http://127.0.0.1:{port}", access, secret)
    deadline = time.monotonic() + READY_TIMEOUT_S
    while True:
        try:
            side.client().list_buckets()
            break
        except Exception:
            if proc.poll() is not None or time.monotonic() > deadline:
                proc.kill()
                pytest.fail(f"MinIO did not start: see {work / 'minio.log'}")
            time.sleep(0.2)
    yield side
    proc.terminate()
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        proc.kill()
    log.close()
    shutil.rmtree(work, ignore_errors=True)


@pytest.fixture(scope="session")
def tessera_side(cluster):
    return Side("tessera", cluster.endpoint, cluster.access_key, cluster.secret_key)


def error(call: Callable[[], object]) -> tuple:
    """(status, error code) of a boto3 call: (status, None) when it succeeded."""
    try:
        response = call()
    except ClientError as e:
        return e.response["ResponseMetadata"]["HTTPStatusCode"], e.response["Error"].get("Code")
    return response["ResponseMetadata"]["HTTPStatusCode"], None


def xml_code(body: bytes) -> str | None:
    text = body.decode("utf-8", "replace")
    start = text.find("<Code>")
    return text[start + 6:text.find("</Code>")] if start >= 0 else None


def new_bucket(side: Side) -> tuple[boto3.client, str]:
    s3 = side.client()
    bucket = unique_bucket_name("diff")
    s3.create_bucket(Bucket=bucket)
    return s3, bucket


def multipart(s3, bucket: str, key: str, parts: list[bytes]) -> tuple[str, list[dict]]:
    upload_id = s3.create_multipart_upload(Bucket=bucket, Key=key)["UploadId"]
    done = [{"PartNumber": n, "ETag": s3.upload_part(Bucket=bucket, Key=key, UploadId=upload_id, PartNumber=n,
                                                     Body=body)["ETag"]}
            for n, body in enumerate(parts, start=1)]
    return upload_id, done


# ---- the cases: each takes a side and returns what a client would act on ----

def missing_key(side):
    s3, bucket = new_bucket(side)
    return error(lambda: s3.get_object(Bucket=bucket, Key="nope")), error(lambda: s3.delete_object(Bucket=bucket, Key="nope"))


def missing_bucket(side):
    s3 = side.client()
    return error(lambda: s3.get_object(Bucket=unique_bucket_name("never"), Key="k"))


def bucket_created_twice(side):
    s3, bucket = new_bucket(side)
    s3.put_object(Bucket=bucket, Key="kept", Body=b"x")
    again = error(lambda: s3.create_bucket(Bucket=bucket))
    return again, s3.get_object(Bucket=bucket, Key="kept")["Body"].read()


def list_buckets_paged(side):
    s3, bucket = new_bucket(side)
    s3.create_bucket(Bucket=bucket + "-b")
    page = s3.list_buckets(MaxBuckets=1, Prefix=bucket)
    return [b["Name"] for b in page["Buckets"]] == [bucket], "ContinuationToken" in page


def part_number_reads(side):
    s3, bucket = new_bucket(side)
    parts = [data(5 * MIB, seed=70), data(KIB, seed=71)]
    upload_id, done = multipart(s3, bucket, "mp", parts)
    s3.complete_multipart_upload(Bucket=bucket, Key="mp", UploadId=upload_id, MultipartUpload={"Parts": done})
    got = s3.get_object(Bucket=bucket, Key="mp", PartNumber=2)
    s3.put_object(Bucket=bucket, Key="single", Body=b"one piece")
    single = s3.get_object(Bucket=bucket, Key="single", PartNumber=1)
    return ((got["ResponseMetadata"]["HTTPStatusCode"], got["PartsCount"], got["ContentRange"],
             got["Body"].read() == parts[1]),
            (single["ResponseMetadata"]["HTTPStatusCode"], single["Body"].read()),
            error(lambda: s3.get_object(Bucket=bucket, Key="mp", PartNumber=3)),
            error(lambda: s3.get_object(Bucket=bucket, Key="single", PartNumber=2)))


def copy_source_ranges(side):
    s3, bucket = new_bucket(side)
    s3.put_object(Bucket=bucket, Key="src", Body=data(MIB, seed=72))
    upload_id = s3.create_multipart_upload(Bucket=bucket, Key="dst")["UploadId"]
    copy = {"Bucket": bucket, "Key": "dst", "UploadId": upload_id, "PartNumber": 1,
            "CopySource": {"Bucket": bucket, "Key": "src"}}
    return (error(lambda: s3.upload_part_copy(**copy, CopySourceRange=f"bytes=0-{MIB}")),
            error(lambda: s3.upload_part_copy(**copy, CopySourceRange="bytes=100-1099")))


def complete_retried(side):
    s3, bucket = new_bucket(side)
    upload_id, done = multipart(s3, bucket, "mp", [data(KIB, seed=73)])
    complete = {"Bucket": bucket, "Key": "mp", "UploadId": upload_id, "MultipartUpload": {"Parts": done}}
    first = s3.complete_multipart_upload(**complete)["ETag"]
    again = error(lambda: s3.complete_multipart_upload(**complete))
    return again, s3.head_object(Bucket=bucket, Key="mp")["ETag"] == first


def complete_conditional(side):
    s3, bucket = new_bucket(side)
    s3.put_object(Bucket=bucket, Key="mp", Body=b"there")
    upload_id, done = multipart(s3, bucket, "mp", [data(KIB, seed=74)])
    complete = {"Bucket": bucket, "Key": "mp", "UploadId": upload_id, "MultipartUpload": {"Parts": done}}
    return (error(lambda: s3.complete_multipart_upload(**complete, IfNoneMatch="*")),
            error(lambda: s3.complete_multipart_upload(**complete, IfMatch='"00000000000000000000000000000000"')))


def presigned_validity(side):
    s3, bucket = new_bucket(side)
    s3.put_object(Bucket=bucket, Key="k", Body=b"x")

    def answer(expires: int) -> tuple:
        url = s3.generate_presigned_url("get_object", Params={"Bucket": bucket, "Key": "k"}, ExpiresIn=60)
        status, _, body = _send_full(url.replace("X-Amz-Expires=60", f"X-Amz-Expires={expires}"))
        return status, xml_code(body)

    # The signature covers X-Amz-Expires: a changed one fails it unless the bound is checked first.
    return answer(604801), answer(-1)


def presigned_expired(side):
    s3, bucket = new_bucket(side)
    s3.put_object(Bucket=bucket, Key="k", Body=b"x")
    url = s3.generate_presigned_url("get_object", Params={"Bucket": bucket, "Key": "k"}, ExpiresIn=1)
    time.sleep(2.1)
    status, _, body = _send_full(url)
    return status, xml_code(body)


def stale_signed_put(side):
    s3, bucket = new_bucket(side)
    status, answer_headers, answer = _put_signed_ago(side.endpoint, side.access_key, side.secret_key,
                                                     f"/{bucket}/stale", b"signed long ago", dt.timedelta(minutes=20))
    return status, xml_code(answer), _request_id(answer) == answer_headers.get("x-amz-request-id")


def put_without_length(side):
    s3, bucket = new_bucket(side)
    url = s3.generate_presigned_url("put_object", Params={"Bucket": bucket, "Key": "streamed"}, ExpiresIn=300)
    parsed = urlparse(url)
    status, body = _put_chunked(url, f"{parsed.path}?{parsed.query}", {}, [b"a" * 1000, b"b" * 70000])
    return status, xml_code(body)


def url_encoded_listings(side):
    s3, bucket = new_bucket(side)
    keys = ["dir a/b+c%d~e", "dir a/plain*", "dir b/x y", "é/ü"]
    for key in keys:
        s3.put_object(Bucket=bucket, Key=key, Body=b"x")
    v2 = s3.list_objects_v2(Bucket=bucket, Prefix="dir ", Delimiter=" ", EncodingType="url")
    v1 = s3.list_objects(Bucket=bucket, EncodingType="url")
    uploads = [s3.create_multipart_upload(Bucket=bucket, Key=key)["UploadId"] for key in keys]
    listed = s3.list_multipart_uploads(Bucket=bucket, EncodingType="url")
    for key, upload_id in zip(keys, uploads):
        s3.abort_multipart_upload(Bucket=bucket, Key=key, UploadId=upload_id)
    return ((v2["Prefix"], v2["Delimiter"], [p["Prefix"] for p in v2["CommonPrefixes"]],
             [o["Key"] for o in v2["Contents"]]),
            [o["Key"] for o in v1["Contents"]],
            sorted(u["Key"] for u in listed["Uploads"]),
            error(lambda: s3.list_objects_v2(Bucket=bucket, EncodingType="base64")))


def bad_checksums(side):
    s3, bucket = new_bucket(side)
    plain = side.client(request_checksum_calculation="when_required")
    wrong = error(lambda: plain.put_object(Bucket=bucket, Key="k", Body=b"body", ChecksumCRC32="AAAAAA=="))
    malformed = error(lambda: plain.put_object(Bucket=bucket, Key="k", Body=b"body", ChecksumCRC32="not base64!"))
    two = error(lambda: plain.put_object(Bucket=bucket, Key="k", Body=b"body", ChecksumCRC32="AAAAAA==",
                                         ChecksumCRC32C="AAAAAA=="))
    kept = error(lambda: s3.head_object(Bucket=bucket, Key="k"))
    return wrong, malformed, two, kept


def _checksum_fields(response: dict) -> dict:
    return {k: v for k, v in response.items() if k.startswith("Checksum")}


def stored_checksums(side):
    s3, bucket = new_bucket(side)
    plain = side.client(request_checksum_calculation="when_required")
    body = b"checksummed body"
    s3.put_object(Bucket=bucket, Key="sent", Body=body, ChecksumAlgorithm="CRC32C")
    plain.put_object(Bucket=bucket, Key="none", Body=body)
    return (_checksum_fields(s3.head_object(Bucket=bucket, Key="sent", ChecksumMode="ENABLED")),
            _checksum_fields(s3.head_object(Bucket=bucket, Key="sent")),
            _checksum_fields(plain.head_object(Bucket=bucket, Key="none", ChecksumMode="ENABLED")))


def multipart_checksums(side):
    s3, bucket = new_bucket(side)
    answers = []
    for algorithm, kind in (("CRC32", "COMPOSITE"), ("CRC32C", "FULL_OBJECT")):
        created = s3.create_multipart_upload(Bucket=bucket, Key=kind, ChecksumAlgorithm=algorithm, ChecksumType=kind)
        upload_id = created["UploadId"]
        parts = []
        for number, body in enumerate((b"a" * (5 << 20), b"tail"), start=1):
            resp = s3.upload_part(Bucket=bucket, Key=kind, UploadId=upload_id, PartNumber=number, Body=body,
                                  ChecksumAlgorithm=algorithm)
            parts.append({"PartNumber": number, "ETag": resp["ETag"], f"Checksum{algorithm}": resp[f"Checksum{algorithm}"]})
        listed = s3.list_parts(Bucket=bucket, Key=kind, UploadId=upload_id)
        done = s3.complete_multipart_upload(Bucket=bucket, Key=kind, UploadId=upload_id,
                                            MultipartUpload={"Parts": parts})
        head = s3.head_object(Bucket=bucket, Key=kind, ChecksumMode="ENABLED")
        answers.append((
            (created.get("ChecksumAlgorithm"), created.get("ChecksumType")),
            (listed.get("ChecksumAlgorithm"), [p.get(f"Checksum{algorithm}") for p in listed["Parts"]]),
            _checksum_fields(done), _checksum_fields(head),
        ))
    return answers


CASES = {f.__name__: f for f in (
    missing_key, missing_bucket, bucket_created_twice, list_buckets_paged, part_number_reads, copy_source_ranges,
    complete_retried, complete_conditional, presigned_validity, presigned_expired, stale_signed_put,
    put_without_length, url_encoded_listings, bad_checksums, stored_checksums, multipart_checksums,
)}

# Case -> (Tessera's answer, MinIO's answer, why they differ). Checked exactly.
DIFFERENCES: dict[str, tuple[object, object, str]] = {
    "bucket_created_twice": (
        ((200, None), b"x"), ((409, "BucketAlreadyOwnedByYou"), b"x"),
        "AWS in us-east-1 (the gateway's default region) answers 200 and leaves the bucket as it "
        "was; elsewhere BucketAlreadyOwnedByYou (tessera gateway --region)",
    ),
    "list_buckets_paged": (
        (True, True), (False, False),
        "AWS pages ListBuckets (max-buckets, prefix, continuation-token, since 2024); MinIO ignores them",
    ),
    "complete_retried": (
        ((200, None), True), ((404, "NoSuchUpload"), True),
        "AWS answers a CompleteMultipartUpload retried after it succeeded with success (a client "
        "whose answer was lost retries it); MinIO has forgotten the upload",
    ),
    "copy_source_ranges": (
        ((416, "InvalidRange"), (200, None)), ((400, "InvalidArgument"), (200, None)),
        "AWS answers a well-formed x-amz-copy-source-range past the source with 416 InvalidRange",
    ),
    "put_without_length": (
        (200, None), (411, "MissingContentLength"),
        "accepting a chunked PUT without Content-Length loses nothing (Ceph RGW does too); AWS and "
        "MinIO answer 411",
    ),
    "bad_checksums": (
        ((400, "BadDigest"), (400, "InvalidRequest"), (400, "InvalidRequest"), (404, "404")),
        ((400, "XAmzContentChecksumMismatch"), (400, "InvalidArgument"), (400, "InvalidArgument"), (404, "404")),
        "AWS answers a wrong x-amz-checksum-* value with BadDigest, a malformed one with InvalidRequest "
        "('Value for x-amz-checksum-crc32 header is invalid.') and two algorithms at once with "
        "InvalidRequest ('Expecting a single x-amz-checksum- header'); MinIO with its own codes",
    ),
    "stored_checksums": (
        ({"ChecksumCRC32C": "TN0j2Q==", "ChecksumType": "FULL_OBJECT"}, {},
         {"ChecksumCRC64NVME": "x9P/nHUVchk=", "ChecksumType": "FULL_OBJECT"}),
        ({"ChecksumCRC32C": "TN0j2Q==", "ChecksumType": "FULL_OBJECT"}, {}, {}),
        "AWS stores a CRC64NVME checksum with every object uploaded without one (since 2025) and "
        "returns it with x-amz-checksum-mode; MinIO stores none",
    ),
    "multipart_checksums": (
        [(("CRC32", "COMPOSITE"), ("CRC32", ["r/zBbw==", "fDe0XQ=="]),
          {"ChecksumCRC32": "4fn9rQ==-2", "ChecksumType": "COMPOSITE"},
          {"ChecksumCRC32": "4fn9rQ==-2", "ChecksumType": "COMPOSITE"}),
         (("CRC32C", "FULL_OBJECT"), ("CRC32C", ["WpuOeg==", "B21LrQ=="]),
          {"ChecksumCRC32C": "7lzcuA==", "ChecksumType": "FULL_OBJECT"},
          {"ChecksumCRC32C": "7lzcuA==", "ChecksumType": "FULL_OBJECT"})],
        [(("CRC32", "COMPOSITE"), ("CRC32", ["r/zBbw==", "fDe0XQ=="]),
          {"ChecksumCRC32": "4fn9rQ==-2"}, {"ChecksumCRC32": "4fn9rQ==-2", "ChecksumType": "COMPOSITE"}),
         (("CRC32C", "FULL_OBJECT"), ("CRC32C", ["WpuOeg==", "B21LrQ=="]),
          {"ChecksumCRC32C": "7lzcuA=="}, {"ChecksumCRC32C": "7lzcuA==", "ChecksumType": "FULL_OBJECT"})],
        "equal values (composite and full-object); AWS's CompleteMultipartUpload answer also names "
        "the ChecksumType, MinIO's leaves it out",
    ),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_tessera_answers_as_minio_or_as_documented(case, tessera_side, minio_side):
    ours, theirs = CASES[case](tessera_side), CASES[case](minio_side)
    if case in DIFFERENCES:
        expected_ours, expected_theirs, why = DIFFERENCES[case]
        assert (ours, theirs) == (expected_ours, expected_theirs), f"the documented difference changed ({why})"
    else:
        assert ours == theirs, f"Tessera {ours!r}, MinIO {theirs!r}"
