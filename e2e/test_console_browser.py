"""The web console in a real headless Chromium (Debian's `chromium` and `chromium-driver`, driven
by Selenium with both paths given, so nothing is ever downloaded) against the suite's cluster:
log in, create a bucket, upload (one request, and a file larger than one part as a multipart
upload), browse and search by prefix, download byte-exact, see the chunk placement, create a
read-only key and see an S3 PUT with it refused, revoke it, see the live traffic charts and a
killed node go down on the cluster page as it refreshes itself, log out. Screenshots of every step are saved as artifacts
(`target/e2e-artifacts/console-browser/`, or $TESSERA_E2E_ARTIFACTS)."""

from __future__ import annotations

import hashlib
import os
import shutil
import time
from pathlib import Path

import pytest

from conftest import Cluster
from s3check import unique_bucket_name
from test_access_keys import error_code

CHROMIUM = shutil.which("chromium")
CHROMEDRIVER = shutil.which("chromedriver")
MIB = 1024 * 1024
PART_BYTES_MIN = 16 * MIB  # console.js PART_BYTES_MIN
WAIT_S = 30  # longest wait for a page to show what a step expects
UPLOAD_WAIT_S = 180  # longest wait for the uploads (37 MiB through the browser on a busy machine)
ARTIFACTS = Path(os.environ.get("TESSERA_E2E_ARTIFACTS", Path(__file__).resolve().parent.parent / "target" / "e2e-artifacts")) \
    / "console-browser"

pytestmark = pytest.mark.skipif(
    CHROMIUM is None or CHROMEDRIVER is None,
    reason="Debian's chromium and chromium-driver are not installed (scripts/install-deps.sh installs them)",
)


class Chrome:
    """One headless Chromium session with a download folder and numbered screenshots."""

    def __init__(self, root: Path):
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service

        # Selenium Manager must never fetch a browser or a driver: both paths are given.
        os.environ["SE_OFFLINE"] = "true"
        self.downloads = root / "downloads"
        self.downloads.mkdir(parents=True)
        options = webdriver.ChromeOptions()
        options.binary_location = CHROMIUM
        for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu",
                    "--window-size=1280,1000", "--no-first-run", "--disable-background-networking",
                    "--disable-component-update", "--disable-sync", "--disable-default-apps",
                    f"--user-data-dir={root / 'profile'}"):
            options.add_argument(arg)
        options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
        service = Service(executable_path=CHROMEDRIVER, log_output=str(root / "chromedriver.log"))
        self.driver = webdriver.Chrome(service=service, options=options)
        self.driver.set_page_load_timeout(WAIT_S)
        self.driver.execute_cdp_cmd(
            "Browser.setDownloadBehavior", {"behavior": "allow", "downloadPath": str(self.downloads)})
        shutil.rmtree(ARTIFACTS, ignore_errors=True)
        ARTIFACTS.mkdir(parents=True)
        self.shots = 0

    def shot(self, name: str) -> None:
        self.shots += 1
        self.driver.save_screenshot(str(ARTIFACTS / f"{self.shots:02d}-{name}.png"))

    def wait(self, condition, what: str, timeout_s: float = WAIT_S):
        from selenium.common.exceptions import WebDriverException
        from selenium.webdriver.support.ui import WebDriverWait

        # Any driver error counts as "not yet": pages that refresh themselves replace the
        # elements a condition was reading (stale elements, nodes no longer in the document).
        try:
            return WebDriverWait(self.driver, timeout_s, poll_frequency=0.2,
                                 ignored_exceptions=(WebDriverException,)).until(condition)
        except Exception as e:
            self.shot("timed-out")
            raise AssertionError(f"the page never showed {what} (at {self.driver.current_url})") from e

    def text(self, element_id: str) -> str:
        from selenium.webdriver.common.by import By
        return self.driver.find_element(By.ID, element_id).text

    def severe_console_messages(self) -> list[str]:
        """Errors the page logged (a script or style the CSP blocked, a failed request)."""
        return [entry["message"] for entry in self.driver.get_log("browser")
                if entry["level"] == "SEVERE" and "favicon.ico" not in entry["message"]]

    def quit(self) -> None:
        self.driver.quit()


@pytest.fixture(scope="module")
def chrome(tmp_path_factory: pytest.TempPathFactory):
    c = Chrome(tmp_path_factory.mktemp("chromium"))
    try:
        yield c
    finally:
        try:
            c.shot("last")
        finally:
            c.quit()


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_a_person_uses_the_console_in_a_real_browser(cluster: Cluster, chrome: Chrome, make_client, tmp_path):
    from selenium.webdriver.common.by import By

    d = chrome.driver
    base = cluster.console_url
    s3 = make_client()

    # Wrong credentials: the login page again, with the error; right ones: the buckets page.
    d.get(base + "/buckets")
    assert d.current_url == base + "/login"
    d.find_element(By.NAME, "access_key").send_keys(cluster.access_key)
    d.find_element(By.NAME, "secret_key").send_keys("not the secret")
    d.find_element(By.CSS_SELECTOR, "form.login button").click()
    chrome.wait(lambda d: "Wrong access key or secret key." in d.page_source, "the wrong-credentials error")
    chrome.shot("login-refused")
    # Reading the log empties it: only the refused login's 401 is in it so far.
    assert [m for m in chrome.severe_console_messages() if "status of 401" not in m] == []
    d.find_element(By.NAME, "access_key").clear()
    d.find_element(By.NAME, "access_key").send_keys(cluster.access_key)
    d.find_element(By.NAME, "secret_key").send_keys(cluster.secret_key)
    d.find_element(By.CSS_SELECTOR, "form.login button").click()
    chrome.wait(lambda d: d.current_url == base + "/buckets", "the buckets page after logging in")
    cookie = d.get_cookie("tessera_console")
    assert cookie and cookie["httpOnly"] and cookie["sameSite"] == "Strict", cookie
    assert cluster.secret_key not in d.page_source
    chrome.shot("buckets")

    # Create a bucket with the form.
    bucket = unique_bucket_name("browser")
    d.find_element(By.NAME, "bucket").send_keys(bucket)
    d.find_element(By.ID, "create-bucket").click()
    chrome.wait(lambda d: d.find_element(By.LINK_TEXT, bucket), f"bucket {bucket} in the list")
    s3.head_bucket(Bucket=bucket)
    chrome.shot("bucket-created")

    # Upload two files with the file picker: one request for the small one, parts for the one
    # larger than a part. The script reloads the page when both are stored.
    small = tmp_path / "notes <b>bold.txt"
    small.write_bytes(os.urandom(100_000))
    large = tmp_path / "large.bin"
    large.write_bytes(os.urandom(2 * PART_BYTES_MIN + 5 * MIB))
    d.find_element(By.LINK_TEXT, bucket).click()
    chrome.wait(lambda d: d.find_element(By.ID, "files"), "the upload picker")
    d.find_element(By.ID, "files").send_keys(f"{small}\n{large}")
    chrome.wait(lambda d: d.find_element(By.LINK_TEXT, large.name) and d.find_element(By.LINK_TEXT, small.name),
                "both uploaded files in the listing", timeout_s=UPLOAD_WAIT_S)
    chrome.shot("uploaded")
    head = s3.head_object(Bucket=bucket, Key=large.name)
    assert head["ContentLength"] == large.stat().st_size
    assert head["ETag"].strip('"').endswith("-3"), f"a file of 2.3 parts goes up in 3 parts: {head['ETag']}"
    assert s3.get_object(Bucket=bucket, Key=small.name)["Body"].read() == small.read_bytes()
    # The script's plan for files no upload can hold, and for the largest ones (in the page).
    plan = d.execute_script("return [partPlan(6 * 1024 ** 4), partPlan(5 * 1024 ** 4), partPlan(1000), "
                            f"partPlan({PART_BYTES_MIN}), partPlan({PART_BYTES_MIN + 1})]")
    assert "an object may have at most 5 TiB" in plan[0]["error"], plan
    assert plan[1]["parts"] <= 10000 and plan[1]["partBytes"] <= 5 * 1024 ** 3, plan
    assert plan[2] == {"parts": 1, "partBytes": 1000}, plan
    assert plan[3] == {"parts": 1, "partBytes": PART_BYTES_MIN}, plan
    assert plan[4] == {"parts": 2, "partBytes": PART_BYTES_MIN}, plan

    # Browse: a folder made by S3, entered by its link; search by prefix.
    s3.put_object(Bucket=bucket, Key="photos/2026/cat.jpg", Body=b"meow" * 1000)
    s3.put_object(Bucket=bucket, Key="photos/dog.jpg", Body=b"woof")
    d.refresh()
    d.find_element(By.LINK_TEXT, "photos/").click()
    chrome.wait(lambda d: d.find_element(By.LINK_TEXT, "dog.jpg") and d.find_element(By.LINK_TEXT, "2026/"),
                "the folder's object and subfolder")
    chrome.shot("folder")
    search = d.find_element(By.NAME, "prefix")
    search.clear()
    search.send_keys("photos/2026/c")
    search.submit()
    chrome.wait(lambda d: d.find_element(By.LINK_TEXT, "cat.jpg"), "the search result")
    assert "dog.jpg" not in d.find_element(By.ID, "objects").text
    chrome.shot("search")

    # Download both files byte-exact, from the object's page with its chunk placement.
    for path in (small, large):
        d.get(base + "/objects?" + f"bucket={bucket}")
        d.find_element(By.LINK_TEXT, path.name).click()
        chrome.wait(lambda d: d.find_element(By.ID, "download"), f"the page of {path.name}")
        if path is small:
            rows = d.find_elements(By.CSS_SELECTOR, "#chunks tbody tr")
            assert len(rows) == 6 and all(r.get_attribute("class") == "present" for r in rows)
            chrome.shot("object-placement")
        else:
            assert "A multipart object of 3 parts" in chrome.text("parts")
        for earlier in chrome.downloads.iterdir():
            earlier.unlink()
        d.find_element(By.ID, "download").click()

        def downloaded(_):
            files = list(chrome.downloads.iterdir())
            done = len(files) == 1 and not files[0].name.endswith(".crdownload")
            return files[0] if done and files[0].stat().st_size == path.stat().st_size else None

        # Chromium may change characters it keeps out of file names ("<", ">"): the one file.
        target = chrome.wait(downloaded, f"the download of {path.name}")
        assert sha256(target) == sha256(path), f"{path.name} downloaded byte-exact"

    # A read-only key for this bucket, made on the keys page: reads, and its S3 PUT is refused.
    d.get(base + "/keys")
    form = d.find_element(By.ID, "create-key")
    form.find_element(By.NAME, "buckets").send_keys(bucket)
    form.find_element(By.NAME, "description").send_keys("browser test, read-only")
    form.find_element(By.CSS_SELECTOR, "button[type=submit]").click()
    chrome.wait(lambda d: d.find_element(By.ID, "new-secret-key"), "the new key, shown once")
    access_key, secret_key = chrome.text("new-access-key"), chrome.text("new-secret-key")
    chrome.shot("key-created")
    reader = make_client(access_key, secret_key)
    assert reader.get_object(Bucket=bucket, Key=small.name)["Body"].read() == small.read_bytes()
    assert error_code(lambda: reader.put_object(Bucket=bucket, Key="from-the-reader", Body=b"x")) == "AccessDenied"
    assert error_code(lambda: s3.head_object(Bucket=bucket, Key="from-the-reader")) == "404"
    d.get(base + "/keys")
    row = d.find_element(By.XPATH, f"//table[@id='keys']//tr[td[contains(., '{access_key}')]]")
    row.find_element(By.CSS_SELECTOR, "button[type=submit]").click()
    chrome.wait(lambda d: d.current_url == base + "/keys" and access_key not in d.page_source, "the key revoked")
    chrome.shot("key-revoked")

    # The cluster page updates itself: a killed node shows as down without a manual reload.
    # The cluster page's live charts (uPlot, served by the console) draw this gateway's traffic.
    for _ in range(5):
        s3.put_object(Bucket=bucket, Key="traffic.bin", Body=os.urandom(MIB))
        s3.get_object(Bucket=bucket, Key="traffic.bin")["Body"].read()
    d.get(base + "/cluster")
    chrome.wait(lambda d: "6 of 6 nodes up" in d.find_element(By.ID, "health").text, "every node up")
    chrome.wait(lambda d: len(d.find_elements(By.CSS_SELECTOR, "#charts .uplot canvas")) == 2
                and int(d.find_element(By.ID, "charts").get_attribute("data-points") or 0) > 0,
                "two charts drawn from the gateway's samples")
    # What the charts draw, fetched by the page itself (its CSP lets it reach its own origin):
    # the megabytes just sent in and out are in the samples.
    traffic = chrome.wait(lambda d: d.execute_async_script(
        "const done = arguments[arguments.length - 1];"
        "fetch('/cluster/traffic').then((r) => r.json()).then((s) => {"
        "  const seconds = s.time.map((t, i) => (i ? t - s.time[i - 1] : s.interval_s));"
        "  const mb = (rates) => rates.reduce((sum, rate, i) => sum + rate * seconds[i], 0);"
        "  const got = [mb(s.received_mb_s), mb(s.sent_mb_s)];"
        "  done(got[0] >= 5 && got[1] >= 5 ? got : null);"
        "}).catch(() => done(null));"), "5 MB in and out in the charts' samples")
    assert min(traffic) >= 5, traffic
    chrome.shot("cluster-charts")
    # A mark on this very document: it is still there after the update, so the tables were
    # swapped in place (the page was not reloaded, the charts were not rebuilt).
    d.execute_script("window.tesseraSamePage = 'yes';")
    with cluster.nodes_down(4):
        def n4_down(d) -> bool:
            row = d.find_element(By.CSS_SELECTOR, 'tr[data-node="n4"]')
            return ("5 of 6 nodes up" in d.find_element(By.ID, "health").text and "down" in row.text
                    and row.get_attribute("class") == "missing")

        chrome.wait(n4_down, "node n4 down")
        chrome.shot("node-down")
        assert d.execute_script("return window.tesseraSamePage;") == "yes", "the page was reloaded"
        assert "Updated at" in d.find_element(By.ID, "refresh").text
        assert len(d.find_elements(By.CSS_SELECTOR, "#charts .uplot canvas")) == 2
    chrome.wait(lambda d: "6 of 6 nodes up" in d.find_element(By.ID, "health").text, "every node up again")
    chrome.shot("nodes-up")

    # Nothing on these pages broke the Content-Security-Policy or failed to load.
    assert chrome.severe_console_messages() == []

    # Log out: the cookie is gone and pages send the browser to the login page.
    d.find_element(By.ID, "logout").click()
    chrome.wait(lambda d: d.current_url == base + "/login", "the login page after logging out")
    assert d.get_cookie("tessera_console") is None
    d.get(base + "/buckets")
    assert d.current_url == base + "/login"
    chrome.shot("logged-out")
