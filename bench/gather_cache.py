#!/usr/bin/env python3
"""The gather row cache's eviction (quick_cache's S3-FIFO) against LRU on the same trace: hit
ratios of Zipf-sampled GNN mini-batches (as bench/gather_bench.py draws them) with a cache of
--cache-share of the table. Tessera's hits and misses come from a real client's counters
(`gather_cache_stats`); LRU is simulated in Python on the same indices, with the same capacity
in rows and the same order of lookups and inserts (every slot looked up, then the rows read
inserted). Prints one JSON line per policy and the ratio of hit ratios.

    bench/gather_cache.py --config tessera-data/cluster.toml --table-mib 256 --batches 30
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections import OrderedDict

import numpy as np

import tessera

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gather_bench import batches  # noqa: E402  (the same mini-batches as the gather benchmark)

ROW_BYTES = 4096
# quick_cache counts each row's bytes plus this much bookkeeping (client::gather's ROW_OVERHEAD_BYTES).
ROW_OVERHEAD_BYTES = 96


def lru_hits(work: list[np.ndarray], capacity_rows: int) -> tuple[int, int]:
    cache: OrderedDict[int, None] = OrderedDict()
    hits = misses = 0
    for indices in work:
        missed = []
        for row in indices.tolist():
            if row in cache:
                cache.move_to_end(row)
                hits += 1
            else:
                misses += 1
                missed.append(row)
        for row in dict.fromkeys(missed):
            cache[row] = None
            cache.move_to_end(row)
            if len(cache) > capacity_rows:
                cache.popitem(last=False)
    return hits, misses


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", default=os.environ.get("TESSERA_CONFIG"))
    parser.add_argument("--bucket", default="bench-gather-cache")
    parser.add_argument("--table-mib", type=int, default=256)
    parser.add_argument("--seeds", type=int, default=1024)
    parser.add_argument("--batches", type=int, default=30)
    parser.add_argument("--cache-share", type=float, default=0.1, help="cache size as a share of the table")
    args = parser.parse_args()

    rows = (args.table_mib << 20) // ROW_BYTES
    client = tessera.connect(args.config)
    client.make_bucket(args.bucket)
    rng = np.random.default_rng(0)
    table = rng.standard_normal((rows, ROW_BYTES // 4), np.float32)
    client.put_tensor(args.bucket, "features.npy", table)
    # Hot rows spread over the table (Zipf's favourites are the lowest numbers).
    permutation = rng.permutation(rows)
    work = [permutation[b] for b in batches(rows, args.seeds, args.batches, rng)]
    capacity = int(args.cache_share * rows * ROW_BYTES)
    client.set_gather_cache(capacity)
    for indices in work:
        got = client.gather(args.bucket, "features.npy", indices)
        assert np.array_equal(got[:50], table[indices[:50]])
    stats = client.gather_cache_stats()
    ours = stats["hits"] / (stats["hits"] + stats["misses"])
    lru_h, lru_m = lru_hits(work, capacity // (ROW_BYTES + ROW_OVERHEAD_BYTES))
    theirs = lru_h / (lru_h + lru_m)
    common = {"table_mib": args.table_mib, "cache_share": args.cache_share, "lookups": int(sum(len(w) for w in work))}
    print(json.dumps({"policy": "S3-FIFO (quick_cache, Tessera's client)", "hit_ratio": ours, **common}))
    print(json.dumps({"policy": "LRU (simulated, same capacity in rows)", "hit_ratio": theirs, **common}))
    print(json.dumps({"hit_ratio_s3fifo_over_lru": ours / theirs, "miss_ratio_s3fifo_over_lru": (1 - ours) / (1 - theirs)}))


if __name__ == "__main__":
    main()
