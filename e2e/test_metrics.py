"""/metrics of the gateway and the nodes, read with prometheus_client's OpenMetrics parser (which
refuses malformed exposition), checked against the traffic the test itself sends."""

from __future__ import annotations

import urllib.error
import urllib.request

import pytest
from prometheus_client.openmetrics.parser import text_string_to_metric_families

from s3check import MIB, data, s3_error


def scrape(cluster, name: str) -> dict[tuple[str, tuple], float]:
    """{(sample name, sorted labels): value} of one process's /metrics."""
    with urllib.request.urlopen(f"http://127.0.0.1:{cluster.metrics_port(name)}/metrics", timeout=10) as resp:
        assert resp.status == 200
        assert resp.headers["Content-Type"].startswith("application/openmetrics-text")
        text = resp.read().decode()
    samples = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return samples


def value(samples, name: str, **labels) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


def total(samples, name: str, **labels) -> float:
    """Sum over the samples of `name` whose labels include `labels`."""
    return sum(v for (n, ls), v in samples.items() if n == name and set(labels.items()) <= set(ls))


def test_gateway_counts_requests_bytes_and_latency_by_operation(cluster, s3, bucket):
    before = scrape(cluster, "gateway")
    body = data(3 * MIB + 5, seed=400)
    s3.put_object(Bucket=bucket, Key="m", Body=body)
    assert s3.get_object(Bucket=bucket, Key="m")["Body"].read() == body
    with s3_error("NoSuchKey", 404):
        s3.get_object(Bucket=bucket, Key="absent")
    after = scrape(cluster, "gateway")

    def delta(name, **labels):
        return total(after, name, **labels) - total(before, name, **labels)

    assert delta("tessera_s3_requests_total", operation="PutObject", outcome="2xx") == 1
    assert delta("tessera_s3_requests_total", operation="GetObject", outcome="2xx") == 1
    assert delta("tessera_s3_requests_total", operation="GetObject", outcome="4xx") == 1
    assert delta("tessera_s3_request_duration_seconds_count", operation="GetObject") == 2
    assert delta("tessera_s3_object_received_bytes_total") == len(body)
    assert delta("tessera_s3_object_sent_bytes_total") == len(body)
    assert value(after, "tessera_s3_connections") >= 1
    nodes = {dict(ls)["node"]: v for (n, ls), v in after.items() if n == "tessera_s3_client_node_up"}
    assert nodes == {f"n{i}": 1.0 for i in range(1, 7)}


def test_metrics_never_name_buckets_keys_or_secrets(cluster, s3, bucket):
    s3.put_object(Bucket=bucket, Key="secret-plans/very-private-key-name.txt", Body=b"x")
    for name in ["gateway", "n1"]:
        with urllib.request.urlopen(f"http://127.0.0.1:{cluster.metrics_port(name)}/metrics", timeout=10) as resp:
            text = resp.read().decode()
        for leaked in (bucket, "very-private-key-name", cluster.secret_key, cluster.access_key):
            assert leaked not in text, f"{name}'s metrics contain {leaked!r}"


def test_unsigned_requests_count_as_unrouted_and_only_metrics_is_served(cluster):
    before = scrape(cluster, "gateway")
    for _ in range(2):
        with pytest.raises(urllib.error.HTTPError) as info:
            urllib.request.urlopen(f"{cluster.endpoint}/some-bucket/some-key", timeout=10)
        assert info.value.code == 403
    after = scrape(cluster, "gateway")
    assert total(after, "tessera_s3_requests_total", outcome="4xx") - total(before, "tessera_s3_requests_total", outcome="4xx") >= 2
    with pytest.raises(urllib.error.HTTPError) as info:
        urllib.request.urlopen(f"http://127.0.0.1:{cluster.metrics_port('gateway')}/other", timeout=10)
    assert info.value.code == 404


def test_nodes_count_chunks_and_report_their_drives(cluster, s3, bucket):
    before = [scrape(cluster, f"n{i}") for i in range(1, 7)]
    body = data(4 * MIB, seed=401)  # one 4+2 stripe of 1 MiB chunks: one chunk per node
    s3.put_object(Bucket=bucket, Key="n", Body=body)
    assert s3.get_object(Bucket=bucket, Key="n")["Body"].read() == body
    after = [scrape(cluster, f"n{i}") for i in range(1, 7)]
    received = sum(total(a, "tessera_node_received_bytes_total") - total(b, "tessera_node_received_bytes_total")
                   for a, b in zip(after, before))
    sent = sum(total(a, "tessera_node_sent_bytes_total") - total(b, "tessera_node_sent_bytes_total")
               for a, b in zip(after, before))
    # At least the four data and two parity chunks written (repair after earlier tests may add more).
    assert received >= 6 * MIB
    assert sent >= 4 * MIB, "at least the data chunks read back"
    for samples in after:
        assert value(samples, "tessera_node_drive_capacity_bytes", drive="1") > 0
        assert value(samples, "tessera_node_drive_up", drive="1") == 1
        assert value(samples, "tessera_node_drive_errors_total", drive="1") == 0
        assert total(samples, "tessera_node_requests_total", kind="chunk_write") >= 1
        assert value(samples, "tessera_node_uptime_seconds") > 0


def test_the_sample_grafana_dashboard_queries_only_metrics_that_exist(cluster, s3, bucket):
    """ops/grafana/tessera-dashboard.json: every tessera_* series it queries is served."""
    import json
    import re
    from pathlib import Path

    s3.put_object(Bucket=bucket, Key="d", Body=b"dashboard")
    served = set()
    for name in ["gateway", "n1"]:
        served |= {n for n, _ in scrape(cluster, name)}
    dashboard = json.loads((Path(__file__).parent.parent / "ops/grafana/tessera-dashboard.json").read_text())
    queried = {m for panel in dashboard["panels"] for target in panel["targets"]
               for m in re.findall(r"tessera_[a-z0-9_]+", target["expr"])}
    assert queried and not queried - served, f"queried but not served: {sorted(queried - served)}"
