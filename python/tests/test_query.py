"""client.query: SQL over Parquet, CSV and JSON-lines objects, evaluated on the storage nodes, as pyarrow tables,
streaming readers, pandas and polars-ready Arrow; errors as QueryError."""

from __future__ import annotations

import io

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

import tessera

ROWS = 30_000


def _table(first: int) -> pa.Table:
    ids = pa.array(range(first, first + ROWS), pa.int64())
    ke = pc.divide(pc.cast(pc.bit_wise_and(pc.multiply(ids, 7919), 1023), pa.float64()), 1024.0)
    species = pa.array([None if i % 7 == 0 else "epn"[i % 3] for i in range(first, first + ROWS)])
    return pa.table({"id": ids, "ke": ke, "species": species})


def _parquet(table: pa.Table) -> bytes:
    sink = io.BytesIO()
    pq.write_table(table, sink, row_group_size=4_000)
    return sink.getvalue()


@pytest.fixture(scope="module")
def particles(client) -> tuple[str, pa.Table]:
    bucket = "query-particles"
    client.make_bucket(bucket)
    tables = [_table(part * ROWS) for part in range(3)]
    for part, table in enumerate(tables):
        client.put(bucket, f"p/{part}.parquet", _parquet(table))
    return bucket, pa.concat_tables(tables)


def test_query_returns_the_rows_a_local_filter_finds(client, particles):
    bucket, local = particles
    result = client.query(f"SELECT id, ke FROM '{bucket}/p/' WHERE ke > 0.99 AND species = 'e' ORDER BY id")
    mask = pc.and_(pc.greater(local["ke"], 0.99), pc.equal(local["species"], "e"))
    expected = local.filter(mask).select(["id", "ke"])
    assert result.column("id").to_pylist() == expected.column("id").to_pylist()
    assert result.column("ke").to_pylist() == expected.column("ke").to_pylist()
    # The same through the client's own evaluation.
    same = client.query(
        f"SELECT id, ke FROM '{bucket}/p/' WHERE ke > 0.99 AND species = 'e' ORDER BY id", pushdown=False
    )
    assert same.equals(result)


def test_csv_and_json_lines_objects_query_like_parquet(client, particles):
    import json

    import pyarrow.csv

    bucket, local = particles
    for part in range(3):
        table = local.slice(part * ROWS, ROWS)
        sink = io.BytesIO()
        pyarrow.csv.write_csv(table, sink)
        client.put(bucket, f"c/{part}.csv", sink.getvalue())
        lines = "".join(json.dumps(row) + "\n" for row in table.to_pylist())
        client.put(bucket, f"j/{part}.jsonl", lines.encode())
    sql = "SELECT id, ke, species FROM {t} WHERE ke > 0.99 ORDER BY id"
    expected = client.query(sql.format(t=f"'{bucket}/p/'"))
    for prefix in ("c", "j"):
        result = client.query(sql.format(t=f"'{bucket}/{prefix}/'"))
        assert result.schema.field("id").type == pa.int64(), prefix
        assert result.to_pylist() == expected.to_pylist(), prefix
        # Empty CSV fields and JSON nulls are NULL, as in the Parquet table.
        nulls = client.query(f"SELECT count(*) AS n FROM '{bucket}/{prefix}/' WHERE species IS NULL")
        assert nulls.column("n").to_pylist() == [local["species"].null_count], prefix


def test_results_go_to_polars_and_duckdb(client, particles):
    import duckdb
    import polars as pl

    bucket, local = particles
    sql = f"SELECT id, ke FROM '{bucket}/p/' WHERE ke > 0.99"
    expected = sorted(
        i for i, k in zip(local["id"].to_pylist(), local["ke"].to_pylist()) if k > 0.99
    )
    frame = pl.from_arrow(client.query(sql))
    assert sorted(frame["id"].to_list()) == expected
    # DuckDB reads the streaming reader as it comes, and filters it further.
    even = duckdb.arrow(client.query_reader(sql)).filter("id % 2 = 0").fetch_arrow_table()
    assert sorted(even.column("id").to_pylist()) == [i for i in expected if i % 2 == 0]


def test_aggregates_and_pandas(client, particles):
    bucket, local = particles
    result = client.query(
        f"SELECT species, count(*) AS n, sum(id) AS s FROM '{bucket}/p/' GROUP BY species ORDER BY species"
    )
    expected: dict = {}
    for row in local.select(["species", "id"]).to_pylist():
        n, s = expected.get(row["species"], (0, 0))
        expected[row["species"]] = (n + 1, s + row["id"])
    got = {row["species"]: (row["n"], row["s"]) for row in result.to_pylist()}
    assert got == expected
    frame = result.to_pandas()
    assert list(frame.columns) == ["species", "n", "s"] and len(frame) == len(expected)


def test_streaming_reader_yields_batches_and_can_stop_early(client, particles):
    bucket, local = particles
    reader = client.query_reader(f"SELECT id FROM '{bucket}/p/'")
    assert isinstance(reader, pa.RecordBatchReader)
    assert reader.schema.names == ["id"]
    first = reader.read_next_batch()
    assert first.num_rows > 0
    reader.close()
    # Read to the end: every row once.
    rows = client.query_reader(f"SELECT id FROM '{bucket}/p/'").read_all()
    assert sorted(rows.column("id").to_pylist()) == local.column("id").to_pylist()


def test_bad_queries_raise_query_error(client, particles):
    bucket, _ = particles
    with pytest.raises(tessera.QueryError, match="nope"):
        client.query(f"SELECT nope FROM '{bucket}/p/'")
    with pytest.raises(tessera.QueryError, match="only SELECT"):
        client.query("DROP TABLE x")
    client.put(bucket, "not-parquet.parquet", b"a,b\n1,2\n")
    with pytest.raises(tessera.QueryError, match="not a Parquet file"):
        client.query(f"SELECT * FROM '{bucket}/not-parquet.parquet'")
    client.put(bucket, "ragged.csv", b"a,b\n1,2\n3\n")
    with pytest.raises(tessera.QueryError, match="ragged.csv"):
        client.query(f"SELECT * FROM '{bucket}/ragged.csv'")
    with pytest.raises(tessera.QueryError, match="times the size of its inputs"):
        client.query(f"SELECT repeat(species, 100) FROM '{bucket}/p/'")
    with pytest.raises((tessera.NoSuchBucket, tessera.NotFound)):
        client.query("SELECT * FROM 'no-such-bucket-here/x.parquet'")


def test_parquet_bytes_are_stored_aligned_and_query_the_same(client):
    bucket = "query-aligned"
    client.make_bucket(bucket)
    ids = pa.array(range(16 * 65_536), pa.int64())
    table = pa.table({"id": ids, "ke": pc.divide(pc.cast(ids, pa.float64()), 1000.0)})
    sink = io.BytesIO()
    pq.write_table(table, sink, row_group_size=65_536, use_dictionary=False, compression="none")
    data = sink.getvalue()
    aligned = client.put(bucket, "a/t.parquet", data)
    plain = client.put(bucket, "p/t.parquet", data, align=False)
    assert (aligned.layout, plain.layout) == ("aligned", "plain")
    assert aligned.size == plain.size == plain.stored_size == len(data)
    # Row groups each inside one chunk cost at most 1% more stored bytes.
    assert aligned.size < aligned.stored_size <= aligned.size * 101 // 100
    assert client.get(bucket, "a/t.parquet") == data
    assert client.get(bucket, "a/t.parquet", range=(1_000_000, 3_000_000)) == data[1_000_000:3_000_000]
    sql = "SELECT count(*) AS n, sum(id) AS s, max(ke) AS top FROM '{}' WHERE ke > 700.5"
    got = client.query(sql.format(f"{bucket}/a/"))
    assert got.equals(client.query(sql.format(f"{bucket}/p/")))
    expected = table.filter(pc.greater(table["ke"], 700.5))
    assert got.column("n").to_pylist() == [expected.num_rows]
    assert got.column("s").to_pylist() == [pc.sum(expected["id"]).as_py()]
    # Bytes that are not Parquet are stored plain, whatever align says.
    assert client.put(bucket, "x.bin", b"PAR1" + b"\0" * 100).layout == "plain"


def test_record_tables_type_skip_and_check_what_stock_writers_leave(client, bucket):
    # A JSON column of mixed values is a string column; one with only nulls in the sample (each
    # object's first 64 KiB) is too, and its later numbers read as their text.
    nulls = b'{"zip": "A1", "v": null}\n' * 3000
    client.put(bucket, "m/a.jsonl", b'{"zip": 12345, "v": null}\n' + nulls + b'{"zip": "B2", "v": 3}\n')
    got = client.query(f"SELECT zip, v FROM '{bucket}/m/' WHERE v IS NOT NULL OR zip = '12345'").to_pylist()
    assert sorted(got, key=str) == sorted([{"zip": "12345", "v": None}, {"zip": "B2", "v": "3"}], key=str)
    # Spark's and Hive's in-flight files and empty partitions are not the table's.
    client.put(bucket, "c/_temporary/0/part-9.csv", b"a,b\n9,9\n")
    client.put(bucket, "c/.hive-staging_1/part-8.csv", b"a,b\n8,8\n")
    client.put(bucket, "c/part-0.csv", b"")
    client.put(bucket, "c/part-1.csv", b"a,b\n1,2\n")
    client.put(bucket, "c/_SUCCESS", b"")
    assert client.query(f"SELECT a, b FROM '{bucket}/c/'").to_pylist() == [{"a": 1, "b": 2}]
    # Past the sample (1 MiB of heads), every CSV object's header is still checked.
    body = b"a,b\n" + b"1,2\n" * 20_000
    for i in range(18):
        client.put(bucket, f"wide/{i:02}.csv", body)
    assert client.query(f"SELECT count(*) AS n FROM '{bucket}/wide/'").column("n").to_pylist() == [18 * 20_000]
    client.put(bucket, "wide/99.csv", b"b,a\n2,1\n")
    with pytest.raises(tessera.QueryError, match="header line differs"):
        client.query(f"SELECT count(*) FROM '{bucket}/wide/'")
