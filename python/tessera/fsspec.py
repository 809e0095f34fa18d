"""An fsspec filesystem for ``tessera://bucket/key`` URLs, so pandas, pyarrow, DuckDB and
anything else that speaks fsspec open Tessera objects directly::

    import pandas as pd
    df = pd.read_parquet("tessera://data/table.parquet")      # TESSERA_CONFIG names the cluster
    df = pd.read_parquet("tessera://data/table.parquet", storage_options={"config": "cluster.toml"})

The ``tessera`` protocol is registered through the ``fsspec.specs`` entry point of the installed
package, and again (``fsspec.register_implementation``) when this module is imported.

Paths are ``bucket/key``; "directories" are key prefixes ending at a ``/``, and the buckets are
the top level. Files opened for reading read the version current at ``open``; files opened for
writing stream a PUT committed by ``close()``.
"""

from __future__ import annotations

import datetime
from typing import Any

import fsspec
from fsspec.spec import AbstractBufferedFile, AbstractFileSystem

from .client import Client, connect, default_client
from .errors import NotFound, NoSuchBucket


class TesseraFileSystem(AbstractFileSystem):
    """fsspec filesystem over a Tessera cluster.

    Arguments: ``client`` (a ``tessera.Client``), or ``config`` (a cluster.toml path or node
    address, as for ``tessera.connect``) and optionally ``secret``; neither: ``TESSERA_CONFIG``.
    """

    protocol = "tessera"
    root_marker = ""
    #: Read-ahead and write piece size of files.
    DEFAULT_BLOCK_SIZE = 4 << 20

    def __init__(self, client: Client | None = None, config: str | None = None, secret: str | None = None, **kwargs: Any):
        super().__init__(**kwargs)
        if client is None:
            client = connect(config, secret=secret) if config is not None else default_client()
        self.client = client

    # Paths ---------------------------------------------------------------------------------

    @classmethod
    def _strip_protocol(cls, path):
        if isinstance(path, list):
            return [cls._strip_protocol(p) for p in path]
        path = str(path)
        if path.startswith("tessera://"):
            path = path[len("tessera://") :]
        elif path.startswith("tessera::"):
            path = path[len("tessera::") :]
        return path.strip("/")

    @staticmethod
    def _split(path: str) -> tuple[str, str]:
        bucket, _, key = path.partition("/")
        return bucket, key

    def _file_info(self, bucket: str, stat: Any) -> dict:
        return {
            "name": f"{bucket}/{stat.key}",
            "size": stat.size,
            "type": "file",
            "etag": stat.etag,
            "ETag": stat.etag,
            "content_type": stat.content_type,
            "modified_ms": stat.modified_ms,
            "version": stat.version,
        }

    # Listing and metadata ------------------------------------------------------------------

    def ls(self, path: str, detail: bool = True, **kwargs: Any):
        path = self._strip_protocol(path)
        if not path:
            entries = [{"name": b, "size": 0, "type": "directory"} for b in self.client.list_buckets()]
        else:
            bucket, key = self._split(path)
            prefix = f"{key}/" if key else ""
            try:
                entries = [
                    {"name": f"{bucket}/{e.key.rstrip('/')}", "size": 0, "type": "directory"}
                    if e.is_prefix
                    else {"name": f"{bucket}/{e.key}", "size": e.size, "type": "file", "etag": e.etag, "ETag": e.etag, "modified_ms": e.modified_ms}
                    for e in self.client.list(bucket, prefix, "/")
                ]
            except NoSuchBucket:
                raise FileNotFoundError(path) from None
            if not entries and key:
                try:
                    entries = [self._file_info(bucket, self.client.stat(bucket, key))]
                except NotFound:
                    raise FileNotFoundError(path) from None
        return entries if detail else [e["name"] for e in entries]

    def info(self, path: str, **kwargs: Any) -> dict:
        path = self._strip_protocol(path)
        if not path:
            return {"name": "", "size": 0, "type": "directory"}
        bucket, key = self._split(path)
        if not key:
            if self.client.bucket_exists(bucket):
                return {"name": bucket, "size": 0, "type": "directory"}
            raise FileNotFoundError(path)
        try:
            return self._file_info(bucket, self.client.stat(bucket, key))
        except NotFound:
            pass
        try:
            for _ in self.client.list(bucket, f"{key}/", page_size=1):
                return {"name": path, "size": 0, "type": "directory"}
        except NoSuchBucket:
            pass
        raise FileNotFoundError(path)

    def exists(self, path: str, **kwargs: Any) -> bool:
        try:
            self.info(path)
        except FileNotFoundError:
            return False
        return True

    def modified(self, path: str) -> datetime.datetime:
        ms = self.info(path).get("modified_ms", 0)
        return datetime.datetime.fromtimestamp(ms / 1000, tz=datetime.timezone.utc)

    def ukey(self, path: str) -> str:
        return self.info(path).get("etag", "")

    def checksum(self, path: str) -> int:
        return int(self.ukey(path) or "0", 16)

    # Reads and writes ----------------------------------------------------------------------

    def cat_file(self, path: str, start: int | None = None, end: int | None = None, **kwargs: Any) -> bytes:
        bucket, key = self._split(self._strip_protocol(path))
        if start is None and end is None:
            return self.client.get(bucket, key)
        if (start is not None and start < 0) or (end is not None and end < 0):
            size = self.client.stat(bucket, key).size
            start = start + size if start is not None and start < 0 else start
            end = end + size if end is not None and end < 0 else end
        start = max(start or 0, 0)
        if end is not None and end <= start:
            return b""
        try:
            return self.client.get(bucket, key, (start, end))
        except ValueError as e:
            # Reading at or past the end of the object gives no bytes, as on a local file.
            if getattr(e, "offset", None) is not None:
                return b""
            raise

    def pipe_file(self, path: str, value: bytes, mode: str = "overwrite", **kwargs: Any) -> None:
        bucket, key = self._split(self._strip_protocol(path))
        self.client.put(bucket, key, value)

    def put_file(self, lpath: str, rpath: str, callback=None, mode: str = "overwrite", **kwargs: Any) -> None:
        bucket, key = self._split(self._strip_protocol(rpath))
        with open(lpath, "rb") as source:
            self.client.put(bucket, key, source)

    def cp_file(self, path1: str, path2: str, **kwargs: Any) -> None:
        b1, k1 = self._split(self._strip_protocol(path1))
        b2, k2 = self._split(self._strip_protocol(path2))
        with self.client.open(b1, k1, "rb") as source:
            self.client.put(b2, k2, source)

    def rm_file(self, path: str) -> None:
        bucket, key = self._split(self._strip_protocol(path))
        if key:
            self.client.delete(bucket, key)
        else:
            self.client.remove_bucket(bucket)

    def _rm(self, path: str) -> None:
        self.rm_file(path)

    def rm(self, path, recursive: bool = False, maxdepth: int | None = None) -> None:
        paths = self.expand_path(path, recursive=recursive, maxdepth=maxdepth)
        # Files first, then buckets; "directories" below buckets vanish with their keys.
        for p in sorted(paths, key=lambda p: -p.count("/")):
            bucket, key = self._split(p)
            if key:
                if self.isfile(p):
                    self.client.delete(bucket, key)
            elif recursive:
                self.client.remove_bucket(bucket)

    def mkdir(self, path: str, create_parents: bool = True, **kwargs: Any) -> None:
        bucket, _ = self._split(self._strip_protocol(path))
        self.client.make_bucket(bucket)

    def makedirs(self, path: str, exist_ok: bool = False) -> None:
        self.mkdir(path)

    def rmdir(self, path: str) -> None:
        bucket, key = self._split(self._strip_protocol(path))
        if not key:
            self.client.remove_bucket(bucket)

    def _open(
        self,
        path: str,
        mode: str = "rb",
        block_size: int | None = None,
        autocommit: bool = True,
        cache_options: dict | None = None,
        **kwargs: Any,
    ) -> "TesseraFile":
        return TesseraFile(self, path, mode, block_size=block_size, autocommit=autocommit, cache_options=cache_options, **kwargs)


class TesseraFile(AbstractBufferedFile):
    """A file of a ``TesseraFileSystem``: reads fetch ranges of the version current at open;
    writes stream one PUT, committed at ``close()`` (``discard()`` drops it)."""

    def __init__(self, fs: TesseraFileSystem, path: str, mode: str = "rb", block_size=None, **kwargs: Any):
        path = fs._strip_protocol(path)
        self._bucket, self._key = fs._split(path)
        self._stat = None
        self._writer = None
        if mode == "rb":
            try:
                self._stat = fs.client.stat(self._bucket, self._key)
            except NotFound:
                raise FileNotFoundError(path) from None
            kwargs["size"] = self._stat.size
        cache_type = kwargs.pop("cache_type", "readahead")
        super().__init__(fs, path, mode, block_size=block_size or "default", cache_type=cache_type, **kwargs)
        if mode == "rb":
            self._details = fs._file_info(self._bucket, self._stat)

    def _fetch_range(self, start: int, end: int) -> bytes:
        if start >= self._stat.size or end <= start:
            return b""
        return self.fs.client._raw.read(self._stat, start, end - start)

    def _initiate_upload(self) -> None:
        self._writer = self.fs.client.open(self._bucket, self._key, "wb")

    def _upload_chunk(self, final: bool = False) -> bool:
        self.buffer.seek(0)
        data = self.buffer.getbuffer()
        if len(data):
            self._writer.write(data)
        del data
        if final and self.autocommit:
            self.commit()
        return True

    def commit(self) -> None:
        if self._writer is not None and not self._writer.closed:
            self._writer.close()

    def discard(self) -> None:
        if self._writer is not None:
            self._writer.abort()


fsspec.register_implementation("tessera", TesseraFileSystem, clobber=True)

__all__ = ["TesseraFileSystem", "TesseraFile"]
