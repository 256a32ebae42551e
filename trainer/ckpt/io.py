"""Moving checkpoint bytes between page-aligned memory and files, fast and checksummed.

One file is written as fixed-size chunks by a few threads, each computing the CRC32 of its
chunk while the bytes are in cache (zlib releases the GIL for both). With O_DIRECT the page
cache is bypassed; where the file system refuses O_DIRECT (tmpfs, some network file
systems) the same code runs buffered and says so in ``io_mode``.
"""

from __future__ import annotations

import errno
import mmap
import zlib
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import torch

from trainer.ckpt.fs import LocalFS

ALIGN = 4096
CHUNK_BYTES = 4 << 20
IO_THREADS = 4

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


@dataclass
class WrittenFile:
    """A file whose bytes are written but not yet fsynced (``fd`` is still open)."""

    fd: int
    nbytes: int
    chunk_bytes: int
    crc32: list[int]
    io_mode: str


class _DirectRefused(Exception):
    """O_DIRECT was accepted at open() but refused at the first transfer (EINVAL)."""


def _chunks(n: int, chunk: int) -> list[tuple[int, int]]:
    return [(off, min(chunk, n - off)) for off in range(0, n, chunk)]


def _transfer(op, fd: int, buf: memoryview, offset: int, direct: bool) -> None:
    """Move all of ``buf`` with ``op`` (pwrite or preadv), looping over short transfers."""
    done = 0
    while done < len(buf):
        try:
            n = op(fd, buf[done:], offset + done)
        except OSError as exc:
            if direct and exc.errno == errno.EINVAL and done == 0 and offset == 0:
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


def _run_chunks(job, n: int, chunk: int, threads: int) -> list[int]:
    spans = _chunks(n, chunk)
    if len(spans) <= 1 or threads <= 1:
        return [job(o, k) for o, k in spans]
    with ThreadPoolExecutor(max_workers=threads, thread_name_prefix="ckpt-io") as pool:
        return [f.result() for f in [pool.submit(job, o, k) for o, k in spans]]


def _with_direct_fallback(fs: LocalFS, open_fd, run, direct: bool) -> tuple[int, list[int], str]:
    """Open (O_DIRECT when asked) and ``run(fd, is_direct)``; fall back to buffered I/O
    where O_DIRECT is refused.

    Refusal comes as EINVAL, either at open() (tmpfs before Linux 6.6) or at the first
    transfer (some network file systems). Returns the still-open fd, the CRCs and the mode;
    on failure the fd is closed.
    """
    mode = IO_DIRECT if direct else IO_BUFFERED
    try:
        fd = open_fd(direct)
    except OSError as exc:
        if not direct or exc.errno != errno.EINVAL:
            raise
        mode, fd = IO_BUFFERED_FALLBACK, open_fd(False)
    try:
        return fd, run(fd, mode == IO_DIRECT), mode
    except _DirectRefused:
        fs.close(fd)
        mode, fd = IO_BUFFERED_FALLBACK, open_fd(False)
    except BaseException:
        fs.close(fd)
        raise
    try:
        return fd, run(fd, False), mode
    except BaseException:
        fs.close(fd)
        raise


def write_file(
    fs: LocalFS,
    path: Path,
    data: memoryview,
    direct: bool,
    chunk_bytes: int = CHUNK_BYTES,
    threads: int = IO_THREADS,
) -> WrittenFile:
    """Write ``data`` to a new file at ``path`` with several writes in flight.

    ``direct`` needs ``data`` page-aligned in memory and a multiple of ALIGN long. Each
    chunk's CRC32 is computed by the thread that writes it.
    """

    def run(fd: int, is_direct: bool) -> list[int]:
        def job(offset: int, n: int) -> int:
            chunk = data[offset : offset + n]
            _transfer(fs.pwrite, fd, chunk, offset, is_direct)
            return zlib.crc32(chunk)

        return _run_chunks(job, len(data), chunk_bytes, threads)

    fd, crcs, mode = _with_direct_fallback(fs, lambda d: fs.open_write(path, direct=d), run, direct)
    return WrittenFile(fd=fd, nbytes=len(data), chunk_bytes=chunk_bytes, crc32=crcs, io_mode=mode)


def read_file(
    fs: LocalFS,
    path: Path,
    nbytes: int,
    buffer: AlignedBuffer,
    direct: bool,
    chunk_bytes: int = CHUNK_BYTES,
    threads: int = IO_THREADS,
) -> tuple[memoryview, list[int], str]:
    """Read ``nbytes`` of ``path`` into ``buffer``; returns the bytes, chunk CRCs and mode."""
    buffer.ensure(align_up(nbytes))
    view = buffer.view(nbytes)

    def run(fd: int, is_direct: bool) -> list[int]:
        def job(offset: int, n: int) -> int:
            _transfer(fs.preadinto, fd, view[offset : offset + n], offset, is_direct)
            return zlib.crc32(view[offset : offset + n])

        return _run_chunks(job, nbytes, chunk_bytes, threads)

    # O_DIRECT reads need whole blocks: a torch.save file's odd tail is read buffered.
    use_direct = direct and nbytes % ALIGN == 0 and chunk_bytes % ALIGN == 0
    fd, crcs, mode = _with_direct_fallback(
        fs, lambda d: fs.open_read(path, direct=d), run, use_direct
    )
    fs.close(fd)
    return view, crcs, mode
