"""The generated dataset: records, the two on-volume formats, the manifest, verification.

A record is a 3 x H x W uint8 image (H = W) and an integer label, generated from the seed
alone, so nothing is downloaded and every profile reads the same bytes. On the volume a
record is a small JSON header (label, shape, codec, the CRC32 of the decoded image) and the
payload: the image's bytes as they are (codec ``none``, the default) or zlib-compressed
(``zlib``, when the user wants inflating on the CPU in the measurement). Decoding a record
parses its header, inflates the payload if compressed, verifies its CRC32 and makes the
uint8 tensor over the bytes read (``torch.frombuffer``, no copy). The default codec keeps
the decoding cheap, so that a scan measures the volume rather than the loader's CPU
(profiled: zlib took 1.1 ms of a core per 128 KiB record, the volume delivers one in 0.4).

- ``webdataset``: tar shards ``shard-NNNNNN.tar``; each sample is two members with the same
  key, ``KEY.json`` and ``KEY.u8`` (``KEY.u8.zlib`` compressed), the WebDataset convention,
  so the ``webdataset`` package reads these shards as they are. They are written with the
  standard library's ``tarfile`` and read by :func:`iter_tar_samples`, a streaming reader
  of the same USTAR format (``tarfile`` spent 150 µs of Python per member header).
- ``files``: one file per record, ``NNNN/KEY.rec`` (a 4-byte header length, the header, the
  payload), a thousand per directory.

The dataset lives in ``<data dir>/<format>/`` with a ``manifest.json`` that records how it
was generated and every file's size and CRC32. It is generated into a hidden directory and
renamed into place only once complete and fsynced, then reused by every later run on the
claim, after :func:`open_dataset` has checked that it is the one asked for and intact.
"""

from __future__ import annotations

import errno
import io
import json
import math
import os
import random
import struct
import tarfile
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any, get_args

import torch

try:  # same CRC32 values and zlib streams as zlib, several times faster (a dependency)
    from isal import isal_zlib as _fast_zlib
except ImportError:  # pragma: no cover - isal is installed with the package
    _fast_zlib = zlib  # type: ignore[assignment]

from checkpoint_storage_bench.contract import DATASET_MANIFEST_SCHEMA
from data_workloads import formats
from data_workloads.config import Codec
from data_workloads.errors import (
    DataDirError,
    DatasetCorruptError,
    DatasetMismatchError,
    DatasetMissingError,
    StorageFullError,
)
from data_workloads.scratch import ScratchDir
from data_workloads.stats import write_back

MANIFEST = "manifest.json"
CODECS: tuple[str, ...] = get_args(Codec)
PAYLOAD_EXT = {"none": "u8", "zlib": "u8.zlib"}
"""The payload member's extension for each codec (WebDataset: the extension names the
decoder)."""
HEADER_EXT = "json"
RECORDS_PER_DIR = 1000
LABELS = 1000
_HEADER_LEN = struct.Struct("<I")
# Four bits of entropy per byte: the payload compresses to about half, so that decoding
# (inflating) costs what it does for real image data, not nothing.
_NIBBLES = bytes(b & 0x0F for b in range(256))
SHARDED = ("webdataset", "parquet", "mds")
"""The formats of shards (many records a file), read shard by shard; ``files`` is one
record a file."""
READ_CHUNK = 1024**2
TAR_BLOCK = 512
_ZERO_BLOCK = bytes(TAR_BLOCK)
crc32 = _fast_zlib.crc32


def open_data_file(path: str | Path) -> int:
    """A file of the verified dataset opened for reading (a file descriptor).

    Raises:
        DatasetCorruptError: It was deleted after the verification (exit 6, as a file
            changed since), named.
    """
    try:
        return os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        raise gone(path) from None


def gone(path: str | Path) -> DatasetCorruptError:
    """The error for a file of the verified dataset that is not there any more."""
    return DatasetCorruptError(
        f"dataset file {path} is gone: deleted after the dataset was verified"
    )


@dataclass(frozen=True)
class DatasetSpec:
    """What identifies a generated dataset: a dataset of other values is another dataset."""

    format: str
    seed: int
    dataset_size: int
    record_size: int
    shard_size: int
    codec: str = "none"
    row_group_size: int = 1024**2

    @property
    def side(self) -> int:
        """H = W of a record's image."""
        return max(8, math.isqrt(self.record_size // 3))

    @property
    def record_bytes(self) -> int:
        """Decoded bytes of one record (3 x side x side)."""
        return 3 * self.side * self.side

    @property
    def records(self) -> int:
        return max(1, self.dataset_size // self.record_bytes)

    @property
    def records_per_shard(self) -> int:
        return max(1, self.shard_size // self.record_bytes)

    @property
    def records_per_group(self) -> int:
        """parquet: records per row group (at most a file's)."""
        return min(self.records_per_shard, max(1, self.row_group_size // self.record_bytes))

    def identity(self) -> dict[str, Any]:
        """The manifest fields a reused dataset must match."""
        return {
            "format": self.format,
            "seed": self.seed,
            "dataset_size": self.dataset_size,
            "record_size": self.record_size,
            "shard_size": self.shard_size if self.format in SHARDED else None,
            "row_group_size": self.row_group_size if self.format == "parquet" else None,
            "codec": self.codec,
            "records": self.records,
        }


@dataclass(frozen=True)
class Dataset:
    """A verified dataset on the volume.

    Attributes:
        root: Its directory.
        spec: How it was generated.
        files: Every data file, in generation order, absolute.
        bytes: Their total size on the volume.
        generated: Whether this run generated it (False: reused).
        sizes: Each file's size, as verified.
    """

    root: Path
    spec: DatasetSpec
    files: tuple[Path, ...]
    bytes: int
    generated: bool
    sizes: tuple[int, ...]

    @property
    def records(self) -> int:
        return self.spec.records


# ------------------------------------------------------------------------------ records


def record(spec: DatasetSpec, index: int) -> tuple[int, bytes]:
    """The label and decoded payload of record ``index`` (a function of seed and index)."""
    rng = random.Random(spec.seed * 1_000_003 + index)
    return rng.randrange(LABELS), rng.randbytes(spec.record_bytes).translate(_NIBBLES)


def encode(spec: DatasetSpec, index: int) -> tuple[bytes, bytes]:
    """A record as stored: its JSON header and its payload (compressed for codec ``zlib``)."""
    _key, header, payload, _label = encode_row(spec, index)
    return header, payload


def encode_row(spec: DatasetSpec, index: int) -> tuple[str, bytes, bytes, int]:
    """A record as a row of the columnar formats: key, JSON header, payload, label."""
    label, raw = record(spec, index)
    header = json.dumps(
        {
            "label": label,
            "shape": [3, spec.side, spec.side],
            "codec": spec.codec,
            "crc32": crc32(raw),
        }
    ).encode()
    payload = zlib.compress(raw, 1) if spec.codec == "zlib" else raw
    return f"{index:08d}", header, payload, label


def _header_fields(header: bytes | bytearray | memoryview) -> tuple[tuple[int, ...], str, int, int]:
    """(shape, codec, CRC32 of the image, label) of a record's JSON header."""
    try:
        meta = json.loads(str(header, "utf-8"))  # a str: json.loads would detect the encoding
        shape = tuple(int(n) for n in meta["shape"])
        return shape, meta["codec"], int(meta["crc32"]), int(meta["label"])
    except (KeyError, TypeError) as exc:
        raise ValueError(f"the record's header {bytes(header[:80])!r} lacks {exc}") from None


def decode(header: bytes, payload: bytes | bytearray | memoryview) -> tuple[torch.Tensor, int]:
    """Decode a stored record into the uint8 image tensor (C, H, W) and its label.

    An uncompressed payload in a writable buffer (a ``bytearray`` the record was read into)
    becomes the tensor's memory as it is; a read-only one is copied first (a tensor may be
    written to).

    Raises:
        ValueError: The header or payload does not decode, the sizes disagree, or the
            image fails its CRC32.
    """
    shape, codec, want_crc, label = _header_fields(header)
    if codec == "zlib":
        raw: bytes | bytearray | memoryview = bytearray(_fast_zlib.decompress(payload))
    elif codec == "none":
        raw = payload if not memoryview(payload).readonly else bytearray(payload)
    else:
        raise ValueError(f"unknown codec {codec!r} in the record's header")
    if len(raw) != math.prod(shape):
        raise ValueError(f"payload of {len(raw)} bytes for shape {shape}")
    if crc32(raw) != want_crc:
        raise ValueError(f"the image of shape {shape} fails its CRC32 check")
    image = torch.frombuffer(raw, dtype=torch.uint8).view(shape)
    return image, label


def decode_into(
    header: bytes,
    image: memoryview,
    shape: tuple[int, ...],
    codec: str,
    payload: bytes | bytearray | memoryview | None = None,
) -> int:
    """Decode a stored record into ``image``, the bytes of its place in a batch; returns
    its label. For codec ``none`` the payload was read into ``image`` already (nothing to
    copy): decoding is the header, the shape and the CRC32 of those bytes; for ``zlib``
    ``payload`` is inflated into it.

    Raises:
        ValueError: The header does not decode, the record is not of the dataset's shape
            or codec, the payload's size disagrees, or the image fails its CRC32.
    """
    got, stored, want_crc, label = _header_fields(header)
    if stored != codec:
        raise ValueError(f"a record stored with codec {stored!r} in a dataset of {codec!r}")
    if got != shape:
        raise ValueError(f"a record of shape {got} in a dataset of shape {shape}")
    if codec == "zlib":
        raw = _fast_zlib.decompress(payload)
        if len(raw) != len(image):
            raise ValueError(f"payload of {len(raw)} bytes for shape {shape}")
        image[:] = raw
    if crc32(image) != want_crc:
        raise ValueError(f"the image of shape {shape} fails its CRC32 check")
    return label


def pack_file_record(header: bytes, payload: bytes) -> bytes:
    """A record of the ``files`` format: header length, header, payload."""
    return _HEADER_LEN.pack(len(header)) + header + payload


def unpack_file_record(data: bytearray | bytes) -> tuple[bytes, memoryview]:
    """The header and the payload (a view of ``data``, not a copy) of a ``files`` record."""
    (n,) = _HEADER_LEN.unpack_from(data)
    if 4 + n > len(data):
        raise ValueError(f"record of {len(data)} bytes with a header of {n}")
    return bytes(data[4 : 4 + n]), memoryview(data)[4 + n :]


def read_file(path: Path) -> bytearray:
    """A whole file into a new buffer, one ``read`` into it (no copy afterwards).

    Raises:
        ValueError: The file is shorter than it was a moment before.
    """
    with open(open_data_file(path), "rb", buffering=0) as f:
        size = os.fstat(f.fileno()).st_size
        data = bytearray(size)
        got = f.readinto(data)
    if got != size:
        raise ValueError(f"{path}: read {got} of its {size} bytes")
    return data


def read_file_record_into(
    path: str, size: int, image: memoryview, shape: tuple[int, ...], codec: str, scratch: bytearray
) -> int:
    """Read and decode the ``files`` record at ``path`` (``size`` bytes, as verified) into
    ``image``; returns its label. Codec ``none``: one ``preadv`` puts the record's header
    into ``scratch`` and its image straight into ``image`` (its size fixes the header's);
    ``zlib``: the file into ``scratch``, inflated into ``image``.

    Raises:
        ValueError: The file is shorter than it was, or its record does not decode.
    """
    head = size - len(image) if codec == "none" else size
    if head < _HEADER_LEN.size:
        raise ValueError(f"record of {size} bytes, too short for an image of {len(image)}")
    if len(scratch) < head:
        scratch.extend(bytes(head - len(scratch)))
    buf = memoryview(scratch)[:head]
    fd = open_data_file(path)
    try:
        got = os.preadv(fd, [buf, image] if codec == "none" else [buf], 0)
    finally:
        os.close(fd)
    if got != size:
        raise ValueError(f"read {got} of its {size} bytes")
    if codec == "none":
        (n,) = _HEADER_LEN.unpack_from(buf)
        if _HEADER_LEN.size + n != head:
            raise ValueError(f"record of {size} bytes with a header of {n}")
        return decode_into(bytes(buf[_HEADER_LEN.size :]), image, shape, codec)
    header, payload = unpack_file_record(buf)
    return decode_into(header, image, shape, codec, payload)


def _octal(field: bytes) -> int:
    if field[:1] == b"\x80":  # GNU base-256 for sizes of 8 GiB and more
        return int.from_bytes(field[1:], "big")
    return int(field.strip(b" \0") or b"0", 8)


def _tar_member(block: bytes) -> tuple[str, int, bytes]:
    """(name, size, type) of a USTAR header block, its checksum verified."""
    # The checksum is the sum of the header's bytes with its own field read as spaces.
    try:
        stored = _octal(block[148:156])
    except ValueError:
        stored = -1
    if stored != sum(block) - sum(block[148:156]) + 8 * 32:
        raise ValueError("a tar header fails its checksum (not a tar file, or damaged)")
    name = block[:100].split(b"\0", 1)[0].decode()
    if block[257:262] == b"ustar":
        prefix = block[345:500].split(b"\0", 1)[0].decode()
        if prefix:
            name = f"{prefix}/{name}"
    return name, _octal(block[124:136]), block[156:157]


class TarStream:
    """A tar file read front to back in reads of :data:`READ_CHUNK` bytes into one staging
    buffer (reused), its regular members copied from there into the caller's buffers: the
    reads stay large and sequential, as a streaming WebDataset reader's, whatever the size
    of the members.

    ``readinto`` reads into the buffer it is given and returns the bytes read (0 at the
    end): a raw file's ``readinto`` is one ``read`` system call.
    """

    def __init__(self, readinto: Callable[[memoryview], int], staging: memoryview | None = None):
        self._readinto = readinto
        self._buf = staging if staging is not None else memoryview(bytearray(2 * READ_CHUNK))
        if len(self._buf) < READ_CHUNK + TAR_BLOCK:
            raise ValueError(f"a staging buffer of {len(self._buf)} bytes is too small")
        self._pos = self._end = 0
        self._left = 0  # bytes of the current member not taken yet
        self._padding = 0
        self._name = ""

    def _fill(self) -> int:
        """Read the next chunk behind what is buffered; returns the bytes read."""
        if self._pos == self._end:
            self._pos = self._end = 0
        elif self._end + READ_CHUNK > len(self._buf):  # keep the unread tail, move it first
            tail = self._end - self._pos
            self._buf[:tail] = self._buf[self._pos : self._end]
            self._pos, self._end = 0, tail
        got = self._readinto(self._buf[self._end : self._end + READ_CHUNK])
        self._end += got
        return got

    def _skip(self, n: int) -> bool:
        while n:
            if self._pos == self._end and not self._fill():
                return False
            step = min(n, self._end - self._pos)
            self._pos += step
            n -= step
        return True

    def members(self) -> Iterator[tuple[str, int]]:
        """(name, size) of each regular member, in order; what the caller does not take
        of a member before the next is skipped. Directories and other non-file members are
        skipped; pax and GNU extended headers are refused (the shards are USTAR).

        Raises:
            ValueError: A header is damaged, the file ends inside a header or a member or
                without its end-of-archive block, or a member is an extended header.
        """
        while True:
            if not self._skip(self._left + self._padding):
                raise ValueError(f"tar member {self._name!r} is truncated")
            self._left = self._padding = 0
            while self._end - self._pos < TAR_BLOCK and self._fill():
                pass
            avail = self._end - self._pos
            if avail == 0:
                raise ValueError("the tar file ends without its end-of-archive block (truncated)")
            if avail < TAR_BLOCK:
                raise ValueError("the tar file ends inside a header (truncated)")
            block = bytes(self._buf[self._pos : self._pos + TAR_BLOCK])
            self._pos += TAR_BLOCK
            if block == _ZERO_BLOCK:
                return
            name, size, kind = _tar_member(block)
            if kind in (b"x", b"g", b"L", b"K"):
                raise ValueError(f"tar member {name!r} is a pax or GNU extended header: not read")
            self._name, self._left, self._padding = name, size, -size % TAR_BLOCK
            if kind in (b"0", b"\0"):
                yield name, size

    def take(self, dst: memoryview | bytearray) -> None:
        """Copy the next ``len(dst)`` bytes of the current member into ``dst``.

        Raises:
            ValueError: The member is shorter, or the file ends inside it.
        """
        n = len(dst)
        if n > self._left:
            raise ValueError(f"tar member {self._name!r} has {self._left} bytes left, not {n}")
        done = 0
        while done < n:
            if self._pos == self._end and not self._fill():
                raise ValueError(f"tar member {self._name!r} is truncated")
            step = min(n - done, self._end - self._pos)
            dst[done : done + step] = self._buf[self._pos : self._pos + step]
            self._pos += step
            done += step
        self._left -= n

    def read(self) -> bytearray:
        """The rest of the current member, in a new buffer."""
        data = bytearray(self._left)
        self.take(data)
        return data


def sample_span(record_bytes: int) -> int:
    """Bytes of one sample in a shard of uncompressed records, as :func:`generate` writes
    it: the JSON member's header block, its data (one block), the image's header block,
    the image padded to whole blocks."""
    return 3 * TAR_BLOCK + -(-record_bytes // TAR_BLOCK) * TAR_BLOCK


class PlacedShard:
    """A shard of ``samples`` uncompressed records of ``record_bytes`` (codec ``none``)
    read in :data:`READ_CHUNK`-byte ``preadv`` calls, as :class:`TarStream` reads, that
    scatter each chunk where its bytes belong: the three header blocks of a sample into a
    small buffer, its image straight into the buffer ``place(j)`` returns for sample ``j``
    (its row in a batch), the padding aside. Nothing is copied afterwards; every header is
    then verified (checksum, name, type, size), so a shard laid out otherwise than the
    generator lays it out is an error, never misread.

    The layout is known before anything is read: every sample takes
    :func:`sample_span` bytes, and the end-of-archive block follows the last one.
    """

    def __init__(self, path: str, size: int, samples: int, record_bytes: int) -> None:
        self.path, self.size, self.samples = path, size, samples
        self.record_bytes = record_bytes
        self.span = sample_span(record_bytes)
        self.end_of_samples = samples * self.span
        if size < self.end_of_samples + 2 * TAR_BLOCK:
            raise ValueError(
                f"a shard of {size} bytes cannot hold {samples} samples of {record_bytes} bytes"
            )

    def _pieces(
        self, start: int, end: int, place: Callable[[int], memoryview], heads: memoryview,
        tail: memoryview, pad: memoryview,
    ) -> list[memoryview]:  # fmt: skip
        """The buffers bytes ``start`` to ``end`` of the file go into, in order."""
        pieces = []
        at = start
        head, image_end = 3 * TAR_BLOCK, 3 * TAR_BLOCK + self.record_bytes
        while at < end:
            if at >= self.end_of_samples:
                within = at - self.end_of_samples
                pieces.append(tail[within : within + end - at])
                break
            j, within = divmod(at, self.span)
            if within < head:
                part = heads[j * head + within : (j + 1) * head]
            elif within < image_end:
                part = place(j)[within - head :]
            else:
                part = pad[: self.span - within]
            part = part[: end - at]
            pieces.append(part)
            at += len(part)
        return pieces

    def read(self, place: Callable[[int], memoryview]) -> Iterator[tuple[int, str, bytes]]:
        """``(j, key, JSON header)`` of each sample, in order, once its image is in
        ``place(j)`` and its tar headers are verified. ``place`` is asked for each sample's
        buffer once, in order, before the chunk its image starts in is read.

        Raises:
            ValueError: The file is shorter than it was, or a header is damaged or not
                where the generator puts it.
        """
        head = 3 * TAR_BLOCK
        heads = memoryview(bytearray(head * self.samples))
        tail = memoryview(bytearray(self.size - self.end_of_samples))
        pad = memoryview(bytearray(self.span))
        placed: dict[int, memoryview] = {}

        def placed_once(j: int) -> memoryview:
            if j not in placed:
                placed[j] = place(j)
            return placed[j]

        done = 0
        fd = open_data_file(self.path)
        try:
            for start in range(0, self.size, READ_CHUNK):
                end = min(start + READ_CHUNK, self.size)
                pieces = self._pieces(start, end, placed_once, heads, tail, pad)
                got = os.preadv(fd, pieces, start)
                if got != end - start:
                    raise ValueError(f"the shard is truncated: {start + got} of {self.size} bytes")
                while done < self.samples and done * self.span + head + self.record_bytes <= end:
                    key, header = self._verify(done, heads[done * head : (done + 1) * head])
                    del placed[done]
                    yield done, key, header
                    done += 1
        finally:
            os.close(fd)
        if bytes(tail[:TAR_BLOCK]) != _ZERO_BLOCK:
            raise ValueError(f"more than the {self.samples} samples of the manifest, or damaged")

    def _verify(self, j: int, blocks: memoryview) -> tuple[str, bytes]:
        """The key and JSON header of sample ``j`` from its three header blocks."""
        json_name, json_size, json_kind = _tar_member(bytes(blocks[:TAR_BLOCK]))
        key, _, ext = json_name.partition(".")
        if ext != HEADER_EXT or json_kind not in (b"0", b"\0") or json_size > TAR_BLOCK:
            raise ValueError(
                f"sample {j} is not laid out as generated: {json_name!r} of {json_size} bytes "
                f"first (expected KEY.{HEADER_EXT} of at most {TAR_BLOCK})"
            )
        name, size, kind = _tar_member(bytes(blocks[2 * TAR_BLOCK :]))
        expected = f"{key}.{PAYLOAD_EXT['none']}"
        if name != expected or kind not in (b"0", b"\0") or size != self.record_bytes:
            raise ValueError(
                f"sample {j} is not laid out as generated: {name!r} of {size} bytes after "
                f"{json_name!r} (expected {expected} of {self.record_bytes})"
            )
        return key, bytes(blocks[TAR_BLOCK : TAR_BLOCK + json_size])


def iter_tar_samples(fileobj: Any) -> Iterator[tuple[str, bytes, bytearray]]:
    """The samples of a tar shard read as a stream, in order: (key, header, payload).

    Each member is copied from the stream's staging buffer into its own buffer; the
    payload is that buffer, which :func:`decode` makes the tensor's memory.

    Raises:
        ValueError: A header is damaged, a member is truncated, a member is of an
            extended-header type, or a sample misses one of its two members.
    """
    pending: dict[str, dict[str, bytearray]] = {}
    stream = TarStream(fileobj.readinto)
    for name, _size in stream.members():
        key, _, ext = name.partition(".")
        fields = pending.setdefault(key, {})
        fields[ext] = stream.read()
        if HEADER_EXT in fields and len(fields) == 2:
            del pending[key]
            payload = next(v for k, v in fields.items() if k != HEADER_EXT)
            yield key, bytes(fields[HEADER_EXT]), payload
    if pending:
        raise ValueError(f"incomplete samples: {', '.join(sorted(pending))}")


def add_tar_member(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    info.mtime = 0
    tar.addfile(info, io.BytesIO(data))


# ---------------------------------------------------------------------- on the volume


def drop_cache(paths: tuple[Path, ...] | list[Path]) -> None:
    """Ask the kernel to drop the page cache of these files, so that the next read comes
    from the volume. The kernel drops clean pages only: the file system's dirty pages are
    written back first (:func:`~data_workloads.stats.write_back`, once per file system),
    since a dataset copied in by another program is not fsynced as ours are."""
    synced: set[int] = set()
    for path in paths:
        fd = open_data_file(path)
        try:
            device = os.fstat(fd).st_dev
            if device not in synced:
                write_back(fd)
                synced.add(device)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def crc32_file(path: Path) -> int:
    crc = 0
    with path.open("rb", buffering=0) as f:
        while chunk := f.read(READ_CHUNK):
            crc = crc32(chunk, crc)
    return crc


def storage_error(exc: OSError, what: str) -> Exception:
    """The part's error for an OSError while writing ``what``."""
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        return StorageFullError(f"no space left on the volume while writing {what}")
    if exc.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
        return DataDirError(f"cannot write {what}: {exc.strerror}")
    return exc


def _write_fsynced(path: Path, data: bytes) -> None:
    with path.open("wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


def _generate_into(tmp: Path, spec: DatasetSpec) -> list[Path]:
    files: list[Path] = []
    if spec.format == "webdataset":
        for first in range(0, spec.records, spec.records_per_shard):
            path = tmp / f"shard-{first // spec.records_per_shard:06d}.tar"
            with path.open("wb") as f:
                with tarfile.open(fileobj=f, mode="w", format=tarfile.USTAR_FORMAT) as tar:
                    for i in range(first, min(first + spec.records_per_shard, spec.records)):
                        header, payload = encode(spec, i)
                        add_tar_member(tar, f"{i:08d}.{HEADER_EXT}", header)
                        add_tar_member(tar, f"{i:08d}.{PAYLOAD_EXT[spec.codec]}", payload)
                f.flush()
                os.fsync(f.fileno())
            files.append(path)
    elif spec.format == "parquet":
        files = formats.write_parquet(
            tmp, spec.records, spec.records_per_shard, spec.records_per_group,
            partial(encode_row, spec),
        )  # fmt: skip
    elif spec.format == "mds":
        files = formats.write_mds(tmp, spec.records, spec.shard_size, partial(encode_row, spec))
    else:
        for i in range(spec.records):
            sub = tmp / f"{i // RECORDS_PER_DIR:04d}"
            if i % RECORDS_PER_DIR == 0:
                sub.mkdir()
            path = sub / f"{i:08d}.rec"
            _write_fsynced(path, pack_file_record(*encode(spec, i)))
            files.append(path)
        for sub in sorted({p.parent for p in files}):
            fsync_dir(sub)
    return files


def generate(root: Path, spec: DatasetSpec) -> bool:
    """Generate the dataset at ``root`` (missing, or an empty directory): into a hidden
    sibling directory of this run's own (:class:`~data_workloads.scratch.ScratchDir`),
    renamed into place once every file and the manifest are durable.

    Returns:
        True, or False when another run put its dataset at ``root`` first (ours is then
        removed: the caller verifies theirs, which is ours when it matches this spec).
    """
    scratch = ScratchDir(root.parent, f"{root.name}.generating")
    tmp = scratch.path
    try:
        scratch.create()
        files = _generate_into(tmp, spec)
        manifest = {
            "schema": DATASET_MANIFEST_SCHEMA,
            **spec.identity(),
            "files": [
                {"path": str(p.relative_to(tmp)), "bytes": p.stat().st_size, "crc32": crc32_file(p)}
                for p in files
            ],
        }
        _write_fsynced(tmp / MANIFEST, json.dumps(manifest, indent=1).encode())
        scratch.disown()  # the dataset in place has no owner file
        fsync_dir(tmp)
        try:
            os.rename(tmp, root)
        except OSError as exc:
            if exc.errno not in (errno.ENOTEMPTY, errno.EEXIST):
                raise
            scratch.remove()  # another run's dataset is in place: the caller verifies it
            return False
        scratch.release()
        fsync_dir(root.parent)
        return True
    except OSError as exc:
        scratch.remove()
        raise storage_error(exc, f"the dataset in {tmp}") from exc
    except BaseException:
        scratch.remove()
        raise


def open_dataset(data_dir: Path, spec: DatasetSpec, allow_generate: bool = True) -> Dataset:
    """The dataset ``spec`` in ``data_dir``, generated when missing (``allow_generate``),
    else verified: the manifest must be this spec's, and every file must have its size
    and CRC32 (so a truncated or altered file is found before anything is measured).

    Raises:
        DatasetMissingError: No dataset, and generating one is not allowed.
        DataDirError: The directory holds files but no manifest of ours (left alone).
        DatasetMismatchError: The dataset there was generated with other settings.
        DatasetCorruptError: A file is missing, truncated, or fails its checksum.
    """
    root = data_dir / spec.format
    if root.is_symlink():
        # Generating would write into wherever it points (or fail renaming over the link),
        # and a dataset there is outside the data dir, where nothing of ours is written.
        raise DataDirError(
            f"{root} is a symbolic link (to {os.readlink(root)}): the dataset must be a "
            "directory of its own in the data dir; remove the link or use another --data-dir"
        )
    generated = False
    if not root.exists() or (root.is_dir() and not any(root.iterdir())):
        if not allow_generate:
            raise DatasetMissingError(
                f"no {spec.format} dataset in {data_dir} (expected {root}/{MANIFEST}); "
                "run once with --generate"
            )
        # An empty directory is replaced by the rename (nothing of anyone's is lost).
        generated = generate(root, spec)
    manifest_path = root / MANIFEST
    if not manifest_path.is_file():
        raise DataDirError(
            f"{root} holds files but no {MANIFEST}: not a dataset generated here, left alone"
        )
    try:
        manifest = json.loads(manifest_path.read_text())
        entries = [(str(e["path"]), int(e["bytes"]), int(e["crc32"])) for e in manifest["files"]]
    except (ValueError, KeyError, TypeError) as exc:
        raise DatasetCorruptError(f"{manifest_path} is unreadable: {exc}") from None
    if manifest.get("schema") != DATASET_MANIFEST_SCHEMA:
        raise DatasetMismatchError(
            f"{manifest_path}: schema {manifest.get('schema')!r}, expected "
            f"{DATASET_MANIFEST_SCHEMA!r}"
        )
    wanted = spec.identity()
    differ = [k for k, v in wanted.items() if manifest.get(k) != v]
    if differ:
        found = ", ".join(f"{k}={manifest.get(k)!r} (asked {wanted[k]!r})" for k in differ)
        raise DatasetMismatchError(
            f"the dataset in {root} is another one: {found}; use another --data-dir or the "
            "settings it was generated with"
        )
    files, sizes = [], []
    for rel, size, crc in entries:
        path = root / rel
        if not path.resolve().is_relative_to(root.resolve()):
            raise DatasetCorruptError(f"{manifest_path} names a file outside the dataset: {rel}")
        try:
            actual = path.stat().st_size
        except FileNotFoundError:
            raise DatasetCorruptError(f"dataset file {path} is missing") from None
        if actual != size:
            raise DatasetCorruptError(
                f"dataset file {path} has {actual} bytes, the manifest says {size} (truncated?)"
            )
        if crc32_file(path) != crc:
            raise DatasetCorruptError(f"dataset file {path} fails its CRC32 check")
        files.append(path)
        sizes.append(size)
    if not files:
        raise DatasetCorruptError(f"{manifest_path} lists no files")
    return Dataset(root, spec, tuple(files), sum(sizes), generated, tuple(sizes))
