"""Tessera: the Python client of an erasure-coded object store.

    import tessera
    client = tessera.connect()                      # TESSERA_CONFIG, a cluster.toml path, or HOST:PORT
    client.make_bucket("data")
    client.put("data", "a.bin", b"hello")
    buf = bytearray(5)
    client.get_into("data", "a.bin", buf)           # straight into the caller's buffer

Reads go straight from the storage nodes into your buffer (one batched request per node),
decoding around missing chunks on the client. ``tessera.torch`` has PyTorch datasets and
checkpoint helpers, ``tessera.fsspec`` an fsspec filesystem for ``tessera://`` URLs.
"""

from . import errors
from .client import Client, ListEntry, ObjectInfo, ObjectReader, ObjectWriter, connect, default_client, parse_uri
from .errors import (
    AuthRejected,
    BucketNotEmpty,
    ConfigError,
    DiskFull,
    GatherError,
    InvalidName,
    NodeUnavailable,
    NoSuchBucket,
    NotFound,
    QueryError,
    RangeNotSatisfiable,
    SourceError,
    TesseraError,
    Timeout,
    Unavailable,
    WriteQuorum,
)

__version__ = "0.0.0"

__all__ = [
    "connect",
    "default_client",
    "Client",
    "ListEntry",
    "ObjectInfo",
    "ObjectReader",
    "ObjectWriter",
    "parse_uri",
    "errors",
    *errors.__all__,
]
