"""tessera.pyg.FeatureStore: PyG's FeatureStore over .npy objects, and GraphSAGE trained through
PyG's NeighborLoader with its features and labels in Tessera (python/examples/graphsage.py)."""

from __future__ import annotations

import importlib.util
import math
import pickle

import numpy as np
import pytest
import torch

pytest.importorskip("torch_geometric", reason="torch_geometric is in python/requirements-test.txt")

import tessera  # noqa: E402
import tessera.pyg  # noqa: E402
from tessera.pyg import FeatureStore  # noqa: E402

EXAMPLE = __import__("pathlib").Path(__file__).resolve().parents[1] / "examples" / "graphsage.py"


def _example():
    spec = importlib.util.spec_from_file_location("graphsage_example", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_feature_store_crud_over_npy_objects(client, bucket):
    store = FeatureStore(client, bucket, "g")
    x = torch.randn(300, 16)
    y = torch.randint(0, 5, (300,))
    assert store.put_tensor(x, group_name="paper", attr_name="x", index=None)
    store["paper", "y", None] = y
    assert store.put_tensor(x[:10].double(), group_name=None, attr_name="x", index=None)
    # The objects are ordinary .npy files any S3 client or NumPy can read.
    assert sorted(e.key for e in client.list(bucket, "g/")) == ["g/_/x.npy", "g/paper/x.npy", "g/paper/y.npy"]
    assert sorted((a.group_name or "", a.attr_name) for a in store.get_all_tensor_attrs()) == [
        ("", "x"), ("paper", "x"), ("paper", "y")]
    # Another store over the same prefix lists what is there.
    assert len(FeatureStore(client, bucket, "g/").get_all_tensor_attrs()) == 3
    idx = torch.tensor([5, 0, 299, 5])
    assert torch.equal(store["paper", "x", idx], x[idx])
    assert torch.equal(store.get_tensor("paper", "y", idx), y[idx])
    assert torch.equal(store["paper", "x", 7:20:3], x[7:20:3])
    assert torch.equal(store["paper", "x", -1], x[-1])
    assert torch.equal(store.get_tensor("paper", "x", None), x)
    assert torch.equal(store.get_tensor(None, "x", None), x[:10].double())
    assert store.get_tensor_size("paper", "x") == (300, 16)
    assert store.get_tensor_size("paper", "y") == (300,)
    assert store.get_tensor_size("paper", "absent") is None
    attrs = [a for a in store.get_all_tensor_attrs() if a.group_name == "paper"]
    for a in attrs:
        a.index = idx
    got = dict(zip((a.attr_name for a in attrs), store.multi_get_tensor(attrs)))
    assert torch.equal(got["x"], x[idx]) and torch.equal(got["y"], y[idx])
    # Bad input: clear errors, nothing written.
    with pytest.raises(ValueError, match="written whole"):
        store.put_tensor(x[:2], group_name="paper", attr_name="x", index=torch.tensor([0, 1]))
    with pytest.raises(ValueError, match="key component"):
        store.put_tensor(x, group_name="a/b", attr_name="x", index=None)
    with pytest.raises(tessera.GatherError, match="out of range"):
        store.get_tensor("paper", "x", torch.tensor([300]))
    with pytest.raises(KeyError):
        store.get_tensor("paper", "absent", idx)
    with pytest.raises(KeyError):
        store.get_tensor("paper", "absent", None)
    with pytest.raises(ValueError, match="edge-type"):
        store.put_tensor(x, group_name=("paper", "cites", "paper"), attr_name="w", index=None)
    assert torch.equal(store["paper", "x", None], x), "the refused partial put changed nothing"
    # Picklable (DataLoader workers), and removal.
    again = pickle.loads(pickle.dumps(store))
    assert torch.equal(again["paper", "y", idx], y[idx])
    assert store.remove_tensor("paper", "y", None)
    assert not store.remove_tensor("paper", "y", None)
    assert sorted((a.group_name or "", a.attr_name) for a in store.get_all_tensor_attrs()) == [("", "x"), ("paper", "x")]


def test_graphsage_trains_through_neighbor_loader_with_features_in_tessera(client, bucket, monkeypatch):
    example = _example()
    calls = []
    gather_many = client.gather_many

    def counted(requests):
        calls.append([(b, k, len(i)) for b, k, i, *_ in requests])
        return gather_many(requests)

    monkeypatch.setattr(client, "gather_many", counted)
    steps = 15
    losses, first, x, y = example.train(client, bucket, steps=steps)
    assert len(losses) == steps and all(math.isfinite(v) for v in losses)
    # The sampled nodes' features and labels are exactly the ones written.
    assert torch.equal(first.x, torch.from_numpy(x[first.n_id.numpy()]))
    assert torch.equal(first.y, torch.from_numpy(y[first.n_id.numpy()]))
    assert first.edge_index.size(1) > first.batch_size, "neighbours were sampled"
    # One batched gather per mini-batch, for features and labels together.
    assert len(calls) == steps, calls[:3]
    assert all(sorted(k for _, k, _ in call) == ["graphsage/_/x.npy", "graphsage/_/y.npy"] for call in calls)
    # It learned: the graph is homophilous and the features carry the class.
    assert np.mean(losses[-3:]) < 0.8 * np.mean(losses[:3]), losses


def test_neighbor_loader_batches_are_exact_with_two_nodes_down(client, bucket, nodes_down):
    example = _example()
    x, y, edge_index = example.synthetic_graph(1500, 6, 24, seed=3)
    store = FeatureStore(client, bucket, "degraded/")
    store.put_tensor(torch.from_numpy(x), group_name=None, attr_name="x", index=None)
    store.put_tensor(torch.from_numpy(y), group_name=None, attr_name="y", index=None)
    loader = example.loader_over(store, edge_index, 1500, batch_size=200)
    nodes_down(1, 4)
    batches = 0
    for batch in loader:
        assert torch.equal(batch.x, torch.from_numpy(x[batch.n_id.numpy()]))
        assert torch.equal(batch.y, torch.from_numpy(y[batch.n_id.numpy()]))
        batches += 1
    assert batches == math.ceil(1500 / 200)
    # The fault was real: the killed nodes refuse connections now.
    with pytest.raises(tessera.TesseraError):
        client.put(bucket, "degraded/probe", b"needs W = 5 of 6 nodes")
