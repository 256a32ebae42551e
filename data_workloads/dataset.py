"""The generated dataset: records, the two on-volume formats, the manifest, verification.

A record is a 3 x H x W uint8 image (H = W) and an integer label, generated from the seed
alone, so nothing is downloaded and every profile reads the same bytes. On the volume a
record is a small JSON header (label, shape) and a zlib-compressed payload; decoding it is
real CPU work, like decoding a JPEG.

- ``webdataset``: tar shards ``shard-NNNNNN.tar``; each sample is two members with the same
  key, ``KEY.json`` and ``KEY.u8.zlib`` (the WebDataset convention, so the ``webdataset``
  package reads these shards as they are; we read them with the standard library's
  ``tarfile``).
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
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from checkpoint_storage_bench.contract import DATASET_MANIFEST_SCHEMA
from data_workloads.errors import (
    DataDirError,
    DatasetCorruptError,
    DatasetMismatchError,
    DatasetMissingError,
    StorageFullError,
)

MANIFEST = "manifest.json"
PAYLOAD_EXT = "u8.zlib"
HEADER_EXT = "json"
RECORDS_PER_DIR = 1000
LABELS = 1000
_HEADER_LEN = struct.Struct("<I")
# Four bits of entropy per byte: the payload compresses to about half, so that decoding
# (inflating) costs what it does for real image data, not nothing.
_NIBBLES = bytes(b & 0x0F for b in range(256))
READ_CHUNK = 1024**2


@dataclass(frozen=True)
class DatasetSpec:
    """What identifies a generated dataset: a dataset of other values is another dataset."""

    format: str
    seed: int
    dataset_size: int
    record_size: int
    shard_size: int

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

    def identity(self) -> dict[str, Any]:
        """The manifest fields a reused dataset must match."""
        return {
            "format": self.format,
            "seed": self.seed,
            "dataset_size": self.dataset_size,
            "record_size": self.record_size,
            "shard_size": self.shard_size if self.format == "webdataset" else None,
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
    """

    root: Path
    spec: DatasetSpec
    files: tuple[Path, ...]
    bytes: int
    generated: bool

    @property
    def records(self) -> int:
        return self.spec.records


# ------------------------------------------------------------------------------ records


def record(spec: DatasetSpec, index: int) -> tuple[int, bytes]:
    """The label and decoded payload of record ``index`` (a function of seed and index)."""
    rng = random.Random(spec.seed * 1_000_003 + index)
    return rng.randrange(LABELS), rng.randbytes(spec.record_bytes).translate(_NIBBLES)


def encode(spec: DatasetSpec, index: int) -> tuple[bytes, bytes]:
    """A record as stored: its JSON header and its compressed payload."""
    label, raw = record(spec, index)
    header = json.dumps({"label": label, "shape": [3, spec.side, spec.side]}).encode()
    return header, zlib.compress(raw, 1)


def decode(header: bytes, payload: bytes) -> tuple[torch.Tensor, int]:
    """Decode a stored record into the uint8 image tensor (C, H, W) and its label.

    Raises:
        ValueError: The header or payload does not decode, or the sizes disagree.
    """
    meta = json.loads(header)
    shape = tuple(int(n) for n in meta["shape"])
    raw = zlib.decompress(payload)
    if len(raw) != math.prod(shape):
        raise ValueError(f"payload of {len(raw)} bytes for shape {shape}")
    image = torch.frombuffer(bytearray(raw), dtype=torch.uint8).view(shape)
    return image, int(meta["label"])


def pack_file_record(header: bytes, payload: bytes) -> bytes:
    """A record of the ``files`` format: header length, header, payload."""
    return _HEADER_LEN.pack(len(header)) + header + payload


def unpack_file_record(data: bytes) -> tuple[bytes, bytes]:
    (n,) = _HEADER_LEN.unpack_from(data)
    return data[4 : 4 + n], data[4 + n :]


def iter_tar_samples(fileobj: io.BufferedIOBase) -> Iterator[tuple[str, bytes, bytes]]:
    """The samples of a tar shard read as a stream, in order: (key, header, payload).

    Raises:
        ValueError: A sample misses one of its two members.
    """
    pending: dict[str, dict[str, bytes]] = {}
    with tarfile.open(fileobj=fileobj, mode="r|") as tar:
        for member in tar:
            if not member.isfile():
                continue
            key, _, ext = member.name.partition(".")
            data = tar.extractfile(member).read()  # type: ignore[union-attr]
            fields = pending.setdefault(key, {})
            fields[ext] = data
            if HEADER_EXT in fields and PAYLOAD_EXT in fields:
                del pending[key]
                yield key, fields[HEADER_EXT], fields[PAYLOAD_EXT]
    if pending:
        raise ValueError(f"incomplete samples: {', '.join(sorted(pending))}")


def add_tar_member(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    info.mtime = 0
    tar.addfile(info, io.BytesIO(data))


# ---------------------------------------------------------------------- on the volume


def drop_cache(paths: tuple[Path, ...] | list[Path]) -> None:
    """Ask the kernel to drop the page cache of these files (clean pages only: they are
    fsynced when written), so that the next read comes from the volume."""
    for path in paths:
        fd = os.open(path, os.O_RDONLY)
        try:
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
            crc = zlib.crc32(chunk, crc)
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
                        add_tar_member(tar, f"{i:08d}.{PAYLOAD_EXT}", payload)
                f.flush()
                os.fsync(f.fileno())
            files.append(path)
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


def generate(root: Path, spec: DatasetSpec) -> None:
    """Generate the dataset at ``root`` (which must not exist): into a hidden sibling
    directory first, renamed into place once every file and the manifest are durable."""
    tmp = root.with_name(f".{root.name}.generating-{os.getpid()}")
    try:
        tmp.mkdir()
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
        fsync_dir(tmp)
        os.rename(tmp, root)
        fsync_dir(root.parent)
    except OSError as exc:
        remove_tree(tmp)
        raise storage_error(exc, f"the dataset in {tmp}") from exc
    except BaseException:
        remove_tree(tmp)
        raise


def remove_tree(path: Path) -> None:
    """Remove a directory this run created (bottom up; never follows a link out)."""
    if not path.exists() or path.is_symlink():
        return
    for dirpath, dirnames, filenames in os.walk(path, topdown=False):
        for name in filenames:
            os.unlink(os.path.join(dirpath, name))
        for name in dirnames:
            full = os.path.join(dirpath, name)
            if os.path.islink(full):
                os.unlink(full)
            else:
                os.rmdir(full)
    os.rmdir(path)


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
    generated = False
    if not root.exists() or (root.is_dir() and not any(root.iterdir())):
        if not allow_generate:
            raise DatasetMissingError(
                f"no {spec.format} dataset in {data_dir} (expected {root}/{MANIFEST}); "
                "run once with --generate"
            )
        if root.exists():
            root.rmdir()  # empty: nothing of anyone's is lost
        generate(root, spec)
        generated = True
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
    files, total = [], 0
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
        total += size
    if not files:
        raise DatasetCorruptError(f"{manifest_path} lists no files")
    return Dataset(root, spec, tuple(files), total, generated)
