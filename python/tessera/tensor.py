"""Tensor objects: 2-D feature tables (and 1-D ones: labels, one value per row) stored as
``.npy`` files (or raw row-major bytes), read by row with ``Client.gather`` straight into a NumPy array or a CPU torch tensor.

Every check on the input (indices, output, the object's header) runs before a read is sent;
the rows then come in one batched request per node per round, checksummed, rebuilt from
parity when a chunk is missing or corrupt, with the GIL released.
"""

from __future__ import annotations

import io
from dataclasses import dataclass
from typing import Any

from .errors import GatherError

# The first read of a `.npy` object: its header almost always fits (NumPy pads it to 64 bytes).
_HEAD_BYTES = 4096
# A header larger than this is not a feature table's.
_HEADER_BYTES_MAX = 1 << 20


@dataclass(frozen=True)
class Table:
    """Where a table's rows lie in its object, and what they hold."""

    data_offset: int
    row_bytes: int
    rows: int
    dtype: Any  # numpy.dtype
    columns: int
    # A 1-D array (one value per row): gathers give 1-D outputs.
    vector: bool = False

    def shape_of(self, count: int) -> tuple:
        """The shape of ``count`` gathered rows."""
        return (count,) if self.vector else (count, self.columns)


def _numpy():
    try:
        import numpy
    except ImportError as e:  # pragma: no cover - numpy is in every test environment
        raise ImportError("gather and put_tensor need numpy: pip install numpy") from e
    return numpy


def table_of(raw: Any, info: Any, name: str, row_bytes: int | None, dtype: Any) -> Table:
    """The table in object ``info``: a ``.npy`` file's (dtype and shape from its header), or,
    with ``row_bytes``, raw rows of that many bytes of ``dtype`` (default uint8)."""
    np = _numpy()
    size = info.size
    if row_bytes is not None:
        dt = np.dtype(dtype if dtype is not None else np.uint8)
        if row_bytes <= 0 or row_bytes % dt.itemsize:
            raise GatherError(f"row_bytes={row_bytes} is not a positive multiple of {dt}'s {dt.itemsize} bytes")
        if size % row_bytes:
            raise GatherError(f"{name} has {size} bytes, not a whole number of {row_bytes}-byte rows")
        return Table(0, row_bytes, size // row_bytes, dt, row_bytes // dt.itemsize)
    head = raw.read(info, 0, min(size, _HEAD_BYTES))
    if head[:6] != b"\x93NUMPY" or len(head) < 10:
        raise GatherError(f"{name} is not a .npy file (give row_bytes= to read raw rows)")
    major = head[6]
    length_bytes = 2 if major == 1 else 4
    header_len = int.from_bytes(head[8:8 + length_bytes], "little")
    data_offset = 8 + length_bytes + header_len
    if data_offset > _HEADER_BYTES_MAX or data_offset > size:
        raise GatherError(f"{name}: a .npy header of {header_len} bytes does not fit")
    if data_offset > len(head):
        head = raw.read(info, 0, data_offset)
    stream = io.BytesIO(head)
    try:
        version = np.lib.format.read_magic(stream)
        if version == (1, 0):
            shape, fortran, dt = np.lib.format.read_array_header_1_0(stream, max_header_size=_HEADER_BYTES_MAX)
        elif version == (2, 0):
            shape, fortran, dt = np.lib.format.read_array_header_2_0(stream, max_header_size=_HEADER_BYTES_MAX)
        else:
            raise GatherError(f"{name}: .npy format version {version} is not read here (1.0 and 2.0 are)")
    except ValueError as e:
        raise GatherError(f"{name}: not a valid .npy header: {e}") from None
    if dt.hasobject:
        raise GatherError(f"{name} holds Python objects ({dt}), not numbers")
    if dtype is not None and np.dtype(dtype) != dt:
        raise GatherError(f"{name} holds {dt}, not {np.dtype(dtype)} (dtype= is for raw rows, with row_bytes=)")
    if fortran and len(shape) > 1:
        raise GatherError(f"{name} is in Fortran order: its rows are not contiguous")
    if len(shape) not in (1, 2):
        raise GatherError(f"{name} has shape {shape}: a feature table is 2-D (or 1-D, a value per row)")
    rows, columns = (shape[0], 1) if len(shape) == 1 else shape
    row_bytes = columns * dt.itemsize
    if stream.tell() + rows * row_bytes != size:
        raise GatherError(
            f"{name} has {size} bytes but its header says {shape} {dt} from byte {stream.tell()} "
            f"({stream.tell() + rows * row_bytes} bytes): truncated or not what its header says"
        )
    if row_bytes == 0:
        raise GatherError(f"{name} has rows of 0 bytes")
    return Table(stream.tell(), row_bytes, rows, dt, columns, vector=len(shape) == 1)


def indices_of(indices: Any, rows: int) -> Any:
    """``indices`` (a sequence, a NumPy array or a CPU torch tensor of integers) as a contiguous
    int64 array, each checked to be a row of the table."""
    np = _numpy()
    if type(indices).__module__.startswith("torch"):
        if indices.device.type != "cpu":
            raise GatherError("indices must be on the CPU")
        indices = indices.detach().numpy()
    array = np.asarray(indices)
    if array.size == 0:
        return np.zeros(0, np.int64)
    if array.dtype.kind not in "iu":
        raise GatherError(f"indices must be integers, not {array.dtype}")
    if array.ndim != 1:
        raise GatherError(f"indices must be one-dimensional, not of shape {array.shape}")
    low, high = int(array.min()), int(array.max())
    if low < 0:
        raise GatherError(f"index {low} is negative: rows are numbered from 0")
    if high >= rows:
        raise GatherError(f"index {high} is out of range: the table has {rows} rows")
    return np.ascontiguousarray(array, dtype=np.int64)


def output_of(out: Any, count: int, table: Table) -> tuple[Any, Any]:
    """The array the rows go to (``out``, or a new one) and a writable byte view of it."""
    np = _numpy()
    shape = table.shape_of(count)
    if out is None:
        out = np.empty(shape, table.dtype)
        return out, out.reshape(-1).view(np.uint8)
    if type(out).__module__.startswith("torch"):
        import torch

        if out.device.type != "cpu":
            raise GatherError("out must be a CPU tensor (pinned memory is fine); copy it to the GPU after")
        if not out.is_contiguous():
            raise GatherError("out must be contiguous")
        dt = torch.empty(0, dtype=out.dtype).numpy().dtype
        if tuple(out.shape) != shape or dt != table.dtype:
            raise GatherError(f"out is {tuple(out.shape)} {dt}; the rows need {shape} {table.dtype}")
        flat = out.detach().reshape(-1)
        return out, (flat.view(torch.uint8).numpy() if flat.numel() else bytearray())
    if not isinstance(out, np.ndarray):
        raise GatherError(f"out must be a NumPy array or a torch tensor, not {type(out).__name__}")
    if out.shape != shape or out.dtype != table.dtype:
        raise GatherError(f"out is {out.shape} {out.dtype}; the rows need {shape} {table.dtype}")
    if not out.flags.c_contiguous:
        raise GatherError("out must be C-contiguous")
    if not out.flags.writeable:
        raise GatherError("out is read-only")
    return out, out.reshape(-1).view(np.uint8)


#: Where ``put_tensor`` starts a table's rows in its file (the header padded with spaces, as
#: the format allows): 4 KiB rows then each lie in one 4 KiB checksum block.
DATA_ALIGN = 4096
def npy_header(array: Any, align: int = 64) -> bytes:
    """The ``.npy`` header NumPy writes for ``array`` (format 1.0, or 2.0 when it must), padded
    with spaces so the data starts at a multiple of ``align`` bytes (NumPy's own is 64)."""
    np = _numpy()
    stream = io.BytesIO()
    header = np.lib.format.header_data_from_array_1_0(array)
    try:
        np.lib.format.write_array_header_1_0(stream, header)
    except ValueError:
        stream = io.BytesIO()
        np.lib.format.write_array_header_2_0(stream, header)
    written = stream.getvalue()
    length_bytes = 2 if written[6] == 1 else 4
    prefix = 8 + length_bytes
    pad = -len(written) % align
    if pad == 0 or (length_bytes == 2 and len(written) - prefix + pad > 0xFFFF):
        return written
    # The header text ends with a newline; spaces before it are part of the format.
    text = written[prefix:-1] + b" " * pad + b"\n"
    return written[:8] + len(text).to_bytes(length_bytes, "little") + text


def wants_cuda(out: Any, device: Any) -> bool:
    """Whether a gather goes to GPU memory: ``out`` is a CUDA tensor, or ``device`` names one."""
    if device is not None:
        return str(device).startswith("cuda")
    return type(out).__module__.startswith("torch") and out.device.type == "cuda"


def gather_to_cuda(client: Any, bucket: str, key: str, indices: Any, out: Any, device: Any,
                   row_bytes: int | None, dtype: Any) -> Any:
    """A gather into GPU memory: the rows land in a pinned host tensor (the smart client writes
    only host memory), then one asynchronous copy on the current CUDA stream moves them to
    ``out`` (or a new tensor on ``device``). PyTorch's pinned-memory allocator keeps the staging
    tensor until the copy has run. Not tested here (no GPU on the machines this was built on);
    without CUDA it fails with a ``GatherError`` before any read."""
    import torch

    if not torch.cuda.is_available():
        raise GatherError("a CUDA output needs a GPU, and torch sees none (torch.cuda.is_available() is False)")
    wanted_device = torch.device(device) if device is not None else None
    if out is not None and wanted_device is not None and (
            wanted_device.type != out.device.type
            or (wanted_device.index is not None and wanted_device.index != out.device.index)):
        raise GatherError(f"out is on {out.device}, not {device}")
    info = client._raw.head_many_cached([(bucket, key)])[0]
    table = client._table(bucket, key, info, row_bytes, dtype)
    wanted = indices_of(indices, table.rows)
    shape = table.shape_of(len(wanted))
    torch_dtype = torch.from_numpy(_numpy().empty(0, table.dtype)).dtype
    if out is None:
        out = torch.empty(shape, dtype=torch_dtype, device=device)
    elif tuple(out.shape) != shape or out.dtype != torch_dtype or not out.is_contiguous():
        raise GatherError(f"out is {tuple(out.shape)} {out.dtype}; the rows need {shape} {torch_dtype}, contiguous")
    staging = torch.empty(shape, dtype=torch_dtype, pin_memory=True)
    if len(wanted):
        client._raw.gather_into(info, table.data_offset, table.row_bytes, table.rows, wanted,
                                staging.reshape(-1).view(torch.uint8).numpy())
    out.copy_(staging, non_blocking=True)
    return out
