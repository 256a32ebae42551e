"""Checkpoint formats: ``raw`` (our direct writer) and ``torch`` (``torch.save``, the reference).

Both split a save into the same stages: ``stage`` (copy the state off the device into host
memory that will not change while it is written), then ``write_file``. ``raw`` lays the
state out exactly as the file will be — a header, then every tensor's bytes at aligned
offsets — in a reused page-aligned buffer, so writing is one O_DIRECT stream and loading
is one read plus zero-copy views.

The raw file layout::

    b"CKPTRAW1" | u64 header length | header JSON | zero padding to 4 KiB
    tensor bytes at 64-byte aligned offsets      | zero padding to 4 KiB

The header holds each tensor's dtype, shape and offset, and the state's non-tensor
structure as JSON (no pickle: loading a checkpoint never runs code).
"""

from __future__ import annotations

import io
import json
import struct
from dataclasses import dataclass
from typing import Any

import torch

from trainer.ckpt.io import ALIGN, AlignedBuffer, align_up
from trainer.errors import CheckpointCorruptError

MAGIC = b"CKPTRAW1"
_PREFIX = struct.Struct("<8sQ")
TENSOR_ALIGN = 64

# Every dtype whose tensors torch can copy into and view out of a byte buffer. Sub-byte
# (int1-7, uint1-7) and quantized dtypes cannot be copied; stage() refuses them, so nothing
# is ever written that load() cannot read. getattr: older torch builds lack the newest ones.
_DTYPES = {name: getattr(torch, name) for name in (
    "float64", "float32", "float16", "bfloat16", "int64", "int32", "int16", "int8",
    "uint64", "uint32", "uint16", "uint8", "bool", "complex128", "complex64", "complex32",
    "float8_e4m3fn", "float8_e4m3fnuz", "float8_e5m2", "float8_e5m2fnuz", "float8_e8m0fnu",
    "float4_e2m1fn_x2", "bits8", "bits16", "bits1x8", "bits2x4", "bits4x2",
) if isinstance(getattr(torch, name, None), torch.dtype)}  # fmt: skip


def flatten(obj: Any, tensors: list[torch.Tensor]) -> Any:
    """Replace every tensor in ``obj`` by ``{"@t": index}``; keep the rest as JSON values.

    Dicts with non-string keys (optimizer state is keyed by int) and tuples are tagged so
    they come back as they were.
    """
    if isinstance(obj, torch.Tensor):
        tensors.append(obj)
        return {"@t": len(tensors) - 1}
    if isinstance(obj, dict):
        if all(isinstance(k, str) and not k.startswith("@") for k in obj):
            return {k: flatten(v, tensors) for k, v in obj.items()}
        return {"@dict": [[flatten(k, tensors), flatten(v, tensors)] for k, v in obj.items()]}
    if isinstance(obj, tuple):
        return {"@tuple": [flatten(v, tensors) for v in obj]}
    if isinstance(obj, list):
        return [flatten(v, tensors) for v in obj]
    if obj is None or isinstance(obj, bool | int | float | str):
        return obj
    raise TypeError(f"cannot checkpoint a {type(obj).__name__} (only tensors and JSON values)")


def unflatten(obj: Any, tensors: list[torch.Tensor]) -> Any:
    """Inverse of :func:`flatten`."""
    if isinstance(obj, dict):
        if "@t" in obj:
            return tensors[obj["@t"]]
        if "@dict" in obj:
            return {unflatten(k, tensors): unflatten(v, tensors) for k, v in obj["@dict"]}
        if "@tuple" in obj:
            return tuple(unflatten(v, tensors) for v in obj["@tuple"])
        return {k: unflatten(v, tensors) for k, v in obj.items()}
    if isinstance(obj, list):
        return [unflatten(v, tensors) for v in obj]
    return obj


@dataclass
class Staged:
    """A checkpoint copied into host memory, ready to write: ``data`` is the whole file."""

    data: memoryview
    nbytes: int
    direct_ok: bool


class RawFormat:
    """Our writer: tensors copied into one reused, page-aligned (pinned on CUDA) buffer."""

    name = "raw"
    filename = "state.ckpt"

    def __init__(self, pin: bool = False) -> None:
        self.buffer = AlignedBuffer(pin=pin)
        self._layout: tuple[int, list] | None = None

    def stage(self, state: Any) -> Staged:
        tensors: list[torch.Tensor] = []
        skeleton = flatten(state, tensors)
        entries, offset = [], 0
        for t in tensors:
            dtype_name = str(t.dtype).removeprefix("torch.")
            if dtype_name not in _DTYPES:
                raise TypeError(f"cannot checkpoint a tensor of dtype {t.dtype} in the raw format")
            nbytes = t.numel() * t.element_size()
            entries.append([dtype_name, list(t.shape), offset, nbytes])
            offset = align_up(offset + nbytes, TENSOR_ALIGN)
        data_bytes = offset
        header = json.dumps(
            {"format": "raw/1", "tensors": entries, "data_bytes": data_bytes, "state": skeleton},
            separators=(",", ":"),
        ).encode()
        head_area = align_up(_PREFIX.size + len(header))
        total = head_area + align_up(data_bytes)
        self.buffer.ensure(total)
        buf = self.buffer.tensor
        # Zero what tensor bytes do not overwrite (header area, gaps, tail), so equal states
        # give equal files; the gaps stay zero while the layout does not change.
        if self._layout != (head_area, entries):
            buf[:total].zero_()
            self._layout = (head_area, entries)
        else:
            buf[:head_area].zero_()
        buf[: _PREFIX.size].copy_(
            torch.frombuffer(bytearray(_PREFIX.pack(MAGIC, len(header))), dtype=torch.uint8)
        )
        buf[_PREFIX.size : _PREFIX.size + len(header)].copy_(
            torch.frombuffer(bytearray(header), dtype=torch.uint8)
        )
        non_blocking = False
        # One thread: these copies are memory-bound, and torch's intra-op pool only adds
        # contention (measured 2-3x slower with 2 threads on a 2-core VM).
        threads = torch.get_num_threads()
        torch.set_num_threads(1)
        try:
            for t, (_, _, off, nbytes) in zip(tensors, entries, strict=True):
                if nbytes == 0:
                    continue
                start = head_area + off
                dst = buf[start : start + nbytes].view(t.dtype).view(t.shape)
                non_blocking |= t.device.type == "cuda"
                dst.copy_(t.detach(), non_blocking=t.device.type == "cuda")
        finally:
            torch.set_num_threads(threads)
        if non_blocking:
            torch.cuda.synchronize()
        return Staged(data=self.buffer.view(total), nbytes=total, direct_ok=True)

    def load(self, data: memoryview) -> Any:
        """Build the state from a verified file image; tensors are views into ``data``."""
        if len(data) < _PREFIX.size:
            raise CheckpointCorruptError("raw checkpoint is shorter than its header")
        magic, header_len = _PREFIX.unpack_from(data, 0)
        if magic != MAGIC:
            raise CheckpointCorruptError(f"not a raw checkpoint (magic {magic!r})")
        try:
            return self._build(data, header_len)
        except (ValueError, KeyError, TypeError, IndexError, RuntimeError) as exc:
            raise CheckpointCorruptError(f"raw checkpoint header is invalid: {exc}") from exc

    def _build(self, data: memoryview, header_len: int) -> Any:
        header = json.loads(bytes(data[_PREFIX.size : _PREFIX.size + header_len]))
        head_area = align_up(_PREFIX.size + header_len)
        whole = torch.frombuffer(data, dtype=torch.uint8) if len(data) else None
        tensors = []
        for dtype_name, shape, off, nbytes in header["tensors"]:
            dtype = _DTYPES.get(dtype_name)
            if dtype is None:
                raise CheckpointCorruptError(f"unknown dtype {dtype_name!r} in checkpoint")
            if nbytes == 0:
                tensors.append(torch.empty(shape, dtype=dtype))
                continue
            start = head_area + off
            tensors.append(whole[start : start + nbytes].view(dtype).view(shape))
        return unflatten(header["state"], tensors)


class TorchFormat:
    """The reference: ``torch.save`` serialized into memory, then written buffered."""

    name = "torch"
    filename = "state.pt"

    def stage(self, state: Any) -> Staged:
        out = io.BytesIO()
        torch.save(state, out)
        data = out.getbuffer()
        return Staged(data=data, nbytes=len(data), direct_ok=False)

    def load(self, data: memoryview) -> Any:
        try:
            return torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)
        except Exception as exc:  # noqa: BLE001 - torch raises many types for bad bytes
            raise CheckpointCorruptError(f"torch.load failed: {exc}") from exc


def make_format(name: str, pin: bool = False) -> RawFormat | TorchFormat:
    if name == "raw":
        return RawFormat(pin=pin)
    if name == "torch":
        return TorchFormat()
    raise ValueError(f"unknown checkpoint format {name!r}")


__all__ = ["ALIGN", "RawFormat", "Staged", "TorchFormat", "flatten", "make_format", "unflatten"]
