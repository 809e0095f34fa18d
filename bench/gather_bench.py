#!/usr/bin/env python3
"""Feature gathers as GNN training does them: rows/s of Tessera's `gather` against
`numpy.memmap` of the same table in a local file, read with the same indices.

Warm (default): the file is in the page cache, as is the cluster's data. Cold (`--cold`, needs
root): the page cache is dropped before every mini-batch, for both systems, so every row comes
from the disk: what a table far larger than memory costs.

Mini-batches of --seeds seed rows plus their sampled 2-hop neighbours (fanout 10, 5), drawn
from a power-law (Zipf) distribution over the rows, as neighbour sampling of a power-law graph
hits hub nodes. Prints one JSON line per system and the ratio.

    bench/gather_bench.py --config tessera-data/cluster.toml --table-gib 1 --dir /tmp/gather [--cold]
"""

from __future__ import annotations

import argparse
import json
import os
import time

import numpy as np

import tessera


def batches(rows: int, seeds: int, count: int, rng: np.random.Generator, uniform: bool = False) -> list[np.ndarray]:
    """Index arrays of `count` mini-batches: seeds, then 10 and 5 neighbours per node per hop
    (Zipf-distributed, or with `uniform` uniformly: every row a random read)."""
    out = []
    for _ in range(count):
        hop0 = rng.integers(0, rows, seeds)
        if uniform:
            hop1, hop2 = rng.integers(0, rows, seeds * 10), rng.integers(0, rows, seeds * 50)
        else:
            hop1 = (rng.zipf(1.5, seeds * 10) - 1) % rows
            hop2 = (rng.zipf(1.5, seeds * 50) - 1) % rows
        out.append(np.concatenate([hop0, hop1, hop2]).astype(np.int64))
    return out


def drop_page_cache() -> None:
    """Writes back and drops the page cache (root only): the next reads come from the disk."""
    os.sync()
    with open("/proc/sys/vm/drop_caches", "w") as f:
        f.write("3\n")


def timed(name: str, fn, work: list[np.ndarray], row_bytes: int, cold: bool = False) -> dict:
    times = []
    for indices in work:
        if cold:
            drop_page_cache()
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
        "cache": "cold" if cold else "warm",
        "distinct_rows": int(sum(len(np.unique(i)) for i in work)),
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
    parser.add_argument("--cold", action="store_true", help="drop the page cache before every batch (root)")
    parser.add_argument("--only", choices=["tessera", "memmap"], help="measure one system")
    parser.add_argument("--label", default="", help="appended to Tessera's system name")
    parser.add_argument("--uniform", action="store_true", help="uniform neighbours instead of Zipf (no hot rows)")
    parser.add_argument("--plain-upload", action="store_true",
                        help="upload the .npy file as bytes (64 KiB checksum blocks) instead of with put_tensor")
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
        if args.plain_upload:
            with open(path, "rb") as f:  # as any S3 client would: 64 KiB checksum blocks
                client.put(args.bucket, "features.npy", f)
        else:  # rows 4 KiB-aligned in the file, small checksum blocks
            client.put_tensor(args.bucket, "features.npy", np.load(path, mmap_mode="r"))
    blocks = client.stat(args.bucket, "features.npy").block_bytes
    local = np.load(path, mmap_mode="r")
    work = batches(rows, args.seeds, args.batches, rng, args.uniform)
    name = f"tessera gather, {blocks // 1024} KiB blocks" + (f" ({args.label})" if args.label else "")
    gather = lambda i: client.gather(args.bucket, "features.npy", i)  # noqa: E731
    results = {}
    if args.only in (None, "tessera"):
        if not args.cold:
            gather(work[0])  # warm: one pass over the same indices first
        results["tessera"] = timed(name, gather, work, args.row_bytes, args.cold)
    if args.only in (None, "memmap"):
        if not args.cold:
            local[work[0]]
        results["memmap"] = timed("numpy.memmap", lambda i: local[i], work, args.row_bytes, args.cold)
    check = work[-1][:100]
    assert np.array_equal(client.gather(args.bucket, "features.npy", check), local[check])
    if len(results) == 2:
        print(json.dumps({"ratio_tessera_over_memmap": results["tessera"]["rows_per_s"] / results["memmap"]["rows_per_s"],
                          "cache": "cold" if args.cold else "warm", "table_gib": args.table_gib,
                          "row_bytes": args.row_bytes}))


if __name__ == "__main__":
    main()
