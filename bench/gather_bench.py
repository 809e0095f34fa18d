#!/usr/bin/env python3
"""Feature gathers as GNN training does them: rows/s of Tessera's `gather` against
`numpy.memmap` of the same table in a local file, read with the same indices (warm: the file
is in the page cache, as is the cluster's data; the cold runs, MinIO and fio of issue 12's
full benchmark are not here yet).

Mini-batches of --seeds seed rows plus their sampled 2-hop neighbours (fanout 10, 5), drawn
from a power-law (Zipf) distribution over the rows, as neighbour sampling of a power-law graph
hits hub nodes. Prints one JSON line per system and the ratio.

    bench/gather_bench.py --config tessera-data/cluster.toml --table-gib 1 --dir /tmp/gather
"""

from __future__ import annotations

import argparse
import json
import os
import time

import numpy as np

import tessera


def batches(rows: int, seeds: int, count: int, rng: np.random.Generator) -> list[np.ndarray]:
    """Index arrays of `count` mini-batches: seeds, then 10 and 5 neighbours per node per hop."""
    out = []
    for _ in range(count):
        hop0 = rng.integers(0, rows, seeds)
        hop1 = (rng.zipf(1.5, seeds * 10) - 1) % rows
        hop2 = (rng.zipf(1.5, seeds * 50) - 1) % rows
        out.append(np.concatenate([hop0, hop1, hop2]).astype(np.int64))
    return out


def timed(name: str, fn, work: list[np.ndarray], row_bytes: int) -> dict:
    times = []
    for indices in work:
        start = time.perf_counter()
        fn(indices)
        times.append(time.perf_counter() - start)
    rows = sum(len(i) for i in work)
    total = sum(times)
    result = {
        "system": name,
        "rows": rows,
        "rows_per_s": rows / total,
        "gb_per_s": rows * row_bytes / total / 1e9,
        "p99_batch_ms": float(np.percentile(times, 99) * 1000),
    }
    print(json.dumps(result))
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", default=os.environ.get("TESSERA_CONFIG"))
    parser.add_argument("--bucket", default="bench-gather")
    parser.add_argument("--table-gib", type=float, default=1.0)
    parser.add_argument("--row-bytes", type=int, default=4096)
    parser.add_argument("--seeds", type=int, default=1024)
    parser.add_argument("--batches", type=int, default=20)
    parser.add_argument("--dir", required=True, help="where the local copy for numpy.memmap goes")
    args = parser.parse_args()

    columns = args.row_bytes // 4
    rows = int(args.table_gib * (1 << 30)) // args.row_bytes
    client = tessera.connect(args.config)
    if not client.bucket_exists(args.bucket):
        client.make_bucket(args.bucket)
    path = os.path.join(args.dir, "features.npy")
    os.makedirs(args.dir, exist_ok=True)
    rng = np.random.default_rng(0)
    if not os.path.exists(path):
        table = np.lib.format.open_memmap(path, mode="w+", dtype=np.float32, shape=(rows, columns))
        step = 1 << 16
        for start in range(0, rows, step):
            table[start:start + step] = rng.standard_normal((min(step, rows - start), columns), np.float32)
        table.flush()
        del table
    if not client.exists(args.bucket, "features.npy"):
        with open(path, "rb") as f:
            client.put(args.bucket, "features.npy", f)
    local = np.load(path, mmap_mode="r")
    work = batches(rows, args.seeds, args.batches, rng)
    # Warm both: one pass each over the same indices, then the measured passes.
    client.gather(args.bucket, "features.npy", work[0])
    local[work[0]]
    ours = timed("tessera gather", lambda i: client.gather(args.bucket, "features.npy", i), work, args.row_bytes)
    theirs = timed("numpy.memmap", lambda i: local[i], work, args.row_bytes)
    check = work[-1][:100]
    assert np.array_equal(client.gather(args.bucket, "features.npy", check), local[check])
    print(json.dumps({"ratio_tessera_over_memmap": ours["rows_per_s"] / theirs["rows_per_s"],
                      "table_gib": args.table_gib, "row_bytes": args.row_bytes}))


if __name__ == "__main__":
    main()
