"""Data tools over the gateway: s3fs/fsspec, pyarrow's S3 filesystem (AWS SDK for C++), DuckDB httpfs."""

from __future__ import annotations

import sysconfig
from pathlib import Path
from urllib.parse import urlparse

import duckdb
import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.fs as pafs
import pyarrow.parquet as pq
import pytest
import s3fs

from s3check import MIB, data, sha

ROWS = 5000


def _table(rows: int = ROWS, offset: int = 0) -> pa.Table:
    xs = list(range(offset, offset + rows))
    return pa.table({
        "x": pa.array(xs, pa.int64()),
        "name": pa.array([f"row-{i}" for i in xs]),
        "ratio": pa.array([i / 7 for i in xs], pa.float64()),
    })


@pytest.fixture
def fs(cluster):
    return s3fs.S3FileSystem(
        key=cluster.access_key, secret=cluster.secret_key, endpoint_url=cluster.endpoint,
        client_kwargs={"region_name": "us-east-1"}, config_kwargs={"s3": {"addressing_style": "path"}},
        skip_instance_cache=True, use_listings_cache=False,
    )


@pytest.fixture
def arrow_fs(cluster):
    return pafs.S3FileSystem(
        access_key=cluster.access_key, secret_key=cluster.secret_key,
        endpoint_override=urlparse(cluster.endpoint).netloc, scheme="http", region="us-east-1",
    )


def test_s3fs_write_read_ls_rm(fs, bucket):
    small = b"hello through fsspec\n"
    big = data(12 * MIB + 5, seed=30)  # above block_size: s3fs uploads it in parts
    with fs.open(f"{bucket}/dir/small.txt", "wb") as f:
        f.write(small)
    with fs.open(f"{bucket}/dir/big.bin", "wb", block_size=5 * MIB) as f:
        for i in range(0, len(big), MIB):
            f.write(big[i:i + MIB])
    fs.pipe_file(f"{bucket}/other.txt", b"piped")

    assert sorted(fs.ls(f"{bucket}/dir/", detail=False)) == [f"{bucket}/dir/big.bin", f"{bucket}/dir/small.txt"]
    assert sorted(fs.ls(bucket, detail=False)) == [f"{bucket}/dir", f"{bucket}/other.txt"]
    assert fs.info(f"{bucket}/dir/big.bin")["size"] == len(big)
    assert fs.cat_file(f"{bucket}/dir/small.txt") == small
    assert sha(fs.cat_file(f"{bucket}/dir/big.bin")) == sha(big)
    assert fs.cat_file(f"{bucket}/dir/big.bin", start=4 * MIB - 3, end=4 * MIB + 3) == big[4 * MIB - 3:4 * MIB + 3]
    with fs.open(f"{bucket}/dir/big.bin", "rb", block_size=MIB) as f:
        f.seek(9 * MIB)
        assert f.read(100) == big[9 * MIB:9 * MIB + 100]
    assert fs.find(bucket) == [f"{bucket}/dir/big.bin", f"{bucket}/dir/small.txt", f"{bucket}/other.txt"]

    fs.rm(f"{bucket}/dir", recursive=True)
    assert not fs.exists(f"{bucket}/dir/small.txt")
    assert fs.find(bucket) == [f"{bucket}/other.txt"]


def test_pyarrow_writes_and_reads_parquet(arrow_fs, s3, bucket):
    table = _table()
    pq.write_table(table, f"{bucket}/tables/t.parquet", filesystem=arrow_fs)
    info = arrow_fs.get_file_info(f"{bucket}/tables/t.parquet")
    assert info.type == pafs.FileType.File and info.size > 0
    assert pq.read_table(f"{bucket}/tables/t.parquet", filesystem=arrow_fs).equals(table)
    assert "ContentEncoding" not in s3.head_object(Bucket=bucket, Key="tables/t.parquet")


def test_pyarrow_streams_a_multipart_object(arrow_fs, s3, bucket):
    body = data(12 * MIB + 11, seed=31)  # Arrow's output stream uploads parts of 5 MiB and up
    with arrow_fs.open_output_stream(f"{bucket}/stream.bin") as out:
        for i in range(0, len(body), MIB):
            out.write(body[i:i + MIB])
    assert arrow_fs.get_file_info(f"{bucket}/stream.bin").size == len(body)
    with arrow_fs.open_input_file(f"{bucket}/stream.bin") as f:
        f.seek(8 * MIB - 2)
        assert f.read(4) == body[8 * MIB - 2:8 * MIB + 2]
        f.seek(0)
        assert sha(f.read()) == sha(body)
    assert "ContentEncoding" not in s3.head_object(Bucket=bucket, Key="stream.bin")


def test_pyarrow_dataset_reads_a_directory_of_parquet_files(arrow_fs, bucket):
    parts = [_table(1000, offset=i * 1000) for i in range(3)]
    for i, part in enumerate(parts):
        pq.write_table(part, f"{bucket}/ds/part-{i}.parquet", filesystem=arrow_fs)
    dataset = ds.dataset(f"{bucket}/ds/", filesystem=arrow_fs, format="parquet")
    got = dataset.to_table().sort_by("x")
    assert got.equals(pa.concat_tables(parts))


def _httpfs_extension_dir() -> Path:
    """duckdb-ext-httpfs installs duckdb_ext/extensions/v<version>/<platform>/httpfs.duckdb_extension."""
    root = Path(sysconfig.get_paths()["purelib"]) / "duckdb_ext" / "extensions"
    found = list(root.glob(f"v{duckdb.__version__}/*/httpfs.duckdb_extension"))
    assert found, f"no httpfs extension for duckdb {duckdb.__version__} under {root}: install e2e/requirements.txt"
    return root


@pytest.fixture
def duck(cluster):
    con = duckdb.connect()
    # Offline: never download, load the extension the duckdb-ext-httpfs wheel installed.
    con.execute("SET autoinstall_known_extensions = false")
    con.execute("SET autoload_known_extensions = false")
    con.execute("SET extension_directory = ?", [str(_httpfs_extension_dir())])
    con.execute("LOAD httpfs")
    con.execute(f"SET s3_endpoint = '{urlparse(cluster.endpoint).netloc}'")
    con.execute("SET s3_url_style = 'path'")
    con.execute("SET s3_use_ssl = false")
    con.execute("SET s3_region = 'us-east-1'")
    con.execute("SET s3_access_key_id = ?", [cluster.access_key])
    con.execute("SET s3_secret_access_key = ?", [cluster.secret_key])
    yield con
    con.close()


def test_duckdb_reads_parquet_written_by_pyarrow(duck, arrow_fs, bucket):
    pq.write_table(_table(), f"{bucket}/file.parquet", filesystem=arrow_fs)
    count, total = duck.execute(f"SELECT count(*), sum(x) FROM read_parquet('s3://{bucket}/file.parquet')").fetchone()
    assert (count, total) == (ROWS, ROWS * (ROWS - 1) // 2)


def test_duckdb_globs_a_prefix(duck, arrow_fs, bucket):
    for i in range(3):
        pq.write_table(_table(1000, offset=i * 1000), f"{bucket}/glob/p{i}.parquet", filesystem=arrow_fs)
    pq.write_table(_table(10), f"{bucket}/elsewhere/p.parquet", filesystem=arrow_fs)
    count, total = duck.execute(f"SELECT count(*), sum(x) FROM read_parquet('s3://{bucket}/glob/*.parquet')").fetchone()
    assert (count, total) == (3000, 3000 * 2999 // 2)


def test_duckdb_copy_to_s3_then_read_back(duck, arrow_fs, s3, bucket):
    duck.execute(
        f"COPY (SELECT range AS x, 'r' || range AS name FROM range({ROWS})) "
        f"TO 's3://{bucket}/from-duckdb.parquet' (FORMAT parquet)"
    )
    count, total = duck.execute(f"SELECT count(*), sum(x) FROM 's3://{bucket}/from-duckdb.parquet'").fetchone()
    assert (count, total) == (ROWS, ROWS * (ROWS - 1) // 2)
    table = pq.read_table(f"{bucket}/from-duckdb.parquet", filesystem=arrow_fs)
    assert table.num_rows == ROWS and table.column("x").to_pylist()[:3] == [0, 1, 2]
    assert "ContentEncoding" not in s3.head_object(Bucket=bucket, Key="from-duckdb.parquet")
