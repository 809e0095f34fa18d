"""S3 Select over CSV benchmark: the particle query over CSV objects, records evaluated where
they are stored.

A particle table (id; x, y, z, ke floats) as ROWS rows of CSV with a header, in FILES objects,
queried with `SELECT * ... WHERE ke > X` at ~1% and ~0.01% selectivity and one aggregate, by:

- tessera-select: S3 Select (boto3 `select_object_content`, one call per object, all objects at
  once) through Tessera's gateway: each storage node decodes and filters the records that start
  in its chunks, and only matching records reach the gateway;
- minio-select: the same calls against MinIO's own S3 Select (6 processes, EC:2; the binary
  bench/compare_minio.py builds once and caches), the named baseline;
- duckdb-tessera: DuckDB reading the CSV objects over httpfs from Tessera's gateway and
  filtering them itself (what a client without pushdown does).

The objects go into Tessera with `tessera put` (one erasure-coded piece each; a multipart
upload's parts are evaluated by the gateway, see ARCHITECTURE.md) and into MinIO with boto3.
Servers run in a network namespace of their own, each query in a fresh process in a client
namespace across a veth pair (`bench/query_bench.py`'s setup, reused); "MB to client" is what
crossed the veth towards the client. With --shaped the link is 1 Gbit/s (`tc tbf`). Runs are
interleaved round by round; each result is the median of ROUNDS; ratios are against
minio-select and duckdb-tessera measured in the same run. Needs root.

    .venv/bin/python bench/select_bench.py [--rows 10000000] [--files 4] [--rounds 3] [--shaped] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import compare_minio as cm  # noqa: E402
import query_bench as qb  # noqa: E402  (namespaces, link, servers, DuckDB connection)

# Thresholds exactly representable in float32 and float64 (see query_bench.py).
KE = "CAST(s.ke AS FLOAT)"
AGGREGATE = "SELECT count(*), avg"
QUERIES = {
    "select_1pct": ("SELECT * FROM S3Object s WHERE " + KE + " > 0.990234375",
                    "SELECT * FROM {t} WHERE ke > 0.990234375"),
    "select_0.01pct": ("SELECT * FROM S3Object s WHERE " + KE + " > 0.9998779296875",
                       "SELECT * FROM {t} WHERE ke > 0.9998779296875"),
    "aggregate": (AGGREGATE + "(" + KE + ") FROM S3Object s WHERE " + KE + " > 0.5",
                  AGGREGATE + "(ke) FROM {t} WHERE ke > 0.5"),
}
SYSTEMS = ("tessera-select", "minio-select", "duckdb-tessera")


def make_dataset(directory: str, rows: int, files: int) -> list[str]:
    import pyarrow.csv as pcsv

    paths = []
    for i, table in enumerate(qb.particle_tables(rows, files)):
        path = os.path.join(directory, f"part-{i:03d}.csv")
        pcsv.write_csv(table, path, pcsv.WriteOptions(quoting_style="none"))
        paths.append(path)
    return paths


def s3_select(target: str, sql: str) -> tuple[float, int]:
    """S3 Select of `sql` over every CSV object, all at once: seconds and rows (for the
    aggregate, the count its per-object rows add up to)."""
    from concurrent.futures import ThreadPoolExecutor

    import boto3

    s3 = boto3.client("s3", endpoint_url=target, aws_access_key_id=qb.ACCESS, aws_secret_access_key=qb.SECRET,
                      region_name="us-east-1")
    keys = [o["Key"] for o in s3.list_objects_v2(Bucket="bench", Prefix="csv/")["Contents"]]

    def select(key: str) -> bytes:
        response = s3.select_object_content(
            Bucket="bench", Key=key, Expression=sql, ExpressionType="SQL",
            InputSerialization={"CSV": {"FileHeaderInfo": "USE"}}, OutputSerialization={"CSV": {}})
        return b"".join(e["Records"]["Payload"] for e in response["Payload"] if "Records" in e)

    with ThreadPoolExecutor(len(keys)) as pool:
        start = time.perf_counter()
        outputs = list(pool.map(select, keys))
        seconds = time.perf_counter() - start
    if sql.startswith(AGGREGATE):
        return seconds, sum(int(out.split(b",")[0]) for out in outputs)
    return seconds, sum(out.count(b"\n") for out in outputs)


def one_run(system: str, query: str, target: str) -> None:
    """Inside the client namespace: one query, printing {"seconds", "rows"} as JSON."""
    select_sql, duckdb_sql = QUERIES[query]
    if system.endswith("-select"):
        seconds, rows = s3_select(target, select_sql)
    else:
        con = qb.duckdb_connection(target)
        start = time.perf_counter()
        table = con.sql(duckdb_sql.format(t="read_csv('s3://bench/csv/*.csv', header = true)")).fetch_arrow_table()
        seconds = time.perf_counter() - start
        rows = table.column(0)[0].as_py() if duckdb_sql.startswith(AGGREGATE) else table.num_rows
    print(json.dumps({"seconds": seconds, "rows": rows}))


def measure(system: str, query: str, target: str) -> tuple[float, int, int]:
    before = qb.host_tx_bytes()
    out = qb.run("ip", "netns", "exec", qb.NS, sys.executable, os.path.abspath(__file__), "--one", system, query,
                 target, check=False)
    moved = qb.host_tx_bytes() - before
    if out.returncode != 0:
        raise SystemExit(f"{system} failed on {query}:\n{out.stderr}")
    result = json.loads(out.stdout.strip().splitlines()[-1])
    return result["seconds"], moved, result["rows"]


def upload(target: str, *paths: str) -> None:
    """Inside the client namespace: the CSV objects into bucket `bench` of an S3 endpoint."""
    qb.upload(target, *paths, prefix="csv/")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=10_000_000)
    parser.add_argument("--files", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--shaped", action="store_true", help="limit the client's link to 1 Gbit/s")
    parser.add_argument("--json", help="write the results here")
    parser.add_argument("--one", nargs=3, metavar=("SYSTEM", "QUERY", "TARGET"), help=argparse.SUPPRESS)
    parser.add_argument("--upload", nargs="+", metavar=("TARGET", "PATH"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        one_run(*args.one)
        return
    if args.upload:
        upload(*args.upload)
        return

    work = tempfile.mkdtemp(prefix="tessera-select-bench-", dir=os.environ.get("TMPDIR", "/var/tmp"))
    try:
        qb.setup_link(args.shaped)
        cm.log(f"== dataset: {args.rows:,} rows in {args.files} CSV files under {work}")
        paths = make_dataset(work, args.rows, args.files)
        total_bytes = sum(os.path.getsize(p) for p in paths)
        link = "1 Gbit/s (tc tbf)" if args.shaped else "unshaped veth"
        cm.log(f"   {total_bytes / 1e6:.0f} MB of CSV; link {link}")
        config, tessera_s3 = qb.start_tessera(work)
        qb.run(*qb.in_client(cm.TESSERA, "mb", "bench", "--config", config))
        for path in paths:
            qb.run(*qb.in_client(cm.TESSERA, "put", path, f"bench/csv/{os.path.basename(path)}", "--config", config))
        minio = qb.start_minio(work)
        qb.run(*qb.in_client(sys.executable, os.path.abspath(__file__), "--upload", minio, *paths))
        targets = {"tessera-select": tessera_s3, "minio-select": minio, "duckdb-tessera": tessera_s3}
        results: dict = {}
        for round_idx in range(args.rounds):
            for query in QUERIES:
                for system in SYSTEMS:
                    results.setdefault((query, system), []).append(measure(system, query, targets[system]))
            cm.log(f"   round {round_idx + 1}/{args.rounds} done")
    finally:
        cm.stop_all()
        qb.teardown_link()

    link = "1 Gbit/s" if args.shaped else "unshaped"
    print(f"\n{args.rows:,} rows, {total_bytes / 1e6:.0f} MB CSV in {args.files} objects, {link} link; "
          f"median of {args.rounds}")
    print(f"{'query':<16}{'system':<16}{'rows':>10}{'seconds':>9}{'MB to client':>14}{'vs minio-select':>17}"
          f"{'vs duckdb-tessera':>19}{'fewer bytes vs duckdb':>23}")
    report = []
    for query in QUERIES:
        medians = {}
        for system in SYSTEMS:
            runs = results[(query, system)]
            medians[system] = (statistics.median(r[0] for r in runs), statistics.median(r[1] for r in runs),
                               runs[0][2])
        counts = {system: m[2] for system, m in medians.items()}
        if len(set(counts.values())) != 1:
            raise SystemExit(f"{query}: systems disagree on the row count: {counts}")
        for system, (s, b, rows) in medians.items():
            vs_minio = medians["minio-select"][0] / s
            vs_duckdb = medians["duckdb-tessera"][0] / s
            fewer = medians["duckdb-tessera"][1] / max(b, 1)
            report.append({"query": query, "system": system, "rows": rows, "seconds": s, "bytes": b,
                           "speedup_vs_minio_select": vs_minio, "speedup_vs_duckdb_tessera": vs_duckdb,
                           "fewer_bytes_vs_duckdb_tessera": fewer})
            print(f"{query:<16}{system:<16}{rows:>10,}{s:>9.2f}{b / 1e6:>14.1f}{vs_minio:>16.2f}x{vs_duckdb:>18.2f}x"
                  f"{fewer:>22.1f}x")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"rows": args.rows, "files": args.files, "csv_bytes": total_bytes, "link": link,
                       "results": report}, f, indent=1)


if __name__ == "__main__":
    main()
