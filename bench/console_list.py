"""The web console's object listing of a large prefix against S3 ListObjectsV2 (issue 14: "The
console's object list of a prefix with 10,000 objects renders in under a second (paginated)").
Driven by bench/console-list.sh, which starts the cluster and the gateway with its console.

Fills BUCKET/PREFIX with COUNT small objects through the S3 gateway (boto3, a thread pool), logs in
to the console as a browser does (POST /login with the console's own Origin, the session cookie)
and times, client-side, each request from sending it to the last byte of the body:
  (a) the first page of /objects?bucket=B&prefix=P (console::PAGE_ROWS = 500 rows), --fetches
      times after --warmups;
  (b) walking every page of the prefix by its "next page" links, --walks times, checking that
      the pages list exactly the COUNT keys, in order, each once;
  (c) the baseline, S3 ListObjectsV2 of the same prefix through the same gateway: the first page
      of 1000 keys and the whole prefix by paginator, with boto3 (what an S3 user runs, XML
      parsing included) and as raw HTTP (a presigned URL fetched like the console pages: the
      server's time alone, measured the same way).
With --node-metrics (a node's /metrics URL) it also counts the listings that node served per
console page and per ListObjectsV2 page.
Optionally (--browser auto, when /usr/bin/chromium, /usr/bin/chromedriver and selenium exist) it
also renders the first page in headless Chromium and reads the Navigation Timing of the page.

Credentials: TESSERA_ACCESS_KEY / TESSERA_SECRET_KEY. Prints plain text; --json writes the raw
timings too."""

from __future__ import annotations

import argparse
import html
import http.client
import json
import math
import os
import re
import shutil
import statistics
import sys
import time
import urllib.parse
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import boto3
from botocore.config import Config

PAGE_ROWS = 500  # console::PAGE_ROWS
PAGES_MAX = 1000  # bound on the pages of one walk


def p95(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[max(0, math.ceil(0.95 * len(ordered)) - 1)]


def ms(seconds: float) -> str:
    return f"{seconds * 1e3:.1f} ms"


def summary(values: list[float]) -> dict:
    return {"median_s": statistics.median(values), "p95_s": p95(values), "min_s": min(values),
            "max_s": max(values), "n": len(values)}


class Browser:
    """Just enough of a browser (as e2e/test_console.py's): the session cookie, Origin on POSTs."""

    def __init__(self, base: str):
        parsed = urllib.parse.urlsplit(base)
        self.host, self.port = parsed.hostname, parsed.port
        self.origin = f"http://{self.host}:{self.port}"
        self.cookie: str | None = None

    def request(self, method: str, path: str, body: bytes | None = None,
                headers: dict | None = None) -> tuple[int, dict[str, str], bytes, float, float]:
        """(status, headers, body, seconds to the response head, seconds to the body's end)."""
        conn = http.client.HTTPConnection(self.host, self.port, timeout=60)
        try:
            sent = dict(headers or {})
            if self.cookie:
                sent["Cookie"] = f"tessera_console={self.cookie}"
            if method != "GET":
                sent["Origin"] = self.origin
            conn.connect()
            t0 = time.perf_counter()
            conn.request(method, path, body=body, headers=sent)
            answer = conn.getresponse()
            t_head = time.perf_counter()
            data = answer.read()
            t_end = time.perf_counter()
            got = {k.lower(): v for k, v in answer.getheaders()}
            return answer.status, got, data, t_head - t0, t_end - t0
        finally:
            conn.close()

    def login(self, access_key: str, secret_key: str) -> None:
        body = urllib.parse.urlencode({"access_key": access_key, "secret_key": secret_key}).encode()
        status, headers, answer, _, _ = self.request(
            "POST", "/login", body, {"Content-Type": "application/x-www-form-urlencoded"})
        match = re.match(r"tessera_console=([0-9a-f]{64});", headers.get("set-cookie", ""))
        if status != 303 or not match:
            sys.exit(f"error: console login failed: {status} {answer[:300]!r}")
        self.cookie = match.group(1)


OBJECT_LINK = re.compile(r'<a href="/object\?([^"]*)"')
NEXT_LINK = re.compile(r'id="next" href="([^"]+)"')


def page_keys(page: str) -> list[str]:
    """The keys of a listing page's object rows (their links to /object?bucket=B&key=K)."""
    keys = []
    for query in OBJECT_LINK.findall(page):
        params = urllib.parse.parse_qs(html.unescape(query), keep_blank_values=True)
        keys.append(params["key"][0])
    return keys


def next_link(page: str) -> str | None:
    found = NEXT_LINK.search(page)
    return html.unescape(found.group(1)) if found else None


def fill(s3, bucket: str, keys: list[str], size: int, threads: int) -> float:
    body = b"x" * size
    t0 = time.perf_counter()
    with ThreadPoolExecutor(threads) as pool:
        for _ in pool.map(lambda k: s3.put_object(Bucket=bucket, Key=k, Body=body), keys):
            pass
    return time.perf_counter() - t0


def raw_get(url: str) -> tuple[int, bytes, float]:
    parsed = urllib.parse.urlsplit(url)
    conn = http.client.HTTPConnection(parsed.hostname, parsed.port, timeout=60)
    try:
        conn.connect()
        t0 = time.perf_counter()
        conn.request("GET", parsed.path + ("?" + parsed.query if parsed.query else ""))
        answer = conn.getresponse()
        data = answer.read()
        return answer.status, data, time.perf_counter() - t0
    finally:
        conn.close()


XML_KEY = re.compile(r"<Key>([^<]*)</Key>")


def xml_keys(text: str) -> list[str]:
    """The keys of a ListObjectsV2 answer (boto3 asks for encoding-type=url)."""
    return [urllib.parse.unquote(html.unescape(k)) for k in XML_KEY.findall(text)]


XML_TOKEN = re.compile(r"<NextContinuationToken>([^<]*)</NextContinuationToken>")
NODE_LISTS = re.compile(r'^tessera_node_requests_total\{kind="list"\} (\d+)', re.M)


def node_lists(url: str | None) -> int | None:
    """Listing requests a node has served (its /metrics), or None without --node-metrics."""
    if not url:
        return None
    with urllib.request.urlopen(url, timeout=10) as answer:
        found = NODE_LISTS.search(answer.read().decode())
    return int(found.group(1)) if found else 0


def per(before: int | None, after: int | None, n: int) -> float | None:
    return None if before is None or after is None else (after - before) / n


def lists_note(value: float | None, what: str = "request") -> str:
    return "" if value is None else f"; node n1 served {value:.1f} listings per {what}"


def browser_render(args, page_path: str, access_key: str, secret_key: str) -> dict | None:
    chromium, driver_path = "/usr/bin/chromium", "/usr/bin/chromedriver"
    if args.browser == "off":
        print("browser render: skipped (--browser off)")
        return None
    missing = [p for p in (chromium, driver_path) if not os.access(p, os.X_OK)]
    try:
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service
        from selenium.webdriver.common.by import By
    except ImportError:
        missing.append("selenium (python)")
    if missing:
        print(f"browser render: skipped ({', '.join(missing)} missing)")
        return None
    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    for flag in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu",
                 "--disable-extensions", "--no-first-run", "--window-size=1280,1024"):
        options.add_argument(flag)
    driver = None
    try:
        driver = webdriver.Chrome(service=Service(driver_path), options=options)
        driver.set_page_load_timeout(60)
        driver.get(args.console + "/login")
        driver.find_element(By.NAME, "access_key").send_keys(access_key)
        driver.find_element(By.NAME, "secret_key").send_keys(secret_key)
        driver.find_element(By.CSS_SELECTOR, "form.login button[type=submit]").click()
        deadline = time.monotonic() + 10
        while "/buckets" not in driver.current_url and time.monotonic() < deadline:
            time.sleep(0.05)
        login = "the login form"
        if "/buckets" not in driver.current_url:
            # What is timed is the listing: log in as the script does and hand Chromium the cookie.
            refused = driver.find_elements(By.CSS_SELECTOR, "p.error")
            print(f"browser render: the login form did not log in ({driver.title!r}: "
                  f"{refused[0].text if refused else driver.current_url}); using a session from POST /login instead")
            cookie = Browser(args.console)
            cookie.login(access_key, secret_key)
            driver.add_cookie({"name": "tessera_console", "value": cookie.cookie, "path": "/", "httpOnly": True,
                               "sameSite": "Strict"})
            login = "a session cookie from POST /login"
        out_login = login
        timings = []
        for i in range(args.browser_loads + 1):  # the first is a warm-up
            driver.get(args.console + page_path)
            nav = driver.execute_script(
                "const n = performance.getEntriesByType('navigation')[0];"
                "return {ttfb: n.responseStart - n.requestStart, response_end: n.responseEnd - n.startTime,"
                " dom_content_loaded: n.domContentLoadedEventEnd - n.startTime, load: n.loadEventEnd - n.startTime,"
                " rows: document.querySelectorAll('#objects tbody tr').length};")
            if nav["rows"] != PAGE_ROWS:
                raise RuntimeError(f"the rendered page has {nav['rows']} rows, not {PAGE_ROWS}")
            if i > 0:
                timings.append(nav)
        out = {k: summary([t[k] / 1e3 for t in timings]) for k in ("ttfb", "response_end", "dom_content_loaded", "load")}
        out["version"] = driver.capabilities.get("browserVersion", "?")
        out["login"] = out_login
        print(f"browser render (headless Chromium {out['version']}, {len(timings)} loads after 1 warm-up, "
              f"Navigation Timing from navigation start, medians): first byte {ms(out['ttfb']['median_s'])}, "
              f"HTML received {ms(out['response_end']['median_s'])}, DOMContentLoaded "
              f"{ms(out['dom_content_loaded']['median_s'])}, load {ms(out['load']['median_s'])} "
              f"(p95 {ms(out['load']['p95_s'])})")
        return out
    except Exception as e:  # optional: a note, not a failed benchmark
        print(f"browser render: failed ({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}); skipped")
        return None
    finally:
        if driver is not None:
            driver.quit()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--s3", required=True, help="the gateway's S3 endpoint, http://HOST:PORT")
    parser.add_argument("--console", required=True, help="the console, http://HOST:PORT")
    parser.add_argument("--bucket", default="console-list")
    parser.add_argument("--prefix", default="data/")
    parser.add_argument("--count", type=int, default=10_000)
    parser.add_argument("--size", type=int, default=100, help="bytes per object")
    parser.add_argument("--put-threads", type=int, default=16)
    parser.add_argument("--fetches", type=int, default=20)
    parser.add_argument("--warmups", type=int, default=2)
    parser.add_argument("--walks", type=int, default=3)
    parser.add_argument("--browser", choices=("auto", "off"), default="auto")
    parser.add_argument("--browser-loads", type=int, default=5)
    parser.add_argument("--node-metrics", help="a node's /metrics URL: count the listings each request causes")
    parser.add_argument("--json", help="also write the raw timings here")
    args = parser.parse_args()
    access_key, secret_key = os.environ["TESSERA_ACCESS_KEY"], os.environ["TESSERA_SECRET_KEY"]
    bucket, prefix = args.bucket, args.prefix
    expected = [f"{prefix}part-{i:05d}.bin" for i in range(args.count)]
    s3 = boto3.session.Session().client(
        "s3", endpoint_url=args.s3, aws_access_key_id=access_key, aws_secret_access_key=secret_key,
        config=Config(region_name="us-east-1", s3={"addressing_style": "path"}, retries={"max_attempts": 1},
                      max_pool_connections=args.put_threads + 4))
    result: dict = {"count": args.count, "size": args.size, "page_rows": PAGE_ROWS}

    s3.create_bucket(Bucket=bucket)
    # A few objects beside the prefix, so the listing has to stop at its end.
    for key in ("before/x", "data-not/x", "zz/x"):
        s3.put_object(Bucket=bucket, Key=key, Body=b".")
    secs = fill(s3, bucket, expected, args.size, args.put_threads)
    result["fill_s"] = secs
    print(f"filled {bucket}/{prefix}: {args.count} objects of {args.size} B with {args.put_threads} boto3 threads "
          f"in {secs:.1f} s ({args.count / secs:.0f} PUT/s)")

    # (a) The console's first page.
    console = Browser(args.console)
    console.login(access_key, secret_key)
    first = "/objects?" + urllib.parse.urlencode({"bucket": bucket, "prefix": prefix})
    heads, ends, size = [], [], 0
    for i in range(args.warmups + args.fetches):
        if i == args.warmups:
            lists_before = node_lists(args.node_metrics)
        status, _, body, t_head, t_end = console.request("GET", first)
        if status != 200:
            sys.exit(f"error: {first} answered {status}: {body[:300]!r}")
        page = body.decode()
        if i == 0:
            keys = page_keys(page)
            if keys != expected[:PAGE_ROWS]:
                sys.exit(f"error: the first page shows {len(keys)} keys, not {expected[0]}..{expected[PAGE_ROWS - 1]}")
            if next_link(page) is None:
                sys.exit("error: the first page has no next page link")
        if i >= args.warmups:
            heads.append(t_head)
            ends.append(t_end)
            size = len(body)
    result["console_page"] = summary(ends)
    page_lists = result["console_page_node_lists"] = per(lists_before, node_lists(args.node_metrics), args.fetches)
    result["console_page_head"] = summary(heads)
    result["console_page_bytes"] = size
    print(f"console first page ({PAGE_ROWS} rows, {size / 1024:.0f} KiB of HTML), {args.fetches} fetches after "
          f"{args.warmups} warm-ups: median {ms(statistics.median(ends))}, p95 {ms(p95(ends))}, "
          f"min {ms(min(ends))}, max {ms(max(ends))} (response head: median {ms(statistics.median(heads))}){lists_note(page_lists)}")

    # (b) Walking every page.
    # Each walk's wall time (parsing the pages' keys included) and its requests' time alone.
    walks, walk_requests, pages_per_walk = [], [], 0
    lists_before = node_lists(args.node_metrics)
    for _ in range(args.walks):
        path, seen, pages, page_times = first, [], 0, []
        t0 = time.perf_counter()
        while path is not None:
            pages += 1
            if pages > PAGES_MAX:
                sys.exit(f"error: more than {PAGES_MAX} pages")
            status, _, body, _, t_end = console.request("GET", path)
            if status != 200:
                sys.exit(f"error: {path} answered {status}: {body[:300]!r}")
            page = body.decode()
            page_times.append(t_end)
            seen.extend(page_keys(page))
            path = next_link(page)
        walks.append(time.perf_counter() - t0)
        walk_requests.append(sum(page_times))
        if seen != expected:
            extra, lost = set(seen) - set(expected), set(expected) - set(seen)
            sys.exit(f"error: the pages list {len(seen)} keys ({len(set(seen))} distinct), {len(lost)} missing, "
                     f"{len(extra)} not expected, in order: {seen == sorted(seen)}")
        pages_per_walk = pages
    result["console_walk"] = summary(walks)
    result["console_walk_requests"] = summary(walk_requests)
    walk_lists = result["console_walk_node_lists"] = per(lists_before, node_lists(args.node_metrics), args.walks)
    result["console_walk_pages"] = pages_per_walk
    print(f"console walk of {prefix}: {pages_per_walk} pages, exactly the {args.count} keys in order, each once; "
          f"{args.walks} walks: requests alone median {ms(statistics.median(walk_requests))} (min {ms(min(walk_requests))}, "
          f"max {ms(max(walk_requests))}), {ms(statistics.median(walk_requests) / pages_per_walk)} per page; with the "
          f"client's parsing median {ms(statistics.median(walks))}{lists_note(walk_lists, 'walk')}")

    # (c) The baseline: ListObjectsV2 through the same gateway.
    boto_pages = []
    for i in range(args.warmups + args.fetches):
        t0 = time.perf_counter()
        answer = s3.list_objects_v2(Bucket=bucket, Prefix=prefix, MaxKeys=1000)
        took = time.perf_counter() - t0
        if i == 0 and [o["Key"] for o in answer["Contents"]] != expected[:1000]:
            sys.exit("error: ListObjectsV2's first page is not the first 1000 keys")
        if i >= args.warmups:
            boto_pages.append(took)
    result["s3_page_boto3"] = summary(boto_pages)
    print(f"S3 ListObjectsV2 first page (1000 keys), boto3: median {ms(statistics.median(boto_pages))}, "
          f"p95 {ms(p95(boto_pages))}")

    # The same request as raw HTTP: the server's time to the whole XML body, as for the console.
    # boto3 presigns with SigV2 unless told; the gateway serves SigV4 only.
    presigner = boto3.session.Session().client(
        "s3", endpoint_url=args.s3, aws_access_key_id=access_key, aws_secret_access_key=secret_key,
        config=Config(region_name="us-east-1", s3={"addressing_style": "path"}, signature_version="s3v4"))
    url = presigner.generate_presigned_url("list_objects_v2", Params={"Bucket": bucket, "Prefix": prefix, "MaxKeys": 1000},
                                    ExpiresIn=3600)
    raw_pages, raw_bytes = [], 0
    status, body, _ = raw_get(url)
    if status == 200 and xml_keys(body.decode()) == expected[:1000]:
        for i in range(args.warmups + args.fetches):
            if i == args.warmups:
                lists_before = node_lists(args.node_metrics)
            status, body, took = raw_get(url)
            if i >= args.warmups:
                raw_pages.append(took)
                raw_bytes = len(body)
        result["s3_page_raw"] = summary(raw_pages)
        s3_lists = result["s3_page_raw_node_lists"] = per(lists_before, node_lists(args.node_metrics), args.fetches)
        result["s3_page_raw_bytes"] = raw_bytes
        print(f"S3 ListObjectsV2 first page (1000 keys, {raw_bytes / 1024:.0f} KiB of XML), raw HTTP (presigned): "
              f"median {ms(statistics.median(raw_pages))}, p95 {ms(p95(raw_pages))}{lists_note(s3_lists)}")
    else:
        print(f"S3 ListObjectsV2 as raw HTTP: skipped (the presigned URL answered {status})")

    boto_walks = []
    for _ in range(args.walks):
        t0 = time.perf_counter()
        keys = [o["Key"] for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix)
                for o in page.get("Contents", [])]
        boto_walks.append(time.perf_counter() - t0)
        if keys != expected:
            sys.exit(f"error: ListObjectsV2 by paginator listed {len(keys)} keys, not the {args.count}")
    result["s3_walk_boto3"] = summary(boto_walks)
    print(f"S3 ListObjectsV2 of {prefix} by paginator ({math.ceil(args.count / 1000)} pages), boto3, {args.walks} "
          f"walks: median {ms(statistics.median(boto_walks))} (min {ms(min(boto_walks))}, max {ms(max(boto_walks))})")

    raw_walks, raw_walk_requests = [], []
    if raw_pages:
        lists_before = node_lists(args.node_metrics)
        for _ in range(args.walks):
            keys, token, calls, requests_s = [], None, 0, 0.0
            t0 = time.perf_counter()
            while True:
                calls += 1
                if calls > PAGES_MAX:
                    sys.exit(f"error: more than {PAGES_MAX} ListObjectsV2 pages")
                params = {"Bucket": bucket, "Prefix": prefix, "MaxKeys": 1000}
                if token:
                    params["ContinuationToken"] = token
                status, body, took = raw_get(presigner.generate_presigned_url("list_objects_v2", Params=params, ExpiresIn=3600))
                requests_s += took
                text = body.decode()
                if status != 200:
                    sys.exit(f"error: ListObjectsV2 answered {status}: {text[:300]}")
                keys.extend(xml_keys(text))
                found = XML_TOKEN.search(text)
                if "<IsTruncated>true</IsTruncated>" not in text or not found:
                    break
                token = html.unescape(found.group(1))
            raw_walks.append(time.perf_counter() - t0)
            raw_walk_requests.append(requests_s)
            if keys != expected:
                sys.exit(f"error: ListObjectsV2 as raw HTTP listed {len(keys)} keys, not the {args.count}")
        result["s3_walk_raw"] = summary(raw_walks)
        result["s3_walk_raw_requests"] = summary(raw_walk_requests)
        s3_walk_lists = result["s3_walk_raw_node_lists"] = per(lists_before, node_lists(args.node_metrics), args.walks)
        print(f"S3 ListObjectsV2 of {prefix} as raw HTTP ({calls} pages), "
              f"{args.walks} walks: requests alone median {ms(statistics.median(raw_walk_requests))}; with signing and "
              f"parsing median {ms(statistics.median(raw_walks))}{lists_note(s3_walk_lists, 'walk')}")

    result["browser"] = browser_render(args, first, access_key, secret_key)

    page_med = statistics.median(ends)
    walk_med = statistics.median(walk_requests)
    print()
    print(f"summary: console first page of {bucket}/{prefix} ({args.count} objects, {PAGE_ROWS} rows per page): "
          f"median {page_med * 1e3:.1f} ms, p95 {p95(ends) * 1e3:.1f} ms; under 1 s: {'yes' if page_med < 1 else 'no'} (p95 {'under' if p95(ends) < 1 else 'over'} 1 s)")
    print(f"summary: console page / ListObjectsV2 page (boto3, 1000 keys) = {page_med / statistics.median(boto_pages):.2f}"
          + (f"; / ListObjectsV2 page (raw HTTP) = {page_med / statistics.median(raw_pages):.2f}" if raw_pages else ""))
    print(f"summary: console walk ({pages_per_walk} pages, requests alone: {walk_med * 1e3:.1f} ms) / ListObjectsV2 walk (boto3, "
          f"{math.ceil(args.count / 1000)} pages) = {walk_med / statistics.median(boto_walks):.2f}"
          + (f"; / ListObjectsV2 walk (raw HTTP, requests alone) = {walk_med / statistics.median(raw_walk_requests):.2f}"
             if raw_walks else ""))
    if result["browser"]:
        load = result["browser"]["load"]["median_s"]
        print(f"summary: rendered in headless Chromium (load event, median): {load * 1e3:.1f} ms; "
              f"under 1 s: {'yes' if load < 1 else 'no'}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
