"""Near-data query benchmark: the LANL particle query at this machine's scale.

A particle table (id int64; x, y, z, ke float32), ROWS rows in FILES Parquet objects, queried
with `SELECT * FROM t WHERE ke > X` at ~1% and ~0.01% selectivity and one aggregate, by:

- tessera-pushdown: Python `client.query` (filters and projections on the storage nodes) over
  objects `tessera put` stored in the aligned layout (each row group inside one chunk),
- tessera-pushdown-plain: the same over copies stored plain (`tessera put --no-align`: row
  groups cross chunks, so nodes read most of a row group from their peers),
- tessera-client: the same with `pushdown=False` (the client reads and evaluates every row group),
- duckdb-tessera: DuckDB reading the objects over httpfs from Tessera's S3 gateway,
- duckdb-minio: the same from MinIO (6 processes, EC:2; with --minio, built once, ~5 min),
- tessera-select: S3 Select (boto3 `select_object_content`) through Tessera's gateway, one call
  per object, all objects at once (Parquet scans on the nodes; the gateway streams CSV back),
- minio-select: the same against MinIO's own S3 Select (with --minio), where it accepts the
  query.

The servers (6 Tessera nodes and the gateway, MinIO) run in a server network namespace this
script creates, bound to its end of a veth pair; every query runs in a fresh process inside a
client namespace at the other end (both namespaces are the script's own: no traffic leaves
them). "MB to client" is what crossed the veth towards the client during that process (the tx
counter of the server's end), so it counts every byte each system moved, metadata included. With --shaped the link is limited to 1 Gbit/s each way by `tc tbf` (the
seed's "host behind a network bottleneck"); without, it is an unshaped veth. Runs are
interleaved round by round and each result is the median of ROUNDS; ratios are against
duckdb-tessera measured in the same run. Needs root (ip netns, tc).

    .venv/bin/python bench/query_bench.py [--rows 50000000] [--files 8] [--rounds 3] [--shaped] [--minio]
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
import compare_minio as cm  # noqa: E402  (process and port helpers, the MinIO build and cluster)

# Thresholds exactly representable in float32 (ke's type) and float64, so that every engine's
# type coercion (column to double, or literal to float) selects the same rows: 1 - 10/1024
# keeps ~0.98% of uniform ke, 1 - 1/8192 ~0.012%.
AGGREGATE = "SELECT count(*), avg(ke)"
QUERIES = {
    "select_1pct": "SELECT * FROM {t} WHERE ke > 0.990234375",
    "select_0.01pct": "SELECT * FROM {t} WHERE ke > 0.9998779296875",
    "aggregate": AGGREGATE + " FROM {t} WHERE ke > 0.5",
}
NS, SERVER_NS = "tqb-client", "tqb-server"
HOST_DEV, CLIENT_DEV = "tqb-host", "tqb-client"
HOST_IP, CLIENT_IP = "10.213.0.1", "10.213.0.2"
ACCESS, SECRET = "BENCHQUERY", "bench-query-secret-key-0123456789"


def run(*cmd: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, check=check, capture_output=True, text=True)


def in_server(*cmd: str) -> list[str]:
    return ["ip", "netns", "exec", SERVER_NS, *cmd]


def in_client(*cmd: str) -> list[str]:
    return ["ip", "netns", "exec", NS, *cmd]


def setup_link(shaped: bool) -> None:
    teardown_link()
    run("ip", "netns", "add", SERVER_NS)
    run("ip", "netns", "add", NS)
    run("ip", "link", "add", HOST_DEV, "type", "veth", "peer", "name", CLIENT_DEV)
    run("ip", "link", "set", HOST_DEV, "netns", SERVER_NS)
    run("ip", "link", "set", CLIENT_DEV, "netns", NS)
    for ns, dev, ip in ((SERVER_NS, HOST_DEV, HOST_IP), (NS, CLIENT_DEV, CLIENT_IP)):
        run("ip", "netns", "exec", ns, "ip", "addr", "add", f"{ip}/30", "dev", dev)
        run("ip", "netns", "exec", ns, "ip", "link", "set", dev, "up")
        run("ip", "netns", "exec", ns, "ip", "link", "set", "lo", "up")
        if shaped:
            run("ip", "netns", "exec", ns, "tc", "qdisc", "add", "dev", dev, "root", "tbf", "rate", "1gbit",
                "burst", "512kb", "latency", "20ms")


def teardown_link() -> None:
    # Deleting a namespace deletes its end of the veth pair, and with it the pair.
    run("ip", "netns", "del", NS, check=False)
    run("ip", "netns", "del", SERVER_NS, check=False)


def host_tx_bytes() -> int:
    out = run(*in_server("cat", f"/sys/class/net/{HOST_DEV}/statistics/tx_bytes"))
    return int(out.stdout)


def reachable(port: int) -> bool:
    """Whether a server listens on HOST_IP:port, seen from the client namespace."""
    probe = f"import socket; socket.create_connection(('{HOST_IP}', {port}), timeout=0.5).close()"
    return run(*in_client(sys.executable, "-c", probe), check=False).returncode == 0


def particle_tables(rows: int, files: int):
    """The particle table (id int64; x, y, z, ke uniform float32 in [0, 1)) as `files` Arrow
    tables of consecutive ids, the same for every run (seeded)."""
    import numpy as np
    import pyarrow as pa

    rng = np.random.default_rng(7)
    per_file = rows // files
    for i in range(files):
        n = per_file if i < files - 1 else rows - per_file * (files - 1)
        yield pa.table({
            "id": pa.array(np.arange(i * per_file, i * per_file + n, dtype=np.int64)),
            "x": pa.array(rng.random(n, dtype=np.float32)),
            "y": pa.array(rng.random(n, dtype=np.float32)),
            "z": pa.array(rng.random(n, dtype=np.float32)),
            "ke": pa.array(rng.random(n, dtype=np.float32)),
        })


def make_dataset(directory: str, rows: int, files: int) -> list[str]:
    import pyarrow.parquet as pq

    paths = []
    for i, table in enumerate(particle_tables(rows, files)):
        path = os.path.join(directory, f"part-{i:03d}.parquet")
        # 512Ki rows (~12 MB) per row group: a row group fits one chunk (at most 16 MiB), so
        # the aligned layout can store each inside one chunk on one node.
        pq.write_table(table, path, row_group_size=1 << 19)
        paths.append(path)
    return paths


def start_tessera(work: str) -> tuple[str, str]:
    """A 6-node 4+2 cluster and its gateway on HOST_IP; returns (config path, S3 endpoint)."""
    base = cm.free_port_block(8)
    data = f"{work}/tessera"
    run(cm.TESSERA, "init", "--nodes", "6", "--ec", "4+2", "--data", data, "--base-port", str(base))
    config = f"{data}/cluster.toml"
    with open(config) as f:
        text = f.read()
    with open(config, "w") as f:
        f.write(text.replace('"127.0.0.1:', f'"{HOST_IP}:'))
    env = dict(os.environ, TESSERA_LOG="warn")
    for i in range(6):
        cm.spawn(in_server(cm.TESSERA, "node", "--config", config, "--id", f"n{i + 1}"), env,
                 f"{work}/tessera-n{i + 1}.log")
    s3_port = base + 7
    genv = dict(env, TESSERA_ACCESS_KEY=ACCESS, TESSERA_SECRET_KEY=SECRET)
    cm.spawn(in_server(cm.TESSERA, "gateway", "--config", config, "--listen", f"{HOST_IP}:{s3_port}"), genv,
             f"{work}/tessera-gateway.log")
    cm.wait_until(lambda: reachable(s3_port), "tessera gateway")
    for i in range(6):
        cm.wait_until(lambda p=base + i: reachable(p), f"tessera node n{i + 1}")
    return config, f"http://{HOST_IP}:{s3_port}"


def start_minio(work: str) -> str:
    cm.ensure_minio()
    base = cm.free_port_block(12)
    ports = [base + i for i in range(6)]
    endpoints = [f"http://{HOST_IP}:{p}{work}/minio/n{i + 1}/d1" for i, p in enumerate(ports)]
    for i, port in enumerate(ports):
        os.makedirs(f"{work}/minio/n{i + 1}/d1", exist_ok=True)
        env = dict(os.environ, MINIO_ROOT_USER=ACCESS, MINIO_ROOT_PASSWORD=SECRET, MINIO_STORAGE_CLASS_STANDARD="EC:2",
                   _MINIO_SERVER_LOCAL=f"{HOST_IP}:{port}", MINIO_ROOTDRIVE_THRESHOLD_SIZE="1", MINIO_BROWSER="off",
                   MINIO_UPDATE="off", MINIO_API_SELECT_PARQUET="on")
        cmd = [cm.MINIO, "server", "--quiet", "--address", f"{HOST_IP}:{port}",
               "--console-address", f"{HOST_IP}:{base + 6 + i}"] + endpoints
        cm.spawn(in_server(*cmd), env, f"{work}/minio-n{i + 1}.log")

    def healthy():
        probe = ("import sys, urllib.request; "
                 f"sys.exit(urllib.request.urlopen('http://{HOST_IP}:{ports[0]}/minio/health/cluster', "
                 "timeout=1).status != 200)")
        return run(*in_client(sys.executable, "-c", probe), check=False).returncode == 0

    cm.wait_until(healthy, "MinIO cluster", deadline_s=120)
    return f"http://{HOST_IP}:{ports[0]}"


def s3_select(target: str, sql: str) -> tuple[float, int]:
    """S3 Select of `sql` over every object of the table, all at once: seconds (from the first
    request) and rows, or for the aggregate the count its per-object rows add up to."""
    from concurrent.futures import ThreadPoolExecutor

    import boto3

    s3 = boto3.client("s3", endpoint_url=target, aws_access_key_id=ACCESS, aws_secret_access_key=SECRET,
                      region_name="us-east-1")
    keys = [o["Key"] for o in s3.list_objects_v2(Bucket="bench", Prefix="particles/")["Contents"]]

    def select(key: str) -> bytes:
        response = s3.select_object_content(
            Bucket="bench", Key=key, Expression=sql.format(t="S3Object"), ExpressionType="SQL",
            InputSerialization={"Parquet": {}}, OutputSerialization={"CSV": {}})
        return b"".join(e["Records"]["Payload"] for e in response["Payload"] if "Records" in e)

    with ThreadPoolExecutor(len(keys)) as pool:
        start = time.perf_counter()
        outputs = list(pool.map(select, keys))
        seconds = time.perf_counter() - start
    if AGGREGATE in sql:
        return seconds, sum(int(out.split(b",")[0]) for out in outputs)
    return seconds, sum(out.count(b"\n") for out in outputs)


def one_run(system: str, sql: str, target: str) -> None:
    """Inside the client namespace: one query, printing {"seconds", "rows"} as JSON ("rows" is
    the count for the aggregate, so that every system's answer is checked against the others)."""
    if system.endswith("-select"):
        seconds, rows = s3_select(target, sql)
        print(json.dumps({"seconds": seconds, "rows": rows}))
        return
    if system.startswith("tessera"):
        import pyarrow.ipc
        import tessera
        import tessera.client
        client = tessera.connect(target)
        prefix = "plain" if system == "tessera-pushdown-plain" else "particles"
        start = time.perf_counter()
        # The cursor under client.query, for its counters (bytes the nodes read from peers).
        cursor = client._raw.query(sql.format(t=f"'bench/{prefix}/'"), system != "tessera-client", 512 << 20)
        table = pyarrow.ipc.open_stream(tessera.client._CursorStream(cursor)).read_all()
        seconds = time.perf_counter() - start
        rows = table.column(0)[0].as_py() if AGGREGATE in sql else table.num_rows
        print(json.dumps({"seconds": seconds, "rows": rows, "peer_bytes": cursor.stats()["node_peer_bytes"]}))
        return
    else:
        con = duckdb_connection(target)
        start = time.perf_counter()
        table = con.sql(sql.format(t="read_parquet('s3://bench/particles/*.parquet')")).fetch_arrow_table()
    seconds = time.perf_counter() - start
    rows = table.column(0)[0].as_py() if AGGREGATE in sql else table.num_rows
    print(json.dumps({"seconds": seconds, "rows": rows}))


def duckdb_connection(url: str):
    import sysconfig
    from pathlib import Path

    import duckdb

    con = duckdb.connect()
    # Offline: the httpfs extension the duckdb-ext-httpfs wheel installed (e2e/requirements.txt).
    extensions = Path(sysconfig.get_paths()["purelib"]) / "duckdb_ext" / "extensions"
    con.execute("SET autoinstall_known_extensions = false")
    con.execute("SET extension_directory = ?", [str(extensions)])
    con.execute("LOAD httpfs")
    con.execute(f"SET s3_endpoint = '{url.removeprefix('http://')}'")
    con.execute("SET s3_url_style = 'path'")
    con.execute("SET s3_use_ssl = false")
    con.execute("SET s3_region = 'us-east-1'")
    con.execute("SET s3_access_key_id = ?", [ACCESS])
    con.execute("SET s3_secret_access_key = ?", [SECRET])
    return con


def measure(system: str, sql: str, target: str) -> tuple[float, int, int, int] | None:
    """Seconds, bytes to the client, rows and bytes nodes read from their peers (Tessera's
    legs) of one query; `None` when the system refused it (MinIO's S3 Select does not take
    every query)."""
    before = host_tx_bytes()
    out = run("ip", "netns", "exec", NS, sys.executable, os.path.abspath(__file__), "--one", system, sql, target,
              check=False)
    moved = host_tx_bytes() - before
    if out.returncode != 0:
        if system == "minio-select":
            cm.log(f"   {system} refused {sql!r}: {out.stderr.strip().splitlines()[-1:]}")
            return None
        raise SystemExit(f"{system} failed on {sql!r}:\n{out.stderr}")
    result = json.loads(out.stdout.strip().splitlines()[-1])
    # Peer bytes are counted by the Python client's legs; S3 Select's are not (float nan).
    peer = result.get("peer_bytes", 0 if system in ("duckdb-tessera", "duckdb-minio") else float("nan"))
    return result["seconds"], moved, result["rows"], peer


def chunk_bytes_stored(size: int, k: int, m: int, chunk: int) -> int:
    """Bytes of data and parity chunks a stream of `size` bytes takes in stripes of k chunks of
    `chunk` bytes (the last stripe's chunks are a k-th of what is left)."""
    stripe = k * chunk
    full, rest = divmod(size, stripe)
    return (full * chunk + -(-rest // k)) * (k + m)


def stored_bytes(config: str) -> dict:
    """Inside the client namespace: chunk bytes the dataset takes in each layout, read from the
    objects' metadata."""
    import tessera

    client = tessera.connect(config)
    totals = {"aligned": 0, "plain": 0, "objects": []}
    for prefix, layout in (("particles/", "aligned"), ("plain/", "plain")):
        for entry in client.list("bench", prefix):
            info = client.head("bench", entry.key)
            stored = chunk_bytes_stored(info.stored_size, info.k, info.m, info.chunk_bytes)
            totals[layout] += stored
            if layout == "aligned":
                totals["objects"].append({"key": entry.key, "layout": info.layout, "size": info.size,
                                          "stored_size": info.stored_size, "chunk_bytes": info.chunk_bytes})
    totals["overhead_percent"] = (totals["aligned"] / totals["plain"] - 1) * 100
    return totals


def upload(target: str, *paths: str, prefix: str = "particles/") -> None:
    """Inside the client namespace: the dataset into bucket `bench` of an S3 endpoint, under
    `prefix`."""
    import boto3

    s3 = boto3.client("s3", endpoint_url=target, aws_access_key_id=ACCESS, aws_secret_access_key=SECRET,
                      region_name="us-east-1")
    s3.create_bucket(Bucket="bench")
    for path in paths:
        s3.upload_file(path, "bench", f"{prefix}{os.path.basename(path)}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=50_000_000)
    parser.add_argument("--files", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--shaped", action="store_true", help="limit the client's link to 1 Gbit/s")
    parser.add_argument("--minio", action="store_true", help="also DuckDB over MinIO")
    parser.add_argument("--json", help="write the results here")
    parser.add_argument("--one", nargs=3, metavar=("SYSTEM", "SQL", "TARGET"), help=argparse.SUPPRESS)
    parser.add_argument("--upload", nargs="+", metavar=("TARGET", "PATH"), help=argparse.SUPPRESS)
    parser.add_argument("--storage", metavar="CONFIG", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.storage:
        print(json.dumps(stored_bytes(args.storage)))
        return
    if args.one:
        one_run(*args.one)
        return
    if args.upload:
        upload(*args.upload)
        return

    work = tempfile.mkdtemp(prefix="tessera-query-bench-", dir=os.environ.get("TMPDIR", "/var/tmp"))
    try:
        setup_link(args.shaped)
        cm.log(f"== dataset: {args.rows:,} rows in {args.files} Parquet files under {work}")
        paths = make_dataset(work, args.rows, args.files)
        total_bytes = sum(os.path.getsize(p) for p in paths)
        cm.log(f"   {total_bytes / 1e6:.0f} MB of Parquet; link {'1 Gbit/s (tc tbf)' if args.shaped else 'unshaped veth'}")
        config, tessera_s3 = start_tessera(work)
        run(*in_client(cm.TESSERA, "mb", "bench", "--config", config))
        for path in paths:
            name = os.path.basename(path)
            run(*in_client(cm.TESSERA, "put", path, f"bench/particles/{name}", "--config", config))
            run(*in_client(cm.TESSERA, "put", "--no-align", path, f"bench/plain/{name}", "--config", config))
        storage = json.loads(run(*in_client(sys.executable, os.path.abspath(__file__), "--storage", config)).stdout)
        systems = {"tessera-pushdown": config, "tessera-pushdown-plain": config, "tessera-client": config,
                   "duckdb-tessera": tessera_s3, "tessera-select": tessera_s3}
        if args.minio:
            minio = start_minio(work)
            run(*in_client(sys.executable, os.path.abspath(__file__), "--upload", minio, *paths))
            systems["duckdb-minio"] = minio
            systems["minio-select"] = minio

        results: dict = {}
        for round_idx in range(args.rounds):
            for name, sql in QUERIES.items():
                for system, target in systems.items():
                    measured = measure(system, sql, target)
                    if measured is not None:
                        results.setdefault((name, system), []).append(measured)
            cm.log(f"   round {round_idx + 1}/{args.rounds} done")
    finally:
        cm.stop_all()
        teardown_link()

    report = []
    link = "1 Gbit/s" if args.shaped else "unshaped"
    print(f"\n{args.rows:,} rows, {total_bytes / 1e6:.0f} MB Parquet in {args.files} objects, {link} link; "
          f"median of {args.rounds}")
    print(f"stored bytes (data and parity): aligned {storage['aligned'] / 1e6:.1f} MB, plain "
          f"{storage['plain'] / 1e6:.1f} MB: +{storage['overhead_percent']:.3f}% for the aligned layout")
    print(f"{'query':<16}{'system':<24}{'rows':>10}{'seconds':>9}{'MB to client':>14}{'speed vs duckdb-tessera':>25}"
          f"{'fewer bytes':>13}{'MB from peers':>14}")
    for name in QUERIES:
        base = results[(name, "duckdb-tessera")]
        base_s = statistics.median(r[0] for r in base)
        base_b = statistics.median(r[1] for r in base)
        counts = {system: runs[0][2] for (q, system), runs in results.items() if q == name}
        if len(set(counts.values())) != 1:
            raise SystemExit(f"{name}: systems disagree on the row count: {counts}")
        for (q, system), runs in results.items():
            if q != name:
                continue
            s = statistics.median(r[0] for r in runs)
            b = statistics.median(r[1] for r in runs)
            peer = statistics.median(r[3] for r in runs)
            report.append({"query": q, "system": system, "rows": counts[system], "seconds": s, "bytes": b,
                           "node_peer_bytes": None if peer != peer else peer,
                           "speedup_vs_duckdb_tessera": base_s / s, "fewer_bytes_vs_duckdb_tessera": base_b / max(b, 1)})
            print(f"{q:<16}{system:<24}{counts[system]:>10,}{s:>9.2f}{b / 1e6:>14.1f}{base_s / s:>24.2f}x"
                  f"{base_b / max(b, 1):>12.1f}x{peer / 1e6:>14.1f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"rows": args.rows, "files": args.files, "parquet_bytes": total_bytes, "link": link,
                       "storage": storage, "results": report}, f, indent=1)


if __name__ == "__main__":
    main()
