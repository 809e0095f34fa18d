"""aws-cli v1 against the gateway: `aws s3` (high level, s3transfer) and `aws s3api`."""

from __future__ import annotations

import json
import os
import time

from s3check import MIB, data, etag, multipart_etag, split


def test_mb_cp_ls_rm_rb_round_trip(aws, bucket_name, tmp_path):
    body = data(300_000, seed=1)
    src = tmp_path / "hello.bin"
    src.write_bytes(body)

    assert f"make_bucket: {bucket_name}" in aws("s3", "mb", f"s3://{bucket_name}").stdout
    assert bucket_name in aws("s3", "ls").stdout
    aws("s3", "cp", src, f"s3://{bucket_name}/dir/hello.bin")

    listing = aws("s3", "ls", f"s3://{bucket_name}/dir/").stdout
    assert "hello.bin" in listing and str(len(body)) in listing
    assert "PRE dir/" in aws("s3", "ls", f"s3://{bucket_name}").stdout

    dst = tmp_path / "copy.bin"
    aws("s3", "cp", f"s3://{bucket_name}/dir/hello.bin", dst)
    assert dst.read_bytes() == body

    aws("s3", "rm", f"s3://{bucket_name}/dir/hello.bin")
    # `aws s3 ls` exits 1 when nothing matches.
    after = aws("s3", "ls", f"s3://{bucket_name}/dir/", check=False)
    assert "hello.bin" not in after.stdout
    aws("s3", "rb", f"s3://{bucket_name}")
    assert bucket_name not in aws("s3", "ls").stdout


def test_cp_multipart_upload_round_trips_and_etag_counts_parts(aws, aws_env, bucket, tmp_path):
    config = tmp_path / "aws-config"
    config.write_text("[default]\ns3 =\n    multipart_threshold = 5MB\n    multipart_chunksize = 5MB\n")
    env = {**aws_env, "AWS_CONFIG_FILE": str(config)}
    body = data(20 * MIB, seed=2)  # aws-cli's "5MB" is 5 MiB: 4 parts
    src = tmp_path / "big.bin"
    src.write_bytes(body)

    aws("s3", "cp", src, f"s3://{bucket}/big.bin", env=env)
    head = aws.json("s3api", "head-object", "--bucket", bucket, "--key", "big.bin")
    assert head["ContentLength"] == len(body)
    assert head["ETag"] == multipart_etag(split(body, 5 * MIB))

    dst = tmp_path / "back.bin"
    aws("s3", "cp", f"s3://{bucket}/big.bin", dst, env=env)  # ranged GETs above the threshold
    assert dst.stat().st_size == len(body)
    assert dst.read_bytes() == body


def _tree(root):
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def test_sync_uploads_changes_deletes_extras_and_downloads(aws, bucket, tmp_path):
    src = tmp_path / "src"
    (src / "a").mkdir(parents=True)
    (src / "b").mkdir()
    (src / "a" / "1.txt").write_bytes(b"one")
    (src / "a" / "2.txt").write_bytes(b"two")
    (src / "b" / "3.txt").write_bytes(b"three")
    # Old mtimes, so a second sync finds every remote copy newer and the sizes equal.
    old = time.time() - 3600
    for p in src.rglob("*.txt"):
        os.utime(p, (old, old))

    first = aws("s3", "sync", src, f"s3://{bucket}/tree/").stdout
    assert first.count("upload:") == 3, first
    again = aws("s3", "sync", src, f"s3://{bucket}/tree/").stdout
    assert "upload:" not in again, again

    (src / "a" / "2.txt").write_bytes(b"two, longer now")
    (src / "b" / "3.txt").unlink()
    third = aws("s3", "sync", src, f"s3://{bucket}/tree/", "--delete").stdout
    assert "upload:" in third and "a/2.txt" in third, third
    assert f"delete: s3://{bucket}/tree/b/3.txt" in third, third

    dst = tmp_path / "dst"
    aws("s3", "sync", f"s3://{bucket}/tree/", dst)
    assert _tree(dst) == _tree(src)


def test_s3api_put_object_with_content_type_and_metadata_then_head(aws, bucket, tmp_path):
    body = data(10_000, seed=3)
    src = tmp_path / "table.csv"
    src.write_bytes(body)
    put = aws.json("s3api", "put-object", "--bucket", bucket, "--key", "t/table.csv", "--body", src,
                   "--content-type", "text/csv", "--metadata", "owner=alice,purpose=e2e")
    assert put["ETag"] == etag(body)

    head = aws.json("s3api", "head-object", "--bucket", bucket, "--key", "t/table.csv")
    assert head["ContentLength"] == len(body)
    assert head["ContentType"] == "text/csv"
    assert head["ETag"] == etag(body)
    assert head["Metadata"] == {"owner": "alice", "purpose": "e2e"}
    assert "LastModified" in head


def test_s3api_list_objects_v2_with_delimiter_and_prefix(aws, bucket, tmp_path):
    src = tmp_path / "x"
    src.write_bytes(b"x")
    for key in ("a/1", "a/2", "b/c/3", "top"):
        aws("s3api", "put-object", "--bucket", bucket, "--key", key, "--body", src)

    root = aws.json("s3api", "list-objects-v2", "--bucket", bucket, "--delimiter", "/")
    assert [o["Key"] for o in root["Contents"]] == ["top"]
    assert [p["Prefix"] for p in root["CommonPrefixes"]] == ["a/", "b/"]

    under_a = aws.json("s3api", "list-objects-v2", "--bucket", bucket, "--prefix", "a/", "--delimiter", "/")
    assert [o["Key"] for o in under_a["Contents"]] == ["a/1", "a/2"]
    assert "CommonPrefixes" not in under_a or under_a["CommonPrefixes"] == []

    everything = aws.json("s3api", "list-objects-v2", "--bucket", bucket)
    assert [o["Key"] for o in everything["Contents"]] == ["a/1", "a/2", "b/c/3", "top"]
    assert all(o["Size"] == 1 for o in everything["Contents"])


def test_s3api_get_object_range(aws, bucket, tmp_path):
    body = data(6 * MIB + 7, seed=4)  # more than one stripe (4 x 1 MiB chunks)
    src = tmp_path / "obj"
    src.write_bytes(body)
    aws("s3api", "put-object", "--bucket", bucket, "--key", "obj", "--body", src)

    start, end = 4 * MIB - 10, 4 * MIB + 9  # across the first stripe boundary
    out = tmp_path / "part"
    got = aws.json("s3api", "get-object", "--bucket", bucket, "--key", "obj", "--range", f"bytes={start}-{end}", out)
    assert got["ContentRange"] == f"bytes {start}-{end}/{len(body)}"
    assert got["ContentLength"] == 20
    assert out.read_bytes() == body[start:end + 1]


def test_s3api_copy_object_keeps_or_replaces_metadata(aws, bucket, tmp_path):
    body = data(2 * MIB, seed=5)
    src = tmp_path / "src"
    src.write_bytes(body)
    aws("s3api", "put-object", "--bucket", bucket, "--key", "orig", "--body", src,
        "--content-type", "application/x-orig", "--metadata", "k=v")

    copied = aws.json("s3api", "copy-object", "--bucket", bucket, "--key", "copy", "--copy-source", f"{bucket}/orig")
    assert copied["CopyObjectResult"]["ETag"] == etag(body)
    head = aws.json("s3api", "head-object", "--bucket", bucket, "--key", "copy")
    assert (head["ContentType"], head["Metadata"]) == ("application/x-orig", {"k": "v"})
    out = tmp_path / "out"
    aws("s3api", "get-object", "--bucket", bucket, "--key", "copy", out)
    assert out.read_bytes() == body

    aws("s3api", "copy-object", "--bucket", bucket, "--key", "replaced", "--copy-source", f"{bucket}/orig",
        "--metadata-directive", "REPLACE", "--content-type", "text/plain", "--metadata", "new=yes")
    head = aws.json("s3api", "head-object", "--bucket", bucket, "--key", "replaced")
    assert (head["ContentType"], head["Metadata"]) == ("text/plain", {"new": "yes"})
    assert head["ETag"] == etag(body)


def test_s3api_delete_objects_reports_each_key(aws, bucket, tmp_path):
    src = tmp_path / "x"
    src.write_bytes(b"x")
    for key in ("d/1", "d/2", "keep"):
        aws("s3api", "put-object", "--bucket", bucket, "--key", key, "--body", src)

    request = {"Objects": [{"Key": "d/1"}, {"Key": "d/2"}, {"Key": "never-existed"}]}
    out = aws.json("s3api", "delete-objects", "--bucket", bucket, "--delete", json.dumps(request))
    # S3 reports a key that did not exist as deleted too.
    assert sorted(d["Key"] for d in out["Deleted"]) == ["d/1", "d/2", "never-existed"]
    assert not out.get("Errors")
    left = aws.json("s3api", "list-objects-v2", "--bucket", bucket)
    assert [o["Key"] for o in left["Contents"]] == ["keep"]


def test_cp_mv_rm_recursive_between_prefixes(aws, aws_env, bucket, tmp_path):
    config = tmp_path / "aws-config"
    config.write_text("[default]\ns3 =\n    multipart_threshold = 5MB\n    multipart_chunksize = 5MB\n")
    env = {**aws_env, "AWS_CONFIG_FILE": str(config)}
    big, small = data(12 * MIB, seed=6), data(1000, seed=7)
    (tmp_path / "big").write_bytes(big)
    (tmp_path / "small").write_bytes(small)
    aws("s3", "cp", tmp_path / "big", f"s3://{bucket}/src/big", env=env)
    aws("s3", "cp", tmp_path / "small", f"s3://{bucket}/src/small", env=env)

    # Server-side copies: CopyObject below the threshold, UploadPartCopy above it.
    aws("s3", "cp", f"s3://{bucket}/src/", f"s3://{bucket}/copy/", "--recursive", env=env)
    aws("s3", "mv", f"s3://{bucket}/copy/small", f"s3://{bucket}/moved/small", env=env)
    keys = [o["Key"] for o in aws.json("s3api", "list-objects-v2", "--bucket", bucket)["Contents"]]
    assert keys == ["copy/big", "moved/small", "src/big", "src/small"]
    aws("s3", "cp", f"s3://{bucket}/copy/big", tmp_path / "big.back", env=env)
    assert (tmp_path / "big.back").read_bytes() == big
    aws("s3", "cp", f"s3://{bucket}/moved/small", tmp_path / "small.back")
    assert (tmp_path / "small.back").read_bytes() == small

    aws("s3", "rm", f"s3://{bucket}/src/", "--recursive")
    keys = [o["Key"] for o in aws.json("s3api", "list-objects-v2", "--bucket", bucket)["Contents"]]
    assert keys == ["copy/big", "moved/small"]
