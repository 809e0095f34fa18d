"""S3 Select (SelectObjectContent) through the gateway with boto3, unchanged: CSV, JSON and
Parquet input, CSV and JSON output, the event stream (Records, Stats, End), and the errors S3
uses for what is not supported."""

from __future__ import annotations

import io
import json

import botocore.exceptions
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

PEOPLE = [
    ("Ana", 34, "Lisbon"), ("Bo", 27, "Oslo"), ("Cy", 41, "Paris"), ("Di", 19, "Paris"),
    ("Ed", 52, "Rome"), ("Fay", 30, "Oslo"), ("Gus", None, "Lisbon"),
]


def _csv(header: bool) -> bytes:
    lines = ["name,age,city"] if header else []
    lines += [f"{n},{'' if a is None else a},{c}" for n, a, c in PEOPLE]
    return ("\n".join(lines) + "\n").encode()


def _select(s3, bucket, key, sql, input_serialization, output_serialization=None, **extra):
    response = s3.select_object_content(
        Bucket=bucket, Key=key, Expression=sql, ExpressionType="SQL",
        InputSerialization=input_serialization,
        OutputSerialization=output_serialization or {"CSV": {}}, **extra,
    )
    records, stats, ended = b"", None, False
    for event in response["Payload"]:
        if "Records" in event:
            records += event["Records"]["Payload"]
        elif "Stats" in event:
            stats = event["Stats"]["Details"]
        elif "End" in event:
            ended = True
    assert ended, "no End event"
    assert stats is not None and stats["BytesReturned"] == len(records)
    return records.decode(), stats


def test_csv_with_header_and_csv_output(s3, bucket):
    s3.put_object(Bucket=bucket, Key="people.csv", Body=_csv(header=True))
    csv_in = {"CSV": {"FileHeaderInfo": "USE"}}
    out, stats = _select(s3, bucket, "people.csv",
                         "SELECT s.name, s.city FROM S3Object s WHERE CAST(NULLIF(s.age, '') AS INT) > 30", csv_in)
    assert out.splitlines() == ["Ana,Lisbon", "Cy,Paris", "Ed,Rome"]
    assert stats["BytesScanned"] >= len(_csv(header=True))
    out, _ = _select(s3, bucket, "people.csv",
                     "SELECT count(*), sum(CAST(NULLIF(age, '') AS INT)), min(name), max(city) FROM S3Object "
                     "WHERE age <> ''", csv_in)
    assert out.strip() == f"6,{34 + 27 + 41 + 19 + 52 + 30},Ana,Rome"
    out, _ = _select(s3, bucket, "people.csv",
                     "SELECT upper(s.name), char_length(s.city) FROM S3Object s "
                     "WHERE s.city IN ('Oslo', 'Rome') AND s.name LIKE '%d' OR s.name BETWEEN 'A' AND 'B' LIMIT 5",
                     csv_in)
    assert sorted(out.splitlines()) == ["ANA,6", "ED,4"]


def test_csv_without_header_by_position_and_json_output(s3, bucket):
    s3.put_object(Bucket=bucket, Key="people.csv", Body=_csv(header=False))
    out, _ = _select(s3, bucket, "people.csv", "SELECT s._1, s._2 FROM S3Object s WHERE s._3 = 'Paris'",
                     {"CSV": {"FileHeaderInfo": "NONE"}}, {"JSON": {}})
    assert [json.loads(line) for line in out.splitlines()] == [{"_1": "Cy", "_2": "41"}, {"_1": "Di", "_2": "19"}]
    # A missing value is an empty string in CSV, as in S3 Select.
    out, _ = _select(s3, bucket, "people.csv", "SELECT s._1 FROM S3Object s WHERE s._2 = ''",
                     {"CSV": {"FileHeaderInfo": "NONE"}})
    assert out.splitlines() == ["Gus"]
    semicolons = _csv(header=True).replace(b",", b";")
    s3.put_object(Bucket=bucket, Key="semi.csv", Body=b"# a comment line\n" + semicolons)
    out, _ = _select(s3, bucket, "semi.csv", "SELECT name FROM S3Object WHERE city = 'Oslo'",
                     {"CSV": {"FileHeaderInfo": "USE", "FieldDelimiter": ";", "Comments": "#"}})
    assert out.splitlines() == ["Bo", "Fay"]


def test_json_lines_input(s3, bucket):
    lines = "\n".join(json.dumps({"name": n, "age": a, "city": c}) for n, a, c in PEOPLE) + "\n"
    s3.put_object(Bucket=bucket, Key="people.json", Body=lines.encode())
    out, _ = _select(s3, bucket, "people.json",
                     "SELECT s.name FROM S3Object s WHERE s.age >= 30 OR s.age IS NULL",
                     {"JSON": {"Type": "LINES"}}, {"JSON": {}})
    assert [json.loads(line)["name"] for line in out.splitlines()] == ["Ana", "Cy", "Ed", "Fay", "Gus"]
    out, _ = _select(s3, bucket, "people.json", "SELECT avg(age) FROM S3Object WHERE city = 'Oslo'",
                     {"JSON": {"Type": "LINES"}})
    assert float(out.strip()) == 28.5


def test_parquet_input_is_scanned_on_the_nodes(s3, bucket):
    table = pa.table({"id": pa.array(range(100_000), pa.int64()),
                      "ke": pa.array([(i * 7919 % 1000) / 1000 for i in range(100_000)], pa.float64())})
    sink = io.BytesIO()
    pq.write_table(table, sink, row_group_size=10_000)
    s3.put_object(Bucket=bucket, Key="particles.parquet", Body=sink.getvalue())
    out, stats = _select(s3, bucket, "particles.parquet",
                         "SELECT count(*) FROM S3Object s WHERE s.ke > 0.99", {"Parquet": {}})
    assert int(out.strip()) == sum(1 for i in range(100_000) if (i * 7919 % 1000) / 1000 > 0.99)
    out, _ = _select(s3, bucket, "particles.parquet",
                     "SELECT id FROM S3Object WHERE ke = 0.5 AND id < 2000", {"Parquet": {}}, {"JSON": {}})
    assert [json.loads(line)["id"] for line in out.splitlines()] == [
        i for i in range(2000) if (i * 7919 % 1000) / 1000 == 0.5
    ]


def _client_error(s3, bucket, key, sql, input_serialization, **extra) -> dict:
    with pytest.raises((botocore.exceptions.ClientError, botocore.exceptions.EventStreamError)) as info:
        _select(s3, bucket, key, sql, input_serialization, **extra)
    return info.value.response["Error"]


def test_unsupported_and_bad_requests_get_s3_errors(s3, bucket):
    s3.put_object(Bucket=bucket, Key="people.csv", Body=_csv(header=True))
    csv_in = {"CSV": {"FileHeaderInfo": "USE"}}
    assert _client_error(s3, bucket, "people.csv", "SELEC name FROM S3Object", csv_in)["Code"] == "ParseUnexpectedToken"
    assert _client_error(s3, bucket, "people.csv", "DELETE FROM S3Object", csv_in)["Code"] == "UnsupportedSyntax"
    assert _client_error(s3, bucket, "people.csv", "SELECT * FROM other", csv_in)["Code"] == "UnsupportedSyntax"
    error = _client_error(s3, bucket, "people.csv", "SELECT nope FROM S3Object", csv_in)
    assert "nope" in error["Message"]
    error = _client_error(s3, bucket, "people.csv", "SELECT * FROM S3Object",
                          {"CSV": {}, "CompressionType": "GZIP"})
    assert error["Code"] == "InvalidCompressionFormat"
    error = _client_error(s3, bucket, "people.csv", "SELECT * FROM S3Object", csv_in,
                          ScanRange={"Start": 0, "End": 10})
    assert error["Code"] == "NotImplemented"
    assert _client_error(s3, bucket, "people.csv", "SELECT * FROM S3Object", {"Parquet": {}})["Code"] == "InvalidQuery"
    assert _client_error(s3, bucket, "missing.csv", "SELECT * FROM S3Object", csv_in)["Code"] == "NoSuchKey"
    # A value that does not cast fails the stream with S3's CastFailed.
    error = _client_error(s3, bucket, "people.csv", "SELECT name FROM S3Object WHERE CAST(age AS INT) > 30", csv_in)
    assert error["Code"] == "CastFailed", error
    # A ragged row fails the stream with an error naming the problem.
    s3.put_object(Bucket=bucket, Key="ragged.csv", Body=b"a,b\n1,2\n3\n")
    error = _client_error(s3, bucket, "ragged.csv", "SELECT * FROM S3Object", csv_in)
    assert "fields" in error["Message"] or "ragged" in error["Message"].lower(), error
