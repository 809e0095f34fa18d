"""The gateway is a smart client: with up to m = 2 of 6 nodes SIGKILLed, S3 reads return the right bytes.

Every test restarts the nodes it killed (Cluster.nodes_down), so later tests see a healthy cluster.
"""

from __future__ import annotations

from boto3.s3.transfer import TransferConfig
from botocore.exceptions import ClientError

from s3check import MIB, data, etag, s3_error, sha


def test_get_with_two_nodes_killed_returns_the_right_bytes(cluster, s3, bucket):
    body = data(10 * MIB + 4321, seed=40)  # 3 stripes of 4 x 1 MiB data chunks
    s3.put_object(Bucket=bucket, Key="obj", Body=body)

    with cluster.nodes_down(2, 5):
        got = s3.get_object(Bucket=bucket, Key="obj")
        assert (got["ContentLength"], got["ETag"]) == (len(body), etag(body))
        assert sha(got["Body"].read()) == sha(body)

        start, end = 4 * MIB - 100, 8 * MIB + 100  # every chunk of the middle stripe plus neighbours
        part = s3.get_object(Bucket=bucket, Key="obj", Range=f"bytes={start}-{end}")["Body"].read()
        assert sha(part) == sha(body[start:end + 1])

        assert s3.head_object(Bucket=bucket, Key="obj")["ContentLength"] == len(body)
        assert [o["Key"] for o in s3.list_objects_v2(Bucket=bucket)["Contents"]] == ["obj"]

    got = s3.get_object(Bucket=bucket, Key="obj")["Body"].read()
    assert sha(got) == sha(body)


def test_multipart_object_reads_back_with_two_other_nodes_killed(cluster, s3, bucket):
    body = data(11 * MIB, seed=41)
    src = cluster.dir / f"{bucket}.src"
    src.write_bytes(body)
    s3.upload_file(str(src), bucket, "mp", Config=TransferConfig(multipart_threshold=5 * MIB, multipart_chunksize=5 * MIB))

    with cluster.nodes_down(1, 6):
        got = s3.get_object(Bucket=bucket, Key="mp")["Body"].read()
        assert sha(got) == sha(body)


def test_put_with_one_node_killed_succeeds_and_reads_back(cluster, s3, bucket):
    body = data(6 * MIB + 1, seed=42)
    with cluster.nodes_down(3):
        # W = 5 of 6 drives: one node down still acknowledges.
        assert s3.put_object(Bucket=bucket, Key="obj", Body=body)["ETag"] == etag(body)
        assert sha(s3.get_object(Bucket=bucket, Key="obj")["Body"].read()) == sha(body)
    assert sha(s3.get_object(Bucket=bucket, Key="obj")["Body"].read()) == sha(body)


def test_put_with_two_nodes_killed_fails_and_leaves_no_object(cluster, s3, bucket):
    with cluster.nodes_down(4, 6):
        try:
            s3.put_object(Bucket=bucket, Key="obj", Body=data(MIB, seed=43))
        except ClientError as e:
            status = e.response["ResponseMetadata"]["HTTPStatusCode"]
            assert 500 <= status <= 599, f"a PUT short of its write quorum should be a 5xx, got {status}: {e}"
        else:
            raise AssertionError("PUT with 4 of 6 drives reachable (W = 5) was acknowledged")
    with s3_error("404"):
        s3.head_object(Bucket=bucket, Key="obj")
    assert s3.list_objects_v2(Bucket=bucket)["KeyCount"] == 0


def test_bucket_created_with_two_nodes_killed_takes_writes_after_they_return(cluster, s3, bucket_name):
    with cluster.nodes_down(2, 5):
        s3.create_bucket(Bucket=bucket_name)  # a majority (4 of 6) of drives is reachable
    # nodes_down returned: the gateway writes to all 6 nodes again.
    s3.head_bucket(Bucket=bucket_name)
    body = data(2 * MIB, seed=44)
    s3.put_object(Bucket=bucket_name, Key="obj", Body=body)
    assert sha(s3.get_object(Bucket=bucket_name, Key="obj")["Body"].read()) == sha(body)


def test_bucket_created_with_one_node_killed_takes_writes_with_another_node_killed(cluster, s3, bucket_name):
    with cluster.nodes_down(1):
        s3.create_bucket(Bucket=bucket_name)
    with cluster.nodes_down(3):
        # 5 of 6 drives reachable is the write quorum, whichever node is missing.
        s3.put_object(Bucket=bucket_name, Key="obj", Body=b"written with n3 down")
    assert s3.get_object(Bucket=bucket_name, Key="obj")["Body"].read() == b"written with n3 down"
