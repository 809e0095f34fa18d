"""tessera.fsspec: the tessera:// filesystem through fsspec, pandas and pyarrow."""

from __future__ import annotations

import os
import subprocess
import sys

import fsspec
import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.parquet as pq
import pytest

import tessera
import tessera.fsspec  # noqa: F401  (registers the protocol)


def frame(rows: int = 10_000) -> pd.DataFrame:
    rng = np.random.default_rng(5)
    return pd.DataFrame({
        "id": np.arange(rows, dtype=np.int64),
        "x": rng.normal(size=rows),
        "label": [f"row-{i % 17}" for i in range(rows)],
    })


def test_protocol_is_registered_by_entry_point(cluster):
    # A fresh interpreter that never imports tessera.fsspec itself.
    code = "import fsspec; fs = fsspec.filesystem('tessera'); print(type(fs).__module__)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env={**os.environ, "TESSERA_CONFIG": str(cluster.config)}, cwd="/")
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "tessera.fsspec"


def test_pandas_writes_and_reads_parquet_through_fsspec(cluster, bucket):
    df = frame()
    url = f"tessera://{bucket}/tables/t.parquet"
    df.to_parquet(url, storage_options={"config": str(cluster.config)})
    back = pd.read_parquet(url, storage_options={"config": str(cluster.config)})
    pd.testing.assert_frame_equal(back, df)
    # Column projection reads only parts of the file.
    assert list(pd.read_parquet(url, columns=["x"]).columns) == ["x"]


def test_pyarrow_reads_parquet_and_datasets_through_fsspec(client, bucket):
    fs = fsspec.filesystem("tessera", client=client)
    table = pa.Table.from_pandas(frame(5000), preserve_index=False)
    for part in range(3):
        with fs.open(f"{bucket}/ds/part-{part}.parquet", "wb") as f:
            pq.write_table(table.slice(part * 1000, 1000), f)
    read = pq.read_table(f"{bucket}/ds/part-1.parquet", filesystem=fs)
    assert read.equals(table.slice(1000, 1000))
    dataset = ds.dataset(f"{bucket}/ds", filesystem=fs, format="parquet")
    assert dataset.to_table().num_rows == 3000
    assert sorted(dataset.files) == [f"{bucket}/ds/part-{p}.parquet" for p in range(3)]


def test_filesystem_operations(client, bucket):
    fs = fsspec.filesystem("tessera", client=client)
    fs.pipe(f"tessera://{bucket}/a/b/c.txt", b"hello world")
    fs.pipe(f"{bucket}/a/d.txt", b"d")
    assert fs.cat(f"tessera://{bucket}/a/b/c.txt") == b"hello world"
    assert fs.cat_file(f"{bucket}/a/b/c.txt", start=6) == b"world"
    assert fs.cat_file(f"{bucket}/a/b/c.txt", start=-5, end=-1) == b"worl"
    assert fs.cat_file(f"{bucket}/a/b/c.txt", start=100) == b""
    assert fs.info(f"{bucket}/a/b/c.txt")["size"] == 11
    assert fs.info(f"{bucket}/a")["type"] == "directory"
    assert fs.isdir(bucket)
    assert sorted(fs.ls(f"{bucket}/a", detail=False)) == [f"{bucket}/a/b", f"{bucket}/a/d.txt"]
    assert fs.find(bucket) == [f"{bucket}/a/b/c.txt", f"{bucket}/a/d.txt"]
    assert bucket in fs.ls("", detail=False)
    with pytest.raises(FileNotFoundError):
        fs.info(f"{bucket}/missing")
    with pytest.raises(FileNotFoundError):
        fs.open(f"{bucket}/missing", "rb")
    fs.cp(f"{bucket}/a/d.txt", f"{bucket}/copy.txt")
    assert fs.cat(f"{bucket}/copy.txt") == b"d"
    fs.mv(f"{bucket}/copy.txt", f"{bucket}/moved.txt")
    assert not fs.exists(f"{bucket}/copy.txt") and fs.cat(f"{bucket}/moved.txt") == b"d"
    fs.rm(f"{bucket}/moved.txt")
    assert not fs.exists(f"{bucket}/moved.txt")
    with fs.open(f"{bucket}/a/b/c.txt", "rb") as f:
        f.seek(6)
        assert f.read() == b"world"


def test_fsspec_open_write_is_committed_on_close_only(client, bucket):
    fs = fsspec.filesystem("tessera", client=client)
    data = os.urandom(9 << 20)  # more than two write blocks
    f = fs.open(f"{bucket}/big.bin", "wb", block_size=4 << 20)
    f.write(data[: 5 << 20])
    assert not client.exists(bucket, "big.bin")
    f.write(data[5 << 20 :])
    f.close()
    assert client.get(bucket, "big.bin") == data
    with fsspec.open(f"tessera://{bucket}/big.bin", "rb", client=client) as f:
        f.seek(123_456)
        assert f.read(1000) == data[123_456:124_456]


def test_fsspec_errors_are_file_not_found(client):
    fs = fsspec.filesystem("tessera", client=client)
    with pytest.raises(FileNotFoundError):
        fs.cat("no-such-bucket-fs/x")
    assert isinstance(tessera.NotFound("x"), FileNotFoundError)
