"""What S3 promises, computed client-side: ETags, error codes, test data."""

from __future__ import annotations

import contextlib
import hashlib
import random
import re
import uuid

import pytest
from botocore.exceptions import ClientError

KIB = 1024
MIB = 1024 * 1024


def unique_bucket_name(test_name: str) -> str:
    """A valid bucket name (3-63 of [a-z0-9-]) derived from the test's name, unique per call."""
    stem = re.sub(r"[^a-z0-9]+", "-", test_name.lower().removeprefix("test_")).strip("-")[:44].strip("-")
    return f"e2e-{stem}-{uuid.uuid4().hex[:8]}"


def data(size: int, seed: int = 0) -> bytes:
    """`size` reproducible pseudo-random bytes (incompressible, different per seed)."""
    return random.Random(seed).randbytes(size)


def etag(body: bytes) -> str:
    """ETag of a single-part upload: the quoted hex MD5."""
    return f'"{hashlib.md5(body).hexdigest()}"'


def multipart_etag(parts: list[bytes]) -> str:
    """ETag of a completed multipart upload: MD5 of the concatenated binary part MD5s, then -N."""
    digests = b"".join(hashlib.md5(p).digest() for p in parts)
    return f'"{hashlib.md5(digests).hexdigest()}-{len(parts)}"'


def split(body: bytes, part_size: int) -> list[bytes]:
    return [body[i:i + part_size] for i in range(0, len(body), part_size)] or [b""]


def sha(body: bytes) -> str:
    """Short digest for comparing large bodies without megabytes in assertion messages."""
    return hashlib.sha256(body).hexdigest()[:16]


@contextlib.contextmanager
def s3_error(code: str, status: int | None = None):
    """Asserts that the body raises a ClientError with S3 error `code` (and HTTP `status`)."""
    with pytest.raises(ClientError) as info:
        yield info
    err = info.value.response.get("Error", {})
    got_status = info.value.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
    assert err.get("Code") == code, f"expected {code} ({status}), got {err.get('Code')} ({got_status}): {err}"
    if status is not None:
        assert got_status == status, f"{code}: expected HTTP {status}, got {got_status}"
