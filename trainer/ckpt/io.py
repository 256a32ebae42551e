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
        self._map = mmap.mmap(-1, align_up(max(size, ALIGN)))
        self.tensor = torch.frombuffer(self._map, dtype=torch.uint8)
        if self.pin:
            cudart = torch.cuda.cudart()
            cudart.cudaHostRegister(self.tensor.data_ptr(), self.capacity, 0)

    def view(self, size: int) -> memoryview:
        return memoryview(self._map)[:size] if self._map is not None else memoryview(b"")

    def release(self) -> None:
        if self._map is None:
            return
        if self.pin:
            torch.cuda.cudart().cudaHostUnregister(self.tensor.data_ptr())
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
    crc32: list[int]
    io_mode: str


def _chunks(n: int, chunk: int) -> list[tuple[int, int]]:
    return [(off, min(chunk, n - off)) for off in range(0, n, chunk)]


def _write_chunk(fs: LocalFS, fd: int, data: memoryview, offset: int) -> int:
    crc = zlib.crc32(data)
    done = 0
    while done < len(data):
        written = fs.pwrite(fd, data[done:], offset + done)
        if written <= 0:
            raise OSError(errno.EIO, "short write")
        done += written
    return crc


def write_file(
    fs: LocalFS,
    path: Path,
    data: memoryview,
    direct: bool,
    chunk_bytes: int = CHUNK_BYTES,
    threads: int = IO_THREADS,
) -> WrittenFile:
    """Write ``data`` to a new file at ``path`` with several writes in flight.

    ``direct`` needs ``data`` page-aligned in memory and a multiple of ALIGN long; when the
    file system rejects O_DIRECT the write is redone buffered.
    """
    mode = IO_BUFFERED
    fd = -1
    if direct:
        try:
            fd = fs.open_write(path, direct=True)
            mode = IO_DIRECT
        except OSError as exc:
            if exc.errno != errno.EINVAL:
                raise
            mode = IO_BUFFERED_FALLBACK
    if fd < 0:
        fd = fs.open_write(path, direct=False)
    try:
        crcs = _write_all(fs, fd, data, chunk_bytes, threads)
    except OSError as exc:
        # Some file systems accept O_DIRECT at open() and refuse it at the first write.
        if mode != IO_DIRECT or exc.errno != errno.EINVAL:
            fs.close(fd)
            raise
        fs.close(fd)
        fd = fs.open_write(path, direct=False)
        mode = IO_BUFFERED_FALLBACK
        try:
            crcs = _write_all(fs, fd, data, chunk_bytes, threads)
        except OSError:
            fs.close(fd)
            raise
    return WrittenFile(fd=fd, nbytes=len(data), crc32=crcs, io_mode=mode)


def _write_all(fs: LocalFS, fd: int, data: memoryview, chunk: int, threads: int) -> list[int]:
    spans = _chunks(len(data), chunk)
    if len(spans) <= 1 or threads <= 1:
        return [_write_chunk(fs, fd, data[o : o + n], o) for o, n in spans]
    with ThreadPoolExecutor(max_workers=threads, thread_name_prefix="ckpt-write") as pool:
        futures = [pool.submit(_write_chunk, fs, fd, data[o : o + n], o) for o, n in spans]
        return [f.result() for f in futures]


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
    mode = IO_BUFFERED
    fd = -1
    if direct and nbytes % ALIGN == 0:
        try:
            fd = fs.open_read(path, direct=True)
            mode = IO_DIRECT
        except OSError as exc:
            if exc.errno != errno.EINVAL:
                raise
            mode = IO_BUFFERED_FALLBACK
    if fd < 0:
        fd = fs.open_read(path, direct=False)
    view = buffer.view(nbytes)

    def read_chunk(offset: int, n: int) -> int:
        done = 0
        while done < n:
            got = fs.preadinto(fd, view[offset + done : offset + n], offset + done)
            if got <= 0:
                raise OSError(errno.EIO, f"{path} is shorter than its manifest says")
            done += got
        return zlib.crc32(view[offset : offset + n])

    try:
        spans = _chunks(nbytes, chunk_bytes)
        with ThreadPoolExecutor(max_workers=threads, thread_name_prefix="ckpt-read") as pool:
            crcs = [f.result() for f in [pool.submit(read_chunk, o, n) for o, n in spans]]
    finally:
        fs.close(fd)
    return view, crcs, mode
