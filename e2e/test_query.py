"""Near-data query, checked differentially against DuckDB on the same Parquet files.

The objects are uploaded with boto3 through the gateway (one of them large enough to go up in
parts, so its row groups are evaluated by the client instead of a node); `tessera query
--format arrow` runs each SQL shape with filters and projections on the nodes, DuckDB runs it
over the local copies of the files. Every shape is checked healthy and with two nodes killed.
"""

from __future__ import annotations

import datetime
import math
import subprocess
import time

import boto3.s3.transfer
import duckdb
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.ipc
import pyarrow.parquet as pq
import pytest

from conftest import TESSERA

FILES = 4
ROWS = 50_000
GROUP_ROWS = 8_000

# (SQL over table {t}, whether row order is defined by the query)
SHAPES = [
    ("SELECT * FROM {t} WHERE ke > 0.995", False),
    ("SELECT id, x FROM {t} WHERE ke BETWEEN 0.2 AND 0.2025", False),
    ("SELECT count(*) FROM {t} WHERE ke > 0.5 AND species = 'e'", True),
    ("SELECT count(*), avg(ke), min(x), max(y), sum(id) FROM {t} WHERE z < 0.1", True),
    ("SELECT species, count(*), avg(ke) FROM {t} GROUP BY species", False),
    ("SELECT id FROM {t} WHERE species IN ('p', 'n') AND NOT (x > 0.05)", False),
    ("SELECT id, species FROM {t} WHERE species LIKE 'e%' AND id % 50 = 0 OR species IS NULL AND ke < 0.01", False),
    ("SELECT id, ke * 2 + x AS v FROM {t} WHERE CAST(id AS DOUBLE) / 7 > 1000 AND id % 13 = 0", False),
    ("SELECT upper(species) AS s, length(species) AS l, count(*) FROM {t} WHERE species IS NOT NULL GROUP BY 1, 2", False),
    ("SELECT id, ke FROM {t} ORDER BY ke DESC, id LIMIT 10", True),
    ("SELECT count(*) FROM {t}", True),
    ("SELECT substr(species, 1, 1) AS c, count(*) FROM {t} GROUP BY c", False),
    ("SELECT id FROM {t} WHERE ke > 2", False),
    ("SELECT extract(month FROM day) AS m, count(*) FROM {t} WHERE day >= DATE '2026-03-01' GROUP BY m", False),
    ("SELECT id FROM {t} WHERE x < 0.001 OR (y > 0.999 AND z > 0.5)", False),
    ("SELECT max(id) - min(id), count(DISTINCT species) FROM {t} WHERE id BETWEEN 60000 AND 140000", True),
    ("SELECT coalesce(species, 'none') AS s, count(*) FROM {t} WHERE ke < 0.001 GROUP BY s", False),
]


def _particles(part: int) -> pa.Table:
    """A deterministic particle table: id, x, y, z, ke in [0, 1), species with nulls, a date."""
    first = part * ROWS
    ids = list(range(first, first + ROWS))

    def unit(i: int, salt: int) -> float:
        return ((i * 2654435761 + salt * 40503) % 1_000_003) / 1_000_003

    day0 = datetime.date(2026, 1, 1)
    return pa.table({
        "id": pa.array(ids, pa.int64()),
        "x": pa.array([unit(i, 1) for i in ids], pa.float64()),
        "y": pa.array([unit(i, 2) for i in ids], pa.float64()),
        "z": pa.array([unit(i, 3) for i in ids], pa.float64()),
        "ke": pa.array([unit(i, 4) for i in ids], pa.float64()),
        "species": pa.array([None if i % 11 == 0 else "epn"[i % 3] for i in ids], pa.string()),
        "day": pa.array([day0 + datetime.timedelta(days=i % 300) for i in ids], pa.date32()),
    })


@pytest.fixture(scope="module")
def dataset(tmp_path_factory, make_client):
    s3 = make_client()
    bucket = "e2e-query-particles"
    s3.create_bucket(Bucket=bucket)
    local = tmp_path_factory.mktemp("particles")
    paths = []
    for part in range(FILES):
        path = local / f"part-{part}.parquet"
        pq.write_table(_particles(part), path, row_group_size=GROUP_ROWS)
        paths.append(path)
    # Part 0 goes up in parts (a multipart object: the client evaluates it); the rest in one PUT.
    multipart = boto3.s3.transfer.TransferConfig(multipart_threshold=1 << 20, multipart_chunksize=5 << 20)
    single = boto3.s3.transfer.TransferConfig(multipart_threshold=1 << 30)
    for part, path in enumerate(paths):
        assert path.stat().st_size > 1 << 20
        s3.upload_file(str(path), bucket, f"particles/{path.name}", Config=multipart if part == 0 else single)
    return bucket, paths


def _tessera(cluster, sql: str) -> tuple[pa.Table, str]:
    out = subprocess.run(
        [str(TESSERA), "query", sql, "--format", "arrow", "--stats", "--config", str(cluster.config)],
        capture_output=True, timeout=120,
    )
    assert out.returncode == 0, out.stderr.decode()
    return pyarrow.ipc.open_stream(out.stdout).read_all(), out.stderr.decode()


def _duckdb(paths, sql: str) -> pa.Table:
    con = duckdb.connect()
    files = ", ".join(f"'{p}'" for p in paths)
    return con.sql(sql.format(t=f"read_parquet([{files}])")).fetch_arrow_table()


def _rows(table: pa.Table, ordered: bool) -> list[tuple]:
    def norm(v):
        if isinstance(v, float):
            return round(v, 9) if not math.isnan(v) else "nan"
        return v

    rows = [tuple(norm(v) for v in row.values()) for row in table.to_pylist()]
    if not ordered:
        rows.sort(key=lambda r: tuple((v is None, str(type(v)), v if v is not None else 0) for v in r))
    return rows


def _check(cluster, bucket, paths, sql: str, ordered: bool) -> str:
    ours, stats = _tessera(cluster, sql.format(t=f"'{bucket}/particles/'"))
    theirs = _duckdb(paths, sql)
    assert ours.num_columns == theirs.num_columns, sql
    assert _rows(ours, ordered) == _rows(theirs, ordered), sql
    return stats


@pytest.mark.parametrize("sql,ordered", SHAPES, ids=[s for s, _ in SHAPES])
def test_results_match_duckdb(cluster, dataset, sql, ordered):
    bucket, paths = dataset
    stats = _check(cluster, bucket, paths, sql, ordered)
    # The nodes did the scans of the single-PUT objects.
    assert " 0 node requests" not in stats, stats


def test_results_match_duckdb_with_two_nodes_down(cluster, dataset):
    bucket, paths = dataset
    with cluster.nodes_down(2, 5):
        for sql, ordered in SHAPES:
            _check(cluster, bucket, paths, sql, ordered)


def test_selective_query_moves_a_fraction_of_the_table(cluster, dataset):
    bucket, paths = dataset
    _, stats = _tessera(cluster, f"SELECT * FROM '{bucket}/particles/part-3.parquet' WHERE ke > 0.99")
    # "<rows> rows; <n> node requests; <r> result bytes from nodes; ..."
    result_bytes = int(stats.split(";")[2].split()[0])
    assert result_bytes * 10 < paths[3].stat().st_size, stats


@pytest.fixture(scope="module")
def record_dataset(tmp_path_factory, make_client, dataset):
    """The particle tables as CSV (`csv/`) and as JSON lines without the date (`json/`), one
    object per table, uploaded with boto3, a `_SUCCESS` marker beside them as Spark leaves one."""
    import json

    import pyarrow.csv

    bucket, paths = dataset
    s3 = make_client()
    local = tmp_path_factory.mktemp("records")
    json_paths = []
    for part, path in enumerate(paths):
        table = pq.read_table(path)
        csv_path = local / f"part-{part}.csv"
        pyarrow.csv.write_csv(table, csv_path)
        s3.upload_file(str(csv_path), bucket, f"csv/{csv_path.name}")
        json_path = local / f"part-{part}.jsonl"
        with open(json_path, "w") as out:
            for row in table.drop_columns(["day"]).to_pylist():
                out.write(json.dumps(row) + "\n")
        s3.upload_file(str(json_path), bucket, f"json/{json_path.name}")
        json_paths.append(json_path)
        assert csv_path.stat().st_size > 1 << 20  # several splits, on several nodes
    for prefix in ("csv", "json"):
        s3.put_object(Bucket=bucket, Key=f"{prefix}/_SUCCESS", Body=b"")
    return bucket, paths, json_paths


def _duckdb_json(paths, sql: str) -> pa.Table:
    con = duckdb.connect()
    files = ", ".join(f"'{p}'" for p in paths)
    return con.sql(sql.format(t=f"read_json([{files}], format='newline_delimited')")).fetch_arrow_table()


def _check_records(cluster, record_dataset, sql: str, ordered: bool) -> None:
    bucket, paths, json_paths = record_dataset
    ours, stats = _tessera(cluster, sql.format(t=f"'{bucket}/csv/'"))
    assert _rows(ours, ordered) == _rows(_duckdb(paths, sql), ordered), sql
    if "day" not in sql:
        ours, stats = _tessera(cluster, sql.format(t=f"'{bucket}/json/'"))
        assert _rows(ours, ordered) == _rows(_duckdb_json(json_paths, sql), ordered), sql


@pytest.mark.parametrize("sql,ordered", SHAPES, ids=[s for s, _ in SHAPES])
def test_csv_and_json_lines_tables_match_duckdb(cluster, record_dataset, sql, ordered):
    _check_records(cluster, record_dataset, sql, ordered)


def test_csv_table_columns_are_typed_and_scanned_on_the_nodes(cluster, record_dataset):
    bucket, paths, _ = record_dataset
    ours, stats = _tessera(cluster, f"SELECT * FROM '{bucket}/csv/' WHERE ke > 0.999")
    assert ours.schema.field("id").type == pa.int64()
    assert ours.schema.field("ke").type == pa.float64()
    assert ours.schema.field("day").type == pa.date32()
    # The nodes scanned their splits, and sent back a fraction of the table.
    requests, result_bytes = int(stats.split(";")[1].split()[0]), int(stats.split(";")[2].split()[0])
    assert requests > 0, stats
    assert result_bytes * 10 < sum(p.stat().st_size for p in paths), stats


def test_csv_and_json_tables_match_duckdb_with_two_nodes_down(cluster, record_dataset):
    with cluster.nodes_down(2, 5):
        for sql, ordered in SHAPES[:6]:
            _check_records(cluster, record_dataset, sql, ordered)


def test_tables_of_mixed_or_compressed_objects_are_refused(cluster, record_dataset, make_client):
    bucket = record_dataset[0]
    s3 = make_client()
    s3.put_object(Bucket=bucket, Key="mixed/a.csv", Body=b"a,b\n1,2\n")
    s3.put_object(Bucket=bucket, Key="mixed/b.jsonl", Body=b'{"a": 1}\n')
    s3.put_object(Bucket=bucket, Key="gz/a.csv.gz", Body=b"\x1f\x8b")
    s3.put_object(Bucket=bucket, Key="array/a.json", Body=b'[{"a": 1}, {"a": 2}]\n')
    s3.put_object(Bucket=bucket, Key="typed/a.csv", Body=b"n,s\n1,x\n2.5,y\n")
    for table, message in [
        ("mixed/", "not of one format"),
        ("gz/", "compressed"),
        ("array/", "JSON array"),
    ]:
        out = subprocess.run(
            [str(TESSERA), "query", f"SELECT * FROM '{bucket}/{table}'", "--config", str(cluster.config)],
            capture_output=True, text=True, timeout=60,
        )
        assert out.returncode != 0 and message in out.stderr, (table, out.stderr)
    # A column with integers and a float in its sample is a float column.
    ours, _ = _tessera(cluster, f"SELECT n, s FROM '{bucket}/typed/a.csv' ORDER BY n")
    assert ours.to_pylist() == [{"n": 1.0, "s": "x"}, {"n": 2.5, "s": "y"}]


def test_values_past_the_growth_bound_are_refused(cluster, dataset):
    bucket, _ = dataset
    out = subprocess.run(
        [str(TESSERA), "query", f"SELECT repeat(species, 1000000) FROM '{bucket}/particles/'",
         "--config", str(cluster.config)],
        capture_output=True, text=True, timeout=60,
    )
    assert out.returncode != 0 and "times the size of its inputs" in out.stderr, out.stderr


def _stat(cluster, path: str) -> str:
    out = subprocess.run([str(TESSERA), "stat", path, "--config", str(cluster.config)], capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return out.stdout


def test_gateway_stores_uploaded_parquet_aligned(cluster, make_client, tmp_path):
    """A stock client's multipart upload of a Parquet file is re-laid in the background: same
    bytes and ETag, each row group inside one chunk, read by its node without peers."""
    s3 = make_client()
    bucket = "e2e-relayout"
    s3.create_bucket(Bucket=bucket)
    ids = pa.array(range(16 * 65_536), pa.int64())
    table = pa.table({"id": ids, "ke": pc.divide(pc.cast(ids, pa.float64()), 1000.0)})
    path = tmp_path / "equal.parquet"
    pq.write_table(table, path, row_group_size=65_536, use_dictionary=False, compression="none")
    parts = boto3.s3.transfer.TransferConfig(multipart_threshold=5 << 20, multipart_chunksize=5 << 20)
    s3.upload_file(str(path), bucket, "t/equal.parquet", Config=parts)
    etag = s3.head_object(Bucket=bucket, Key="t/equal.parquet")["ETag"]
    assert etag.endswith('-4"'), etag  # a multipart object
    deadline = time.monotonic() + 120
    while "layout:       aligned" not in (stat := _stat(cluster, f"{bucket}/t/equal.parquet")):
        assert time.monotonic() < deadline, f"not re-laid within 120 s:\n{stat}"
        time.sleep(0.5)
    assert s3.head_object(Bucket=bucket, Key="t/equal.parquet")["ETag"] == etag
    body = s3.get_object(Bucket=bucket, Key="t/equal.parquet")["Body"].read()
    assert body == path.read_bytes()
    sql = "SELECT count(*) AS n, sum(id) AS s FROM {t} WHERE ke > 700.5"
    ours, stats = _tessera(cluster, sql.format(t=f"'{bucket}/t/'"))
    theirs = _duckdb([path], sql)
    assert _rows(ours, True) == _rows(theirs, True)
    assert "(0 from peers)" in stats and "client read 0 bytes" in stats, stats


def test_gateway_joins_a_multipart_csv_upload_into_one_piece(cluster, make_client, tmp_path):
    """aws-cli and boto3 upload files above 8 MB in parts; a CSV or JSON-lines object in parts
    is stored again whole in the background (same bytes and ETag), so that S3 Select over it
    runs on the nodes that hold it."""
    s3 = make_client()
    bucket = "e2e-join"
    s3.create_bucket(Bucket=bucket)
    rows = 600_000
    body = b"id,v\n" + b"".join(b"%d,%d\n" % (i, i % 1000) for i in range(rows))
    path = tmp_path / "big.csv"
    path.write_bytes(body)
    parts = boto3.s3.transfer.TransferConfig(multipart_threshold=5 << 20, multipart_chunksize=5 << 20)
    s3.upload_file(str(path), bucket, "logs/big.csv", Config=parts)
    etag = s3.head_object(Bucket=bucket, Key="logs/big.csv")["ETag"]
    assert etag.endswith('-2"'), etag  # a multipart object
    deadline = time.monotonic() + 120
    while "layout:       plain" not in (stat := _stat(cluster, f"{bucket}/logs/big.csv")):
        assert time.monotonic() < deadline, f"not joined within 120 s:\n{stat}"
        time.sleep(0.5)
    assert s3.head_object(Bucket=bucket, Key="logs/big.csv")["ETag"] == etag
    assert s3.get_object(Bucket=bucket, Key="logs/big.csv")["Body"].read() == body
    response = s3.select_object_content(
        Bucket=bucket, Key="logs/big.csv", Expression="SELECT id FROM S3Object WHERE CAST(v AS INT) = 7",
        ExpressionType="SQL", InputSerialization={"CSV": {"FileHeaderInfo": "USE"}}, OutputSerialization={"CSV": {}})
    out = b"".join(e["Records"]["Payload"] for e in response["Payload"] if "Records" in e)
    assert sorted(int(x) for x in out.split()) == [i for i in range(rows) if i % 1000 == 7]


def test_gateway_joins_a_multipart_npy_upload_into_one_piece(cluster, make_client, tmp_path):
    """A `.npy` feature table uploaded in parts is stored again whole too, so that a gather
    reads its rows in one batched request per node."""
    import struct

    s3 = make_client()
    bucket = "e2e-join-npy"
    s3.create_bucket(Bucket=bucket)
    rows = (12 << 20) // 128
    header = "{'descr': '<i8', 'fortran_order': False, 'shape': (%d, 16), }" % rows
    header += " " * (63 - (10 + len(header)) % 64) + "\n"
    path = tmp_path / "features.npy"
    path.write_bytes(b"\x93NUMPY\x01\x00" + struct.pack("<H", len(header)) + header.encode()
                     + struct.pack(f"<{rows * 16}q", *range(rows * 16)))
    parts = boto3.s3.transfer.TransferConfig(multipart_threshold=5 << 20, multipart_chunksize=5 << 20)
    s3.upload_file(str(path), bucket, "features.npy", Config=parts)
    deadline = time.monotonic() + 120
    while "layout:       plain" not in (stat := _stat(cluster, f"{bucket}/features.npy")):
        assert time.monotonic() < deadline, f"not joined within 120 s:\n{stat}"
        time.sleep(0.5)
    assert s3.get_object(Bucket=bucket, Key="features.npy")["Body"].read() == path.read_bytes()


def test_pyarrow_writes_through_its_s3_filesystem_are_re_laid_too(cluster, tmp_path):
    """pyarrow's own S3 filesystem (the AWS SDK for C++: footer last, multipart above 5 MB)."""
    from urllib.parse import urlparse

    import pyarrow.fs as pafs

    arrow_fs = pafs.S3FileSystem(
        access_key=cluster.access_key, secret_key=cluster.secret_key,
        endpoint_override=urlparse(cluster.endpoint).netloc, scheme="http", region="us-east-1",
        allow_bucket_creation=True,
    )
    bucket = "e2e-relayout-arrow"
    arrow_fs.create_dir(bucket)
    ids = pa.array(range(16 * 65_536), pa.int64())
    table = pa.table({"id": ids, "ke": pc.divide(pc.cast(ids, pa.float64()), 1000.0)})
    pq.write_table(table, f"{bucket}/w/t.parquet", filesystem=arrow_fs, row_group_size=65_536,
                   use_dictionary=False, compression="none")
    deadline = time.monotonic() + 120
    while "layout:       aligned" not in (stat := _stat(cluster, f"{bucket}/w/t.parquet")):
        assert time.monotonic() < deadline, f"not re-laid within 120 s:\n{stat}"
        time.sleep(0.5)
    assert pq.read_table(f"{bucket}/w/t.parquet", filesystem=arrow_fs).equals(table)
    ours, stats = _tessera(cluster, f"SELECT count(*) AS n FROM '{bucket}/w/' WHERE ke > 1000.5")
    assert ours.column(0).to_pylist() == [16 * 65_536 - 1_000_501]
    assert "(0 from peers)" in stats, stats
