"""Reads with nodes down (killed with SIGKILL, restarted afterwards)."""

from __future__ import annotations

import numpy as np
import pytest
from torch.utils.data import DataLoader

import tessera
import tessera.torch as tt


def blob(i: int) -> bytes:
    return np.random.default_rng(1000 + i).integers(0, 256, 30_000 + 4099 * i, dtype=np.uint8).tobytes()


def test_reads_with_2_nodes_down_return_the_original_bytes(client, bucket, nodes_down):
    keys = [f"k{i:02}" for i in range(24)]
    for i, key in enumerate(keys):
        client.put(bucket, key, blob(i))
    ds = tt.MapDataset(client, bucket)
    nodes_down(1, 4)

    for i, key in enumerate(keys):
        assert client.get(bucket, key) == blob(i)
    target = np.empty(len(blob(5)), dtype=np.uint8)
    assert client.get_into(bucket, keys[5], target) == target.nbytes
    assert target.tobytes() == blob(5)
    assert client.get_many([(bucket, k) for k in keys]) == [blob(i) for i in range(len(keys))]
    assert client.get(bucket, keys[20], range=(70_000, 80_000)) == blob(20)[70_000:80_000]
    loader = DataLoader(ds, batch_size=8, num_workers=2, collate_fn=lambda b: b)
    got = {key: data for batch in loader for key, data in batch}
    assert got == {key: blob(i) for i, key in enumerate(keys)}


def test_reads_with_3_nodes_down_raise_unavailable_with_chunk_counts(client, bucket, nodes_down):
    client.put(bucket, "x", blob(1))
    nodes_down(0, 2, 5)
    with pytest.raises(tessera.Unavailable) as e:
        client.get(bucket, "x")
    err = e.value
    assert isinstance(err, ConnectionError)
    assert (err.chunks_needed, err.total) == (4, 6)
    assert err.chunks_missing >= 3 and err.available <= 3
    assert "needed" in str(err)
