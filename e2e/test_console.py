"""The web console (`tessera gateway --console-listen`) over HTTP, as a browser would use it:
login with S3 credentials, the session cookie and CSRF rules, buckets, the object browser,
uploads and downloads, access keys, and bad input (forged tokens, other origins, HTML and `..` in names,
cut uploads, rebound host names, planted cookies)."""

from __future__ import annotations

import hashlib
import http.client
import json
import re
import socket
import subprocess
import time
import urllib.parse
from concurrent.futures import ThreadPoolExecutor

import pytest
from botocore.exceptions import ClientError

from conftest import Cluster, _free_port_range, _wait_tcp
from s3check import data, unique_bucket_name
from test_access_keys import create_key, error_code, tessera_key

PAGE_ROWS = 500  # console::PAGE_ROWS


class Browser:
    """Just enough of a browser: one cookie jar entry, Origin on state changes, no redirects."""

    def __init__(self, base: str):
        parsed = urllib.parse.urlsplit(base)
        self.host, self.port = parsed.hostname, parsed.port
        self.origin = f"http://{self.host}:{self.port}"
        self.cookie: str | None = None

    def request(self, method: str, path: str, body: bytes | None = None, headers: dict | None = None,
                origin: str | None = "self") -> tuple[int, dict[str, str], bytes]:
        conn = http.client.HTTPConnection(self.host, self.port, timeout=30)
        try:
            sent = dict(headers or {})
            if self.cookie:
                sent["Cookie"] = f"tessera_console={self.cookie}"
            if method != "GET" and origin is not None:
                sent["Origin"] = self.origin if origin == "self" else origin
            conn.request(method, path, body=body, headers=sent)
            answer = conn.getresponse()
            got = {k.lower(): v for k, v in answer.getheaders()}
            return answer.status, got, answer.read()
        finally:
            conn.close()

    def get(self, path: str) -> tuple[int, dict[str, str], str]:
        status, headers, body = self.request("GET", path)
        return status, headers, body.decode()

    def post(self, path: str, fields: dict[str, str], origin: str | None = "self") -> tuple[int, dict[str, str], str]:
        body = urllib.parse.urlencode(fields).encode()
        status, headers, answer = self.request(
            "POST", path, body, {"Content-Type": "application/x-www-form-urlencoded"}, origin=origin)
        return status, headers, answer.decode()

    def login(self, access_key: str, secret_key: str) -> tuple[int, dict[str, str], str]:
        status, headers, body = self.post("/login", {"access_key": access_key, "secret_key": secret_key})
        cookie = headers.get("set-cookie", "")
        match = re.match(r"tessera_console=([0-9a-f]*);", cookie)
        if match:
            self.cookie = match.group(1) or None
        return status, headers, body

    def csrf(self, page: str = "/buckets") -> str:
        status, _, body = self.get(page)
        assert status == 200, body
        return re.search(r'name="csrf" value="([0-9a-f]{64})"', body).group(1)


def q(**params: str) -> str:
    return "?" + urllib.parse.urlencode(params)


@pytest.fixture
def browser(cluster: Cluster) -> Browser:
    b = Browser(cluster.console_url)
    status, headers, body = b.login(cluster.access_key, cluster.secret_key)
    assert status == 303 and headers["location"] == "/buckets", body
    return b


def test_login_sets_a_strict_http_only_cookie_and_wrong_credentials_get_none(cluster):
    b = Browser(cluster.console_url)
    status, headers, _ = b.get("/buckets")
    assert status == 303 and headers["location"] == "/login", "no session: to the login page"
    status, headers, page = b.get("/login")
    assert status == 200 and 'name="secret_key"' in page
    csp = headers["content-security-policy"]
    assert "script-src 'self'" in csp and "default-src 'none'" in csp and "frame-ancestors 'none'" in csp
    assert headers["x-content-type-options"] == "nosniff"

    for access_key, secret_key in [(cluster.access_key, "wrong"), ("nobody", cluster.secret_key), ("", "")]:
        status, headers, page = b.login(access_key, secret_key)
        assert status == 401 and "Wrong access key or secret key." in page, page
        assert "set-cookie" not in headers and b.cookie is None
        assert cluster.secret_key not in page

    status, headers, _ = b.login(cluster.access_key, cluster.secret_key)
    cookie = headers["set-cookie"]
    assert status == 303 and b.cookie and len(b.cookie) == 64
    for attribute in ("HttpOnly", "SameSite=Strict", "Path=/", "Max-Age="):
        assert attribute in cookie, cookie
    status, _, page = b.get("/buckets")
    assert status == 200 and cluster.access_key in page and cluster.secret_key not in page

    # A login posted from another site, or without saying where from, is refused (login CSRF).
    other = Browser(cluster.console_url)
    for origin in ("http://evil.example", "null", None):
        status, headers, _ = other.post("/login", {"access_key": cluster.access_key, "secret_key": cluster.secret_key},
                                        origin=origin)
        assert status == 403 and "set-cookie" not in headers, origin

    # A page of another site whose name was rebound to 127.0.0.1 names its own host: refused.
    status, _, _ = b.request("GET", "/buckets", headers={"Host": f"evil.example:{b.port}"})
    assert status == 421

    # Two session cookies (another site on this host can plant one for a narrower path): none.
    planted = Browser(cluster.console_url)
    status, headers, _ = planted.request("GET", "/buckets",
                                         headers={"Cookie": f"tessera_console={'a' * 64}; tessera_console={b.cookie}"})
    assert status == 303 and headers["location"] == "/login"

    # Logging in again ends the session before.
    before = b.cookie
    b.login(cluster.access_key, cluster.secret_key)
    assert b.cookie != before
    stale = Browser(cluster.console_url)
    stale.cookie = before
    assert stale.get("/buckets")[0] == 303


def test_every_change_needs_this_sessions_token_and_origin(cluster, browser, s3):
    name = unique_bucket_name("console-csrf")
    token = browser.csrf()
    for fields, origin in [
        ({"bucket": name}, "self"),                                   # no token
        ({"bucket": name, "csrf": "0" * 64}, "self"),                 # forged token
        ({"bucket": name, "csrf": token}, "http://evil.example"),     # right token, other site
    ]:
        status, _, page = browser.post("/buckets/create", fields, origin=origin)
        assert status == 403, (fields, origin, page)
    assert name not in {b["Name"] for b in s3.list_buckets()["Buckets"]}, "nothing was created"

    status, headers, _ = browser.post("/buckets/create", {"bucket": name, "csrf": token})
    assert status == 303 and headers["location"] == "/objects" + q(bucket=name)
    s3.head_bucket(Bucket=name)

    # Another session's token is not this one's.
    other = Browser(cluster.console_url)
    other.login(cluster.access_key, cluster.secret_key)
    assert other.csrf() != token
    status, _, _ = browser.post("/buckets/delete", {"bucket": name, "confirm": name, "csrf": other.csrf()})
    assert status == 403
    # Deleting needs the name typed again.
    status, _, page = browser.post("/buckets/delete", {"bucket": name, "confirm": "nope", "csrf": token})
    assert status == 400 and "confirm" in page
    status, headers, _ = browser.post("/buckets/delete", {"bucket": name, "confirm": name, "csrf": token})
    assert status == 303 and headers["location"] == "/buckets"
    assert name not in {b["Name"] for b in s3.list_buckets()["Buckets"]}

    # Logging out ends the session: its cookie is worth nothing after.
    old = browser.cookie
    status, headers, _ = browser.post("/logout", {"csrf": token})
    assert status == 303 and "Max-Age=0" in headers["set-cookie"]
    browser.cookie = old
    status, headers, _ = browser.get("/buckets")
    assert status == 303 and headers["location"] == "/login"
    status, _, _ = browser.post("/buckets/create", {"bucket": name, "csrf": token})
    assert status == 401


def test_upload_browse_download_and_delete_byte_exact(cluster, browser, bucket, s3):
    token = browser.csrf()
    body = data(3 * 1024 * 1024 + 17, seed=71)
    status, _, answer = browser.request("PUT", "/upload" + q(bucket=bucket, key="dir/sub/blob.bin"), body,
                                        {"x-csrf-token": token, "Content-Type": "application/x-test"})
    assert (status, answer) == (200, b"ok")
    assert s3.get_object(Bucket=bucket, Key="dir/sub/blob.bin")["Body"].read() == body
    # Without the token, or with another, nothing is stored.
    for headers in ({}, {"x-csrf-token": "f" * 64}):
        status, _, _ = browser.request("PUT", "/upload" + q(bucket=bucket, key="sneaky.bin"), b"x", headers)
        assert status == 403
    assert s3.list_objects_v2(Bucket=bucket, Prefix="sneaky")["KeyCount"] == 0

    status, _, page = browser.get("/objects" + q(bucket=bucket))
    assert status == 200 and 'href="/objects?bucket=' in page and ">dir/<" in page, page
    status, _, page = browser.get("/objects" + q(bucket=bucket, prefix="dir/sub/"))
    assert ">blob.bin<" in page
    status, _, page = browser.get("/object" + q(bucket=bucket, key="dir/sub/blob.bin"))
    assert status == 200 and "application/x-test" in page
    chunk_rows = re.findall(r'<tr class="(present|missing)">', page)
    assert chunk_rows == ["present"] * 6, "one row per position of the 4+2 set"
    assert all(f"<td>n{i}</td>" in page for i in range(1, 7)), page

    status, headers, got = browser.request("GET", "/download" + q(bucket=bucket, key="dir/sub/blob.bin"))
    assert status == 200 and hashlib.sha256(got).digest() == hashlib.sha256(body).digest()
    assert headers["content-disposition"] == "attachment; filename*=UTF-8''blob.bin"
    assert int(headers["content-length"]) == len(body)

    status, headers, _ = browser.post("/object/delete", {"bucket": bucket, "key": "dir/sub/blob.bin", "csrf": token})
    assert status == 303 and headers["location"] == "/objects" + q(bucket=bucket, prefix="dir/sub/")
    assert s3.list_objects_v2(Bucket=bucket)["KeyCount"] == 0


def test_multipart_objects_download_whole_and_cut_uploads_store_nothing(browser, bucket, s3):
    part = data(5 * 1024 * 1024 + 100, seed=72)
    upload = s3.create_multipart_upload(Bucket=bucket, Key="big/mp.bin")["UploadId"]
    etags = [s3.upload_part(Bucket=bucket, Key="big/mp.bin", UploadId=upload, PartNumber=n, Body=part[: len(part) - n])["ETag"]
             for n in (1, 2)]
    s3.complete_multipart_upload(Bucket=bucket, Key="big/mp.bin", UploadId=upload, MultipartUpload={
        "Parts": [{"PartNumber": n, "ETag": etag} for n, etag in zip((1, 2), etags)]})
    status, _, page = browser.get("/object" + q(bucket=bucket, key="big/mp.bin"))
    assert status == 200 and 'id="parts"' in page and 'id="chunks"' not in page, "no single chunk table for parts"
    status, _, got = browser.request("GET", "/download" + q(bucket=bucket, key="big/mp.bin"))
    assert status == 200 and got == part[:-1] + part[:-2]

    # A body that ends before its Content-Length: nothing stored.
    token = browser.csrf()
    conn = http.client.HTTPConnection(browser.host, browser.port, timeout=30)
    conn.putrequest("PUT", "/upload" + q(bucket=bucket, key="cut.bin"))
    for name, value in [("Cookie", f"tessera_console={browser.cookie}"), ("Origin", browser.origin),
                        ("x-csrf-token", token), ("Content-Length", str(1 << 20))]:
        conn.putheader(name, value)
    conn.endheaders()
    conn.send(b"x" * 1000)
    conn.sock.shutdown(socket.SHUT_WR)
    try:
        conn.getresponse().read()
    except (OSError, http.client.HTTPException):
        pass  # the console may close without an answer
    conn.close()
    assert s3.list_objects_v2(Bucket=bucket, Prefix="cut")["KeyCount"] == 0

    # The upload target is the folder shown, not a search's partial name.
    status, _, page = browser.get("/objects" + q(bucket=bucket, prefix="big/m"))
    assert 'data-prefix="big/"' in page, page


def test_browser_multipart_uploads_make_one_object_and_refuse_bad_parts(cluster, browser, bucket, s3):
    """The endpoints console.js uses for files larger than one part (the real browser drives
    them in test_console_browser.py); here each refusal, by raw HTTP."""
    token = browser.csrf()
    upload_headers = {"x-csrf-token": token}

    def call(method: str, path: str, body: bytes | None = None, headers: dict | None = None):
        status, _, answer = browser.request(method, path, body, {**upload_headers, **(headers or {})})
        return status, answer.decode()

    status, upload = call("POST", "/upload/start" + q(bucket=bucket, key="mp/video.bin"),
                          headers={"Content-Type": "video/mp4"})
    assert status == 200 and re.fullmatch(r"[0-9a-f]{32}", upload), upload
    parts = [data(5 * 1024 * 1024, seed=80), data(1000, seed=81)]
    etags = []
    for number, part in enumerate(parts, start=1):
        status, etag = call("PUT", "/upload/part" + q(bucket=bucket, key="mp/video.bin", upload=upload, part=str(number)),
                            part)
        assert status == 200 and etag == hashlib.md5(part).hexdigest(), etag
        etags.append(etag)

    # A part larger than the part limit is refused by its length, before a byte is read.
    conn = http.client.HTTPConnection(browser.host, browser.port, timeout=30)
    conn.putrequest("PUT", "/upload/part" + q(bucket=bucket, key="mp/video.bin", upload=upload, part="3"))
    for name, value in [("Cookie", f"tessera_console={browser.cookie}"), ("Origin", browser.origin),
                        ("x-csrf-token", token), ("Content-Length", str(6 << 30))]:
        conn.putheader(name, value)
    conn.endheaders()
    answer = conn.getresponse()
    assert answer.status == 413 and "a part may have at most 5368709120" in answer.read().decode()
    conn.close()

    # Bad part numbers, another session's token, unknown uploads, malformed or wrong part lists.
    assert call("PUT", "/upload/part" + q(bucket=bucket, key="mp/video.bin", upload=upload, part="x"), b"1")[0] == 400
    status, answer = call("PUT", "/upload/part" + q(bucket=bucket, key="mp/video.bin", upload=upload, part="10001"), b"1")
    assert status == 400 and "part numbers are 1 to 10000" in answer, answer
    status, _, _ = browser.request("POST", "/upload/start" + q(bucket=bucket, key="mp/x"), None,
                                   {"x-csrf-token": "0" * 64})
    assert status == 403
    status, answer = call("PUT", "/upload/part" + q(bucket=bucket, key="mp/video.bin", upload="0" * 32, part="1"), b"1")
    assert status == 404 and "no such multipart upload" in answer, answer
    complete = "/upload/complete" + q(bucket=bucket, key="mp/video.bin", upload=upload)
    assert call("POST", complete, b"one two")[0] == 400
    assert call("POST", complete, b"")[0] == 400
    status, answer = call("POST", complete, f"1 {etags[0]}\n2 {'0' * 32}".encode())
    assert status == 400 and "invalid part 2" in answer, answer
    assert s3.list_objects_v2(Bucket=bucket, Prefix="mp/")["KeyCount"] == 0, "nothing until a right Complete"

    status, answer = call("POST", complete, "\n".join(f"{n} {e}" for n, e in enumerate(etags, start=1)).encode())
    assert status == 200 and answer == "ok", answer
    got = s3.get_object(Bucket=bucket, Key="mp/video.bin")
    assert got["Body"].read() == b"".join(parts) and got["ContentType"] == "video/mp4"
    assert got["ETag"].strip('"').endswith("-2")

    # An upload aborted by the script leaves no parts behind; a read-only key may start none.
    status, upload = call("POST", "/upload/start" + q(bucket=bucket, key="mp/aborted.bin"))
    assert status == 200
    assert call("PUT", "/upload/part" + q(bucket=bucket, key="mp/aborted.bin", upload=upload, part="1"), b"abc")[0] == 200
    assert call("POST", "/upload/abort" + q(bucket=bucket, key="mp/aborted.bin", upload=upload))[0] == 200
    assert s3.list_multipart_uploads(Bucket=bucket).get("Uploads", []) == []

    # Every upload route: a read-only key, a key of another bucket, another site's page: 403.
    status, upload = call("POST", "/upload/start" + q(bucket=bucket, key="mp/guarded.bin"))
    assert status == 200
    routes = [("POST", "/upload/start", {}), ("PUT", "/upload", {}), ("PUT", "/upload/part", {"upload": upload, "part": "1"}),
              ("POST", "/upload/complete", {"upload": upload}), ("POST", "/upload/abort", {"upload": upload})]
    other = unique_bucket_name("console-other")
    s3.create_bucket(Bucket=other)
    made = [create_key(cluster, "--bucket", bucket, "--read-only"), create_key(cluster, "--bucket", other)]
    try:
        for key in made:
            session = Browser(cluster.console_url)
            assert session.login(key["access_key"], key["secret_key"])[0] == 303
            token = session.csrf()
            for method, path, extra in routes:
                status, _, answer = session.request(method, path + q(bucket=bucket, key="mp/guarded.bin", **extra),
                                                    b"1", {"x-csrf-token": token})
                assert status == 403 and b"may not write" in answer, (key, path, answer)
        for method, path, extra in routes:
            status, _, _ = browser.request(method, path + q(bucket=bucket, key="mp/guarded.bin", **extra), b"1",
                                           upload_headers, origin="http://evil.example")
            assert status == 403, path
        # A part sent in chunks, without its length: refused, nothing read.
        status, _, answer = browser.request(
            "PUT", "/upload/part" + q(bucket=bucket, key="mp/guarded.bin", upload=upload, part="1"),
            iter([b"abc"]), {**upload_headers, "Transfer-Encoding": "chunked"})
        assert status == 411, answer
    finally:
        for key in made:
            tessera_key(cluster, "revoke", key["access_key"])
    assert call("POST", "/upload/abort" + q(bucket=bucket, key="mp/guarded.bin", upload=upload))[0] == 200
    assert s3.list_objects_v2(Bucket=bucket, Prefix="mp/guarded")["KeyCount"] == 0


def test_html_in_names_and_metadata_is_shown_as_text(browser, bucket, s3):
    key = 'x/<img src=q onerror=alert("k")>&amp;.txt'
    s3.put_object(Bucket=bucket, Key=key, Body=b"hi", Metadata={"note": "<img src=x onerror=alert(1)>"})
    for path in ("/objects" + q(bucket=bucket, prefix="x/"), "/object" + q(bucket=bucket, key=key)):
        status, _, page = browser.get(path)
        assert status == 200
        assert "<img src=q" not in page and "<img src=x" not in page, page
        assert "&lt;img src=q onerror=alert(&quot;k&quot;)&gt;&amp;amp;.txt" in page, page
    assert "&lt;img src=x onerror=alert(1)&gt;" in browser.get("/object" + q(bucket=bucket, key=key))[2]


def test_dot_dot_names_are_object_keys_and_bad_buckets_are_refused(browser, bucket, s3, tmp_path):
    token = browser.csrf()
    key = "../../../../etc/passwd"
    before = open("/etc/passwd", "rb").read()
    status, _, answer = browser.request("PUT", "/upload" + q(bucket=bucket, key=key), b"not a passwd file",
                                        {"x-csrf-token": token})
    assert (status, answer) == (200, b"ok")
    assert open("/etc/passwd", "rb").read() == before, "keys never become paths"
    assert s3.get_object(Bucket=bucket, Key=key)["Body"].read() == b"not a passwd file"
    status, headers, got = browser.request("GET", "/download" + q(bucket=bucket, key=key))
    assert status == 200 and got == b"not a passwd file"
    assert headers["content-disposition"] == "attachment; filename*=UTF-8''passwd"
    for bad in ("../etc", "..", ".tessera-access-keys", "a/b"):
        status, _, page = browser.get("/objects" + q(bucket=bad))
        assert status in (400, 403, 404), (bad, status)
        assert "root:" not in page
    status, _, page = browser.get("/object" + q(bucket=bucket, key="no/such/key"))
    assert status == 404


def test_a_scoped_key_sees_and_does_only_what_it_may(cluster, s3, bucket):
    other = unique_bucket_name("console-other")
    s3.create_bucket(Bucket=other)
    s3.put_object(Bucket=bucket, Key="mine.txt", Body=b"mine")
    made = create_key(cluster, "--bucket", bucket, "--read-only")
    b = Browser(cluster.console_url)
    status, _, _ = b.login(made["access_key"], made["secret_key"])
    assert status == 303
    status, _, page = b.get("/buckets")
    assert bucket in page and other not in page and "Create bucket" not in page
    token = b.csrf()
    status, _, page = b.get("/objects" + q(bucket=other))
    assert status == 403 and made["access_key"] in page
    status, _, page = b.get("/objects" + q(bucket=bucket))
    assert status == 200 and "mine.txt" in page and 'id="upload"' not in page, "no upload for a reader"
    status, _, answer = b.request("PUT", "/upload" + q(bucket=bucket, key="no.txt"), b"x", {"x-csrf-token": token})
    assert status == 403 and b"may not write" in answer
    status, _, _ = b.post("/object/delete", {"bucket": bucket, "key": "mine.txt", "csrf": token})
    assert status == 403
    status, _, _ = b.post("/buckets/create", {"bucket": unique_bucket_name("by-reader"), "csrf": token})
    assert status == 403
    assert s3.get_object(Bucket=bucket, Key="mine.txt")["Body"].read() == b"mine"

    # Revoking the key ends its sessions (checked every 5 s).
    tessera_key(cluster, "revoke", made["access_key"])
    deadline = time.monotonic() + 15
    while b.get("/buckets")[0] == 200:
        assert time.monotonic() < deadline, "the revoked key's session still works"
        time.sleep(0.5)
    assert b.get("/buckets")[1]["location"] == "/login"


def test_listings_page_and_fold_folders(browser, bucket, s3):
    keys = [f"flat/{i:04d}" for i in range(PAGE_ROWS + 20)] + [f"deep/{i}/x" for i in range(3)]
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda k: s3.put_object(Bucket=bucket, Key=k, Body=b"."), keys))
    status, _, page = browser.get("/objects" + q(bucket=bucket))
    assert re.findall(r">(deep/|flat/)<", page) == ["deep/", "flat/"], "each folder once"
    status, _, page = browser.get("/objects" + q(bucket=bucket, prefix="flat/"))
    shown = re.findall(r">(\d{4})<", page)
    assert shown == [f"{i:04d}" for i in range(PAGE_ROWS)]
    after = re.search(r'id="next" href="([^"]+)"', page).group(1).replace("&amp;", "&")
    status, _, page = browser.get(after)
    assert re.findall(r">(\d{4})<", page) == [f"{i:04d}" for i in range(PAGE_ROWS, PAGE_ROWS + 20)]
    assert 'id="next"' not in page
    status, _, page = browser.get("/objects" + q(bucket=bucket, prefix="deep/"))
    assert re.findall(r">(\d/)<", page) == ["0/", "1/", "2/"]


def test_a_session_expires(cluster, tmp_path):
    s3_port = _free_port_range(2)
    console = f"127.0.0.1:{s3_port + 1}"
    proc = cluster.spawn_extra(
        "gateway-short-sessions",
        ["gateway", "--config", str(cluster.config), "--listen", f"127.0.0.1:{s3_port}",
         "--console-listen", console, "--console-session-ttl", "2s"],
        {"TESSERA_ACCESS_KEY": cluster.access_key, "TESSERA_SECRET_KEY": cluster.secret_key},
    )
    try:
        _wait_tcp(s3_port, proc, "gateway-short-sessions", cluster.log_path("gateway-short-sessions"),
                  time.monotonic() + 20)
        b = Browser(f"http://{console}")
        status, headers, _ = b.login(cluster.access_key, cluster.secret_key)
        assert status == 303 and "Max-Age=2" in headers["set-cookie"]
        assert b.get("/buckets")[0] == 200
        time.sleep(2.5)
        status, headers, _ = b.get("/buckets")
        assert status == 303 and headers["location"] == "/login", "the session expired"
    finally:
        cluster.stop_extra("gateway-short-sessions")


def test_the_root_creates_and_revokes_scoped_keys_that_the_gateway_enforces(cluster, browser, bucket, make_client):
    other = unique_bucket_name("console-keys-other")
    root = make_client()
    root.create_bucket(Bucket=other)
    root.put_object(Bucket=bucket, Key="seen.txt", Body=b"seen")
    status, _, page = browser.get("/keys")
    assert status == 200 and 'action="/keys/create"' in page and 'href="/keys"' in page
    token = browser.csrf("/keys")

    # Bad forms change nothing: no bucket, both "all" and names, an unknown permission, a bad
    # name, a description with HTML is kept as text (escaped below).
    before = tessera_key(cluster, "ls", "--json").stdout
    for fields in ({"buckets": "", "permission": "read-only"},
                   {"buckets": bucket, "all_buckets": "on", "permission": "read-only"},
                   {"buckets": bucket, "permission": "admin"},
                   {"buckets": "Bad_Name", "permission": "read-only"}):
        status, _, page = browser.post("/keys/create", {**fields, "csrf": token})
        assert status == 400, (fields, page)
    status, _, _ = browser.post("/keys/create", {"buckets": bucket, "permission": "read-only", "csrf": "0" * 64})
    assert status == 403
    status, _, _ = browser.post("/keys/create", {"buckets": bucket, "permission": "read-only", "csrf": token},
                                origin="http://evil.example")
    assert status == 403
    assert tessera_key(cluster, "ls", "--json").stdout == before, "no key was made by a refused form"

    # A read-only key on one bucket: its secret shown once, never cached; the gateway enforces it.
    status, headers, page = browser.post(
        "/keys/create",
        {"buckets": bucket, "permission": "read-only", "description": "<b>reader</b>", "csrf": token})
    assert status == 200 and headers["cache-control"] == "no-store", page
    access_key = re.search(r'id="new-access-key">(TK[0-9A-Z]{18})<', page).group(1)
    secret_key = re.search(r'id="new-secret-key">([0-9A-Za-z]{40})<', page).group(1)
    assert "&lt;b&gt;reader&lt;/b&gt;" in page and "<b>reader</b>" not in page
    reader = make_client(access_key, secret_key)
    assert reader.get_object(Bucket=bucket, Key="seen.txt")["Body"].read() == b"seen"
    assert error_code(lambda: reader.put_object(Bucket=bucket, Key="no.txt", Body=b"x")) == "AccessDenied"
    assert error_code(lambda: reader.list_objects_v2(Bucket=other)) == "AccessDenied"
    status, _, page = browser.get("/keys")
    assert access_key in page and secret_key not in page, "the list never shows a secret"
    listed = {k["access_key"]: k for k in map(json.loads, tessera_key(cluster, "ls", "--json").stdout.splitlines())}
    assert listed[access_key]["permission"] == "read-only" and listed[access_key]["buckets"] == [bucket]

    # A read-write key on all buckets writes anywhere, but a scoped session cannot manage keys.
    status, _, page = browser.post("/keys/create", {"buckets": "", "all_buckets": "on", "permission": "read-write",
                                                    "csrf": token})
    assert status == 200, page
    writer_key = re.search(r'id="new-access-key">(TK[0-9A-Z]{18})<', page).group(1)
    writer_secret = re.search(r'id="new-secret-key">([0-9A-Za-z]{40})<', page).group(1)
    make_client(writer_key, writer_secret).put_object(Bucket=other, Key="w.txt", Body=b"w")
    scoped = Browser(cluster.console_url)
    assert scoped.login(writer_key, writer_secret)[0] == 303
    scoped_token = scoped.csrf()
    assert 'href="/keys"' not in scoped.get("/buckets")[2]
    assert scoped.get("/keys")[0] == 403
    status, _, _ = scoped.post("/keys/create", {"buckets": other, "permission": "read-write", "csrf": scoped_token})
    assert status == 403
    status, _, _ = scoped.post("/keys/revoke", {"id": access_key, "csrf": scoped_token})
    assert status == 403
    reading = Browser(cluster.console_url)
    assert reading.login(access_key, secret_key)[0] == 303 and reading.get("/buckets")[0] == 200
    status, _, _ = browser.post("/keys/revoke", {"id": access_key, "csrf": "0" * 64})
    assert status == 403
    status, _, _ = browser.post("/keys/revoke", {"id": access_key, "csrf": token}, origin="http://evil.example")
    assert status == 403
    assert access_key in tessera_key(cluster, "ls").stdout, "no refused request revoked anything"

    # Revoking in the console: the gateway refuses the key within 10 s; an unknown id is a 404.
    status, headers, _ = browser.post("/keys/revoke", {"id": access_key, "csrf": token})
    assert status == 303 and headers["location"] == "/keys"
    assert reading.get("/buckets")[1].get("location") == "/login", "its console sessions end at once"
    deadline = time.monotonic() + 10
    while True:
        try:
            reader.head_object(Bucket=bucket, Key="seen.txt")
        except ClientError as e:
            assert e.response["ResponseMetadata"]["HTTPStatusCode"] == 403, e.response
            break
        assert time.monotonic() < deadline, "the revoked key still reads"
        time.sleep(0.5)
    status, _, page = browser.post("/keys/revoke", {"id": access_key, "csrf": token})
    assert status == 404 and access_key in page
    assert access_key not in browser.get("/keys")[2]
    tessera_key(cluster, "revoke", writer_key)


def test_the_cluster_page_charts_this_gateways_traffic_from_its_counters(cluster, browser, bucket, s3):
    status, _, page = browser.get("/cluster")
    assert status == 200 and 'id="charts"' in page and 'src="/assets/uPlot.iife.min.js"' in page, page
    status, headers, script = browser.get("/assets/uPlot.iife.min.js")
    assert status == 200 and headers["content-type"].startswith("text/javascript") and "uPlot" in script
    assert browser.get("/assets/uPlot.min.css")[0] == 200

    def series() -> dict:
        status, headers, body = browser.get("/cluster/traffic")
        assert status == 200 and headers["content-type"] == "application/json", body
        got = json.loads(body)
        lengths = {len(got[name]) for name in ("time", "received_mb_s", "sent_mb_s", "requests_s",
                                               "server_errors_s", "mean_latency_ms")}
        assert len(lengths) == 1 and got["interval_s"] == 2, got
        return got

    # Uploads and downloads of 4 MiB show as MB/s in and out, with requests and their latency,
    # in a sample taken after they were answered (one every 2 s).
    before = series()["time"]
    since = before[-1] if before else 0
    body = data(4 * 1024 * 1024, seed=90)
    for i in range(3):
        s3.put_object(Bucket=bucket, Key=f"t{i}", Body=body)
        assert s3.get_object(Bucket=bucket, Key=f"t{i}")["Body"].read() == body
    deadline = time.monotonic() + 15
    while True:
        got = series()
        fresh = [i for i, t in enumerate(got["time"]) if t > since]
        # Rates are over each sample's own interval (about 2 s): back to megabytes by it.
        seconds = [t - (got["time"][i - 1] if i else t - got["interval_s"]) for i, t in enumerate(got["time"])]
        received = sum(got["received_mb_s"][i] * seconds[i] for i in fresh)
        sent = sum(got["sent_mb_s"][i] * seconds[i] for i in fresh)
        if received >= 3 * 4.19 * 0.9 and sent >= 3 * 4.19 * 0.9:
            break
        assert time.monotonic() < deadline, f"12.6 MB in and out never showed in the samples: {got}"
        time.sleep(0.5)
    busy = [i for i in fresh if got["requests_s"][i] > 0]
    assert busy and all(got["mean_latency_ms"][i] > 0 for i in busy), got
    assert len(got["time"]) <= 299, "ten minutes of samples at most"

    # Only the root sees them.
    made = create_key(cluster, "--all-buckets")
    scoped = Browser(cluster.console_url)
    assert scoped.login(made["access_key"], made["secret_key"])[0] == 303
    assert scoped.get("/cluster/traffic")[0] == 403
    tessera_key(cluster, "revoke", made["access_key"])


def test_the_cluster_page_shows_nodes_drives_sets_and_a_node_going_down(cluster, browser):
    status, _, page = browser.get("/cluster")
    assert status == 200, page
    # With scripts its parts update in place (the browser test); without, it reloads itself.
    assert '<noscript><meta http-equiv="refresh"' in page, "the page reloads itself without scripts"
    assert re.search(r'<p id="health" data-live class="ok">', page) and "6 of 6 nodes up" in page, page
    assert "node protocol over plain TCP" in page, page
    for i in range(1, 7):
        assert f'data-node="n{i}"' in page
    assert page.count("<meter") == 6, "one capacity meter per drive"
    assert cluster.secret_key not in page

    def cluster_page_once(text: str) -> str:
        """The cluster page once it shows `text` (pages share one status round of 2 s)."""
        deadline = time.monotonic() + 15
        while True:
            status, _, page = browser.get("/cluster")
            assert status == 200, page
            if text in page:
                return page
            assert time.monotonic() < deadline, f"the cluster page never showed {text!r}: {page}"
            time.sleep(0.5)

    # A killed node shows as down, its drive as "node down", its set as degraded.
    with cluster.nodes_down(3):
        page = cluster_page_once("5 of 6 nodes up")
        row = re.search(r'<tr class="missing" data-node="n3">(.*?)</tr>', page, re.S)
        assert row and "<td>down</td>" in row.group(1), page
        assert "5 of 6 nodes up" in page and 'class="error"' in page and "node down" in page
        sets = re.search(r'<table id="sets">(.*?)</table>', page, re.S).group(1)
        assert re.search(r"n3/1</td><td>degraded</td>", sets), sets
    cluster_page_once("6 of 6 nodes up")

    # Only the root sees the nodes.
    made = create_key(cluster, "--all-buckets")
    scoped = Browser(cluster.console_url)
    assert scoped.login(made["access_key"], made["secret_key"])[0] == 303
    status, _, page = scoped.get("/cluster")
    assert status == 403 and 'data-node="n1"' not in page
    tessera_key(cluster, "revoke", made["access_key"])
