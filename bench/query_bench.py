"""Near-data query benchmark: the LANL particle query at this machine's scale.

A particle table (id int64; x, y, z, ke float32), ROWS rows in FILES Parquet objects, queried
with `SELECT * FROM t WHERE ke > X` at 1% and 0.01% selectivity and one aggregate, by:

- tessera-pushdown: `client.query` (Python; filters and projections on the storage nodes),
- tessera-client: the same query with `pushdown=False` (the client reads every row group),
- duckdb-tessera: DuckDB reading the objects over httpfs from Tessera's S3 gateway,
- duckdb-minio: the same from MinIO (6 processes, EC:2; only with --minio, built once).

Runs are interleaved round by round (this machine's disk and cores are shared by all), and each
result is the median of ROUNDS. "bytes to client" is what the querying process read from its
sockets during the query (/proc/self/io rchar: everything the process read, and the querying
process reads nothing else meanwhile). Prints times and ratios against duckdb-tessera, the
baseline measured in the same run.

    .venv/bin/python bench/query_bench.py [--rows 50000000] [--files 8] [--rounds 3] [--minio]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import compare_minio as cm  # noqa: E402  (cluster helpers: ports, processes, MinIO build)

QUERIES = {
    "select_1pct": "SELECT * FROM {t} WHERE ke > 0.99",
    "select_0.01pct": "SELECT * FROM {t} WHERE ke > 0.9999",
    "aggregate": "SELECT count(*), avg(ke) FROM {t} WHERE ke > 0.5",
}


def rchar() -> int:
    with open("/proc/self/io") as f:
        for line in f:
            if line.startswith("rchar:"):
                return int(line.split()[1])
    raise RuntimeError("no rchar in /proc/self/io")


def make_dataset(directory: str, rows: int, files: int) -> list[str]:
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    rng = np.random.default_rng(7)
    paths = []
    per_file = rows // files
    for i in range(files):
        n = per_file if i < files - 1 else rows - per_file * (files - 1)
        table = pa.table({
            "id": pa.array(np.arange(i * per_file, i * per_file + n, dtype=np.int64)),
            "x": pa.array(rng.random(n, dtype=np.float32)),
            "y": pa.array(rng.random(n, dtype=np.float32)),
            "z": pa.array(rng.random(n, dtype=np.float32)),
            "ke": pa.array(rng.random(n, dtype=np.float32)),
        })
        path = os.path.join(directory, f"part-{i:03d}.parquet")
        pq.write_table(table, path, row_group_size=1 << 20)
        paths.append(path)
    return paths


def duckdb_connection(url: str, access: str, secret: str):
    import duckdb

    con = duckdb.connect()
    con.execute("LOAD httpfs")
    endpoint = url.removeprefix("http://")
    con.execute(
        f"CREATE SECRET s (TYPE s3, KEY_ID '{access}', SECRET '{secret}', ENDPOINT '{endpoint}', "
        "URL_STYLE 'path', USE_SSL false, REGION 'us-east-1')"
    )
    return con


def timed(run) -> tuple[float, int, int]:
    before = rchar()
    start = time.perf_counter()
    rows = run()
    return time.perf_counter() - start, rchar() - before, rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=50_000_000)
    parser.add_argument("--files", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--minio", action="store_true", help="also DuckDB over MinIO (builds MinIO once, ~5 min)")
    parser.add_argument("--json", help="write the results here")
    args = parser.parse_args()

    import boto3
    import tessera

    work = tempfile.mkdtemp(prefix="tessera-query-bench-", dir=os.environ.get("TMPDIR", "/var/tmp"))
    access, secret = "BENCHQUERY", "bench-query-secret-key-0123456789"
    cm.log(f"== dataset: {args.rows:,} rows in {args.files} Parquet files under {work}")
    paths = make_dataset(work, args.rows, args.files)
    total_bytes = sum(os.path.getsize(p) for p in paths)
    cm.log(f"   {total_bytes / 1e6:.0f} MB of Parquet")

    systems = {}
    tessera_cluster = cm.TesseraCluster(work, access, secret)
    tessera_cluster.start()
    for path in paths:
        subprocess.run([cm.TESSERA, "mb", "bench", "--config", tessera_cluster.config], capture_output=True)
        subprocess.run([cm.TESSERA, "put", path, f"bench/particles/{os.path.basename(path)}",
                        "--config", tessera_cluster.config], check=True, capture_output=True)
    client = tessera.connect(tessera_cluster.config)
    table = "'bench/particles/'"

    def tessera_query(sql: str, pushdown: bool):
        return lambda: client.query(sql.format(t=table), pushdown=pushdown).num_rows

    duck_tessera = duckdb_connection(tessera_cluster.url, access, secret)
    glob = "read_parquet('s3://bench/particles/*.parquet')"

    def duck(con, sql: str):
        return lambda: con.sql(sql.format(t=glob)).fetch_arrow_table().num_rows

    for name, sql in QUERIES.items():
        systems[(name, "tessera-pushdown")] = tessera_query(sql, True)
        systems[(name, "tessera-client")] = tessera_query(sql, False)
        systems[(name, "duckdb-tessera")] = duck(duck_tessera, sql)

    if args.minio:
        cm.ensure_minio()
        minio = cm.MinioCluster(work, access, secret)
        minio.start()
        s3 = boto3.client("s3", endpoint_url=minio.url, aws_access_key_id=access, aws_secret_access_key=secret,
                          region_name="us-east-1")
        s3.create_bucket(Bucket="bench")
        for path in paths:
            s3.upload_file(path, "bench", f"particles/{os.path.basename(path)}")
        duck_minio = duckdb_connection(minio.url, access, secret)
        for name, sql in QUERIES.items():
            systems[(name, "duckdb-minio")] = duck(duck_minio, sql)

    results: dict = {key: [] for key in systems}
    rows_seen: dict = {}
    for round_idx in range(args.rounds):
        for key, run in systems.items():
            seconds, read_bytes, rows = timed(run)
            results[key].append((seconds, read_bytes))
            if rows_seen.setdefault(key[0], {}).setdefault(key[1], rows) != rows:
                raise SystemExit(f"{key}: {rows} rows this round, {rows_seen[key[0]][key[1]]} before")
        cm.log(f"   round {round_idx + 1}/{args.rounds} done")

    report = []
    print(f"\n{args.rows:,} rows, {total_bytes / 1e6:.0f} MB Parquet in {args.files} objects; median of {args.rounds}")
    print(f"{'query':<16}{'system':<18}{'rows':>10}{'seconds':>10}{'MB to client':>14}{'time vs duckdb-tessera':>24}"
          f"{'bytes vs duckdb-tessera':>25}")
    for name in QUERIES:
        base_key = (name, "duckdb-tessera")
        base_s = statistics.median(s for s, _ in results[base_key])
        base_b = statistics.median(b for _, b in results[base_key])
        counts = set(rows_seen[name].values())
        if len(counts) != 1:
            raise SystemExit(f"{name}: systems disagree on the row count: {rows_seen[name]}")
        for (q, system), runs in results.items():
            if q != name:
                continue
            s = statistics.median(x for x, _ in runs)
            b = statistics.median(y for _, y in runs)
            report.append({"query": q, "system": system, "rows": rows_seen[q][system], "seconds": s, "bytes": b,
                           "speedup_vs_duckdb_tessera": base_s / s, "bytes_ratio_vs_duckdb_tessera": base_b / max(b, 1)})
            print(f"{q:<16}{system:<18}{rows_seen[q][system]:>10,}{s:>10.2f}{b / 1e6:>14.1f}{base_s / s:>23.2f}x"
                  f"{base_b / max(b, 1):>24.1f}x")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"rows": args.rows, "files": args.files, "parquet_bytes": total_bytes, "results": report}, f, indent=1)
    cm.stop_all()


if __name__ == "__main__":
    main()
