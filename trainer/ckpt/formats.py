"""Checkpoint formats, each behind one interface: ``begin(state, directory, fs, options,
name)`` copies what must be copied while training waits and returns an :class:`InFlight`
whose ``finish()`` completes the files (on a background thread in async mode). ``name`` is
the file a process writes: the format's own for one process, a rank's shard file for
many (:class:`trainer.ckpt.checkpointer.Checkpointer` decides, for every format alike).

- ``raw`` (ours): the state laid out exactly as the file will be — a header, then every
  tensor's bytes at aligned offsets — in a reused page-aligned (pinned on CUDA) buffer,
  written with O_DIRECT by :class:`~trainer.ckpt.io.ChunkWriter`. With ``overlap`` (the
  default) chunk k is written while chunk k+1 is still being copied; loading is one read
  plus zero-copy views.
- ``torch``: ``torch.save`` into memory, then written by the same writer (the reference).
- ``safetensors``: the library's own ``save_file`` (one file per stream), then fsync.
- ``dcp``: ``torch.distributed.checkpoint`` with its ``FileSystemWriter`` (``thread_count``
  = streams), ``async_save`` in async mode; one process alone (``no_dist``), or under
  torchrun every rank together on the checkpoint group (DCP's own sharded save).

The first two produce one byte image that our writer stripes over the stream files and
checksums as it writes. The library formats write their own files; their checksums come
from reading the files back once written (timed apart, as ``checksum_s``).

The raw file layout::

    b"CKPTRAW1" | u64 header length | header JSON | zero padding to 4 KiB
    tensor bytes at 64-byte aligned offsets      | zero padding to 4 KiB

The header holds each tensor's dtype, shape and offset, and the state's non-tensor
structure as JSON (no pickle: loading a checkpoint never runs code). The library formats
store the same JSON structure as a uint8 tensor next to the flat tensors.
"""

from __future__ import annotations

import io
import json
import struct
import time
import warnings
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import torch

from trainer.ckpt import checksum as checksums
from trainer.ckpt.fs import LocalFS
from trainer.ckpt.io import (
    ALIGN,
    BACKGROUND_NICE,
    CHUNK_BYTES,
    IO_BUFFERED,
    IO_THREADS,
    AlignedBuffer,
    ChunkWriter,
    WrittenFile,
    align_up,
    stream_names,
)
from trainer.ckpt.store import LAYOUT_FILES, LAYOUT_STRIPED
from trainer.errors import CheckpointCorruptError, RankFailedError

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
class WriteOptions:
    """How a checkpoint is written.

    Attributes:
        durable: fsync files and directories (library formats that fsync themselves).
        overlap: raw: write chunk k while chunk k+1 is copied; off: stage, then write.
        io_streams: Files the state is spread over, written in parallel (raw and torch:
            chunks striped round-robin; safetensors: shards; dcp: ``thread_count``).
        checksum: The manifest's checksum algorithm.
        background: The write is finished on a background thread (async mode).
        chunk_bytes: Chunk size of the striped formats (checksum and stripe unit).
        group: The process group of a format every rank writes together (dcp under
            torchrun); None for one process.
    """

    durable: bool = True
    overlap: bool = True
    io_streams: int = 1
    checksum: str = checksums.DEFAULT
    background: bool = False
    chunk_bytes: int = CHUNK_BYTES
    group: Any = None

    def __post_init__(self) -> None:
        if self.chunk_bytes <= 0 or self.chunk_bytes % ALIGN:
            raise ValueError(f"chunk_bytes must be a positive multiple of {ALIGN}")
        if self.io_streams < 1:
            raise ValueError(f"io_streams must be at least 1, got {self.io_streams}")
        checksums.get(self.checksum)


@dataclass
class Written:
    """A checkpoint's files, written but not yet fsynced (their fds are open)."""

    files: list[WrittenFile]
    write_s: float
    checksum_s: float | None
    layout: str
    io_mode: str
    checksum: str

    @property
    def nbytes(self) -> int:
        return sum(f.nbytes for f in self.files)


class InFlight(Protocol):
    """A save whose blocking part is done: ``serialize_s`` is what it took."""

    serialize_s: float
    overlapped: bool
    nbytes: int

    def finish(self) -> Written: ...

    def abort(self) -> None: ...


@dataclass
class Staged:
    """A checkpoint copied into host memory, ready to write: ``data`` is the whole file.

    What the byte-image formats (raw, torch) stage inside their :meth:`begin`; the
    checkpointer itself only ever calls ``begin``."""

    data: memoryview
    nbytes: int
    direct_ok: bool


@dataclass
class _Plan:
    tensors: list[torch.Tensor]
    entries: list[list[Any]]
    head_area: int
    total: int


class RawFormat:
    """Our writer: tensors copied into one reused, page-aligned (pinned on CUDA) buffer."""

    name = "raw"
    filename = "state.ckpt"
    layout = LAYOUT_STRIPED
    overlaps = True
    collective = False

    def __init__(self, pin: bool = False) -> None:
        self.buffer = AlignedBuffer(pin=pin)
        self._layout: tuple[int, list] | None = None

    def plan(self, state: Any) -> _Plan:
        """Lay the state out, size the buffer and write the header into it (no tensor bytes)."""
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
        return _Plan(tensors, entries, head_area, total)

    def data(self, plan: _Plan) -> memoryview:
        return self.buffer.view(plan.total)

    def copy(self, plan: _Plan, sink=None, chunk_bytes: int = CHUNK_BYTES) -> Staged:
        """Copy the tensors' bytes into the buffer, in order.

        With ``sink``, the copy goes in pieces that end on ``chunk_bytes`` boundaries of the
        image and ``sink(upto, event)`` is told after each one that bytes ``[0, upto)`` are
        final, so a writer can start on them (``event``: a CUDA event recorded after the
        piece's device-to-host copy, which runs asynchronously into the pinned buffer).
        """
        buf = self.buffer.tensor
        if sink is not None:
            sink(plan.head_area, None)
        any_cuda = False
        # One thread: these copies are memory-bound, and torch's intra-op pool only adds
        # contention (measured 2-3x slower with 2 threads on a 2-core VM).
        threads = torch.get_num_threads()
        torch.set_num_threads(1)
        try:
            for t, (_, _, off, nbytes) in zip(plan.tensors, plan.entries, strict=True):
                if nbytes == 0:
                    continue
                start = plan.head_area + off
                cuda = t.device.type == "cuda"
                any_cuda |= cuda
                if sink is None:
                    dst = buf[start : start + nbytes].view(t.dtype).view(t.shape)
                    dst.copy_(t.detach(), non_blocking=cuda)
                    continue
                # Bytes of the tensor in memory order (a copy only for the rare
                # non-contiguous tensor), cut where the image's chunks end.
                src = t.detach().contiguous().reshape(-1).view(torch.uint8)
                pos = 0
                while pos < nbytes:
                    end = min(
                        nbytes, (start + pos) // chunk_bytes * chunk_bytes + chunk_bytes - start
                    )
                    buf[start + pos : start + end].copy_(src[pos:end], non_blocking=cuda)
                    event = None
                    if cuda:
                        event = torch.cuda.Event()
                        event.record()
                    pos = end
                    sink(start + pos, event)
        finally:
            torch.set_num_threads(threads)
        if any_cuda:
            torch.cuda.synchronize()  # staging ends when the bytes are in host memory
        if sink is not None:
            sink(plan.total, None)
        return Staged(data=self.data(plan), nbytes=plan.total, direct_ok=True)

    def stage(self, state: Any) -> Staged:
        """The whole file image of ``state``, copied without overlap (``begin`` uses it
        with ``--no-overlap``; tests read the image through it)."""
        return self.copy(self.plan(state))

    def begin(
        self, state: Any, directory: Path, fs: LocalFS, opts: WriteOptions, name: str = ""
    ) -> InFlight:
        return _ImageSave(self, state, directory, fs, opts, name or self.filename)

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
    layout = LAYOUT_STRIPED
    overlaps = False
    collective = False

    def stage(self, state: Any) -> Staged:
        """``torch.save`` of ``state`` into memory: the image ``begin`` writes."""
        out = io.BytesIO()
        torch.save(state, out)
        data = out.getbuffer()
        return Staged(data=data, nbytes=len(data), direct_ok=False)

    def begin(
        self, state: Any, directory: Path, fs: LocalFS, opts: WriteOptions, name: str = ""
    ) -> InFlight:
        return _ImageSave(self, state, directory, fs, opts, name or self.filename)

    def load(self, data: memoryview) -> Any:
        try:
            return torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)
        except Exception as exc:  # noqa: BLE001 - torch raises many types for bad bytes
            raise CheckpointCorruptError(f"torch.load failed: {exc}") from exc


class _ImageSave:
    """Stage a byte image and write it striped, the writes overlapping the copy when the
    format can (raw) and ``opts.overlap`` asks for it."""

    def __init__(
        self,
        fmt: RawFormat | TorchFormat,
        state: Any,
        directory: Path,
        fs: LocalFS,
        opts: WriteOptions,
        name: str,
    ) -> None:
        self.fs, self.opts = fs, opts
        self.paths = [directory / n for n in stream_names(name, opts.io_streams)]
        self.nice = BACKGROUND_NICE if opts.background else 0
        self.writer: ChunkWriter | None = None
        self.overlapped = bool(opts.overlap and fmt.overlaps)
        t0 = time.monotonic()
        if self.overlapped:
            assert isinstance(fmt, RawFormat)
            plan = fmt.plan(state)
            self.writer = self._writer(fmt.data(plan), direct=True)
            try:
                self.staged = fmt.copy(plan, sink=self.writer.ready, chunk_bytes=opts.chunk_bytes)
            except BaseException:
                self.writer.abort()
                raise
        else:
            self.staged = fmt.stage(state)
        self.serialize_s = time.monotonic() - t0
        self.nbytes = self.staged.nbytes

    def _writer(self, data: memoryview, direct: bool) -> ChunkWriter:
        return ChunkWriter(
            self.fs,
            self.paths,
            data,
            direct,
            self.opts.chunk_bytes,
            IO_THREADS,
            self.opts.checksum,
            self.nice,
        )

    def finish(self) -> Written:
        if self.writer is None:
            self.writer = self._writer(self.staged.data, direct=self.staged.direct_ok)
        files = self.writer.finish()
        return Written(
            files=files,
            write_s=self.writer.write_s,
            checksum_s=None,  # computed by the writer threads, inside write_s
            layout=LAYOUT_STRIPED,
            io_mode=self.writer.mode,
            checksum=self.opts.checksum,
        )

    def abort(self) -> None:
        if self.writer is not None:
            self.writer.abort()


# ------------------------------------------------------------------ library formats

STATE_KEY = "@state"
"""The flat tensor dict's entry holding the non-tensor structure (JSON as uint8)."""


def _flat_tensors(state: Any) -> dict[str, torch.Tensor]:
    tensors: list[torch.Tensor] = []
    skeleton = json.dumps(flatten(state, tensors), separators=(",", ":")).encode()
    flat = {f"t{i}": t.detach() for i, t in enumerate(tensors)}
    flat[STATE_KEY] = torch.frombuffer(bytearray(skeleton), dtype=torch.uint8)
    return flat


def _unflat_tensors(flat: dict[str, torch.Tensor]) -> Any:
    try:
        skeleton = json.loads(bytes(flat.pop(STATE_KEY).numpy()))
        tensors = [flat[f"t{i}"] for i in range(len(flat))]
        return unflatten(skeleton, tensors)
    except (KeyError, ValueError, TypeError, IndexError) as exc:
        raise CheckpointCorruptError(f"checkpoint structure is invalid: {exc}") from exc


def checksum_file(
    fs: LocalFS, path: Path, checksum: str, chunk_bytes: int = CHUNK_BYTES
) -> tuple[int, list[int]]:
    """Read ``path`` through (buffered) and checksum it chunk by chunk: (bytes, checksums).

    Chunks are ``chunk_bytes`` long except the last: a regular file returns a short read
    only at its end.
    """
    summer = checksums.get(checksum)
    buf = bytearray(chunk_bytes)
    view = memoryview(buf)
    values, offset = [], 0
    fd = fs.open_read(path, direct=False)
    try:
        while (n := fs.preadinto(fd, view, offset)) > 0:
            values.append(summer(view[:n]))
            offset += n
    finally:
        fs.close(fd)
    return offset, values


def _library_written(
    fs: LocalFS, directory: Path, names: list[str], opts: WriteOptions, write_s: float
) -> Written:
    """Checksum what a library wrote (reading it back) and open each file for fsync."""
    t0 = time.monotonic()
    files: list[WrittenFile] = []
    try:
        for name in sorted(names):
            nbytes, values = checksum_file(fs, directory / name, opts.checksum)
            fd = fs.open_read(directory / name, direct=False)  # fsync needs an fd only
            files.append(
                WrittenFile(
                    fd=fd,
                    nbytes=nbytes,
                    chunk_bytes=CHUNK_BYTES,
                    checksums=values,
                    io_mode=IO_BUFFERED,
                    name=name,
                    checksum=opts.checksum,
                )
            )
    except BaseException:
        for f in files:
            fs.close(f.fd)
        raise
    return Written(
        files=files,
        write_s=write_s,
        checksum_s=time.monotonic() - t0,
        layout=LAYOUT_FILES,
        io_mode=IO_BUFFERED,
        checksum=opts.checksum,
    )


def _host_copy(t: torch.Tensor, stable: bool, seen: set[int]) -> torch.Tensor:
    """``t`` as safetensors accepts it: on the host, contiguous, sharing no storage with
    another entry (it refuses both); a copy also when the caller needs a stable snapshot."""
    if t.device.type != "cpu":
        return t.to("cpu")
    if t.numel() == 0:
        return t
    ptr = t.untyped_storage().data_ptr()
    whole = t.untyped_storage().nbytes() == t.numel() * t.element_size()
    if stable or not t.is_contiguous() or ptr in seen or not whole:
        t = t.contiguous().clone() if t.is_contiguous() else t.contiguous()
    seen.add(t.untyped_storage().data_ptr())
    return t


class _LibraryFormat:
    """A format a library writes as files of its own: checksummed once written, loaded by
    the library (a subclass names its save, the library's in-flight write)."""

    layout = LAYOUT_FILES
    overlaps = False
    collective = False
    filename: str
    _save: Callable[[Any, Path, LocalFS, WriteOptions, str], InFlight]

    def begin(
        self, state: Any, directory: Path, fs: LocalFS, opts: WriteOptions, name: str = ""
    ) -> InFlight:
        return type(self)._save(state, directory, fs, opts, name or self.filename)


class _SafetensorsSave:
    def __init__(
        self, state: Any, directory: Path, fs: LocalFS, opts: WriteOptions, name: str
    ) -> None:
        self.directory, self.fs, self.opts = directory, fs, opts
        self.overlapped = False
        t0 = time.monotonic()
        seen: set[int] = set()
        # The stage: device-to-host copies (and, for a background write, a snapshot the
        # training loop can move on from). Converting tensors to bytes happens inside
        # save_file, so it is timed as part of the write.
        flat = {k: _host_copy(t, opts.background, seen) for k, t in _flat_tensors(state).items()}
        n = opts.io_streams
        names = stream_names(name, n)
        shards: list[dict[str, torch.Tensor]] = [{} for _ in names]
        loads = [0] * n
        for key, t in sorted(flat.items(), key=lambda kv: -kv[1].nbytes):
            i = loads.index(min(loads))  # biggest first onto the lightest shard
            shards[i][key] = t
            loads[i] += t.nbytes
        self.shards = list(zip(names, shards, strict=True))
        self.nbytes = sum(loads)
        self.serialize_s = time.monotonic() - t0

    def finish(self) -> Written:
        from safetensors.torch import save_file

        t0 = time.monotonic()
        self.fs.library_write()
        if len(self.shards) == 1:
            save_file(self.shards[0][1], self.directory / self.shards[0][0])
        else:
            with ThreadPoolExecutor(len(self.shards), thread_name_prefix="st-write") as pool:
                for f in [
                    pool.submit(save_file, shard, self.directory / name)
                    for name, shard in self.shards
                ]:
                    f.result()
        write_s = time.monotonic() - t0
        return _library_written(
            self.fs, self.directory, [n for n, _ in self.shards], self.opts, write_s
        )

    def abort(self) -> None:
        pass


class SafetensorsFormat(_LibraryFormat):
    """``safetensors.torch.save_file`` + fsync, the way a user would save with it; with N
    streams the tensors are split over N shard files written by N threads."""

    name = "safetensors"
    filename = "state.safetensors"
    _save = _SafetensorsSave

    def load_dir(self, directory: Path, names: list[str]) -> Any:
        from safetensors.torch import load_file

        flat: dict[str, torch.Tensor] = {}
        for name in names:
            try:
                flat.update(load_file(directory / name))
            except Exception as exc:  # noqa: BLE001 - the library raises its own types
                raise CheckpointCorruptError(f"safetensors could not load {name}: {exc}") from exc
        return _unflat_tensors(flat)


# Without a process group DCP warns on every call (also from its async thread) that it
# assumes a single process, which is exactly what no_dist asks for.
warnings.filterwarnings("ignore", message="torch.distributed is disabled", category=UserWarning)


DTENSORS_KEY = "@dtensors"
"""Under torchrun, the dcp flat dict's entry saying which leaves are DTensors and how they
are placed (JSON as uint8), so a resume can ask DCP for the same local pieces."""
RNG_PREFIX = "@rng."
"""Under torchrun, each rank's own RNG state in the dcp flat dict: ``@rng.<rank>.<name>``."""


def _dcp_flat(state: Any, rank: int | None) -> dict[str, torch.Tensor]:
    """The flat tensor dict DCP saves. Under torchrun (``rank`` set) every rank passes the
    whole state, DTensors included, and DCP writes each tensor once (a replicated one by
    one rank, a DTensor's pieces by their ranks); the RNG, which differs per rank, is
    kept apart under each rank's own keys."""
    if rank is None:
        return _flat_tensors(state)
    rest = {k: v for k, v in state.items() if k != "rng"}
    tensors: list[torch.Tensor] = []
    skeleton = json.dumps(flatten(rest, tensors), separators=(",", ":")).encode()
    flat = {f"t{i}": t.detach() for i, t in enumerate(tensors)}
    flat[STATE_KEY] = torch.frombuffer(bytearray(skeleton), dtype=torch.uint8)
    from trainer.ckpt.sharded import placements_json  # torch.distributed: only under torchrun

    placed = {
        str(i): placements_json(t.placements) for i, t in enumerate(tensors) if _is_dtensor(t)
    }
    flat[DTENSORS_KEY] = torch.frombuffer(bytearray(json.dumps(placed).encode()), dtype=torch.uint8)
    for name, t in (state.get("rng") or {}).items():
        flat[f"{RNG_PREFIX}{rank}.{name}"] = t.detach().cpu()
    return flat


def _is_dtensor(t: torch.Tensor) -> bool:
    from torch.distributed.tensor import DTensor

    return isinstance(t, DTensor)


class _DcpSave:
    def __init__(
        self, state: Any, directory: Path, fs: LocalFS, opts: WriteOptions, name: str
    ) -> None:
        import torch.distributed as dist
        import torch.distributed.checkpoint as dcp

        self.directory, self.fs, self.opts = directory, fs, opts
        self.overlapped = False
        self._dcp = dcp
        # Under torchrun every rank saves together on the checkpoint group, DCP's own
        # sharded save; alone, no process group (no_dist).
        self.rank = None if opts.group is None else dist.get_rank(opts.group)
        self._where: dict[str, Any] = (
            {"no_dist": True} if opts.group is None else {"process_group": opts.group}
        )
        t0 = time.monotonic()
        self.flat = _dcp_flat(state, self.rank)
        self.nbytes = sum(t.nbytes for t in self.flat.values())
        self._future = None
        if opts.background:
            # async_save blocks while it stages the state into host memory (the pause),
            # then writes on its own thread.
            response = dcp.async_save(self.flat, storage_writer=self._writer(), **self._where)
            self._future = getattr(response, "upload_completion", response)
            self.flat = {}
        self.serialize_s = time.monotonic() - t0
        self._t_begin_end = time.monotonic()

    def _writer(self):
        # DCP fsyncs each file itself when sync_files is set; its planning, staging and
        # serialization all happen inside save(), so they count as write.
        writer = self._dcp.FileSystemWriter(
            self.directory, thread_count=self.opts.io_streams, sync_files=self.opts.durable
        )
        write_data, fs = writer.write_data, self.fs

        def write_data_through_the_seam(plan: Any, planner: Any) -> Any:
            # Inside DCP's write step, after its planning collectives (on DCP's thread
            # when the save is asynchronous).
            fs.library_write()
            return write_data(plan, planner)

        writer.write_data = write_data_through_the_seam
        return writer

    def _mine(self, name: str) -> bool:
        """Whether this rank wrote the file: its own ``__<rank>_*`` data files, and rank 0
        the global metadata (each rank checksums only what it wrote)."""
        if self.rank is None:
            return True
        return name.startswith(f"__{self.rank}_") or (self.rank == 0 and name == ".metadata")

    def finish(self) -> Written:
        try:
            if self._future is not None:
                self._future.result()
                write_s = time.monotonic() - self._t_begin_end
            else:
                t0 = time.monotonic()
                self._dcp.save(self.flat, storage_writer=self._writer(), **self._where)
                write_s = time.monotonic() - t0
        except BaseException as exc:
            raise _dcp_failure(exc, self.rank) from exc
        names = [p.name for p in self.directory.iterdir() if p.is_file() and self._mine(p.name)]
        return _library_written(self.fs, self.directory, names, self.opts, write_s)

    def abort(self) -> None:
        if self._future is not None:
            # Wait for its thread, which still writes into the directory; its error (a
            # CheckpointException, a BaseException) is already the one being raised.
            self._future.exception()


def _dcp_failure(exc: BaseException, rank: int | None) -> BaseException:
    """What a failed DCP save under torchrun means for ``rank``.

    DCP reports a failure to every rank of the save alike (a CheckpointException holding
    each failed rank's error): the rank that failed gets its own error back (a full
    volume stays exit 4 there), a rank that did not gets :class:`RankFailedError` (its
    part was written; another rank's was not), so that only the rank that failed exits
    with its own code.
    """
    failures = getattr(exc, "failures", None)
    if rank is None or not isinstance(failures, dict) or not failures:
        return exc
    if rank not in failures:
        failed = ", ".join(str(r) for r in sorted(failures))
        said = " ".join(str(exc).split())[:300]
        return RankFailedError(f"DCP's save failed on rank {failed}: {said}")
    own = failures[rank]
    own = own[0] if isinstance(own, tuple) else getattr(own, "exc", own)
    return own if isinstance(own, BaseException) else exc


class DcpFormat(_LibraryFormat):
    """``torch.distributed.checkpoint`` with its FileSystemWriter: one process alone
    (``no_dist``), or under torchrun every rank together (DCP's own sharded save)."""

    name = "dcp"
    filename = ".metadata"
    collective = True
    _save = _DcpSave

    @staticmethod
    def join_failed(error: BaseException, directory: Path, opts: WriteOptions) -> None:
        """Join the save the other ranks of ``opts.group`` are in, with ``error`` instead
        of this rank's part: DCP's first collective (the plan) then fails on every rank
        at once. A rank that failed before its save would otherwise leave the others
        waiting in it until the group's timeout, and its next message on the group would
        be taken for DCP's."""
        import torch.distributed.checkpoint as dcp

        class _Failed(dcp.DefaultSavePlanner):
            def set_up_planner(
                self, state_dict: Any, storage_meta: Any = None, is_coordinator: bool = False
            ) -> None:
                raise error

        try:
            dcp.save(
                {},
                storage_writer=dcp.FileSystemWriter(directory),
                planner=_Failed(),
                process_group=opts.group,
            )
        except (KeyboardInterrupt, SystemExit):
            raise
        except BaseException:  # noqa: BLE001 - DCP's CheckpointException naming this rank
            pass  # ``error`` is what this rank reports; the others were told by DCP

    def load_dir(self, directory: Path, names: list[str]) -> Any:
        import torch.distributed.checkpoint as dcp

        try:
            reader = dcp.FileSystemReader(directory)
            meta = reader.read_metadata().state_dict_metadata
            flat = {
                key: torch.empty(tuple(m.size), dtype=m.properties.dtype) for key, m in meta.items()
            }
            dcp.load(flat, storage_reader=dcp.FileSystemReader(directory), no_dist=True)
        except CheckpointCorruptError:
            raise
        except Exception as exc:  # noqa: BLE001 - DCP raises many types for bad files
            raise CheckpointCorruptError(f"dcp.load failed: {exc}") from exc
        return _unflat_tensors(flat)

    def load_collective(self, directory: Path, ranks: Any) -> Any:
        """Under torchrun: every rank loads its own pieces of a checkpoint DCP's sharded
        save wrote (DTensors as this rank's local shards, its own RNG), together."""
        import torch.distributed.checkpoint as dcp

        from trainer.ckpt.sharded import placements

        group = {"process_group": ranks.ckpt_group}
        try:
            meta = dcp.FileSystemReader(directory).read_metadata().state_dict_metadata
            heads = {
                k: torch.empty(tuple(meta[k].size), dtype=torch.uint8)
                for k in (STATE_KEY, DTENSORS_KEY)
            }
            dcp.load(heads, checkpoint_id=directory, **group)
            placed = json.loads(bytes(heads[DTENSORS_KEY].numpy()))
            own = f"{RNG_PREFIX}{ranks.rank}."
            flat: dict[str, torch.Tensor] = {}
            for key, m in meta.items():
                if key in heads or (key.startswith(RNG_PREFIX) and not key.startswith(own)):
                    continue
                size, dtype = tuple(m.size), m.properties.dtype
                where = placed.get(key.removeprefix("t"))
                if where is None:
                    flat[key] = torch.empty(size, dtype=dtype)
                else:
                    from torch.distributed import tensor as dtensor

                    flat[key] = dtensor.empty(
                        size, dtype=dtype, device_mesh=ranks.mesh, placements=placements(where)
                    )
            dcp.load(flat, checkpoint_id=directory, **group)
        except CheckpointCorruptError:
            raise
        except Exception as exc:  # noqa: BLE001 - DCP raises many types for bad files
            raise CheckpointCorruptError(f"dcp.load failed: {exc}") from exc
        rng = {k.removeprefix(own): flat.pop(k) for k in list(flat) if k.startswith(own)}
        flat[STATE_KEY] = heads[STATE_KEY]
        state = _unflat_tensors(flat)
        state["rng"] = rng
        return state


Format = RawFormat | TorchFormat | SafetensorsFormat | DcpFormat

_FORMATS: dict[str, Callable[[bool], Format]] = {
    RawFormat.name: lambda pin: RawFormat(pin=pin),
    TorchFormat.name: lambda pin: TorchFormat(),
    DcpFormat.name: lambda pin: DcpFormat(),
    SafetensorsFormat.name: lambda pin: SafetensorsFormat(),
}
"""Every format by name, and how to make one (``pin``: a pinned staging buffer, on CUDA)."""
FORMATS = tuple(_FORMATS)


def load_verified(
    fmt: Format, path: Path, manifest: dict[str, Any], data: memoryview | None
) -> Any:
    """The state of a checkpoint ``store.read_verified`` returned (``data`` None: files a
    library loads from ``path``)."""
    layout = manifest["layout"]
    if layout != fmt.layout:
        raise CheckpointCorruptError(
            f"{path.name}: layout {layout!r} is not what format {fmt.name!r} writes"
        )
    if data is not None:
        return fmt.load(data)
    return fmt.load_dir(path, [entry["name"] for entry in manifest["files"]])


def make_format(name: str, pin: bool = False) -> Format:
    try:
        return _FORMATS[name](pin)
    except KeyError:
        raise ValueError(f"unknown checkpoint format {name!r}") from None


__all__ = [
    "ALIGN",
    "FORMATS",
    "LAYOUT_FILES",
    "LAYOUT_STRIPED",
    "DcpFormat",
    "Format",
    "InFlight",
    "RawFormat",
    "SafetensorsFormat",
    "Staged",
    "TorchFormat",
    "WriteOptions",
    "Written",
    "flatten",
    "load_verified",
    "make_format",
    "unflatten",
]
