"""PyTorch integration: datasets over a bucket prefix, and checkpoints.

- ``MapDataset(source, bucket, prefix="", transform=None)``: ``len``, random access, and
  ``__getitems__`` so a DataLoader fetches a whole batch with one ``get_many`` (one batched
  request per node). An item is ``(key, data)`` with ``data`` a ``bytes`` object, or whatever
  ``transform(key, data)`` returns.
- ``IterableDataset(source, bucket, prefix="", transform=None, shuffle=False, seed=0)``: shards
  the keys across torch.distributed ranks and DataLoader workers (no key lost or repeated),
  reshuffles every epoch from ``seed`` and the epoch (``set_epoch``, as with
  ``DistributedSampler``), and fetches ``batch_size`` objects per ``get_many``.
- ``save(obj, "tessera://bucket/key")`` / ``load(uri)``: ``torch.save`` / ``torch.load``
  streamed to and from the cluster, no temporary file.
- ``StorageWriter(uri)`` / ``StorageReader(uri)``: a ``torch.distributed.checkpoint`` storage
  pair (``dcp.save(state_dict, storage_writer=StorageWriter("tessera://bkt/ckpt"))``).

``source`` is a ``tessera.Client``, or a config path / node address for ``tessera.connect``
(None: ``TESSERA_CONFIG``). Datasets pickle their client's source, so they work with both fork
and spawn DataLoader workers; each worker opens its own connections.
"""

from __future__ import annotations

import io
import os
import random
from contextlib import contextmanager
from typing import Any, Callable, Iterator, Sequence

import torch
import torch.utils.data
from torch.distributed.checkpoint.filesystem import FileSystemBase, FileSystemReader, FileSystemWriter

from .client import Client, connect, default_client, parse_uri
from .errors import NotFound

#: Objects fetched per ``get_many`` by ``IterableDataset``.
ITERABLE_BATCH_OBJECTS = 32


def _client(source: Client | str | os.PathLike | None) -> Client:
    if isinstance(source, Client):
        return source
    if source is None:
        return default_client()
    return connect(source)


def _list_keys(client: Client, bucket: str, prefix: str) -> list[str]:
    return [e.key for e in client.list(bucket, prefix)]


class MapDataset(torch.utils.data.Dataset):
    """Map-style dataset over the objects of ``bucket`` under ``prefix`` (listed once, sorted).
    ``keys`` replaces the listing with an explicit key list."""

    def __init__(
        self,
        source: Client | str | None,
        bucket: str,
        prefix: str = "",
        transform: Callable[[str, bytes], Any] | None = None,
        *,
        keys: Sequence[str] | None = None,
    ):
        self.client = _client(source)
        self.bucket = bucket
        self.prefix = prefix
        self.transform = transform
        self.keys = list(keys) if keys is not None else _list_keys(self.client, bucket, prefix)

    def __len__(self) -> int:
        return len(self.keys)

    def _item(self, key: str, data: bytes) -> Any:
        return self.transform(key, data) if self.transform is not None else (key, data)

    def __getitem__(self, index: int) -> Any:
        key = self.keys[index]
        return self._item(key, self.client.get(self.bucket, key))

    def __getitems__(self, indices: Sequence[int]) -> list:
        keys = [self.keys[i] for i in indices]
        blobs = self.client.get_many([(self.bucket, k) for k in keys])
        return [self._item(k, d) for k, d in zip(keys, blobs)]


def _shard() -> tuple[int, int]:
    """(this shard's index, shard count) over torch.distributed ranks x DataLoader workers."""
    rank, world_size = 0, 1
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        rank, world_size = torch.distributed.get_rank(), torch.distributed.get_world_size()
    worker = torch.utils.data.get_worker_info()
    worker_id, workers = (worker.id, worker.num_workers) if worker is not None else (0, 1)
    return rank * workers + worker_id, world_size * workers


class IterableDataset(torch.utils.data.IterableDataset):
    """Iterable dataset over the objects of ``bucket`` under ``prefix``.

    Each (rank, worker) pair gets a disjoint slice of the key list: key ``i`` of the (shuffled)
    list goes to shard ``i mod (world_size x num_workers)``. ``rank`` and ``world_size`` default
    to torch.distributed's when it is initialised. With ``shuffle``, the order is a permutation
    seeded by ``seed + epoch``: the same on every rank, different every epoch. Call
    ``set_epoch(epoch)`` before each epoch (as with ``DistributedSampler``); without it, the
    epoch advances by one per ``iter()`` in the process that iterates.
    """

    def __init__(
        self,
        source: Client | str | None,
        bucket: str,
        prefix: str = "",
        transform: Callable[[str, bytes], Any] | None = None,
        *,
        shuffle: bool = False,
        seed: int = 0,
        rank: int | None = None,
        world_size: int | None = None,
        batch_objects: int = ITERABLE_BATCH_OBJECTS,
        keys: Sequence[str] | None = None,
    ):
        if (rank is None) != (world_size is None):
            raise ValueError("pass both rank and world_size, or neither")
        if world_size is not None and not 0 <= rank < world_size:
            raise ValueError(f"rank {rank} is not in [0, {world_size})")
        self.client = _client(source)
        self.bucket = bucket
        self.prefix = prefix
        self.transform = transform
        self.shuffle = shuffle
        self.seed = seed
        self.rank = rank
        self.world_size = world_size
        self.batch_objects = max(1, batch_objects)
        self.epoch = 0
        self._epoch_set = False
        self._keys = list(keys) if keys is not None else None

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch
        self._epoch_set = True

    @property
    def keys(self) -> list[str]:
        if self._keys is None:
            self._keys = _list_keys(self.client, self.bucket, self.prefix)
        return self._keys

    def _shard(self) -> tuple[int, int]:
        if self.rank is None:
            return _shard()
        worker = torch.utils.data.get_worker_info()
        worker_id, workers = (worker.id, worker.num_workers) if worker is not None else (0, 1)
        return self.rank * workers + worker_id, self.world_size * workers

    def shard_keys(self) -> list[str]:
        """The keys this process (rank and worker) reads this epoch, in order."""
        keys = list(self.keys)
        if self.shuffle:
            random.Random(self.seed + self.epoch).shuffle(keys)
        index, count = self._shard()
        return keys[index::count]

    def __iter__(self) -> Iterator[Any]:
        keys = self.shard_keys()
        if not self._epoch_set:
            self.epoch += 1
        for start in range(0, len(keys), self.batch_objects):
            batch = keys[start : start + self.batch_objects]
            blobs = self.client.get_many([(self.bucket, k) for k in batch])
            for key, data in zip(batch, blobs):
                yield self.transform(key, data) if self.transform is not None else (key, data)


# torch.save / torch.load --------------------------------------------------------------------


def save(obj: Any, uri: str, client: Client | None = None, **kwargs: Any) -> None:
    """``torch.save(obj)`` streamed to ``tessera://bucket/key`` (no temporary file); the
    object appears only once the whole checkpoint is written."""
    bucket, key = parse_uri(uri)
    client = client or default_client()
    with client.open(bucket, key, "wb") as f:
        torch.save(obj, f, **kwargs)


def load(uri: str, client: Client | None = None, **kwargs: Any) -> Any:
    """``torch.load`` streamed from ``tessera://bucket/key``; keyword arguments go to
    ``torch.load`` (``map_location``, ``weights_only``, ...)."""
    bucket, key = parse_uri(uri)
    client = client or default_client()
    with client.open(bucket, key, "rb") as f:
        return torch.load(f, **kwargs)


# torch.distributed.checkpoint ---------------------------------------------------------------


class _CheckpointFileSystem(FileSystemBase):
    """DCP's file operations on ``tessera://bucket/prefix`` paths, through one client."""

    def __init__(self, client: Client | None):
        self._client = client

    @property
    def client(self) -> Client:
        if self._client is None:
            self._client = default_client()
        return self._client

    @contextmanager
    def create_stream(self, path, mode: str):
        bucket, key = parse_uri(os.fspath(path))
        if "r" in mode:
            with self.client.open(bucket, key, "rb") as stream:
                yield stream
        else:
            with self.client.open(bucket, key, "wb") as stream:
                yield stream

    def concat_path(self, path, suffix: str) -> str:
        return f"{os.fspath(path).rstrip('/')}/{suffix}"

    def init_path(self, path, **kwargs: Any) -> str:
        path = os.fspath(path)
        parse_uri(path)  # checks the form
        return path

    def rename(self, path, new_path) -> None:
        b1, k1 = parse_uri(os.fspath(path))
        b2, k2 = parse_uri(os.fspath(new_path))
        with self.client.open(b1, k1, "rb") as source:
            self.client.put(b2, k2, source)
        self.client.delete(b1, k1)

    def mkdir(self, path) -> None:
        bucket, _ = parse_uri(os.fspath(path))
        self.client.make_bucket(bucket)

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id) -> bool:
        return isinstance(checkpoint_id, str) and checkpoint_id.startswith("tessera://")

    def exists(self, path) -> bool:
        bucket, key = parse_uri(os.fspath(path))
        return self.client.exists(bucket, key)

    def rm_file(self, path) -> None:
        bucket, key = parse_uri(os.fspath(path))
        self.client.delete(bucket, key)

    def ls(self, path) -> list[str]:
        path = os.fspath(path).rstrip("/")
        bucket, key = parse_uri(path)
        return [f"tessera://{bucket}/{e.key}" for e in self.client.list(bucket, key + "/", "/")]


class StorageWriter(FileSystemWriter):
    """A ``torch.distributed.checkpoint`` StorageWriter into ``tessera://bucket/prefix``: one
    object per rank (or per tensor with ``single_file_per_rank=False``) plus ``.metadata``."""

    def __init__(self, uri: str, client: Client | None = None, *, single_file_per_rank: bool = True, thread_count: int = 1, overwrite: bool = True, **kwargs: Any):
        super().__init__(
            path=uri,
            single_file_per_rank=single_file_per_rank,
            sync_files=False,  # a PUT is durable once acknowledged; there is no fsync to ask for
            thread_count=thread_count,
            overwrite=overwrite,
            **kwargs,
        )
        self.fs = _CheckpointFileSystem(client)
        self.path = self.fs.init_path(uri)

    def reset(self, checkpoint_id=None) -> None:
        super().reset(checkpoint_id)

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id) -> bool:
        return _CheckpointFileSystem.validate_checkpoint_id(checkpoint_id)


class StorageReader(FileSystemReader):
    """A ``torch.distributed.checkpoint`` StorageReader from ``tessera://bucket/prefix``."""

    def __init__(self, uri: str, client: Client | None = None):
        super().__init__(uri)
        self.fs = _CheckpointFileSystem(client)
        self.path = self.fs.init_path(uri)

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id) -> bool:
        return _CheckpointFileSystem.validate_checkpoint_id(checkpoint_id)


__all__ = ["MapDataset", "IterableDataset", "save", "load", "StorageWriter", "StorageReader"]
