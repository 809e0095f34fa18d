"""Exceptions of the tessera package: one class per kind of error, each also an instance of the
nearest built-in exception (a missing object is a ``FileNotFoundError``, as fsspec expects).

Every class takes the message and keyword attributes; the Rust extension raises them with the
numbers needed to act (chunks reachable and needed, unreachable nodes, ...).
"""

from __future__ import annotations


class TesseraError(Exception):
    """Base class of every tessera error."""

    def __init__(self, message: str = "", **attrs: object) -> None:
        super().__init__(message)
        self.message = message
        for name, value in attrs.items():
            setattr(self, name, value)

    def __str__(self) -> str:
        return self.message

    def __reduce__(self):
        # Picklable with its attributes (DataLoader workers send exceptions to the parent).
        attrs = {k: v for k, v in self.__dict__.items() if k != "message"}
        return (_rebuild, (type(self), self.message, attrs))


def _rebuild(cls: type, message: str, attrs: dict) -> TesseraError:
    return cls(message, **attrs)


class ConfigError(TesseraError, ValueError):
    """No usable cluster configuration (missing or invalid cluster.toml, bad node address)."""


class InvalidName(TesseraError, ValueError):
    """A bucket or key name the cluster refuses."""


class NotFound(TesseraError, FileNotFoundError):
    """No such object. Attributes: ``bucket``, ``key``."""

    bucket: str = ""
    key: str = ""


class NoSuchBucket(TesseraError, FileNotFoundError):
    """No such bucket. Attribute: ``bucket``."""

    bucket: str = ""


class BucketNotEmpty(TesseraError, OSError):
    """Removing a bucket that still holds objects. Attribute: ``bucket``."""

    bucket: str = ""


class Unavailable(TesseraError, ConnectionError):
    """Too few chunks (or drives) reachable to read or write.

    Attributes: ``available``, ``total`` and ``needed`` counts, ``missing`` (= total -
    available), ``unreachable`` (node ids), ``bucket`` and ``key``. ``chunks_missing`` and
    ``chunks_needed`` are aliases of ``missing`` and ``needed``.
    """

    available: int = 0
    total: int = 0
    needed: int = 0
    unreachable: list = []
    bucket: str = ""
    key: str = ""

    @property
    def missing(self) -> int:
        return self.total - self.available

    @property
    def chunks_missing(self) -> int:
        return self.missing

    @property
    def chunks_needed(self) -> int:
        return self.needed

    @property
    def chunks_available(self) -> int:
        return self.available


class WriteQuorum(Unavailable):
    """A PUT or delete reached fewer drives than the write quorum; nothing was committed."""


class NodeUnavailable(TesseraError, ConnectionError):
    """A node could not be reached. Attribute: ``node``."""

    node: str = ""


class Timeout(NodeUnavailable, TimeoutError):
    """A node did not answer in time. Attribute: ``node``."""


class AuthRejected(TesseraError, PermissionError):
    """A node refused the cluster secret. Attribute: ``node``."""

    node: str = ""


class DiskFull(TesseraError, OSError):
    """A node's drive is full. Attribute: ``node``."""

    node: str = ""


class GatherError(TesseraError, ValueError):
    """A gather's input is wrong: an index out of range, an output of the wrong size, a table
    that does not fit its object (checked before anything is read)."""


class RangeNotSatisfiable(TesseraError, ValueError):
    """A read starting past the end of the object. Attributes: ``offset``, ``size``."""

    offset: int = 0
    size: int = 0


class SourceError(TesseraError, OSError):
    """Reading the data of a PUT failed (or the upload was aborted)."""


__all__ = [
    "TesseraError",
    "ConfigError",
    "InvalidName",
    "NotFound",
    "NoSuchBucket",
    "BucketNotEmpty",
    "Unavailable",
    "WriteQuorum",
    "NodeUnavailable",
    "Timeout",
    "AuthRejected",
    "DiskFull",
    "RangeNotSatisfiable",
    "GatherError",
    "SourceError",
    "QueryError",
]


class QueryError(TesseraError, ValueError):
    """A query that cannot run: bad SQL, an unknown column, a type error, a table that is not
    Parquet, a query over its memory limit."""
