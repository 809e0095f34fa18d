"""GraphSAGE on a graph whose node features and labels live in Tessera.

The graph (edges) stays in memory in PyG's ``LocalGraphStore``; features and labels are
``.npy`` objects behind ``tessera.pyg.FeatureStore``; PyG's ``NeighborLoader`` samples each
mini-batch and fetches its rows with one ``multi_get_tensor`` call, which is one batched gather
(one request per node per round for features and labels together).

    python python/examples/graphsage.py --config tessera-data/cluster.toml --bucket graphs

PyG's own neighbour sampling needs ``pyg-lib`` (published on data.pyg.org, not PyPI) or
``torch-sparse`` (a source build). Where neither is installed, ``UniformSampler`` below samples
in plain PyTorch (uniformly, without replacement, homogeneous graphs only) so the example
still runs; with either installed, PyG's sampler is used.
"""

from __future__ import annotations

import argparse
import warnings

import numpy as np
import torch
import torch.nn.functional as F
import torch_geometric.typing
from torch_geometric.distributed import LocalGraphStore
from torch_geometric.loader import NeighborLoader
from torch_geometric.nn import GraphSAGE
from torch_geometric.sampler import NeighborSampler, SamplerOutput

import tessera
import tessera.pyg


class UniformSampler(NeighborSampler):
    """PyG's ``NeighborSampler``, sampling in plain PyTorch when neither pyg-lib nor
    torch-sparse is installed (homogeneous graphs, directional, without replacement)."""

    def _sample(self, seed, seed_time=None, **kwargs):
        if torch_geometric.typing.WITH_PYG_LIB or torch_geometric.typing.WITH_TORCH_SPARSE or isinstance(seed, dict):
            return super()._sample(seed, seed_time, **kwargs)
        colptr, row = self.colptr, self.row
        nodes = seed.tolist()
        local = {node: i for i, node in enumerate(nodes)}
        frontier = list(range(len(nodes)))
        rows, cols, edges = [], [], []
        sampled_nodes, sampled_edges = [len(nodes)], []
        for fanout in self.num_neighbors.get_mapped_values():
            reached = []
            edges_before = len(edges)
            for target in frontier:
                start, end = int(colptr[nodes[target]]), int(colptr[nodes[target] + 1])
                picks = torch.arange(start, end)
                if 0 <= fanout < len(picks):
                    picks = picks[torch.randperm(len(picks))[:fanout]]
                for e in picks.tolist():
                    source = int(row[e])
                    if source not in local:
                        local[source] = len(nodes)
                        nodes.append(source)
                        reached.append(local[source])
                    rows.append(local[source])
                    cols.append(target)
                    edges.append(e)
            sampled_nodes.append(len(reached))
            sampled_edges.append(len(edges) - edges_before)
            frontier = reached
        as_tensor = lambda values: torch.tensor(values, dtype=torch.int64)  # noqa: E731
        return SamplerOutput(node=as_tensor(nodes), row=as_tensor(rows), col=as_tensor(cols), edge=as_tensor(edges),
                             batch=None, num_sampled_nodes=sampled_nodes, num_sampled_edges=sampled_edges)


def synthetic_graph(nodes: int, classes: int, features: int, seed: int = 0):
    """Node features near their class's centre, labels, and edges that mostly join nodes of
    one class (so a GNN has something to learn)."""
    rng = np.random.default_rng(seed)
    y = rng.integers(0, classes, nodes)
    centres = rng.standard_normal((classes, features)).astype(np.float32)
    x = (centres[y] + 0.8 * rng.standard_normal((nodes, features))).astype(np.float32)
    by_class = [np.flatnonzero(y == c) for c in range(classes)]
    sources = rng.integers(0, nodes, nodes * 8)
    same = rng.random(len(sources)) < 0.8
    targets = np.where(same, [rng.choice(by_class[y[s]]) for s in sources], rng.integers(0, nodes, len(sources)))
    edge_index = torch.tensor(np.stack([sources, targets]), dtype=torch.int64)
    return x, y.astype(np.int64), edge_index


def loader_over(store: tessera.pyg.FeatureStore, edge_index: torch.Tensor, nodes: int, *, fanout=(10, 5),
                batch_size: int = 128, num_workers: int = 0) -> NeighborLoader:
    graph = LocalGraphStore.from_data(torch.arange(edge_index.size(1)), edge_index, nodes)
    with warnings.catch_warnings():
        # PyG warns that sampling without pyg-lib is deprecated: UniformSampler is the fallback.
        warnings.filterwarnings("ignore", message=".*pyg-lib.*")
        sampler = UniformSampler((store, graph), num_neighbors=list(fanout))
    seeds = torch.arange(nodes)
    return NeighborLoader((store, graph), num_neighbors=list(fanout), input_nodes=seeds, batch_size=batch_size,
                          shuffle=True, neighbor_sampler=sampler, num_workers=num_workers)


def train(client: tessera.Client, bucket: str, *, prefix: str = "graphsage/", nodes: int = 2000, classes: int = 8,
          features: int = 32, steps: int = 20, num_workers: int = 0, seed: int = 0):
    """Writes a synthetic graph's features and labels to Tessera, then trains GraphSAGE for
    ``steps`` mini-batches. Returns (losses, the first batch, the features, the labels)."""
    torch.manual_seed(seed)
    x, y, edge_index = synthetic_graph(nodes, classes, features, seed)
    store = tessera.pyg.FeatureStore(client, bucket, prefix)
    store.put_tensor(torch.from_numpy(x), group_name=None, attr_name="x", index=None)
    store.put_tensor(torch.from_numpy(y), group_name=None, attr_name="y", index=None)
    loader = loader_over(store, edge_index, nodes, num_workers=num_workers)
    model = GraphSAGE(features, 64, num_layers=2, out_channels=classes)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    losses, first = [], None
    while len(losses) < steps:
        for batch in loader:
            first = first if first is not None else batch
            optimizer.zero_grad()
            out = model(batch.x, batch.edge_index)[: batch.batch_size]
            loss = F.cross_entropy(out, batch.y[: batch.batch_size])
            loss.backward()
            optimizer.step()
            losses.append(loss.item())
            if len(losses) == steps:
                break
    return losses, first, x, y


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="tessera-data/cluster.toml", help="the cluster's cluster.toml")
    parser.add_argument("--bucket", default="graphs")
    parser.add_argument("--steps", type=int, default=50)
    args = parser.parse_args()
    client = tessera.connect(args.config)
    if not client.bucket_exists(args.bucket):
        client.make_bucket(args.bucket)
    losses, *_ = train(client, args.bucket, steps=args.steps)
    for step in range(0, len(losses), 10):
        print(f"step {step:4d}  loss {losses[step]:.3f}")
    print(f"step {len(losses) - 1:4d}  loss {losses[-1]:.3f}")


if __name__ == "__main__":
    main()
