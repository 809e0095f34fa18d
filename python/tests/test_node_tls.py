"""The Python package against a cluster whose node protocol runs over TLS (`init --node-tls on`):
from the cluster.toml (trusting its CA) and from a node address and the secret alone (a
bootstrap, which learns the CA from the map it fetches)."""

from __future__ import annotations

import pickle
import shutil
import tempfile
from pathlib import Path

import numpy as np
import pytest

import tessera
from conftest import TESSERA_BIN, Cluster


@pytest.fixture(scope="module")
def tls_cluster():
    if not TESSERA_BIN.exists():
        pytest.fail(f"{TESSERA_BIN} is missing: run `cargo build --release -p cli` first")
    data_dir = Path(tempfile.mkdtemp(prefix="tessera-pytest-tls-"))
    c = Cluster(data_dir, node_tls=True)
    try:
        assert "[node_tls]" in c.config.read_text()
        c.start_all()
        yield c
    finally:
        c.stop_all()
        shutil.rmtree(data_dir, ignore_errors=True)


def test_a_client_from_the_config_reads_and_writes_over_tls(tls_cluster):
    client = tessera.connect(str(tls_cluster.config))
    client.make_bucket("tls-config")
    data = np.random.default_rng(7).integers(0, 256, 700_000, dtype=np.uint8).tobytes()
    client.put("tls-config", "obj", data)
    assert client.get("tls-config", "obj") == data
    buf = np.zeros(len(data), dtype=np.uint8)
    assert client.get_into("tls-config", "obj", buf) == len(data)
    assert buf.tobytes() == data
    # A pickled client (a DataLoader worker) reconnects over TLS too.
    again = pickle.loads(pickle.dumps(client))
    assert again.get("tls-config", "obj", range=(100, 200)) == data[100:200]


def test_a_client_from_a_node_address_and_the_secret_bootstraps_over_tls(tls_cluster):
    host, port = tls_cluster.addr(2)
    client = tessera.connect(f"{host}:{port}", secret=tls_cluster.secret)
    client.make_bucket("tls-bootstrap")
    client.put("tls-bootstrap", "k", b"via a node address")
    assert client.get("tls-bootstrap", "k") == b"via a node address"
    with pytest.raises(tessera.AuthRejected):
        tessera.connect(f"{host}:{port}", secret="00" * 32)
