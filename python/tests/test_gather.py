"""client.gather: rows of a 2-D table object picked by index, into NumPy arrays and torch
tensors, checked against NumPy's own indexing; bad input refused before anything is read."""

from __future__ import annotations

import io
import pickle

import numpy as np
import pytest
import torch

import tessera

ROWS, COLUMNS = 5000, 64  # 256-byte float32 rows: several stripes, rows across chunk edges


@pytest.fixture
def table() -> np.ndarray:
    return np.random.default_rng(1).standard_normal((ROWS, COLUMNS)).astype(np.float32)


def saved_bytes(array: np.ndarray) -> bytes:
    out = io.BytesIO()
    np.save(out, array)
    return out.getvalue()


def _indices(count: int, seed: int = 2) -> np.ndarray:
    idx = np.random.default_rng(seed).integers(0, ROWS, count)
    idx[10:20] = idx[0]  # repeats
    idx[20:30] = np.arange(100, 110)  # a run of neighbours
    return idx


def test_tables_get_the_smallest_checksum_blocks_their_metadata_can_carry(client):
    # A 4+2 cluster: every version's checksums must fit one 32 MiB frame (with a repair's
    # commit, 1.5 times them), so 4 KiB blocks up to about 11 GiB (the 8 GiB table
    # included), then larger ones.
    raw = client._raw
    assert raw.smallest_block_bytes(4096 + (8 << 30)) == 4096
    assert raw.smallest_block_bytes(64 << 30) == 32 << 10
    assert raw.smallest_block_bytes(1 << 50) == 64 << 10


def test_gather_matches_numpy_indexing_into_arrays_and_tensors(client, bucket, table):
    info = client.put_tensor(bucket, "features.npy", table)
    # Rows start 4 KiB into the file and checksum blocks are 4 KiB (the test cluster's chunks
    # are 64 KiB): a gathered row costs about its own bytes. NumPy reads the padded file.
    assert info.block_bytes == 4096
    assert np.load(io.BytesIO(client.get(bucket, "features.npy"))).tobytes() == table.tobytes()
    assert client.get(bucket, "features.npy", (4096, 4096 + 8)) == table[0, :2].tobytes()
    idx = _indices(3000)
    out = client.gather(bucket, "features.npy", idx)
    assert out.dtype == np.float32 and out.shape == (3000, COLUMNS)
    np.testing.assert_array_equal(out, table[idx])
    # Into a caller's tensor (pinned memory where this torch has a device for it), indices as
    # a tensor.
    target = torch.empty((len(idx), COLUMNS), dtype=torch.float32, pin_memory=torch.cuda.is_available())
    assert client.gather(bucket, "features.npy", torch.from_numpy(idx), out=target) is target
    assert torch.equal(target, torch.from_numpy(table[idx]))
    # Into a caller's array, a list of indices; nothing at all.
    mine = np.zeros((3, COLUMNS), np.float32)
    client.gather(bucket, "features.npy", [ROWS - 1, 0, ROWS - 1], out=mine)
    np.testing.assert_array_equal(mine, table[[ROWS - 1, 0, ROWS - 1]])
    assert client.gather(bucket, "features.npy", np.zeros(0, np.int64)).shape == (0, COLUMNS)
    # Replaced by a table of another shape: the next gather reads the new header and rows.
    client.put_tensor(bucket, "features.npy", np.ascontiguousarray(table[:10, :8]))
    np.testing.assert_array_equal(client.gather(bucket, "features.npy", [9, 0]), table[[9, 0], :8])


def test_npy_files_from_numpy_and_raw_rows(client, bucket):
    ints = np.arange(3000 * 5, dtype=np.int64).reshape(3000, 5)
    saved = io.BytesIO()
    np.save(saved, ints)
    client.put(bucket, "ints.npy", saved.getvalue())
    idx = np.array([2999, 7, 7, 0, 1500], np.int32)
    np.testing.assert_array_equal(client.gather(bucket, "ints.npy", idx), ints[idx])
    # Raw row-major bytes with an explicit row size.
    client.put(bucket, "ints.bin", ints.tobytes())
    rows = client.gather(bucket, "ints.bin", idx, row_bytes=40, dtype=np.int64)
    np.testing.assert_array_equal(rows, ints[idx])
    # A structured dtype's rows gather too.
    pairs = np.zeros((100, 2), dtype=[("a", "<i4"), ("b", "<f8")])
    pairs["a"] = np.arange(200).reshape(100, 2)
    client.put_tensor(bucket, "pairs.npy", pairs)
    np.testing.assert_array_equal(client.gather(bucket, "pairs.npy", [99, 3]), pairs[[99, 3]])


def test_bad_gathers_are_refused_before_anything_is_read(client, bucket, table):
    client.put_tensor(bucket, "t.npy", table)

    def refused(match: str, *args, **kwargs) -> None:
        with pytest.raises(tessera.GatherError, match=match):
            client.gather(bucket, *args, **kwargs)

    refused("out of range", "t.npy", [0, ROWS])
    refused("negative", "t.npy", [-1])
    refused("integers", "t.npy", np.array([1.0, 2.0]))
    refused("one-dimensional", "t.npy", np.zeros((2, 2), np.int64))
    refused("need", "t.npy", [1, 2], out=np.zeros((3, COLUMNS), np.float32))
    refused("need", "t.npy", [1, 2], out=np.zeros((2, COLUMNS), np.float64))
    refused("need", "t.npy", [1, 2], out=torch.zeros((2, COLUMNS), dtype=torch.float16))
    refused("C-contiguous", "t.npy", [1, 2], out=np.zeros((COLUMNS, 2), np.float32).T)
    read_only = np.zeros((2, COLUMNS), np.float32)
    read_only.flags.writeable = False
    refused("read-only", "t.npy", [1, 2], out=read_only)
    refused("NumPy array or a torch tensor", "t.npy", [1], out=bytearray(COLUMNS * 4))
    # Objects that are not what a table needs.
    client.put(bucket, "plain.txt", b"hello, not a table")
    refused("not a .npy file", "plain.txt", [0])
    saved = io.BytesIO()
    np.save(saved, table)
    client.put(bucket, "truncated.npy", saved.getvalue()[:-100])
    refused("truncated", "truncated.npy", [0])
    saved = io.BytesIO()
    np.save(saved, np.asfortranarray(table))
    client.put(bucket, "fortran.npy", saved.getvalue())
    refused("Fortran", "fortran.npy", [0])
    saved = io.BytesIO()
    np.save(saved, np.zeros((2, 3, 4), np.float32))
    client.put(bucket, "cube.npy", saved.getvalue())
    refused("2-D", "cube.npy", [0])
    with pytest.raises(tessera.GatherError, match="2-D"):
        client.put_tensor(bucket, "cube2.npy", np.zeros((2, 3, 4)))
    refused("whole number", "plain.txt", [0], row_bytes=4)
    refused("multiple", "plain.txt", [0], row_bytes=3, dtype=np.float32)
    refused("not float16", "t.npy", [0], dtype=np.float16)
    # The caller's buffer is untouched by a refused gather, in Python's checks and in Rust's.
    mine = np.full((2, COLUMNS), 7, np.float32)
    with pytest.raises(tessera.GatherError):
        client.gather(bucket, "t.npy", [0, ROWS], out=mine)
    info = client.stat(bucket, "t.npy")
    with pytest.raises(tessera.GatherError, match="out of range"):
        client._raw.gather_into(info, 128, COLUMNS * 4, ROWS, np.array([0, ROWS], np.int64),
                                mine.reshape(-1).view(np.uint8))
    with pytest.raises(tessera.GatherError, match="out of range"):
        client._raw.gather_into(info, 128, COLUMNS * 4, ROWS, np.array([0, -1], np.int64),
                                mine.reshape(-1).view(np.uint8))
    assert (mine == 7).all()
    # The same object read as another layout is other rows, never the cached ones of the first.
    cached = pickle.loads(pickle.dumps(client))
    cached.set_gather_cache(1 << 20)
    np.testing.assert_array_equal(cached.gather(bucket, "t.npy", [3]), table[[3]])
    raw = cached.gather(bucket, "t.npy", [3], row_bytes=128)
    assert raw.tobytes() == client.get(bucket, "t.npy", (3 * 128, 4 * 128))


def test_a_gather_cache_serves_hot_rows_and_survives_pickling(client, bucket, table):
    import pickle

    client.put_tensor(bucket, "hot.npy", table)
    cached = pickle.loads(pickle.dumps(client))  # a client of its own, as a DataLoader worker has
    cached.set_gather_cache(4 << 20)
    hot = _indices(500, seed=3)
    np.testing.assert_array_equal(cached.gather(bucket, "hot.npy", hot), table[hot])
    first = cached.gather_cache_stats()
    assert first["hits"] == 0 and first["misses"] == len(hot) and first["rows"] > 0
    np.testing.assert_array_equal(cached.gather(bucket, "hot.npy", hot), table[hot])
    second = cached.gather_cache_stats()
    assert second["hits"] == len(hot) and second["misses"] == len(hot)
    assert second["bytes"] <= second["capacity_bytes"] == 4 << 20
    # The setting goes with the client to a worker; the rows do not (each process its own).
    worker = pickle.loads(pickle.dumps(cached))
    assert worker.gather_cache_stats()["capacity_bytes"] == 4 << 20
    assert worker.gather_cache_stats()["rows"] == 0
    # Replaced: new rows, not cached old ones.
    client.put_tensor(bucket, "hot.npy", table[::-1].copy())
    np.testing.assert_array_equal(cached.gather(bucket, "hot.npy", hot), table[::-1][hot])
    # Off.
    cached.set_gather_cache(0)
    assert cached.gather_cache_stats()["capacity_bytes"] == 0


def test_gather_many_reads_several_tables_in_one_call(client, bucket, table):
    labels = np.random.default_rng(3).integers(0, 40, ROWS).astype(np.int64)
    client.put_tensor(bucket, "many/x.npy", table)
    client.put_tensor(bucket, "many/y.npy", labels)
    halves = np.ascontiguousarray(table[:, : COLUMNS // 2]).astype(np.float64)
    client.put_tensor(bucket, "many/h.npy", halves)
    idx = _indices(2000, seed=5)
    into = torch.empty((2000, COLUMNS // 2), dtype=torch.float64)
    x, y, h, again = client.gather_many([
        (bucket, "many/x.npy", idx),
        (bucket, "many/y.npy", torch.from_numpy(idx)),
        (bucket, "many/h.npy", idx, into),
        (bucket, "many/x.npy", idx[::-1].copy()),
    ])
    assert np.array_equal(x, table[idx])
    # A 1-D table (labels): 1-D rows out.
    assert y.shape == (2000,) and y.dtype == np.int64 and np.array_equal(y, labels[idx])
    assert h is into and torch.equal(into, torch.from_numpy(halves[idx]))
    assert np.array_equal(again, table[idx[::-1]])
    assert client.gather(bucket, "many/y.npy", [3, 1, 3]).tolist() == labels[[3, 1, 3]].tolist()
    assert client.gather_many([]) == []
    # Everything is checked before a read: one bad item leaves every output untouched.
    mine = np.full((2, COLUMNS), 7, np.float32)
    with pytest.raises(tessera.GatherError, match="out of range"):
        client.gather_many([(bucket, "many/x.npy", [0, 1], mine), (bucket, "many/y.npy", [ROWS])])
    assert (mine == 7).all()
    with pytest.raises(tessera.NotFound):
        client.gather_many([(bucket, "many/x.npy", [0]), (bucket, "many/absent.npy", [0])])
    # Two outputs sharing memory would be written twice at once: refused.
    shared = np.zeros((4, COLUMNS), np.float32)
    with pytest.raises(ValueError, match="overlap"):
        client.gather_many([(bucket, "many/x.npy", [0, 1], shared[:2]), (bucket, "many/x.npy", [2, 3], shared[:2])])
    with pytest.raises(TypeError, match="bucket, key, indices"):
        client.gather_many([(bucket, "many/x.npy")])


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no GPU: the CUDA output path cannot run here")
def test_gather_into_cuda_tensors(client, bucket, table):
    client.put_tensor(bucket, "cuda.npy", table)
    idx = _indices(1000, seed=9)
    out = client.gather(bucket, "cuda.npy", idx, device="cuda")
    assert out.device.type == "cuda" and torch.equal(out.cpu(), torch.from_numpy(table[idx]))
    into = torch.zeros((1000, COLUMNS), device="cuda")
    assert client.gather(bucket, "cuda.npy", idx, out=into) is into
    torch.cuda.synchronize()
    assert torch.equal(into.cpu(), torch.from_numpy(table[idx]))


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal without a GPU")
def test_a_cuda_output_without_a_gpu_is_a_clear_error(client, bucket, table):
    client.put_tensor(bucket, "nogpu.npy", table[:10])
    with pytest.raises(tessera.GatherError, match="needs a GPU"):
        client.gather(bucket, "nogpu.npy", [1, 2], device="cuda")
