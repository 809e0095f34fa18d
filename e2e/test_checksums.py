"""Flexible checksums kept with objects (S3's "Checking object integrity"): stored at upload,
returned with x-amz-checksum-mode: ENABLED, combined over multipart uploads as S3 defines.

Expected values are computed here, independently of the gateway: zlib (CRC32), awscrt (CRC32C,
CRC64NVME) and hashlib (SHA-1, SHA-256). botocore itself checks the returned checksum against
every whole-object GET body (response_checksum_validation=when_supported), so a wrong stored
value also fails the GETs of other suites.
"""

from __future__ import annotations

import base64
import hashlib
import zlib

import pytest
from awscrt import checksums as crt

from s3check import KIB, MIB, data, s3_error, sha, split

DIGESTS = {
    "CRC32": lambda b: zlib.crc32(b).to_bytes(4, "big"),
    "CRC32C": lambda b: crt.crc32c(b).to_bytes(4, "big"),
    "CRC64NVME": lambda b: crt.crc64nvme(b).to_bytes(8, "big"),
    "SHA1": lambda b: hashlib.sha1(b).digest(),
    "SHA256": lambda b: hashlib.sha256(b).digest(),
}


def b64(digest: bytes) -> str:
    return base64.b64encode(digest).decode()


def checksum(algorithm: str, body: bytes) -> str:
    return b64(DIGESTS[algorithm](body))


def composite(algorithm: str, parts: list[bytes]) -> str:
    """S3's COMPOSITE checksum: the checksum of the parts' binary checksums, then -N."""
    return f"{checksum(algorithm, b''.join(DIGESTS[algorithm](p) for p in parts))}-{len(parts)}"


def returned(response: dict) -> dict:
    """The checksum fields of a response."""
    return {k: v for k, v in response.items() if k.startswith("Checksum") and k != "ChecksumAlgorithm"}


@pytest.mark.parametrize(("checksums", "algorithm"), [
    ("header", "CRC32"),
    ("header", "SHA1"),
    ("trailer", "CRC32C"),
    ("trailer", "CRC64NVME"),
    ("trailer", "SHA256"),
])
def test_a_put_checksum_is_stored_and_returned_only_when_asked(make_client, bucket, checksums, algorithm):
    s3 = make_client(checksums=checksums)
    body = data(MIB + 7, seed=300)
    put = s3.put_object(Bucket=bucket, Key="obj", Body=body, ChecksumAlgorithm=algorithm)
    expected = {f"Checksum{algorithm}": checksum(algorithm, body), "ChecksumType": "FULL_OBJECT"}
    assert returned(put) == expected
    assert returned(s3.head_object(Bucket=bucket, Key="obj", ChecksumMode="ENABLED")) == expected
    assert returned(s3.head_object(Bucket=bucket, Key="obj")) == {}
    got = s3.get_object(Bucket=bucket, Key="obj", ChecksumMode="ENABLED")
    assert returned(got) == expected
    assert sha(got["Body"].read()) == sha(body)  # botocore checked the body against it, too
    # A byte range has no checksum of its own.
    ranged = s3.get_object(Bucket=bucket, Key="obj", ChecksumMode="ENABLED", Range="bytes=0-99")
    assert returned(ranged) == {}


def test_a_put_without_a_checksum_gets_crc64nvme_as_s3_adds_it(make_client, bucket):
    s3 = make_client(checksums="when_required")
    body = data(300 * KIB, seed=301)
    put = s3.put_object(Bucket=bucket, Key="plain", Body=body)
    expected = {"ChecksumCRC64NVME": checksum("CRC64NVME", body), "ChecksumType": "FULL_OBJECT"}
    assert returned(put) == expected
    assert returned(s3.head_object(Bucket=bucket, Key="plain", ChecksumMode="ENABLED")) == expected
    # An empty object too.
    s3.put_object(Bucket=bucket, Key="empty", Body=b"")
    head = s3.head_object(Bucket=bucket, Key="empty", ChecksumMode="ENABLED")
    assert returned(head) == {"ChecksumCRC64NVME": checksum("CRC64NVME", b""), "ChecksumType": "FULL_OBJECT"}


def test_the_checksum_mode_header_alone_asks_for_the_checksum(make_client, bucket):
    """A client that never validates responses still gets the checksum when it sends the mode."""
    s3 = make_client(checksums="when_required", response_checksum_validation="when_required")
    body = b"hello checksum mode"
    s3.put_object(Bucket=bucket, Key="k", Body=body, ChecksumCRC32=checksum("CRC32", body))
    assert "ChecksumCRC32" not in s3.get_object(Bucket=bucket, Key="k")
    assert s3.get_object(Bucket=bucket, Key="k", ChecksumMode="ENABLED")["ChecksumCRC32"] == checksum("CRC32", body)


def _upload_parts(s3, bucket, key, parts, upload_id, **extra):
    listed = []
    for number, part in enumerate(parts, start=1):
        resp = s3.upload_part(Bucket=bucket, Key=key, UploadId=upload_id, PartNumber=number, Body=part, **extra)
        entry = {"PartNumber": number, "ETag": resp["ETag"]}
        entry.update({k: v for k, v in returned(resp).items() if k != "ChecksumType"})
        listed.append(entry)
    return listed


@pytest.mark.parametrize("algorithm", ["CRC32", "SHA256"])
def test_a_composite_multipart_checksum_is_remembered_listed_and_combined(make_client, bucket, algorithm):
    s3 = make_client()
    parts = [data(5 * MIB, seed=310), data(123 * KIB + 5, seed=311)]
    created = s3.create_multipart_upload(Bucket=bucket, Key="mp", ChecksumAlgorithm=algorithm)
    assert (created["ChecksumAlgorithm"], created["ChecksumType"]) == (algorithm, "COMPOSITE")
    upload_id = created["UploadId"]
    # Part 1 with the checksum the SDK computes; part 2 from a client that sends none (the
    # gateway computes it).
    listed = _upload_parts(s3, bucket, "mp", parts[:1], upload_id, ChecksumAlgorithm=algorithm)
    bare = make_client(checksums="when_required")
    two = bare.upload_part(Bucket=bucket, Key="mp", UploadId=upload_id, PartNumber=2, Body=parts[1])
    assert two[f"Checksum{algorithm}"] == checksum(algorithm, parts[1])
    listed.append({"PartNumber": 2, "ETag": two["ETag"], f"Checksum{algorithm}": two[f"Checksum{algorithm}"]})
    assert listed[0][f"Checksum{algorithm}"] == checksum(algorithm, parts[0])

    page = s3.list_parts(Bucket=bucket, Key="mp", UploadId=upload_id)
    assert page["ChecksumAlgorithm"] == algorithm and page["ChecksumType"] == "COMPOSITE"
    assert [p[f"Checksum{algorithm}"] for p in page["Parts"]] == [checksum(algorithm, p) for p in parts]
    uploads = s3.list_multipart_uploads(Bucket=bucket)["Uploads"]
    assert [(u["UploadId"], u["ChecksumAlgorithm"], u["ChecksumType"]) for u in uploads] == [
        (upload_id, algorithm, "COMPOSITE")]

    done = s3.complete_multipart_upload(Bucket=bucket, Key="mp", UploadId=upload_id,
                                        MultipartUpload={"Parts": listed})
    expected = {f"Checksum{algorithm}": composite(algorithm, parts), "ChecksumType": "COMPOSITE"}
    assert returned(done) == expected
    assert returned(s3.head_object(Bucket=bucket, Key="mp", ChecksumMode="ENABLED")) == expected
    got = s3.get_object(Bucket=bucket, Key="mp", ChecksumMode="ENABLED")
    assert returned(got) == expected and sha(got["Body"].read()) == sha(b"".join(parts))
    # A part read returns the part's own checksum (botocore checks the part's bytes against it).
    part = s3.get_object(Bucket=bucket, Key="mp", PartNumber=2, ChecksumMode="ENABLED")
    assert part[f"Checksum{algorithm}"] == checksum(algorithm, parts[1])
    assert sha(part["Body"].read()) == sha(parts[1])


@pytest.mark.parametrize(("algorithm", "declared"), [("CRC64NVME", False), ("CRC32C", True), ("CRC32", True)])
def test_a_full_object_multipart_checksum_is_the_crc_of_the_whole_object(make_client, bucket, algorithm, declared):
    s3 = make_client(checksums="when_required")
    body = data(11 * MIB + 333, seed=320)
    parts = split(body, 5 * MIB)
    extra = {"ChecksumAlgorithm": algorithm, "ChecksumType": "FULL_OBJECT"} if declared else {}
    created = s3.create_multipart_upload(Bucket=bucket, Key="full", **extra)
    # An upload created without an algorithm lists none, as S3; its object still gets CRC64NVME.
    assert (created.get("ChecksumAlgorithm"), created.get("ChecksumType")) == (
        (algorithm, "FULL_OBJECT") if declared else (None, None))
    listed = _upload_parts(s3, bucket, "full", parts, created["UploadId"])
    done = s3.complete_multipart_upload(Bucket=bucket, Key="full", UploadId=created["UploadId"],
                                        MultipartUpload={"Parts": listed})
    expected = {f"Checksum{algorithm}": checksum(algorithm, body), "ChecksumType": "FULL_OBJECT"}
    assert returned(done) == expected
    assert returned(s3.head_object(Bucket=bucket, Key="full", ChecksumMode="ENABLED")) == expected
    checked = make_client()  # validates the whole body against the full-object checksum
    assert sha(checked.get_object(Bucket=bucket, Key="full")["Body"].read()) == sha(body)


def test_the_transfer_manager_uploads_with_the_sdks_default_checksum(make_client, bucket, tmp_path):
    """What boto3's upload_file sends by default (CRC32 per part, declared at creation)."""
    from boto3.s3.transfer import TransferConfig

    s3 = make_client()
    body = data(12 * MIB + 1, seed=325)
    src = tmp_path / "src"
    src.write_bytes(body)
    s3.upload_file(str(src), bucket, "tm", Config=TransferConfig(multipart_threshold=5 * MIB,
                                                                 multipart_chunksize=5 * MIB))
    head = s3.head_object(Bucket=bucket, Key="tm", ChecksumMode="ENABLED")
    (name, value), = ((k, v) for k, v in returned(head).items() if k != "ChecksumType")
    algorithm = name.removeprefix("Checksum")
    parts = split(body, 5 * MIB)
    wanted = composite(algorithm, parts) if head["ChecksumType"] == "COMPOSITE" else checksum(algorithm, body)
    assert value == wanted, (head["ChecksumType"], algorithm)


def test_complete_refuses_checksums_that_do_not_match_and_keeps_the_upload(make_client, bucket):
    s3 = make_client()
    parts = [data(5 * MIB, seed=330), data(10 * KIB, seed=331)]
    upload_id = s3.create_multipart_upload(Bucket=bucket, Key="k", ChecksumAlgorithm="CRC32",
                                           ChecksumType="FULL_OBJECT")["UploadId"]
    listed = _upload_parts(s3, bucket, "k", parts, upload_id, ChecksumAlgorithm="CRC32")
    wrong_part = [dict(listed[0], ChecksumCRC32=b64(b"\0\0\0\0")), listed[1]]
    with s3_error("InvalidPart", 400):
        s3.complete_multipart_upload(Bucket=bucket, Key="k", UploadId=upload_id,
                                     MultipartUpload={"Parts": wrong_part})
    with s3_error("BadDigest", 400):
        s3.complete_multipart_upload(Bucket=bucket, Key="k", UploadId=upload_id,
                                     MultipartUpload={"Parts": listed}, ChecksumCRC32=b64(b"\0\0\0\1"),
                                     ChecksumType="FULL_OBJECT")
    with s3_error("InvalidRequest", 400):
        s3.complete_multipart_upload(Bucket=bucket, Key="k", UploadId=upload_id,
                                     MultipartUpload={"Parts": listed}, ChecksumType="COMPOSITE")
    with s3_error("404"):
        s3.head_object(Bucket=bucket, Key="k")
    whole = checksum("CRC32", b"".join(parts))
    done = s3.complete_multipart_upload(Bucket=bucket, Key="k", UploadId=upload_id,
                                        MultipartUpload={"Parts": listed}, ChecksumCRC32=whole,
                                        ChecksumType="FULL_OBJECT")
    assert done["ChecksumCRC32"] == whole


def test_checksum_requests_s3_refuses(make_client, bucket):
    s3 = make_client()
    for algorithm, kind in (("SHA256", "FULL_OBJECT"), ("CRC64NVME", "COMPOSITE")):
        with s3_error("InvalidRequest", 400):
            s3.create_multipart_upload(Bucket=bucket, Key="k", ChecksumAlgorithm=algorithm, ChecksumType=kind)
    upload_id = s3.create_multipart_upload(Bucket=bucket, Key="k", ChecksumAlgorithm="SHA256")["UploadId"]
    with s3_error("InvalidRequest", 400):
        s3.upload_part(Bucket=bucket, Key="k", UploadId=upload_id, PartNumber=1, Body=b"x",
                       ChecksumCRC32=checksum("CRC32", b"x"))
    assert s3.list_parts(Bucket=bucket, Key="k", UploadId=upload_id).get("Parts", []) == []


def test_copies_carry_a_checksum_of_the_bytes_copied(make_client, bucket):
    s3 = make_client()
    body = data(2 * MIB + 11, seed=340)
    s3.put_object(Bucket=bucket, Key="src", Body=body, ChecksumAlgorithm="SHA256")
    copied = s3.copy_object(Bucket=bucket, Key="dst", CopySource={"Bucket": bucket, "Key": "src"})
    assert copied["CopyObjectResult"]["ChecksumSHA256"] == checksum("SHA256", body)
    head = s3.head_object(Bucket=bucket, Key="dst", ChecksumMode="ENABLED")
    assert returned(head) == {"ChecksumSHA256": checksum("SHA256", body), "ChecksumType": "FULL_OBJECT"}
    asked = s3.copy_object(Bucket=bucket, Key="dst2", CopySource={"Bucket": bucket, "Key": "src"},
                           ChecksumAlgorithm="CRC32C")
    assert asked["CopyObjectResult"]["ChecksumCRC32C"] == checksum("CRC32C", body)
    # A part copied into a declared upload gets the upload's checksum.
    upload_id = s3.create_multipart_upload(Bucket=bucket, Key="mp", ChecksumAlgorithm="CRC32")["UploadId"]
    part = s3.upload_part_copy(Bucket=bucket, Key="mp", UploadId=upload_id, PartNumber=1,
                               CopySource={"Bucket": bucket, "Key": "src"}, CopySourceRange="bytes=0-1023")
    assert part["CopyPartResult"]["ChecksumCRC32"] == checksum("CRC32", body[:1024])
    listed = s3.list_parts(Bucket=bucket, Key="mp", UploadId=upload_id)["Parts"]
    assert [p["ChecksumCRC32"] for p in listed] == [checksum("CRC32", body[:1024])]
    s3.abort_multipart_upload(Bucket=bucket, Key="mp", UploadId=upload_id)


def test_a_client_without_checksum_support_still_reads_everything(make_client, bucket):
    """Old clients: no flexible checksums sent, none validated; the gateway's answers stay plain."""
    old = make_client(checksums="when_required", response_checksum_validation="when_required")
    body = data(100 * KIB, seed=350)
    old.put_object(Bucket=bucket, Key="o", Body=body)
    got = old.get_object(Bucket=bucket, Key="o")
    assert returned(got) == {} and sha(got["Body"].read()) == sha(body)
