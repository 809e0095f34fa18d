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
import atexit
import concurrent.futures
import json
import os
import subprocess
import sys
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


def rmat_graph(nodes: int, edges_per_node: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """A power-law graph by R-MAT (Chakrabarti et al.; a, b, c, d = 0.57, 0.19, 0.19, 0.05, as
    Graph500), node ids permuted so hubs spread over the table: (indptr, neighbours) in CSR."""
    scale = max(1, (nodes - 1).bit_length())
    edges = nodes * edges_per_node
    src = np.empty(edges, np.int64)
    dst = np.empty(edges, np.int64)
    step = 1 << 22
    for start in range(0, edges, step):
        count = min(step, edges - start)
        s = np.zeros(count, np.int64)
        d = np.zeros(count, np.int64)
        for level in range(scale):
            r = rng.random(count)
            down = r >= 0.57 + 0.19  # quadrants c and d: the source bit is set
            right = ((r >= 0.57) & (r < 0.57 + 0.19)) | (r >= 0.57 + 0.19 + 0.19)  # b and d
            s |= down.astype(np.int64) << level
            d |= right.astype(np.int64) << level
        src[start:start + count] = s % nodes
        dst[start:start + count] = d % nodes
    permutation = rng.permutation(nodes)
    src, dst = permutation[src], permutation[dst]
    order = np.argsort(src, kind="stable")
    indptr = np.zeros(nodes + 1, np.int64)
    np.cumsum(np.bincount(src, minlength=nodes), out=indptr[1:])
    return indptr, dst[order]


def graph_batches(indptr: np.ndarray, neighbours: np.ndarray, seeds: int, count: int,
                  rng: np.random.Generator) -> list[np.ndarray]:
    """Mini-batches as a GNN's neighbour sampler draws them: `seeds` random nodes, then 10
    neighbours of each (with replacement), then 5 of each of those; the rows of all of them."""
    nodes = len(indptr) - 1

    def sample(frontier: np.ndarray, fanout: int) -> np.ndarray:
        frontier = np.repeat(frontier, fanout)
        degree = indptr[frontier + 1] - indptr[frontier]
        frontier = frontier[degree > 0]
        degree = degree[degree > 0]
        return neighbours[indptr[frontier] + (rng.random(len(frontier)) * degree).astype(np.int64)]

    out = []
    for _ in range(count):
        hop0 = rng.integers(0, nodes, seeds)
        hop1 = sample(hop0, 10)
        hop2 = sample(hop1, 5)
        out.append(np.concatenate([hop0, hop1, hop2]).astype(np.int64))
    return out


def drop_page_cache() -> None:
    """Writes back and drops the page cache (root only): the next reads come from the disk."""
    os.sync()
    with open("/proc/sys/vm/drop_caches", "w") as f:
        f.write("3\n")


def cached_bytes(paths: list[str]) -> int:
    """Bytes of `paths` in the page cache, by util-linux `fincore` (0 if it is missing)."""
    total = 0
    for start in range(0, len(paths), 200):
        done = subprocess.run(["fincore", "--bytes", "--noheadings", "--output", "RES", *paths[start:start + 200]],
                              capture_output=True, text=True, check=False)
        total += sum(int(line) for line in done.stdout.split() if line.isdigit())
    return total


def summary(name: str, times: list[float], work: list[np.ndarray], row_bytes: int, cold: bool) -> dict:
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


def interleaved(systems: dict, work: list[np.ndarray], row_bytes: int, cold: bool, prepare) -> dict:
    """Each batch read by every system in turn (so drifts of this VM's disk and host cache hit
    them alike); cold: `prepare` (untimed) drops the page cache and reopens the local file
    before every system's batch. `systems`: name -> (read one batch, its share of each batch).
    Before the timed batches every system reads once, untimed: warm, the whole first batch;
    cold, 16 rows of it, so a Tessera client has fetched the table's metadata (its first
    gather reads the block checksums, ~300 ms for an 8 GiB table, once per process: reported
    on its own as "a fresh client's first gather"), as a training loop has after its first
    mini-batch. The page cache is dropped again before every timed batch."""
    for read, share in systems.values():
        if cold:
            prepare()
            read(share(work[0])[:16])
        else:
            read(share(work[0]))  # warm: one pass over the first batch first
    times: dict = {name: [] for name in systems}
    for indices in work:
        for name, (read, share) in systems.items():
            if cold:
                prepare()
            start = time.perf_counter()
            read(share(indices))
            times[name].append(time.perf_counter() - start)
    return {name: summary(name, times[name], [share(w) for w in work], row_bytes, cold)
            for name, (_, share) in systems.items()}


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
    parser.add_argument("--rmat", action="store_true",
                        help="sample neighbours of an R-MAT graph with a node per row (8 edges per node)")
    parser.add_argument("--minio", action="store_true", help="also boto3 ranged GETs against MinIO (6 processes)")
    parser.add_argument("--minio-rows", type=int, default=2000, help="rows per batch boto3 fetches")
    parser.add_argument("--cluster-data", help="the cluster's data directory (for the fincore check)")
    parser.add_argument("--reuse-out", action="store_true",
                        help="Tessera gathers into one output array allocated once (as a training loop's staging buffer)")
    parser.add_argument("--row-cache", type=float, default=0.1,
                        help="also Tessera with a row cache of this share of the table (0: not measured)")
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
    if args.rmat:
        indptr, neighbours = rmat_graph(rows, 8, np.random.default_rng(1))
        work = graph_batches(indptr, neighbours, args.seeds, args.batches, rng)
        print(json.dumps({"graph": "R-MAT", "nodes": rows, "edges": int(len(neighbours)),
                          "max_degree": int(np.diff(indptr).max())}))
    else:
        work = batches(rows, args.seeds, args.batches, rng, args.uniform)
    name = f"tessera gather, {blocks // 1024} KiB blocks" + (f" ({args.label})" if args.label else "")
    opened = {"local": np.load(path, mmap_mode="r")}

    def cold_start() -> None:
        # Unmap first: pages a live mapping holds survive a drop. Then reopen, as a fresh
        # process would.
        opened["local"] = None
        drop_page_cache()
        opened["local"] = np.load(path, mmap_mode="r")

    whole = lambda i: i  # noqa: E731
    systems = {}
    if args.only in (None, "tessera"):
        outs = {}

        def gather_with(c, i):
            if not args.reuse_out:
                return c.gather(args.bucket, "features.npy", i)
            out = outs.setdefault(id(c), np.empty((max(len(w) for w in work), columns), np.float32))
            return c.gather(args.bucket, "features.npy", i, out=out[:len(i)])

        if args.reuse_out:
            name += ", output reused"
        systems[name] = (lambda i: gather_with(client, i), whole)
        if args.row_cache > 0:
            # A client of its own (a row cache is per client), warming up over the batches.
            cached = tessera.connect(args.config)
            cached.set_gather_cache(int(args.row_cache * rows * args.row_bytes))
            systems[f"{name}, {args.row_cache:.0%} row cache"] = (lambda i: gather_with(cached, i), whole)
    if args.only in (None, "memmap"):
        systems["numpy.memmap"] = (lambda i: opened["local"][i], whole)
    if args.minio and args.only is None:
        systems["boto3 ranged GETs, MinIO"] = (boto3_minio(args, path), lambda i: i[: args.minio_rows])
    if args.cold:
        # Every file holding the table, on both sides: none of it may be cached after a drop.
        roots = [r for r in (args.cluster_data, os.path.join(args.dir, "minio")) if r and os.path.isdir(r)]
        files = [path] + [os.path.join(d, f) for r in roots for d, _, fs in os.walk(r) for f in fs]
        cold_start()
        print(json.dumps({"check": "fincore after a drop", "files": len(files), "cached_bytes": cached_bytes(files)}))
    if args.cold and args.only in (None, "tessera"):
        # What the untimed first read of `interleaved` leaves out: a new process's first gather,
        # cold, which fetches the table's whole record (block checksums included) once.
        cold_start()
        fresh = tessera.connect(args.config)
        start = time.perf_counter()
        fresh.gather(args.bucket, "features.npy", work[0][:16])
        print(json.dumps({"check": "a fresh client's first gather (cold, 16 rows)",
                          "ms": round((time.perf_counter() - start) * 1000, 1)}))
        del fresh
    results = interleaved(systems, work, args.row_bytes, args.cold, cold_start)
    check = work[-1][:100]
    assert np.array_equal(client.gather(args.bucket, "features.npy", check), opened["local"][check])
    ratios = {f"{ours} over {theirs}": results[ours]["rows_per_s"] / results[theirs]["rows_per_s"]
              for ours in results if ours.startswith("tessera") for theirs in results if not theirs.startswith("tessera")}
    if ratios:
        print(json.dumps({"ratios": ratios, "cache": "cold" if args.cold else "warm", "table_gib": args.table_gib,
                          "row_bytes": args.row_bytes}))


def boto3_minio(args, path: str):
    """What an S3 user would do: one ranged GET per row with boto3 (32 threads) against MinIO
    (6 processes, EC:2) holding the same .npy file. Returns the batch reader; its share of
    each batch is the first --minio-rows rows."""
    import boto3
    from botocore.config import Config

    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import compare_minio as cm

    atexit.register(cm.stop_all)  # MinIO's processes go with this one
    cm.ensure_minio()
    access, secret = "BENCHGATHER", "bench-gather-secret-key-0123456789"
    minio = cm.MinioCluster(args.dir, access, secret)
    minio.start()
    s3 = boto3.client("s3", endpoint_url=minio.url, aws_access_key_id=access, aws_secret_access_key=secret,
                      region_name="us-east-1", config=Config(max_pool_connections=32))
    if "gather" not in [b["Name"] for b in s3.list_buckets().get("Buckets", [])]:
        s3.create_bucket(Bucket="gather")
    try:  # a second run (cold after warm) finds the table there
        s3.head_object(Bucket="gather", Key="features.npy")
    except s3.exceptions.ClientError:
        s3.upload_file(path, "gather", "features.npy")
    with open(path, "rb") as f:
        header = 10 + int.from_bytes(f.read(10)[8:10], "little")
    pool = concurrent.futures.ThreadPoolExecutor(32)

    def fetch(row: int) -> bytes:
        start = header + row * args.row_bytes
        body = s3.get_object(Bucket="gather", Key="features.npy", Range=f"bytes={start}-{start + args.row_bytes - 1}")
        return body["Body"].read()

    def batch(indices: np.ndarray) -> None:
        got = list(pool.map(fetch, indices.tolist()))
        assert all(len(g) == args.row_bytes for g in got)

    return batch


if __name__ == "__main__":
    main()
