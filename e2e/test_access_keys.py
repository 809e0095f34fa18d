"""Scoped access keys (`tessera key create|ls|revoke`) enforced by the gateway, with boto3.

Each key is made with the CLI against the session's cluster (its records live in the cluster),
then used by a stock S3 client: what its permission allows in its buckets works, anything else
is AccessDenied, and a revoked key stops working.
"""

from __future__ import annotations

import json
import subprocess
import time

import urllib.error
import urllib.request

import pytest
from botocore.exceptions import ClientError

from conftest import TESSERA, Cluster
from s3check import unique_bucket_name

# The gateway's cache of a key lives s3::KEY_CACHE_TTL (5 s, counted from before its lookup),
# so a revoked key is refused 5 s after the revocation at most; the rest is slack for a loaded
# machine's request latency.
REVOKE_BOUND_S = 10.0


def tessera_key(cluster: Cluster, *args: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(TESSERA), "key", *args, "--config", str(cluster.config)],
        capture_output=True, text=True, timeout=60, check=check,
    )


def create_key(cluster: Cluster, *args: str) -> dict:
    made = json.loads(tessera_key(cluster, "create", *args, "--json").stdout)
    assert made["access_key"].startswith("TK") and len(made["secret_key"]) == 40, made
    return made


def error_code(call) -> str:
    with pytest.raises(ClientError) as info:
        call()
    return info.value.response["Error"]["Code"]


@pytest.fixture
def two_buckets(s3, request):
    names = [unique_bucket_name(f"{request.node.name}-{i}") for i in range(2)]
    for name in names:
        s3.create_bucket(Bucket=name)
        s3.put_object(Bucket=name, Key="hello.txt", Body=f"hello from {name}".encode())
    return names


def test_a_read_only_key_reads_its_buckets_and_nothing_else(cluster, make_client, two_buckets):
    mine, other = two_buckets
    made = create_key(cluster, "--bucket", mine, "--read-only", "--description", "e2e reader")
    assert made["buckets"] == [mine] and made["permission"] == "read-only"
    s3 = make_client(made["access_key"], made["secret_key"])

    assert s3.get_object(Bucket=mine, Key="hello.txt")["Body"].read() == f"hello from {mine}".encode()
    assert s3.head_object(Bucket=mine, Key="hello.txt")["ContentLength"] == len(f"hello from {mine}")
    assert [o["Key"] for o in s3.list_objects_v2(Bucket=mine)["Contents"]] == ["hello.txt"]
    assert [b["Name"] for b in s3.list_buckets()["Buckets"]] == [mine], "ListBuckets shows its buckets only"

    assert error_code(lambda: s3.put_object(Bucket=mine, Key="new.txt", Body=b"x")) == "AccessDenied"
    assert error_code(lambda: s3.delete_object(Bucket=mine, Key="hello.txt")) == "AccessDenied"
    assert error_code(lambda: s3.get_object(Bucket=other, Key="hello.txt")) == "AccessDenied"
    assert error_code(lambda: s3.list_objects_v2(Bucket=other)) == "AccessDenied"
    assert error_code(lambda: s3.create_bucket(Bucket=unique_bucket_name("by-reader"))) == "AccessDenied"
    assert error_code(lambda: s3.delete_bucket(Bucket=mine)) == "AccessDenied"

    # Presigned by the key: the signature is checked, then the same scope.
    url = s3.generate_presigned_url("get_object", Params={"Bucket": mine, "Key": "hello.txt"}, ExpiresIn=60)
    with urllib.request.urlopen(url, timeout=10) as answer:
        assert answer.read() == f"hello from {mine}".encode()
    url = s3.generate_presigned_url("put_object", Params={"Bucket": mine, "Key": "p.txt"}, ExpiresIn=60)
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(urllib.request.Request(url, data=b"x", method="PUT"), timeout=10)
    body = refused.value.read()
    assert refused.value.code == 403 and b"<Code>AccessDenied</Code>" in body, body

    root = make_client()
    assert error_code(lambda: root.head_object(Bucket=mine, Key="new.txt")) == "404", "the refused PUT stored nothing"
    assert root.get_object(Bucket=mine, Key="hello.txt")["Body"].read(), "the refused delete deleted nothing"
    tessera_key(cluster, "revoke", made["access_key"])


def test_a_read_write_key_writes_in_its_bucket_but_copies_only_from_buckets_it_reaches(
    cluster, make_client, two_buckets
):
    mine, other = two_buckets
    made = create_key(cluster, "--bucket", mine)
    s3 = make_client(made["access_key"], made["secret_key"])

    s3.put_object(Bucket=mine, Key="written.bin", Body=b"w" * 1000)
    upload = s3.create_multipart_upload(Bucket=mine, Key="parts.bin")["UploadId"]
    part = s3.upload_part(Bucket=mine, Key="parts.bin", UploadId=upload, PartNumber=1, Body=b"p" * 100)
    s3.complete_multipart_upload(
        Bucket=mine, Key="parts.bin", UploadId=upload,
        MultipartUpload={"Parts": [{"PartNumber": 1, "ETag": part["ETag"]}]},
    )
    assert s3.get_object(Bucket=mine, Key="parts.bin")["Body"].read() == b"p" * 100
    s3.copy_object(Bucket=mine, Key="copy.bin", CopySource={"Bucket": mine, "Key": "written.bin"})
    s3.delete_object(Bucket=mine, Key="copy.bin")

    # Reading `other` through a copy is reading it.
    code = error_code(lambda: s3.copy_object(Bucket=mine, Key="stolen.txt",
                                             CopySource={"Bucket": other, "Key": "hello.txt"}))
    assert code == "AccessDenied"
    assert error_code(lambda: s3.put_object(Bucket=other, Key="x", Body=b"x")) == "AccessDenied"
    assert error_code(lambda: s3.delete_bucket(Bucket=mine)) == "AccessDenied", "bucket admin is root's"

    wrong = make_client(made["access_key"], "x" * 40)
    assert error_code(lambda: wrong.get_object(Bucket=mine, Key="written.bin")) == "SignatureDoesNotMatch"
    tessera_key(cluster, "revoke", made["access_key"])


def test_batch_deletes_part_copies_and_upload_listings_stay_in_scope(cluster, make_client, two_buckets, localhost_subdomains):
    mine, other = two_buckets
    reader = create_key(cluster, "--bucket", mine, "--bucket", other, "--read-only")
    writer = create_key(cluster, "--bucket", mine)
    ro = make_client(reader["access_key"], reader["secret_key"])
    rw = make_client(writer["access_key"], writer["secret_key"])
    root = make_client()

    # DeleteObjects is a write, whatever keys it lists.
    assert error_code(lambda: ro.delete_objects(Bucket=mine, Delete={"Objects": [{"Key": "hello.txt"}]})) == "AccessDenied"
    assert root.head_object(Bucket=mine, Key="hello.txt")["ContentLength"] > 0

    # UploadPartCopy reads its source: from a bucket the writer does not reach, refused.
    upload = rw.create_multipart_upload(Bucket=mine, Key="copied.bin")["UploadId"]
    code = error_code(lambda: rw.upload_part_copy(Bucket=mine, Key="copied.bin", UploadId=upload, PartNumber=1,
                                                  CopySource={"Bucket": other, "Key": "hello.txt"}))
    assert code == "AccessDenied"
    part = rw.upload_part_copy(Bucket=mine, Key="copied.bin", UploadId=upload, PartNumber=1,
                               CopySource={"Bucket": mine, "Key": "hello.txt"})
    rw.complete_multipart_upload(Bucket=mine, Key="copied.bin", UploadId=upload, MultipartUpload={
        "Parts": [{"PartNumber": 1, "ETag": part["CopyPartResult"]["ETag"]}]})
    assert rw.get_object(Bucket=mine, Key="copied.bin")["Body"].read() == f"hello from {mine}".encode()

    # Uploads of a bucket out of reach are neither listed nor aborted.
    theirs = root.create_multipart_upload(Bucket=other, Key="theirs.bin")["UploadId"]
    assert error_code(lambda: rw.list_multipart_uploads(Bucket=other)) == "AccessDenied"
    assert error_code(lambda: rw.list_parts(Bucket=other, Key="theirs.bin", UploadId=theirs)) == "AccessDenied"
    assert error_code(lambda: rw.abort_multipart_upload(Bucket=other, Key="theirs.bin", UploadId=theirs)) == "AccessDenied"
    assert error_code(lambda: ro.abort_multipart_upload(Bucket=other, Key="theirs.bin", UploadId=theirs)) == "AccessDenied"
    root.abort_multipart_upload(Bucket=other, Key="theirs.bin", UploadId=theirs)

    # Virtual-host style addressing names the bucket in the Host header: the same scope.
    port = cluster.endpoint.rsplit(":", 1)[1]
    vhost = make_client(writer["access_key"], writer["secret_key"], addressing_style="virtual",
                        endpoint_url=f"http://localhost:{port}")
    assert vhost.get_object(Bucket=mine, Key="hello.txt")["Body"].read()
    assert error_code(lambda: vhost.get_object(Bucket=other, Key="hello.txt")) == "AccessDenied"
    for made in (reader, writer):
        tessera_key(cluster, "revoke", made["access_key"])


def test_ids_that_are_no_key_of_ours_are_unknown(make_client, bucket):
    for access_key in ["TK" + "0" * 18, "TKNOTAKEY0000000000", "AKIAIOSFODNN7EXAMPLE", "x" * 4000]:
        s3 = make_client(access_key, "y" * 40)
        assert error_code(lambda: s3.list_objects_v2(Bucket=bucket)) == "InvalidAccessKeyId", access_key


def test_an_all_buckets_key_reaches_buckets_made_after_it(cluster, make_client, two_buckets, s3):
    made = create_key(cluster, "--all-buckets", "--read-only")
    assert made["buckets"] == "*"
    later = unique_bucket_name("made-after-key")
    s3.create_bucket(Bucket=later)
    s3.put_object(Bucket=later, Key="k", Body=b"later")
    reader = make_client(made["access_key"], made["secret_key"])
    assert reader.get_object(Bucket=later, Key="k")["Body"].read() == b"later"
    listed = {b["Name"] for b in reader.list_buckets()["Buckets"]}
    assert {later, *two_buckets} <= listed
    assert error_code(lambda: reader.put_object(Bucket=later, Key="k", Body=b"no")) == "AccessDenied"
    tessera_key(cluster, "revoke", made["access_key"])


def test_a_revoked_key_is_refused_and_listed_no_more(cluster, make_client, two_buckets):
    mine, _ = two_buckets
    made = create_key(cluster, "--bucket", mine, "--description", "to revoke")
    s3 = make_client(made["access_key"], made["secret_key"])
    assert s3.get_object(Bucket=mine, Key="hello.txt")["Body"].read()

    listed = [json.loads(line) for line in tessera_key(cluster, "ls", "--json").stdout.splitlines()]
    mine_listed = [k for k in listed if k["access_key"] == made["access_key"]]
    assert mine_listed and mine_listed[0]["description"] == "to revoke"
    assert all("secret_key" not in k for k in listed), "ls never shows secrets"
    assert made["secret_key"] not in tessera_key(cluster, "ls").stdout

    revoked = tessera_key(cluster, "revoke", made["access_key"])
    assert "revoked" in revoked.stdout
    deadline = time.monotonic() + REVOKE_BOUND_S
    while True:
        try:
            s3.get_object(Bucket=mine, Key="hello.txt")
        except ClientError as e:
            assert e.response["Error"]["Code"] == "InvalidAccessKeyId", e.response
            break
        assert time.monotonic() < deadline, f"the revoked key still works after {REVOKE_BOUND_S} s"
        time.sleep(0.5)
    assert made["access_key"] not in tessera_key(cluster, "ls").stdout
    again = tessera_key(cluster, "revoke", made["access_key"], check=False)
    assert again.returncode != 0 and again.stderr.strip() == f"error: no access key {made['access_key']}"


def test_bad_key_requests_are_one_line_errors(cluster):
    # Argument errors come from the argument parser (with its usage line).
    for args, wanted in [(["create"], "--bucket"), (["create", "--bucket", "ok-bucket", "--all-buckets"], "cannot be used with")]:
        done = tessera_key(cluster, *args, check=False)
        assert done.returncode != 0 and wanted in done.stderr, (args, done.stderr)
    cases = [
        (["create", "--bucket", "Not_A_Bucket"], "invalid bucket name"),
        (["create", "--all-buckets", "--description", "a\nb"], "control characters"),
        (["revoke", "../../etc/passwd"], "no access key ../../etc/passwd"),
    ]
    for args, wanted in cases:
        done = tessera_key(cluster, *args, check=False)
        assert done.returncode != 0, args
        lines = done.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("error: ") and wanted in lines[0], (args, done.stderr)
