"""The Python client: ``tessera.connect()`` and ``Client``.

Every call that does I/O releases the GIL in the Rust extension; a ``Client`` is thread-safe,
picklable (it reconnects from its source) and usable after ``fork`` (a DataLoader worker builds
its own connections on first use).
"""

from __future__ import annotations

import io
import os
import socket
from dataclasses import dataclass
from typing import Any, BinaryIO, Iterator, Sequence

from . import _tessera
from .errors import ConfigError, NotFound

#: Pieces read from a file object by a streaming ``put``.
PUT_PIECE_BYTES = 1 << 20
# Table descriptions (a .npy header each) a client keeps for gather, at most.
TABLES_CACHED_MAX = 1024
#: Read buffer of ``Client.open(..., "rb")``: at least one stripe of a 4+2 cluster with 1 MiB
#: chunks, so sequential reads are one batched request per node per stripe.
READ_BUFFER_BYTES = 4 << 20
#: Keys per listing request.
LIST_PAGE_SIZE = 1000

ObjectInfo = _tessera.ObjectInfo


@dataclass(frozen=True)
class ListEntry:
    """One listed object, or with ``is_prefix`` a common prefix (a "directory") when listing
    with a delimiter."""

    key: str
    size: int = 0
    etag: str = ""
    modified_ms: int = 0
    is_prefix: bool = False


def parse_uri(uri: str) -> tuple[str, str]:
    """``tessera://bucket/key`` (or ``bucket/key``) -> ``(bucket, key)``."""
    path = uri[len("tessera://") :] if uri.startswith("tessera://") else uri
    bucket, _, key = path.lstrip("/").partition("/")
    if not bucket or not key:
        raise ValueError(f"expected tessera://BUCKET/KEY, got {uri!r}")
    return bucket, key


def _resolve_address(address: str) -> str:
    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit():
        raise ConfigError(f"invalid node address {address!r}: expected HOST:PORT or a cluster.toml path")
    host = host.strip("[]")
    try:
        infos = socket.getaddrinfo(host, int(port), type=socket.SOCK_STREAM)
    except socket.gaierror as e:
        raise ConfigError(f"cannot resolve node address {address!r}: {e}") from None
    family, _, _, _, sockaddr = infos[0]
    ip = sockaddr[0]
    return f"[{ip}]:{port}" if family == socket.AF_INET6 else f"{ip}:{port}"


def connect(config_path_or_node_address: str | os.PathLike | None = None, *, secret: str | None = None) -> "Client":
    """A client of the cluster described by a ``cluster.toml`` path (or the directory holding
    it), or reached through any node's ``HOST:PORT`` (the cluster secret then comes from
    ``secret`` or the ``TESSERA_CLUSTER_SECRET`` environment variable). Without an argument,
    the ``TESSERA_CONFIG`` environment variable names the config."""
    source = config_path_or_node_address
    if source is None:
        source = os.environ.get("TESSERA_CONFIG")
        if not source:
            raise ConfigError(
                "no cluster config: pass a cluster.toml path or node address to tessera.connect() "
                "or set TESSERA_CONFIG (create one with `tessera init`)"
            )
    source = os.fspath(source)
    if os.path.isdir(source):
        source = os.path.join(source, "cluster.toml")
    if os.path.exists(source) or source.endswith(".toml"):
        return Client(config=os.path.abspath(source))
    return Client(address=source, secret=secret)


class Client:
    """A client of one Tessera cluster. Build it with ``tessera.connect()``."""

    def __init__(self, *, config: str | None = None, address: str | None = None, secret: str | None = None):
        self._config = config
        self._address = address
        self._secret = secret
        # Tables gathered from, by version: a replaced object is a new version, read again.
        self._tables: dict = {}
        self._gather_cache_bytes = 0
        if address is not None:
            secret = secret if secret is not None else os.environ.get("TESSERA_CLUSTER_SECRET")
            self._raw = _tessera.RawClient(None, _resolve_address(address), secret)
        else:
            self._raw = _tessera.RawClient(config, None, None)

    def __repr__(self) -> str:
        source = self._config if self._config is not None else self._address
        return f"tessera.Client({source!r}, {self._raw.describe()})"

    def __reduce__(self):
        # Pickled clients (spawned DataLoader workers) reconnect from their source; a secret
        # taken from the environment is read again there, not pickled.
        return (_unpickle_client, (self._config, self._address, self._secret, self._gather_cache_bytes))

    # Reads ---------------------------------------------------------------------------------

    def stat(self, bucket: str, key: str) -> ObjectInfo:
        """Metadata of ``bucket/key``: ``size``, ``etag``, ``content_type``, ``user_meta``,
        ``modified_ms``, ``version``, ``k``, ``m``. Raises ``NotFound``."""
        return self._raw.head(bucket, key)

    head = stat

    def exists(self, bucket: str, key: str) -> bool:
        try:
            self._raw.head(bucket, key)
        except NotFound:
            return False
        return True

    def get(self, bucket: str, key: str, range: Any = None) -> bytes:
        """The object as bytes; ``range`` is a half-open ``(start, stop)`` byte range (``stop``
        None: to the end), a ``range`` or a ``slice`` with step 1."""
        offset, length = _byte_range(range)
        return self._raw.get(bucket, key, offset, length)

    def get_into(self, bucket: str, key: str, buffer: Any, offset: int = 0) -> int:
        """Reads the object from ``offset`` straight into ``buffer`` (bytearray, memoryview,
        numpy array, CPU torch tensor: any writable C-contiguous buffer), with no intermediate
        copy; returns the number of bytes written: the smaller of the buffer's size and the
        bytes after ``offset``."""
        return self._raw.get_into(bucket, key, _writable(buffer), offset)

    def get_many(self, keys: Sequence[tuple[str, str]], buffers: Sequence[Any] | None = None) -> list:
        """Many whole objects at once: a list of bytes in the order of ``keys``; with
        ``buffers`` (one per key) each object lands in its buffer and the list holds the byte
        counts. The first error (``NotFound``, ``Unavailable``, ...) is raised."""
        keys = [(b, k) for b, k in keys]
        if buffers is None:
            return self._raw.get_many(keys, None)
        return self._raw.get_many(keys, [_writable(b) for b in buffers])

    def open(self, bucket: str, key: str, mode: str = "rb", *, content_type: str | None = None, metadata: dict | None = None):
        """A file object: ``"rb"`` reads (seekable, buffered), ``"wb"`` streams a PUT that is
        committed by ``close()`` (use ``with``: an exception aborts the upload)."""
        if mode in ("rb", "r"):
            reader = ObjectReader(self._raw, self._raw.head(bucket, key))
            return io.BufferedReader(reader, buffer_size=READ_BUFFER_BYTES)
        if mode in ("wb", "w"):
            return ObjectWriter(self._raw.writer(bucket, key, content_type, _meta(metadata)))
        raise ValueError(f"unsupported mode {mode!r}: use 'rb' or 'wb'")

    def gather(self, bucket: str, key: str, indices: Any, out: Any = None, *, row_bytes: int | None = None,
               dtype: Any = None, device: Any = None) -> Any:
        """Rows ``indices`` of the 2-D table in ``bucket/key`` (a ``.npy`` file, or raw rows of
        ``row_bytes`` bytes of ``dtype``), row ``indices[i]`` into ``out[i]``: a NumPy array or
        a CPU torch tensor (pinned memory accepted) of shape ``(len(indices), columns)`` and the
        table's dtype, C-contiguous and writable, or a new NumPy array when ``out`` is None.
        Indices may repeat and come in any order. Returns ``out``.

        GPUs (untested: no GPU where this was built): ``out`` may be a CUDA tensor, or
        ``device="cuda"`` makes a new one; the rows then land in pinned host memory and go to
        the GPU with an asynchronous copy on the current stream (``tensor.gather_to_cuda``).

        Every index is checked before a read is sent (``GatherError``, a ``ValueError``). The rows
        come in one batched request per node per round, straight into ``out``, checksummed and
        rebuilt from parity where a chunk is missing; the GIL is released meanwhile."""
        from . import tensor

        if tensor.wants_cuda(out, device):
            return tensor.gather_to_cuda(self, bucket, key, indices, out, device, row_bytes, dtype)
        info = self._raw.head_many_cached([(bucket, key)])[0]
        table = self._table(bucket, key, info, row_bytes, dtype)
        wanted = tensor.indices_of(indices, table.rows)
        out, target = tensor.output_of(out, len(wanted), table)
        if len(wanted):
            self._raw.gather_into(info, table.data_offset, table.row_bytes, table.rows, wanted, target)
        return out

    def gather_many(self, requests: Sequence[tuple]) -> list:
        """Several gathers at once: ``requests`` of ``(bucket, key, indices)`` or ``(bucket, key,
        indices, out)`` (``.npy`` tables; the same key may come more than once), returning the
        outputs in order. One metadata round and one batched read for all of them: every node
        gets one request per round for every table's rows (a mini-batch's features and labels
        together). Everything is checked before a read is sent; the outputs must not overlap."""
        from . import tensor

        requests = [tuple(r) for r in requests]
        for r in requests:
            if len(r) not in (3, 4):
                raise TypeError(f"expected (bucket, key, indices) or (bucket, key, indices, out), got {len(r)} items")
        infos = self._raw.head_many_cached([(r[0], r[1]) for r in requests]) if requests else []
        items, outs = [], []
        for r, info in zip(requests, infos):
            table = self._table(r[0], r[1], info, None, None)
            wanted = tensor.indices_of(r[2], table.rows)
            out, target = tensor.output_of(r[3] if len(r) == 4 else None, len(wanted), table)
            outs.append(out)
            items.append((info, table.data_offset, table.row_bytes, table.rows, wanted, target))
        if any(len(item[4]) for item in items):
            self._raw.gather_many_into(items)
        return outs

    def _table(self, bucket: str, key: str, info: Any, row_bytes: int | None, dtype: Any) -> Any:
        """The table description of version ``info`` of ``bucket/key`` (its ``.npy`` header read
        once per version, or raw rows), cached."""
        from . import tensor

        cached = (bucket, key, info.version, row_bytes, str(dtype))
        table = self._tables.get(cached)
        if table is None:
            table = tensor.table_of(self._raw, info, f"{bucket}/{key}", row_bytes, dtype)
            if len(self._tables) >= TABLES_CACHED_MAX:
                self._tables.clear()
            self._tables[cached] = table
        return table

    def set_gather_cache(self, capacity_bytes: int) -> None:
        """Keeps hot rows of ``gather`` in a cache of at most ``capacity_bytes`` (0, the default,
        turns it off). S3-FIFO eviction, which suits the power-law access of graph sampling;
        rows are keyed by object version, so a replaced object's old rows are never served.
        One cache per process: each DataLoader worker fills its own (the setting is pickled
        with the client)."""
        if capacity_bytes < 0:
            raise ValueError("capacity_bytes must be 0 or more")
        self._gather_cache_bytes = int(capacity_bytes)
        self._raw.set_gather_cache(int(capacity_bytes))

    def gather_cache_stats(self) -> dict:
        """This process's gather cache: ``hits`` and ``misses`` (rows), ``rows`` and ``bytes``
        held, ``capacity_bytes``."""
        return dict(self._raw.gather_cache_stats())

    # Writes --------------------------------------------------------------------------------

    def put_tensor(self, bucket: str, key: str, array: Any) -> ObjectInfo:
        """Writes ``array`` (a 2-D NumPy array or CPU torch tensor, or a 1-D one: a value per
        row) as the ``.npy`` file ``bucket/key`` that ``gather`` reads rows of, streamed from
        the array's own memory. The header is padded so the rows start 4 KiB into the file, and
        the object gets the smallest checksum blocks its metadata can carry (4 KiB for tables up
        to about 11 GiB on a 4+2 cluster, growing past that), so a gathered row costs about its
        own bytes, not a 64 KiB block; readers that gather from it again fetch those checksums
        once per process (``head_many_cached``)."""
        from . import tensor

        np = tensor._numpy()
        if type(array).__module__.startswith("torch"):
            array = array.detach().cpu().numpy()
        array = np.ascontiguousarray(array)
        if array.ndim not in (1, 2):
            raise tensor.GatherError(f"put_tensor takes a 2-D (or 1-D) array, not one of shape {array.shape}")
        if array.dtype.hasobject:
            raise tensor.GatherError(f"put_tensor takes numbers, not {array.dtype}")
        data = memoryview(array.reshape(-1).view(np.uint8))
        pieces = [tensor.npy_header(array, align=tensor.DATA_ALIGN)]
        pieces += [data[i:i + PUT_PIECE_BYTES] for i in range(0, len(data), PUT_PIECE_BYTES)]
        return self._put_pieces(bucket, key, iter(pieces), "application/octet-stream", None,
                                block_bytes=self._raw.smallest_block_bytes(len(pieces[0]) + len(data)))

    def put(self, bucket: str, key: str, data: Any, *, content_type: str | None = None, metadata: dict | None = None,
            align: bool = True) -> ObjectInfo:
        """Writes ``data`` as ``bucket/key``: bytes or any buffer (no copy), or a binary file
        object (streamed with bounded memory). Returns the new object's ``ObjectInfo``.

        Bytes holding a Parquet file are stored in the aligned layout (each row group inside
        one chunk, at most 1% more stored bytes) so that queries read every row group on the
        node that holds it; ``align=False`` stores them plain. A file object streams plain."""
        if hasattr(data, "read") and not isinstance(data, (bytes, bytearray, memoryview)):
            return self._put_stream(bucket, key, data, content_type, metadata)
        if isinstance(data, str):
            raise TypeError("put() needs bytes or a binary file, not str (encode it first)")
        return self._raw.put(bucket, key, data, content_type, _meta(metadata), align)

    def _put_stream(self, bucket: str, key: str, source: BinaryIO, content_type, metadata) -> ObjectInfo:
        return self._put_pieces(bucket, key, _pieces_of(source), content_type, metadata)

    def _put_pieces(self, bucket: str, key: str, pieces: Iterator[Any], content_type, metadata,
                    block_bytes: int | None = None) -> ObjectInfo:
        """A streaming PUT of ``pieces`` (each written before the next is made), aborted if
        making or writing one fails; ``block_bytes`` is the object's checksum block size."""
        writer = self._raw.writer(bucket, key, content_type, _meta(metadata), block_bytes)
        try:
            for piece in pieces:
                writer.write(piece)
        except BaseException:
            writer.abort()
            raise
        return writer.close()

    def delete(self, bucket: str, key: str) -> None:
        """Deletes ``bucket/key`` (deleting a missing key succeeds)."""
        self._raw.delete(bucket, key)

    # Buckets and listings ------------------------------------------------------------------

    def make_bucket(self, bucket: str) -> None:
        """Creates ``bucket`` (no error if it exists)."""
        self._raw.make_bucket(bucket)

    def remove_bucket(self, bucket: str) -> None:
        """Removes an empty bucket; raises ``BucketNotEmpty`` or ``NoSuchBucket``."""
        self._raw.remove_bucket(bucket)

    def query(self, sql: str, *, pushdown: bool = True, memory: int = 512 << 20):
        """Runs ``sql`` and returns the result as a ``pyarrow.Table``.

        Tables are quoted paths: ``'bucket/key.parquet'`` (one Parquet object) or
        ``'bucket/prefix/'`` (every object under the prefix, one table). Filters and
        projections run on the storage nodes, next to the data; only matching rows (or, for
        ``count(*)``, only counts) come back, straight from the nodes. ``pushdown=False``
        evaluates everything here (same answer, every byte over the network). ``memory``
        bounds this process's share of the work (merging, aggregating, sorting), in bytes.
        Raises ``QueryError`` for bad SQL or data, ``Unavailable`` when too few chunks remain.
        """
        return self.query_reader(sql, pushdown=pushdown, memory=memory).read_all()

    def query_reader(self, sql: str, *, pushdown: bool = True, memory: int = 512 << 20):
        """Like :meth:`query`, streaming: a ``pyarrow.RecordBatchReader`` whose batches arrive as
        the nodes find them. Closing the reader (or dropping it) stops the query on every
        node. Works with pandas, polars and DuckDB (``duckdb.arrow(reader)``)."""
        import pyarrow.ipc

        cursor = self._raw.query(sql, pushdown, memory)
        reader = pyarrow.ipc.open_stream(_CursorStream(cursor))
        return reader

    def list_buckets(self) -> list[str]:
        return self._raw.list_buckets()

    def bucket_exists(self, bucket: str) -> bool:
        return self._raw.bucket_exists(bucket)

    def list(
        self,
        bucket: str,
        prefix: str = "",
        delimiter: str | None = None,
        *,
        start_after: str = "",
        page_size: int = LIST_PAGE_SIZE,
    ) -> Iterator[ListEntry]:
        """Iterates over the objects of ``bucket`` whose key starts with ``prefix``, sorted by
        key, fetching ``page_size`` keys per request. With a ``delimiter``, keys that contain it
        after the prefix are rolled up into one ``ListEntry(is_prefix=True)`` per common prefix."""
        cursor = start_after
        while True:
            entries, next_start_after = self._raw.list(bucket, prefix, cursor, page_size)
            skip_to = None
            for key, size, etag, modified_ms in entries:
                if skip_to is not None and key.startswith(skip_to):
                    continue
                if delimiter:
                    cut = key.find(delimiter, len(prefix))
                    if cut >= 0:
                        common = key[: cut + len(delimiter)]
                        skip_to = common
                        yield ListEntry(key=common, is_prefix=True)
                        continue
                yield ListEntry(key=key, size=size, etag=etag, modified_ms=modified_ms)
            if next_start_after is None:
                return
            cursor = next_start_after
            if skip_to is not None and cursor.startswith(skip_to):
                # Jump past every key under the rolled-up prefix (UTF-8 order = code point order).
                cursor = skip_to + "\U0010ffff"


def _pieces_of(source: BinaryIO) -> Iterator[Any]:
    """A binary file's bytes in pieces of at most PUT_PIECE_BYTES; with ``readinto``, each in the
    same buffer (the writer takes a piece before the next is read)."""
    readinto = getattr(source, "readinto", None)
    if readinto is not None:
        view = memoryview(bytearray(PUT_PIECE_BYTES))
        while n := readinto(view):
            yield view[:n]
        return
    while data := source.read(PUT_PIECE_BYTES):
        if isinstance(data, str):
            raise TypeError("put() needs a binary file, not a text file")
        yield data


def _unpickle_client(config, address, secret, gather_cache_bytes=0) -> Client:
    client = Client(config=config, address=address, secret=secret)
    if gather_cache_bytes:
        client.set_gather_cache(gather_cache_bytes)
    return client


def _meta(metadata: dict | None) -> list[tuple[str, str]]:
    return [(str(k), str(v)) for k, v in (metadata or {}).items()]


def _byte_range(r: Any) -> tuple[int, int | None]:
    if r is None:
        return 0, None
    if isinstance(r, slice):
        if r.step not in (None, 1):
            raise ValueError("a byte range has step 1")
        start, stop = r.start or 0, r.stop
    elif isinstance(r, range):
        if r.step != 1:
            raise ValueError("a byte range has step 1")
        start, stop = r.start, r.stop
    else:
        start, stop = r
        start = start or 0
    if start < 0 or (stop is not None and stop < start):
        raise ValueError(f"invalid byte range {r!r}")
    return start, (None if stop is None else stop - start)


def _writable(buffer: Any) -> Any:
    """A torch tensor as a writable byte view of its own memory (no copy); anything else as is."""
    if type(buffer).__module__.startswith("torch") and hasattr(buffer, "untyped_storage"):
        import torch

        tensor = buffer
        if tensor.device.type != "cpu":
            raise ValueError("get_into needs a CPU tensor (read into a pinned CPU tensor, then copy to the device)")
        if not tensor.is_contiguous():
            raise ValueError("get_into needs a contiguous tensor")
        flat = tensor.detach().reshape(-1)
        if flat.numel() == 0:
            return bytearray()
        return flat.view(torch.uint8).numpy()
    return buffer


class ObjectReader(io.RawIOBase):
    """A seekable raw reader over one version of an object (the one current when opened)."""

    def __init__(self, raw: Any, info: ObjectInfo):
        super().__init__()
        self._raw = raw
        self.info = info
        self._size = info.size
        self._pos = 0

    @property
    def size(self) -> int:
        return self._size

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        if whence == io.SEEK_SET:
            pos = offset
        elif whence == io.SEEK_CUR:
            pos = self._pos + offset
        elif whence == io.SEEK_END:
            pos = self._size + offset
        else:
            raise ValueError(f"invalid whence {whence}")
        if pos < 0:
            raise ValueError("negative seek position")
        self._pos = pos
        return pos

    def readinto(self, buffer: Any) -> int:
        if self.closed:
            raise ValueError("I/O operation on a closed file")
        if self._pos >= self._size:
            return 0
        n = self._raw.read_into(self.info, buffer, self._pos)
        self._pos += n
        return n

    def read(self, size: int = -1) -> bytes:
        if self.closed:
            raise ValueError("I/O operation on a closed file")
        if self._pos >= self._size:
            return b""
        length = None if size is None or size < 0 else size
        data = self._raw.read(self.info, self._pos, length)
        self._pos += len(data)
        return data

    def readall(self) -> bytes:
        return self.read(-1)


class ObjectWriter(io.BufferedIOBase):
    """A streaming PUT as a write-only file: ``close()`` commits (and sets ``info``); leaving a
    ``with`` block by an exception, ``abort()``, or garbage collection without ``close()``
    drops the upload, so a partial object is never committed."""

    def __init__(self, writer: Any):
        super().__init__()
        self._writer = writer
        self.info: ObjectInfo | None = None

    def writable(self) -> bool:
        return True

    def write(self, data: Any) -> int:
        if self._writer.closed:
            raise ValueError("I/O operation on a closed file")
        return self._writer.write(data)

    def tell(self) -> int:
        return self._writer.tell()

    def flush(self) -> None:
        # Bytes go out as soon as a piece is full; nothing is durable before close().
        pass

    def abort(self) -> None:
        self._writer.abort()

    @property
    def closed(self) -> bool:
        return self._writer.closed

    def close(self) -> None:
        if not self._writer.closed:
            self.info = self._writer.close()

    def __exit__(self, exc_type, exc, tb):
        if exc_type is not None:
            self.abort()
            return False
        self.close()
        return False

    def __del__(self):
        try:
            self._writer.abort()
        except Exception:
            pass


_default: Client | None = None


def default_client() -> Client:
    """``tessera.connect()`` made once per process and reused (``TESSERA_CONFIG``)."""
    global _default
    if _default is None:
        _default = connect()
    return _default


class _CursorStream(io.RawIOBase):
    """A query cursor's IPC pieces as a readable byte stream, for ``pyarrow.ipc.open_stream``."""

    def __init__(self, cursor: Any) -> None:
        self._cursor = cursor
        self._pending = memoryview(b"")
        self.stats = cursor.stats

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        while not self._pending:
            piece = self._cursor.next()
            if piece is None:
                return 0
            self._pending = memoryview(piece)
        n = min(len(buffer), len(self._pending))
        buffer[:n] = self._pending[:n]
        self._pending = self._pending[n:]
        return n

    def close(self) -> None:
        self._cursor.close()
        super().close()
