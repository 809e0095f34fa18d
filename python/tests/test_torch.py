"""tessera.torch: datasets under real DataLoaders (worker processes), DDP-style sharding with
torch.distributed (gloo, 2 ranks as 2 processes), torch.save/load and DCP checkpoints."""

from __future__ import annotations

import hashlib
import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.distributed.checkpoint as dcp
from torch.utils.data import DataLoader

import tessera
import tessera.torch as tt

OBJECTS = 200


def sample(i: int) -> bytes:
    """Object i: a size and contents derived from i."""
    size = 1000 + (i * 7919) % 70_000
    return hashlib.sha256(str(i).encode()).digest() * (size // 32) + bytes([i % 256]) * (size % 32)


@pytest.fixture(scope="module")
def dataset_bucket(client):
    bucket = "t-torch-dataset"
    client.make_bucket(bucket)
    for i in range(OBJECTS):
        client.put(bucket, f"train/{i:05}.bin", sample(i))
    client.put(bucket, "other/not-in-prefix", b"x")
    return bucket


def key_index(key: str) -> int:
    return int(key.rsplit("/", 1)[1].split(".")[0])


def collate_pairs(batch):
    return batch


def test_map_dataset_under_a_dataloader_with_2_workers(client, dataset_bucket):
    ds = tt.MapDataset(client, dataset_bucket, prefix="train/")
    assert len(ds) == OBJECTS
    key, data = ds[7]
    assert (key, data) == ("train/00007.bin", sample(7))
    loader = DataLoader(ds, batch_size=16, shuffle=True, num_workers=2, collate_fn=collate_pairs)
    seen = {}
    for batch in loader:
        for key, data in batch:
            assert key not in seen
            seen[key] = data
    assert len(seen) == OBJECTS
    for key, data in seen.items():
        assert data == sample(key_index(key)), key


def test_map_dataset_with_transform_and_default_collate(dataset_bucket):
    # Source as a config path (TESSERA_CONFIG-style), a transform to tensors, default collate.
    def first_bytes(key, data):
        return torch.frombuffer(bytearray(data[:32]), dtype=torch.uint8)

    ds = tt.MapDataset(os.environ["TESSERA_CONFIG"], dataset_bucket, prefix="train/", transform=first_bytes)
    loader = DataLoader(ds, batch_size=50, num_workers=2)
    batches = list(loader)
    assert [b.shape for b in batches] == [torch.Size([50, 32])] * 4
    for i, row in enumerate(torch.cat(batches)):
        assert bytes(row.tolist()) == sample(i)[:32]


def test_map_dataset_with_spawned_workers(client, dataset_bucket):
    ds = tt.MapDataset(client, dataset_bucket, prefix="train/", keys=[f"train/{i:05}.bin" for i in range(20)])
    loader = DataLoader(ds, batch_size=5, num_workers=2, multiprocessing_context="spawn", collate_fn=collate_pairs)
    got = [pair for batch in loader for pair in batch]
    assert got == [(f"train/{i:05}.bin", sample(i)) for i in range(20)]


def test_iterable_dataset_shards_over_workers_and_reshuffles_per_epoch(client, dataset_bucket):
    ds = tt.IterableDataset(client, dataset_bucket, prefix="train/", shuffle=True, seed=42, batch_objects=8)
    orders = []
    for epoch in range(2):
        ds.set_epoch(epoch)
        loader = DataLoader(ds, batch_size=None, num_workers=2)
        keys = []
        for key, data in loader:
            assert data == sample(key_index(key)), key
            keys.append(key)
        assert sorted(keys) == [f"train/{i:05}.bin" for i in range(OBJECTS)]
        orders.append(keys)
    assert orders[0] != orders[1]
    # The same seed and epoch give the same order.
    ds.set_epoch(0)
    again = [key for key, _ in DataLoader(ds, batch_size=None, num_workers=2)]
    assert again == orders[0]


def test_iterable_dataset_explicit_ranks_partition_the_keys(client, dataset_bucket):
    shards = []
    for rank in range(2):
        ds = tt.IterableDataset(client, dataset_bucket, prefix="train/", shuffle=True, seed=7, rank=rank, world_size=2)
        ds.set_epoch(3)
        shards.append([key for key, _ in DataLoader(ds, batch_size=None, num_workers=2)])
    assert not set(shards[0]) & set(shards[1])
    assert sorted(shards[0] + shards[1]) == [f"train/{i:05}.bin" for i in range(OBJECTS)]


DDP_WORKER = r"""
import json, sys
import torch.distributed as dist
from torch.utils.data import DataLoader
import tessera.torch as tt

rank, world_size, port, bucket, out = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4], sys.argv[5]
dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world_size)
ds = tt.IterableDataset(None, bucket, prefix="train/", shuffle=True, seed=1)
result = {}
for epoch in range(2):
    ds.set_epoch(epoch)
    keys = []
    for key, data in DataLoader(ds, batch_size=None, num_workers=2):
        keys.append([key, len(data)])
    result[epoch] = keys
dist.barrier()
dist.destroy_process_group()
json.dump(result, open(out, "w"))
"""


def test_ddp_sharding_with_world_size_2_loses_and_repeats_nothing(cluster, dataset_bucket, tmp_path):
    script = tmp_path / "ddp_worker.py"
    script.write_text(DDP_WORKER)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**os.environ, "TESSERA_CONFIG": str(cluster.config)}
    procs = [
        subprocess.Popen([sys.executable, str(script), str(rank), "2", str(port), dataset_bucket, str(tmp_path / f"r{rank}.json")], env=env)
        for rank in range(2)
    ]
    for p in procs:
        assert p.wait(timeout=300) == 0
    results = [json.loads((tmp_path / f"r{rank}.json").read_text()) for rank in range(2)]
    expected = sorted(f"train/{i:05}.bin" for i in range(OBJECTS))
    for epoch in ("0", "1"):
        per_rank = [[k for k, _ in r[epoch]] for r in results]
        assert len(per_rank[0]) == len(per_rank[1]) == OBJECTS // 2
        assert not set(per_rank[0]) & set(per_rank[1])
        assert sorted(per_rank[0] + per_rank[1]) == expected
        for r in results:
            for key, size in r[epoch]:
                assert size == len(sample(key_index(key)))
    assert [k for k, _ in results[0]["0"]] != [k for k, _ in results[0]["1"]]


class SmallNet(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 8, 3)
        self.bn = torch.nn.BatchNorm2d(8)
        self.fc = torch.nn.Linear(8 * 30 * 30, 10)


def assert_state_dicts_equal(a, b):
    assert a.keys() == b.keys()
    for name in a:
        assert torch.equal(a[name], b[name]), name


def test_save_and_load_state_dict_round_trip(client, bucket):
    torch.manual_seed(0)
    model = SmallNet()
    uri = f"tessera://{bucket}/ckpt/model.pt"
    tt.save({"model": model.state_dict(), "step": 12}, uri, client=client)
    loaded = tt.load(uri, client=client, weights_only=True)
    assert loaded["step"] == 12
    assert_state_dicts_equal(loaded["model"], model.state_dict())
    # With the default client (TESSERA_CONFIG).
    tt.save(model.state_dict(), f"tessera://{bucket}/ckpt/default.pt")
    fresh = SmallNet()
    fresh.load_state_dict(tt.load(f"tessera://{bucket}/ckpt/default.pt"))
    assert_state_dicts_equal(fresh.state_dict(), model.state_dict())


def test_save_that_fails_leaves_no_checkpoint(client, bucket):
    class Unpicklable:
        def __reduce__(self):
            raise RuntimeError("cannot pickle")

    with pytest.raises(RuntimeError):
        tt.save({"w": torch.zeros(100_000), "bad": Unpicklable()}, f"tessera://{bucket}/bad.pt", client=client)
    assert not client.exists(bucket, "bad.pt")


@pytest.mark.filterwarnings("ignore:torch.distributed is disabled")
def test_distributed_checkpoint_writer_and_reader_round_trip(client, bucket):
    torch.manual_seed(1)
    model = SmallNet()
    state = {"model": model.state_dict()}
    uri = f"tessera://{bucket}/dcp/step-1"
    dcp.save(state, storage_writer=tt.StorageWriter(uri, client=client), no_dist=True)
    keys = [e.key for e in client.list(bucket, prefix="dcp/step-1/")]
    assert "dcp/step-1/.metadata" in keys
    assert any(k.endswith(".distcp") for k in keys)

    restored = {"model": SmallNet().state_dict()}
    for tensor in restored["model"].values():
        tensor.zero_()
    dcp.load(restored, storage_reader=tt.StorageReader(uri, client=client), no_dist=True)
    assert_state_dicts_equal(restored["model"], model.state_dict())
