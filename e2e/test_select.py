"""S3 Select (SelectObjectContent) through the gateway with boto3, unchanged: CSV, JSON and
Parquet input (CSV and JSON also gzip or bzip2 compressed, or cut by a ScanRange), CSV and JSON
output, the event stream (Records, Progress, Stats, End), and the errors S3 uses for what is not
supported."""

from __future__ import annotations

import bz2
import gzip
import io
import json
import time

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


def _select(s3, bucket, key, sql, input_serialization, output_serialization=None, progress=None, **extra):
    """Records and Stats of a select; `progress`, a list, collects its Progress events."""
    response = s3.select_object_content(
        Bucket=bucket, Key=key, Expression=sql, ExpressionType="SQL",
        InputSerialization=input_serialization,
        OutputSerialization=output_serialization or {"CSV": {}}, **extra,
    )
    records, stats, ended = b"", None, False
    for event in response["Payload"]:
        if "Records" in event:
            records += event["Records"]["Payload"]
        elif "Progress" in event:
            assert progress is not None, "Progress events nobody asked for"
            progress.append((event["Progress"]["Details"], len(records)))
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
    # A DOCUMENT's records may span lines; LINES input may not (split at every line break, its
    # answer would depend on where chunks end), and says so.
    pretty = "\n".join(json.dumps({"name": n, "age": a}, indent=2) for n, a, _ in PEOPLE) + "\n"
    s3.put_object(Bucket=bucket, Key="pretty.json", Body=pretty.encode())
    out, _ = _select(s3, bucket, "pretty.json", "SELECT s.name FROM S3Object s WHERE s.age > 40",
                     {"JSON": {"Type": "DOCUMENT"}})
    assert out.splitlines() == ["Cy", "Ed"]
    error = _client_error(s3, bucket, "pretty.json", "SELECT s.name FROM S3Object s", {"JSON": {"Type": "LINES"}})
    assert "JSON" in error["Message"], error
    # One that only the nodes' split reader meets: single-line records first, then one over two.
    late = "".join(json.dumps({"i": i}) + "\n" for i in range(3000)) + '{"i":\n 3000}\n'
    s3.put_object(Bucket=bucket, Key="late-line.json", Body=late.encode())
    error = _client_error(s3, bucket, "late-line.json", "SELECT count(*) FROM S3Object", {"JSON": {"Type": "LINES"}})
    assert "spans lines" in error["Message"], error


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
    # Plain bytes read as GZIP or BZIP2, and a compression S3 Select does not know.
    for compression in ("GZIP", "BZIP2", "ZSTD"):
        error = _client_error(s3, bucket, "people.csv", "SELECT * FROM S3Object",
                              {"CSV": {}, "CompressionType": compression})
        assert error["Code"] == "InvalidCompressionFormat", (compression, error)
    # ScanRange: backwards, with compression, on Parquet.
    error = _client_error(s3, bucket, "people.csv", "SELECT * FROM S3Object", csv_in,
                          ScanRange={"Start": 10, "End": 5})
    assert error["Code"] == "InvalidRequest", error
    s3.put_object(Bucket=bucket, Key="people.csv.gz", Body=gzip.compress(_csv(header=True)))
    error = _client_error(s3, bucket, "people.csv.gz", "SELECT * FROM S3Object",
                          {"CSV": {}, "CompressionType": "GZIP"}, ScanRange={"Start": 0, "End": 10})
    assert error["Code"] == "InvalidRequest", error
    error = _client_error(s3, bucket, "people.csv", "SELECT * FROM S3Object", {"Parquet": {}},
                          ScanRange={"Start": 0})
    assert error["Code"] == "InvalidRequest", error
    assert _client_error(s3, bucket, "people.csv", "SELECT * FROM S3Object", {"Parquet": {}})["Code"] == "InvalidQuery"
    assert _client_error(s3, bucket, "missing.csv", "SELECT * FROM S3Object", csv_in)["Code"] == "NoSuchKey"
    # A value that does not cast fails the stream with S3's CastFailed.
    error = _client_error(s3, bucket, "people.csv", "SELECT name FROM S3Object WHERE CAST(age AS INT) > 30", csv_in)
    assert error["Code"] == "CastFailed", error
    # A value whose size a number chooses, past the bound, is refused before anything runs
    # (it would take the gateway's memory), and the gateway goes on serving.
    for sql in ("SELECT repeat(name, 1000000000) FROM S3Object", "SELECT lpad(name, 2000000000) FROM S3Object"):
        error = _client_error(s3, bucket, "people.csv", sql, csv_in)
        assert "times the size" in error["Message"] or "at most 4096" in error["Message"], error
    out, _ = _select(s3, bucket, "people.csv", "SELECT repeat(name, 2) FROM S3Object LIMIT 1", csv_in)
    assert out.strip()
    # A ragged row fails the stream with an error naming the problem.
    s3.put_object(Bucket=bucket, Key="ragged.csv", Body=b"a,b\n1,2\n3\n")
    error = _client_error(s3, bucket, "ragged.csv", "SELECT * FROM S3Object", csv_in)
    assert "fields" in error["Message"] or "ragged" in error["Message"].lower(), error


def test_joins_and_subqueries_are_refused_anywhere_in_the_statement(s3, bucket):
    # On 2862b84 only the top SELECT was checked: a join inside a subquery ran (a cubic self
    # join of a large object would hold the gateway).
    s3.put_object(Bucket=bucket, Key="people.csv", Body=_csv(header=True))
    csv_in = {"CSV": {"FileHeaderInfo": "USE"}}
    for sql in (
        "SELECT name FROM S3Object WHERE name IN (SELECT a.name FROM S3Object a, S3Object b)",
        "SELECT name FROM S3Object WHERE name IN (SELECT a.name FROM S3Object a JOIN S3Object b ON a.name = b.name)",
        "SELECT name FROM S3Object WHERE EXISTS (SELECT 1 FROM S3Object)",
        "SELECT name FROM S3Object WHERE age > (SELECT MIN(age) FROM S3Object)",
    ):
        error = _client_error(s3, bucket, "people.csv", sql, csv_in)
        assert error["Code"] == "UnsupportedSyntax", (sql, error)
    out, _ = _select(s3, bucket, "people.csv", "SELECT name FROM S3Object WHERE name IN ('Ana', 'Bo')", csv_in)
    assert out is not None


def test_a_gateway_runs_a_bounded_number_of_selects_and_answers_slow_down_past_it(s3, bucket):
    # Each select holds its permit while its event stream is open: four selects whose output
    # nobody reads (larger than the sockets' buffers) hold all four, and a fifth is refused.
    rows = "".join(f"{i},{'x' * 200}\n" for i in range(100_000)).encode()
    s3.put_object(Bucket=bucket, Key="big.csv", Body=rows)
    csv_in = {"CSV": {"FileHeaderInfo": "NONE"}}
    held = []
    try:
        for _ in range(4):
            held.append(s3.select_object_content(
                Bucket=bucket, Key="big.csv", Expression="SELECT * FROM S3Object", ExpressionType="SQL",
                InputSerialization=csv_in, OutputSerialization={"CSV": {}}))
        error = _client_error(s3, bucket, "big.csv", "SELECT * FROM S3Object", csv_in)
        assert error["Code"] == "SlowDown", error
    finally:
        for response in held:
            response["Payload"].close()
    # The permits come back with the closed streams.
    deadline = time.monotonic() + 30
    while True:
        try:
            out, _ = _select(s3, bucket, "big.csv", "SELECT COUNT(*) FROM S3Object", csv_in)
            break
        except botocore.exceptions.ClientError as e:
            assert e.response["Error"]["Code"] == "SlowDown" and time.monotonic() < deadline, e
            time.sleep(0.2)
    assert out.strip() == "100000"


def test_gzip_and_bzip2_input_read_like_plain_input(s3, bucket):
    plain = _csv(header=True)
    sql = "SELECT name, city FROM S3Object WHERE city <> 'Oslo'"
    csv_in = {"CSV": {"FileHeaderInfo": "USE"}}
    s3.put_object(Bucket=bucket, Key="people.csv", Body=plain)
    expected, _ = _select(s3, bucket, "people.csv", sql, csv_in)
    # Two gzip members back to back (as `cat a.gz b.gz` makes) are one stream of records.
    half = plain.index(b"\nDi,") + 1
    for key, body, compression in [
        ("people.csv.gz", gzip.compress(plain), "GZIP"),
        ("people-2.csv.gz", gzip.compress(plain[:half]) + gzip.compress(plain[half:]), "GZIP"),
        ("people.csv.bz2", bz2.compress(plain), "BZIP2"),
    ]:
        s3.put_object(Bucket=bucket, Key=key, Body=body)
        out, stats = _select(s3, bucket, key, sql, {**csv_in, "CompressionType": compression})
        assert out == expected, key
        assert stats["BytesScanned"] == len(body), (key, stats)
        assert stats["BytesProcessed"] == len(plain), (key, stats)
    lines = "".join(json.dumps({"name": n, "age": a}) + "\n" for n, a, _ in PEOPLE).encode()
    s3.put_object(Bucket=bucket, Key="people.json.gz", Body=gzip.compress(lines))
    out, _ = _select(s3, bucket, "people.json.gz", "SELECT name FROM S3Object WHERE age > 40",
                     {"JSON": {"Type": "LINES"}, "CompressionType": "GZIP"})
    assert out.splitlines() == ["Cy", "Ed"]
    # A large object that compresses well streams through (never whole in memory).
    big = b"n,v\n" + b"".join(b"%d,%d\n" % (i, i % 7) for i in range(400_000))
    s3.put_object(Bucket=bucket, Key="big.csv.bz2", Body=bz2.compress(big))
    out, _ = _select(s3, bucket, "big.csv.bz2", "SELECT count(*) FROM S3Object WHERE v = '3'",
                     {"CSV": {"FileHeaderInfo": "USE"}, "CompressionType": "BZIP2"})
    assert int(out) == sum(1 for i in range(400_000) if i % 7 == 3)


def _records_starting_in(body: bytes, start: int, end: int) -> list[str]:
    """The lines of `body` whose first byte lies in start..=end (S3's ScanRange rule)."""
    out, at = [], 0
    for line in body.split(b"\n")[:-1]:
        if start <= at <= end:
            out.append(line.decode())
        at += len(line) + 1
    return out


def test_scan_ranges_select_the_records_that_start_inside_them(s3, bucket):
    body = b"".join(b"%d,%s\n" % (i, b"x" * (i % 13)) for i in range(3000))
    s3.put_object(Bucket=bucket, Key="split.csv", Body=body)
    csv_in = {"CSV": {"FileHeaderInfo": "NONE"}}

    def ranged(scan_range):
        out, _ = _select(s3, bucket, "split.csv", "SELECT * FROM S3Object", csv_in, ScanRange=scan_range)
        return out.splitlines()

    size = len(body)
    first_break = body.index(b"\n")
    for start, end in [(0, 0), (1, 50), (first_break, first_break), (first_break + 1, first_break + 1),
                       (777, 5000), (size - 3, size + 100)]:
        assert ranged({"Start": start, "End": end}) == _records_starting_in(body, start, end), (start, end)
    assert ranged({"Start": 12345}) == _records_starting_in(body, 12345, size)
    assert ranged({"End": 100}) == _records_starting_in(body, size - 100, size)
    assert ranged({"Start": size + 10}) == []
    # Consecutive ranges, as parallel readers split an object: every record exactly once.
    step = 4096
    split = [line for at in range(0, size, step) for line in ranged({"Start": at, "End": at + step - 1})]
    assert split == body.decode().splitlines()
    # A header line counts only where the range starts at the object's first byte.
    s3.put_object(Bucket=bucket, Key="people.csv", Body=_csv(header=True))
    out, _ = _select(s3, bucket, "people.csv", "SELECT name FROM S3Object", {"CSV": {"FileHeaderInfo": "USE"}},
                     ScanRange={"Start": 30})
    assert out.splitlines() == [line.split(",")[0] for line in _records_starting_in(_csv(header=True), 30, 10**6)]
    # JSON lines too.
    lines = "".join(json.dumps({"i": i}) + "\n" for i in range(100)).encode()
    s3.put_object(Bucket=bucket, Key="split.json", Body=lines)
    out, _ = _select(s3, bucket, "split.json", "SELECT i FROM S3Object", {"JSON": {"Type": "LINES"}},
                     {"JSON": {}}, ScanRange={"Start": 100, "End": 199})
    assert [json.loads(r)["i"] for r in out.splitlines()] == [
        json.loads(r)["i"] for r in _records_starting_in(lines, 100, 199)
    ]


def test_a_large_csv_or_json_object_is_selected_by_the_nodes_that_hold_it(s3, bucket):
    # Several MiB: several chunks on several nodes, each taking the records that start in its
    # chunks (records come in no particular order across chunks, as S3 Select over Parquet).
    rows = 300_000
    ke = [(i * 7919) % 1000 for i in range(rows)]
    body = b"id,ke,tag\n" + b"".join(b"%d,%d,t%d\n" % (i, ke[i], i % 5) for i in range(rows))
    lines = "".join(json.dumps({"id": i, "ke": ke[i], "tag": f"t{i % 5}"}) + "\n" for i in range(rows)).encode()
    s3.put_object(Bucket=bucket, Key="large.csv", Body=body)
    s3.put_object(Bucket=bucket, Key="large.json", Body=lines)
    hot = [i for i in range(rows) if ke[i] > 995]
    t3 = [i for i in range(rows) if i % 5 == 3]
    for key, data, input_serialization, cast in [
        ("large.csv", body, {"CSV": {"FileHeaderInfo": "USE"}}, "CAST(ke AS INT)"),
        ("large.json", lines, {"JSON": {"Type": "LINES"}}, "ke"),
    ]:
        out, stats = _select(s3, bucket, key, f"SELECT id FROM S3Object WHERE {cast} > 995", input_serialization)
        assert sorted(int(x) for x in out.split()) == hot, key
        assert stats["BytesScanned"] >= len(data), (key, stats)
        out, _ = _select(s3, bucket, key, "SELECT count(*), sum(CAST(id AS BIGINT)) FROM S3Object WHERE tag = 't3'",
                         input_serialization)
        assert out.strip() == f"{len(t3)},{sum(t3)}", key
        out, _ = _select(s3, bucket, key, "SELECT id FROM S3Object LIMIT 7", input_serialization)
        ids = [int(x) for x in out.split()]
        assert len(ids) == 7 and len(set(ids)) == 7 and all(0 <= i < rows for i in ids), (key, ids)


def test_s3_select_types_are_s3_selects(s3, bucket):
    # FLOAT is an 8-byte float and INT an 8-byte integer in S3 Select (DataFusion's are 4-byte:
    # 0.9902344 would round down to 0.990234375, and 3000000000 would not fit).
    s3.put_object(Bucket=bucket, Key="types.csv", Body=b"v,n\n0.9902344,3000000000\n0.990234375,1\n")
    csv_in = {"CSV": {"FileHeaderInfo": "USE"}}
    out, _ = _select(s3, bucket, "types.csv", "SELECT v FROM S3Object WHERE CAST(v AS FLOAT) > 0.990234375", csv_in)
    assert out.splitlines() == ["0.9902344"]
    out, _ = _select(s3, bucket, "types.csv", "SELECT CAST(n AS INT) + 1 FROM S3Object WHERE CAST(n AS INTEGER) > 2",
                     csv_in)
    assert out.splitlines() == ["3000000001"]


def test_json_fields_are_typed_by_the_first_thousand_records(s3, bucket):
    # Records of ~100 bytes: the first 1,000 take more than the first 64 KiB read.
    pad = "x" * 80
    lines = [{"i": i, "pad": pad} for i in range(2000)]
    lines[900]["late"] = 7
    body = "".join(json.dumps(line) + "\n" for line in lines).encode()
    assert len(body) > 64 * 1024 * 1.5
    s3.put_object(Bucket=bucket, Key="late.json", Body=body)
    out, _ = _select(s3, bucket, "late.json", "SELECT i, late FROM S3Object WHERE late IS NOT NULL",
                     {"JSON": {"Type": "LINES"}})
    assert out.splitlines() == ["900,7"]


def test_progress_events_when_asked_for(s3, bucket):
    body = b"".join(b"%d,%d\n" % (i, i * i) for i in range(200_000))
    s3.put_object(Bucket=bucket, Key="squares.csv", Body=body)
    progress = []
    out, stats = _select(s3, bucket, "squares.csv", "SELECT _2 FROM S3Object WHERE CAST(_1 AS INT) % 2 = 0",
                         {"CSV": {}}, progress=progress, RequestProgress={"Enabled": True})
    assert len(out.splitlines()) == 100_000
    assert progress, "no Progress event"
    returned = [details["BytesReturned"] for details, _ in progress]
    assert returned == sorted(returned) and all(r == seen for (_, seen), r in zip(progress, returned))
    assert all(d["BytesScanned"] <= stats["BytesScanned"] for d, _ in progress)
    # Not asked for: none (the helper fails on one).
    _select(s3, bucket, "squares.csv", "SELECT count(*) FROM S3Object", {"CSV": {}})


def test_quote_escape_character_in_and_out(s3, bucket):
    s3.put_object(Bucket=bucket, Key="escaped.csv", Body=b'id,text\n1,"say \\"hi\\", twice"\n2,plain\n')
    csv_in = {"CSV": {"FileHeaderInfo": "USE", "QuoteEscapeCharacter": "\\"}}
    out, _ = _select(s3, bucket, "escaped.csv", "SELECT text FROM S3Object WHERE id = '1'", csv_in, {"JSON": {}})
    assert json.loads(out) == {"text": 'say "hi", twice'}
    out, _ = _select(s3, bucket, "escaped.csv", "SELECT text FROM S3Object WHERE id = '1'", csv_in,
                     {"CSV": {"QuoteEscapeCharacter": "\\"}})
    assert out == '"say \\"hi\\", twice"\n'
    # The default: a doubled quote.
    out, _ = _select(s3, bucket, "escaped.csv", "SELECT text FROM S3Object WHERE id = '1'", csv_in)
    assert out == '"say ""hi"", twice"\n'
