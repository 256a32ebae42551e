"""Moving checkpoint bytes between page-aligned memory and files, fast and checksummed.

A checkpoint's bytes (its "image") are cut into fixed-size chunks, striped round-robin over
``streams`` files (chunk k goes to file k mod N, one file when N is 1), and written by a
few threads per file, each checksumming its chunk while the bytes are in cache (ISA-L's
CRC32 and the syscalls release the GIL). Chunks can be handed to the writer as soon as
they are final (:meth:`ChunkWriter.ready`), so the writes of the first chunks overlap the
copying of the next ones. With O_DIRECT the page cache is bypassed; where the file system
refuses O_DIRECT (tmpfs, some network file systems) the same code runs buffered and says
so in ``io_mode``.
"""

from __future__ import annotations

import errno
import mmap
import os
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from trainer.ckpt import checksum as checksums
from trainer.ckpt.fs import LocalFS

ALIGN = 4096
CHUNK_BYTES = 4 << 20
IO_THREADS = 4
"""Writes (or reads) in flight per stream: 4 x 4 MiB matched fio's best case on our VMs."""
BACKGROUND_NICE = 10
"""CPU priority of the threads of a background (async) write: on a node whose cores the
training loop keeps busy they yield to it; on an idle core they run at full speed."""

IO_DIRECT = "direct"
IO_BUFFERED = "buffered"
IO_BUFFERED_FALLBACK = "buffered (O_DIRECT unsupported)"


def align_up(n: int, align: int = ALIGN) -> int:
    return (n + align - 1) // align * align


class AlignedBuffer:
    """Page-aligned host memory, reused across checkpoints and grown on demand.

    With ``pin`` (a CUDA model) the pages are registered with CUDA so device-to-host copies
    run at full speed and asynchronously.
    """

    def __init__(self, pin: bool = False) -> None:
        self.pin = pin
        self._map: mmap.mmap | None = None
        self.tensor = torch.empty(0, dtype=torch.uint8)

    @property
    def capacity(self) -> int:
        return len(self._map) if self._map is not None else 0

    def ensure(self, size: int) -> None:
        """Make the buffer at least ``size`` bytes (contents are not kept on growth)."""
        if size <= self.capacity:
            return
        self.release()
        mapping = mmap.mmap(-1, align_up(max(size, ALIGN)))
        # Through a memoryview, so mmap.close() refuses while any tensor view is alive.
        tensor = torch.frombuffer(memoryview(mapping), dtype=torch.uint8)
        if self.pin:
            # cudart returns an error code instead of raising; check_error raises on failure.
            torch.cuda.check_error(
                torch.cuda.cudart().cudaHostRegister(tensor.data_ptr(), len(mapping), 0)
            )
        self._map, self.tensor = mapping, tensor

    def view(self, size: int) -> memoryview:
        return memoryview(self._map)[:size] if self._map is not None else memoryview(b"")

    def release(self) -> None:
        if self._map is None:
            return
        if self.pin:
            torch.cuda.check_error(torch.cuda.cudart().cudaHostUnregister(self.tensor.data_ptr()))
        self.tensor = torch.empty(0, dtype=torch.uint8)
        try:
            self._map.close()
        except BufferError:
            # Tensors loaded zero-copy from this buffer still use it; the GC frees it later.
            pass
        self._map = None


@dataclass(frozen=True)
class Span:
    """Chunk ``index`` of an image: ``nbytes`` at ``image_offset``, stored in file ``file`` at
    ``file_offset``."""

    index: int
    file: int
    file_offset: int
    image_offset: int
    nbytes: int

    @property
    def image_end(self) -> int:
        return self.image_offset + self.nbytes


def stripe(nbytes: int, chunk_bytes: int, files: int) -> list[Span]:
    """The chunks of an ``nbytes`` image striped round-robin over ``files`` files."""
    return [
        Span(k, k % files, (k // files) * chunk_bytes, off, min(chunk_bytes, nbytes - off))
        for k, off in enumerate(range(0, nbytes, chunk_bytes))
    ]


def stripe_sizes(nbytes: int, chunk_bytes: int, files: int) -> list[int]:
    """How many bytes each of the ``files`` files of a striped image holds."""
    sizes = [0] * files
    for span in stripe(nbytes, chunk_bytes, files):
        sizes[span.file] += span.nbytes
    return sizes


def stream_names(filename: str, streams: int) -> list[str]:
    """File names of a state striped over ``streams`` files (one: the name as it was)."""
    if streams == 1:
        return [filename]
    return [f"{filename}.{i:02d}-of-{streams:02d}" for i in range(streams)]


@dataclass
class WrittenFile:
    """A file whose bytes are written but not yet fsynced (``fd`` is still open)."""

    fd: int
    nbytes: int
    chunk_bytes: int
    checksums: list[int]
    io_mode: str
    name: str = ""
    checksum: str = checksums.DEFAULT


class _DirectRefused(Exception):
    """O_DIRECT was accepted at open() but refused at a transfer (EINVAL)."""


def _transfer(op, fd: int, buf: memoryview, offset: int, direct: bool) -> None:
    """Move all of ``buf`` with ``op`` (pwrite or preadv), looping over short transfers."""
    done = 0
    while done < len(buf):
        try:
            n = op(fd, buf[done:], offset + done)
        except OSError as exc:
            # Chunks run in parallel, so the refusal can come at any chunk's first byte.
            if direct and exc.errno == errno.EINVAL and done == 0:
                raise _DirectRefused from exc
            raise
        if n <= 0:
            raise OSError(
                errno.EIO, "the file is shorter than its manifest says" if n == 0 else "I/O error"
            )
        if direct and n % ALIGN:
            # A retry from an unaligned position would fail with EINVAL; this is an I/O error.
            raise OSError(errno.EIO, f"short O_DIRECT transfer of {n} bytes")
        done += n


def _lower_priority(nice: int) -> Callable[[], None]:
    def init() -> None:
        if nice <= 0:
            return
        # Linux keeps a nice value per thread: this lowers only the calling pool thread.
        tid = threading.get_native_id()
        try:
            os.setpriority(os.PRIO_PROCESS, tid, max(nice, os.getpriority(os.PRIO_PROCESS, tid)))
        except OSError:
            pass  # a priority is an optimisation, never a reason to fail a checkpoint

    return init


@dataclass
class _Timing:
    first_start: float | None = None
    last_end: float | None = None
    lock: threading.Lock = field(default_factory=threading.Lock)

    def span(self, start: float, end: float) -> None:
        with self.lock:
            if self.first_start is None or start < self.first_start:
                self.first_start = start
            if self.last_end is None or end > self.last_end:
                self.last_end = end


class ChunkWriter:
    """Writes one image into ``paths`` (striped), chunk by chunk as the caller makes them final.

    Files are opened (O_DIRECT when ``direct``) when the writer is made; :meth:`ready` hands
    over every chunk that lies wholly below a byte offset; :meth:`finish` hands over the
    rest, waits, and returns the still-open files. ``depth`` writes are in flight per file.

    Args:
        fs: The storage seam.
        paths: The files, one per stream.
        data: The whole image (its bytes below the offsets passed to ``ready`` are final).
        direct: Use O_DIRECT (``data`` page-aligned, chunks multiples of ALIGN).
        chunk_bytes: Chunk size.
        depth: Writes in flight per file.
        checksum: The manifest's checksum algorithm.
        nice: CPU priority of the writer threads (0: unchanged).
    """

    def __init__(
        self,
        fs: LocalFS,
        paths: list[Path],
        data: memoryview,
        direct: bool,
        chunk_bytes: int = CHUNK_BYTES,
        depth: int = IO_THREADS,
        checksum: str = checksums.DEFAULT,
        nice: int = 0,
    ) -> None:
        self.fs, self.paths, self.data = fs, paths, data
        self.chunk_bytes, self.checksum = chunk_bytes, checksum
        self._sum = checksums.get(checksum)
        self.spans = stripe(len(data), chunk_bytes, len(paths))
        self.timing = _Timing()
        self._futures: list[Future[int]] = []
        self._fds: list[int] = []
        self.mode = IO_DIRECT if direct else IO_BUFFERED
        try:
            self._fds = self._open_all(direct)
        except _DirectRefused:
            self.mode = IO_BUFFERED_FALLBACK
            self._fds = self._open_all(False)
        self._pool = ThreadPoolExecutor(
            max(1, depth * len(paths)),
            thread_name_prefix="ckpt-write",
            initializer=_lower_priority(nice),
        )

    def _open_all(self, direct: bool) -> list[int]:
        fds: list[int] = []
        try:
            for path in self.paths:
                try:
                    fds.append(self.fs.open_write(path, direct=direct))
                except OSError as exc:
                    # tmpfs before Linux 6.6 refuses O_DIRECT at open().
                    if direct and exc.errno == errno.EINVAL:
                        raise _DirectRefused from exc
                    raise
        except BaseException:
            for fd in fds:
                self.fs.close(fd)
            raise
        return fds

    def _job(self, span: Span, direct: bool, event: Any) -> int:
        if event is not None:
            event.synchronize()  # the device-to-host copy of this chunk has landed
        start = time.monotonic()
        chunk = self.data[span.image_offset : span.image_end]
        _transfer(self.fs.pwrite, self._fds[span.file], chunk, span.file_offset, direct)
        value = self._sum(chunk)
        self.timing.span(start, time.monotonic())
        return value

    def ready(self, upto: int, event: Any = None) -> None:
        """Bytes ``[0, upto)`` of the image are final: start writing the chunks they cover.

        ``event`` (a CUDA event) is waited for by each such write before it starts.
        """
        direct = self.mode == IO_DIRECT
        while len(self._futures) < len(self.spans):
            span = self.spans[len(self._futures)]
            if span.image_end > upto:
                break
            self._futures.append(self._pool.submit(self._job, span, direct, event))

    def finish(self) -> list[WrittenFile]:
        """Write whatever is left, wait for every write; the files stay open for fsync."""
        try:
            self.ready(len(self.data))
            values = self._collect()
        except BaseException:
            self.abort()
            raise
        self._pool.shutdown(wait=True)
        # The open fds now belong to the caller (fsync, close): abort() must not close them.
        fds, self._fds = self._fds, []
        written = []
        for i, (fd, path) in enumerate(zip(fds, self.paths, strict=True)):
            mine = [s for s in self.spans if s.file == i]
            written.append(
                WrittenFile(
                    fd=fd,
                    nbytes=sum(s.nbytes for s in mine),
                    chunk_bytes=self.chunk_bytes,
                    checksums=[values[s.index] for s in mine],
                    io_mode=self.mode,
                    name=path.name,
                    checksum=self.checksum,
                )
            )
        return written

    def _collect(self) -> list[int]:
        wait(self._futures)
        errors = [f.exception() for f in self._futures if f.exception() is not None]
        if not errors:
            return [f.result() for f in self._futures]
        real = [e for e in errors if not isinstance(e, _DirectRefused)]
        if real:
            raise real[0]
        # O_DIRECT refused at a transfer (some network file systems): every chunk is still
        # in ``data``, so write all of it again, buffered, into truncated files.
        for fd in self._fds:
            self.fs.close(fd)
        self._fds = []
        self.mode = IO_BUFFERED_FALLBACK
        self._fds = self._open_all(False)
        self._futures = []
        self.ready(len(self.data))
        wait(self._futures)
        return [f.result() for f in self._futures]

    def abort(self) -> None:
        """Stop: wait for writes already running, close the files (the caller deletes them)."""
        for f in self._futures:
            f.cancel()
        self._pool.shutdown(wait=True)
        for fd in self._fds:
            self.fs.close(fd)
        self._fds = []

    @property
    def write_s(self) -> float:
        """From the first write's start to the last one's end."""
        t = self.timing
        return 0.0 if t.first_start is None else t.last_end - t.first_start


def write_file(
    fs: LocalFS,
    path: Path,
    data: memoryview,
    direct: bool,
    chunk_bytes: int = CHUNK_BYTES,
    threads: int = IO_THREADS,
    checksum: str = checksums.DEFAULT,
) -> WrittenFile:
    """Write all of ``data`` to a new file at ``path`` (one stream, ``threads`` in flight)."""
    writer = ChunkWriter(fs, [path], data, direct, chunk_bytes, threads, checksum)
    (written,) = writer.finish()
    return written


def read_image(
    fs: LocalFS,
    paths: list[Path],
    nbytes: int,
    buffer: AlignedBuffer,
    direct: bool,
    chunk_bytes: int = CHUNK_BYTES,
    threads: int = IO_THREADS,
    checksum: str = checksums.DEFAULT,
) -> tuple[memoryview, list[list[int]], str]:
    """Read an image striped over ``paths`` into ``buffer``.

    Returns:
        The image, each file's chunk checksums (in file order) and the I/O mode.
    """
    buffer.ensure(align_up(nbytes))
    view = buffer.view(nbytes)
    spans = stripe(nbytes, chunk_bytes, len(paths))
    summer = checksums.get(checksum)
    # O_DIRECT reads need whole blocks: a torch.save file's odd tail is read buffered.
    use_direct = direct and nbytes % ALIGN == 0 and chunk_bytes % ALIGN == 0

    def attempt(is_direct: bool) -> list[int]:
        fds: list[int] = []
        try:
            for path in paths:
                try:
                    fds.append(fs.open_read(path, direct=is_direct))
                except OSError as exc:
                    if is_direct and exc.errno == errno.EINVAL:
                        raise _DirectRefused from exc
                    raise

            def job(span: Span) -> int:
                part = view[span.image_offset : span.image_end]
                _transfer(fs.preadinto, fds[span.file], part, span.file_offset, is_direct)
                return summer(part)

            if len(spans) <= 1 or threads <= 1:
                return [job(s) for s in spans]
            workers = threads * len(paths)
            with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="ckpt-read") as pool:
                futures = [pool.submit(job, s) for s in spans]
                wait(futures)
                errors = [f.exception() for f in futures if f.exception() is not None]
                real = [e for e in errors if not isinstance(e, _DirectRefused)]
                if real or errors:
                    raise (real or errors)[0]
                return [f.result() for f in futures]
        finally:
            for fd in fds:
                fs.close(fd)

    mode = IO_DIRECT if use_direct else IO_BUFFERED
    try:
        values = attempt(use_direct)
    except _DirectRefused:
        mode, values = IO_BUFFERED_FALLBACK, attempt(False)
    per_file = [[values[s.index] for s in spans if s.file == i] for i in range(len(paths))]
    return view, per_file, mode
