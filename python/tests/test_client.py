"""The Client API against a real cluster: reads, zero-copy reads, writes, listings, errors,
pickling and fork."""

from __future__ import annotations

import io
import multiprocessing
import os
import pickle
import threading

import numpy as np
import pytest
import torch

import tessera


def payload(size: int, seed: int = 0) -> bytes:
    return np.random.default_rng(seed).integers(0, 256, size, dtype=np.uint8).tobytes()


def test_put_get_stat_delete_round_trip(client, bucket):
    data = payload(1_000_003)  # several 4 x 64 KiB stripes, last one partial
    info = client.put(bucket, "dir/obj.bin", data, content_type="application/x-test", metadata={"owner": "me"})
    assert info.size == len(data)
    assert client.get(bucket, "dir/obj.bin") == data
    stat = client.stat(bucket, "dir/obj.bin")
    assert (stat.size, stat.etag, stat.content_type) == (len(data), info.etag, "application/x-test")
    assert stat.user_meta == {"owner": "me"}
    assert (stat.k, stat.m) == (4, 2)
    client.delete(bucket, "dir/obj.bin")
    with pytest.raises(tessera.NotFound):
        client.get(bucket, "dir/obj.bin")


def test_empty_object_round_trips(client, bucket):
    client.put(bucket, "empty", b"")
    assert client.get(bucket, "empty") == b""
    assert client.get_into(bucket, "empty", bytearray(4)) == 0


@pytest.mark.parametrize("byte_range", [(0, 10), (70_000, 200_000), (999_990, None), range(5, 6), slice(100, 300_000)])
def test_get_with_range_returns_those_bytes(client, bucket, byte_range):
    data = payload(1_000_000, seed=1)
    client.put(bucket, "r", data)
    if isinstance(byte_range, tuple):
        start, stop = byte_range
    else:
        start, stop = byte_range.start, byte_range.stop
    assert client.get(bucket, "r", range=byte_range) == data[start:stop]


def test_get_into_bytearray_and_memoryview_at_offset(client, bucket):
    data = payload(300_000, seed=2)
    client.put(bucket, "x", data)
    buf = bytearray(100_000)
    assert client.get_into(bucket, "x", buf, offset=250_000) == 50_000
    assert buf[:50_000] == data[250_000:]
    view = memoryview(bytearray(300_000))[1000:2000]
    assert client.get_into(bucket, "x", view) == 1000
    assert bytes(view) == data[:1000]


def test_get_into_numpy_writes_in_place(client, bucket):
    values = np.arange(100_000, dtype=np.float32)
    client.put(bucket, "f32", values)  # any buffer, no copy
    target = np.zeros(100_000, dtype=np.float32)
    pointer = target.__array_interface__["data"][0]
    assert client.get_into(bucket, "f32", target) == values.nbytes
    assert target.__array_interface__["data"][0] == pointer
    np.testing.assert_array_equal(target, values)


def test_get_into_torch_tensor_writes_in_place(client, bucket):
    values = torch.arange(50_000, dtype=torch.float64)
    client.put(bucket, "f64", values.numpy())
    target = torch.empty(50_000, dtype=torch.float64)
    pointer = target.data_ptr()
    assert client.get_into(bucket, "f64", target) == 50_000 * 8
    assert target.data_ptr() == pointer
    assert torch.equal(target, values)
    # A dtype numpy lacks, through the tensor's bytes.
    bf = torch.zeros(1000, dtype=torch.bfloat16)
    pointer = bf.data_ptr()
    assert client.get_into(bucket, "f64", bf) == 2000
    assert bf.data_ptr() == pointer
    assert bf.view(torch.uint8).numpy().tobytes() == values.numpy().tobytes()[:2000]


def test_get_into_refuses_read_only_and_strided_buffers(client, bucket):
    client.put(bucket, "x", b"abc")
    with pytest.raises(BufferError):
        client.get_into(bucket, "x", b"xyz")
    with pytest.raises(BufferError):
        client.get_into(bucket, "x", np.zeros(10, dtype=np.uint8)[::2])


def test_get_many_returns_every_object_in_order(client, bucket):
    blobs = {f"k{i:03}": payload(1000 + 997 * i, seed=i) for i in range(50)}
    for key, data in blobs.items():
        client.put(bucket, key, data)
    keys = sorted(blobs, reverse=True)
    got = client.get_many([(bucket, k) for k in keys])
    assert got == [blobs[k] for k in keys]


def test_get_many_into_buffers(client, bucket):
    blobs = [payload(20_000 + i, seed=i) for i in range(10)]
    for i, data in enumerate(blobs):
        client.put(bucket, f"b{i}", data)
    buffers = [np.zeros(30_000, dtype=np.uint8) for _ in blobs]
    pointers = [b.ctypes.data for b in buffers]
    counts = client.get_many([(bucket, f"b{i}") for i in range(10)], buffers=buffers)
    assert counts == [len(d) for d in blobs]
    for buf, data, pointer in zip(buffers, blobs, pointers):
        assert buf.ctypes.data == pointer
        assert buf[: len(data)].tobytes() == data
    shared = bytearray(100)
    with pytest.raises(ValueError):
        client.get_many([(bucket, "b0"), (bucket, "b1")], buffers=[shared, memoryview(shared)[10:]])


def test_get_many_raises_not_found(client, bucket):
    client.put(bucket, "present", b"1")
    with pytest.raises(tessera.NotFound):
        client.get_many([(bucket, "present"), (bucket, "absent")])


def test_put_streams_a_file_object(client, bucket, tmp_path):
    data = payload(5 * (1 << 20) + 12345, seed=3)
    path = tmp_path / "big.bin"
    path.write_bytes(data)
    with open(path, "rb") as f:
        info = client.put(bucket, "big", f)
    assert info.size == len(data)
    assert client.get(bucket, "big") == data

    class ReadOnly:  # a file object with read() only
        def __init__(self, data):
            self.inner = io.BytesIO(data)

        def read(self, n=-1):
            return self.inner.read(n)

    client.put(bucket, "big2", ReadOnly(data[:3_000_000]))
    assert client.get(bucket, "big2") == data[:3_000_000]


def test_put_from_a_failing_file_leaves_no_object(client, bucket):
    class Broken(io.RawIOBase):
        def __init__(self):
            self.calls = 0

        def readable(self):
            return True

        def readinto(self, b):
            self.calls += 1
            if self.calls > 3:
                raise OSError("disk on fire")
            b[:] = b"x" * len(b)
            return len(b)

    with pytest.raises(OSError, match="disk on fire"):
        client.put(bucket, "broken", Broken())
    assert not client.exists(bucket, "broken")


def test_open_for_writing_commits_on_close_and_aborts_on_error(client, bucket):
    with client.open(bucket, "w", "wb") as f:
        for i in range(100):
            f.write(b"%05d" % i)
        assert f.tell() == 500
    assert client.get(bucket, "w") == b"".join(b"%05d" % i for i in range(100))
    assert f.info.size == 500

    with pytest.raises(RuntimeError):
        with client.open(bucket, "aborted", "wb") as f:
            f.write(b"partial")
            raise RuntimeError("stop")
    assert not client.exists(bucket, "aborted")


def test_open_for_reading_seeks(client, bucket):
    data = payload(700_000, seed=4)
    client.put(bucket, "seek", data)
    with client.open(bucket, "seek") as f:
        assert f.read(10) == data[:10]
        f.seek(500_000)
        assert f.read(100) == data[500_000:500_100]
        f.seek(-5, io.SEEK_END)
        assert f.read() == data[-5:]
        assert f.read() == b""


def test_list_paginates_and_rolls_up_prefixes(client, bucket):
    keys = [f"a/{i:03}" for i in range(25)] + ["a/sub/x", "a/sub/y", "b", "c/z"]
    for key in keys:
        client.put(bucket, key, b"")
    assert [e.key for e in client.list(bucket, page_size=7)] == sorted(keys)
    assert [e.key for e in client.list(bucket, prefix="a/", page_size=4)] == sorted(k for k in keys if k.startswith("a/"))
    top = list(client.list(bucket, delimiter="/", page_size=3))
    assert [(e.key, e.is_prefix) for e in top] == [("a/", True), ("b", False), ("c/", True)]
    sub = list(client.list(bucket, prefix="a/", delimiter="/", page_size=5))
    assert [e.key for e in sub] == [f"a/{i:03}" for i in range(25)] + ["a/sub/"]


def test_errors_are_typed_and_say_what_is_wrong(client, bucket):
    with pytest.raises(tessera.NotFound) as e:
        client.get(bucket, "nope")
    assert isinstance(e.value, FileNotFoundError)
    assert (e.value.bucket, e.value.key) == (bucket, "nope")
    with pytest.raises(tessera.NoSuchBucket):
        list(client.list("no-such-bucket-here"))
    with pytest.raises(tessera.InvalidName):
        client.put("Bad_Bucket!", "k", b"")
    client.put(bucket, "k", b"")
    with pytest.raises(tessera.BucketNotEmpty):
        client.remove_bucket(bucket)
    with pytest.raises(tessera.RangeNotSatisfiable):
        client.get(bucket, "k", range=(10, 20))
    assert issubclass(tessera.errors.Unavailable, ConnectionError)


def test_connect_without_config_says_what_to_do(monkeypatch):
    monkeypatch.delenv("TESSERA_CONFIG", raising=False)
    with pytest.raises(tessera.ConfigError, match="TESSERA_CONFIG"):
        tessera.connect()
    with pytest.raises(OSError):
        tessera.connect("/nonexistent/cluster.toml")


def test_connect_through_a_node_address(cluster, bucket, client, monkeypatch):
    client.put(bucket, "via-node", b"hi")
    host, port = cluster.addr(2)
    monkeypatch.setenv("TESSERA_CLUSTER_SECRET", cluster.secret)
    other = tessera.connect(f"localhost:{port}")
    assert other.get(bucket, "via-node") == b"hi"
    monkeypatch.delenv("TESSERA_CLUSTER_SECRET")
    with pytest.raises(tessera.ConfigError, match="TESSERA_CLUSTER_SECRET"):
        tessera.connect(f"{host}:{port}")
    with pytest.raises(tessera.AuthRejected):
        tessera.connect(f"{host}:{port}", secret="00" * 32)


def test_client_pickles_and_reconnects(client, bucket):
    client.put(bucket, "p", b"pickled")
    clone = pickle.loads(pickle.dumps(client))
    assert clone.get(bucket, "p") == b"pickled"


def _child_reads(client, bucket, queue):
    try:
        queue.put(client.get(bucket, "forked"))
    except BaseException as e:  # report, do not hang the parent
        queue.put(repr(e))


def test_client_works_in_a_forked_child(client, bucket):
    client.put(bucket, "forked", b"from the parent")
    assert client.get(bucket, "forked") == b"from the parent"  # the parent's connections exist
    ctx = multiprocessing.get_context("fork")
    queue = ctx.Queue()
    children = [ctx.Process(target=_child_reads, args=(client, bucket, queue)) for _ in range(2)]
    for child in children:
        child.start()
    results = [queue.get(timeout=60) for _ in children]
    for child in children:
        child.join(timeout=60)
    assert results == [b"from the parent"] * 2
    assert client.get(bucket, "forked") == b"from the parent"  # and the parent's still work


def test_client_is_thread_safe(client, bucket):
    blobs = {f"t{i}": payload(50_000, seed=100 + i) for i in range(16)}
    for key, data in blobs.items():
        client.put(bucket, key, data)
    errors = []

    def reader(keys):
        try:
            for _ in range(5):
                for key in keys:
                    assert client.get(bucket, key) == blobs[key]
        except BaseException as e:
            errors.append(e)

    keys = list(blobs)
    threads = [threading.Thread(target=reader, args=(keys[i::4],)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors


def test_buckets(client):
    client.make_bucket("t-buckets-x")
    client.make_bucket("t-buckets-x")  # idempotent
    assert "t-buckets-x" in client.list_buckets()
    client.remove_bucket("t-buckets-x")
    assert not client.bucket_exists("t-buckets-x")
    with pytest.raises(tessera.NoSuchBucket):
        client.remove_bucket("t-buckets-x")
    assert os.environ["TESSERA_CONFIG"]
