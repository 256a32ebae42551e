"""Checkpoint directories on the volume: commit protocol, discovery, verification, retention.

A checkpoint for step N is written into ``.step-0000000N.tmp-PID/``: the state file, then
``MANIFEST.json`` (sizes, per-chunk checksums and their algorithm), each fsynced; the directory is then renamed
to ``step-0000000N/`` and the parent fsynced. A directory is a checkpoint only under its
final name *and* with a manifest that parses and matches the bytes, so a crash at any point
leaves at worst a ``.tmp`` directory that is never taken for a good checkpoint.
"""

from __future__ import annotations

import json
import os
import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trainer.ckpt import checksum as checksums
from trainer.ckpt.fs import LocalFS
from trainer.ckpt.io import ALIGN, AlignedBuffer, WrittenFile, read_image, stripe_sizes
from trainer.errors import CheckpointCorruptError

MANIFEST = "MANIFEST.json"
MANIFEST_SCHEMA = "checkpoint-manifest/1"
_FINAL = re.compile(r"^step-(\d{8})$")
# In-progress (.tmp) and replaced (.old) copies; neither is ever a checkpoint.
_HIDDEN = re.compile(r"^\.step-(\d{8})\.(?:tmp|old)-(\d+)$")


def final_name(step: int) -> str:
    return f"step-{step:08d}"


def tmp_name(step: int) -> str:
    return f".step-{step:08d}.tmp-{os.getpid()}"


def old_name(step: int) -> str:
    return f".step-{step:08d}.old-{os.getpid()}"


def manifest_for(
    step: int,
    fmt: str,
    filename: str,
    written: WrittenFile | list[WrittenFile],
    layout: str = "striped",
) -> dict[str, Any]:
    """The manifest of a checkpoint whose ``written`` files are complete.

    ``layout`` "striped": the files hold one image, chunk k in file k mod N (one file: the
    image itself); "files": independent files a library wrote (dcp, safetensors). Each
    file's checksums are stored under the algorithm's name, ``checksum`` names it
    (manifests without it are CRC32).
    """
    files = written if isinstance(written, list) else [written]
    return {
        "schema": MANIFEST_SCHEMA,
        "step": step,
        "format": fmt,
        "created_at": time.time(),
        "io_mode": files[0].io_mode,
        "checksum": files[0].checksum,
        "layout": layout,
        "files": [
            {
                "name": f.name or filename,
                "bytes": f.nbytes,
                "chunk_bytes": f.chunk_bytes,
                f.checksum: f.checksums,
            }
            for f in files
        ],
    }


def commit(
    fs: LocalFS, tmp_dir: Path, final_dir: Path, manifest: dict[str, Any], durable: bool
) -> None:
    """Write the manifest, then atomically publish ``tmp_dir`` as ``final_dir``.

    An existing ``final_dir`` (a resumed run saving a step again, over a copy that failed
    verification) is moved aside first and deleted only once the new one is published.
    """
    fs.write_small(tmp_dir / MANIFEST, json.dumps(manifest, indent=1).encode(), durable=durable)
    if durable:
        fs.fsync_dir(tmp_dir)
    replaced = None
    if final_dir.exists():
        replaced = final_dir.with_name(old_name(manifest["step"]))
        fs.rename(final_dir, replaced)
    fs.rename(tmp_dir, final_dir)
    if durable:
        fs.fsync_dir(final_dir.parent)
    if replaced is not None:
        fs.rmtree(replaced)


@dataclass(frozen=True)
class CheckpointRef:
    step: int
    path: Path


def list_checkpoints(directory: Path) -> list[CheckpointRef]:
    """Published checkpoint directories, newest first (not yet verified)."""
    refs = []
    for entry in directory.iterdir() if directory.is_dir() else []:
        match = _FINAL.match(entry.name)
        if match and entry.is_dir():
            refs.append(CheckpointRef(int(match.group(1)), entry))
    return sorted(refs, key=lambda r: r.step, reverse=True)


def read_manifest(path: Path) -> dict[str, Any]:
    try:
        manifest = json.loads((path / MANIFEST).read_text())
    except FileNotFoundError:
        raise CheckpointCorruptError(f"{path.name}: no {MANIFEST} (incomplete)") from None
    except (OSError, ValueError) as exc:
        raise CheckpointCorruptError(f"{path.name}: unreadable {MANIFEST}: {exc}") from None
    if manifest.get("schema") != MANIFEST_SCHEMA or not manifest.get("files"):
        raise CheckpointCorruptError(f"{path.name}: {MANIFEST} is not a {MANIFEST_SCHEMA}")
    return manifest


def read_verified(
    fs: LocalFS, path: Path, buffer: AlignedBuffer
) -> tuple[dict[str, Any], memoryview | None]:
    """Read a checkpoint's files and check them against the manifest.

    Returns:
        The manifest and, for a striped image (raw, torch), the image in ``buffer``; for
        library-written files (dcp, safetensors) None: they verified, the library loads them.

    Raises:
        CheckpointCorruptError: Missing or malformed manifest, missing or short file, a read
            error, or a checksum mismatch.
    """
    manifest = read_manifest(path)
    algorithm = manifest.get("checksum", checksums.LEGACY)
    layout = manifest.get("layout", "striped")
    try:
        checksums.get(algorithm)
    except ValueError as exc:
        raise CheckpointCorruptError(f"{path.name}: {exc}") from None
    if layout not in ("striped", "files"):
        raise CheckpointCorruptError(f"{path.name}: {MANIFEST} has an unknown layout {layout!r}")
    try:
        entries = [
            (e["name"], e["bytes"], e["chunk_bytes"], e[algorithm]) for e in manifest["files"]
        ]
    except (KeyError, IndexError, TypeError):
        raise CheckpointCorruptError(f"{path.name}: {MANIFEST} lacks a file entry") from None
    for name, nbytes, chunk, _ in entries:
        if not (isinstance(chunk, int) and chunk > 0 and chunk % ALIGN == 0):
            raise CheckpointCorruptError(
                f"{path.name}: {MANIFEST} has an invalid chunk size {chunk!r}"
            )
        if not isinstance(name, str) or "/" in name or name in ("", ".", ".."):
            raise CheckpointCorruptError(f"{path.name}: {MANIFEST} names a file {name!r}")
        try:
            size = (path / name).stat().st_size
        except FileNotFoundError:
            raise CheckpointCorruptError(f"{path.name}: {name} is missing") from None
        if size != nbytes:
            raise CheckpointCorruptError(
                f"{path.name}: {name} has {size} bytes, manifest says {nbytes}"
            )
    if layout == "striped":
        chunk = entries[0][2]
        total = sum(e[1] for e in entries)
        if any(e[2] != chunk for e in entries) or [e[1] for e in entries] != stripe_sizes(
            total, chunk, len(entries)
        ):
            raise CheckpointCorruptError(f"{path.name}: {MANIFEST} file sizes do not form a stripe")
        data, got = _read(fs, path, [path / e[0] for e in entries], total, buffer, chunk, algorithm)
    else:
        data, got = None, []
        for name, nbytes, chunk, _ in entries:
            # Files a library wrote, read through once here and again by the library.
            _, (values,) = _read(fs, path, [path / name], nbytes, buffer, chunk, algorithm)
            got.append(values)
    for (name, _, _, expected), values in zip(entries, got, strict=True):
        if values != expected:
            bad = next(
                (i for i, (a, b) in enumerate(zip(values, expected, strict=False)) if a != b),
                len(values),
            )
            raise CheckpointCorruptError(f"{path.name}: checksum mismatch in chunk {bad} of {name}")
    return manifest, data


def _read(
    fs: LocalFS,
    path: Path,
    files: list[Path],
    nbytes: int,
    buffer: AlignedBuffer,
    chunk: int,
    algorithm: str,
) -> tuple[memoryview, list[list[int]]]:
    try:
        data, values, _ = read_image(
            fs, files, nbytes, buffer, direct=True, chunk_bytes=chunk, checksum=algorithm
        )
    except OSError as exc:
        raise CheckpointCorruptError(f"{path.name}: reading {files[0].name} failed: {exc}") from exc
    return data, values


def apply_retention(fs: LocalFS, directory: Path, keep: int, newest_step: int) -> list[Path]:
    """Keep the ``keep`` newest checkpoints up to ``newest_step`` (just made durable).

    Checkpoints above ``newest_step`` are left alone: they are what a resumed run skipped
    (incomplete or corrupt), and must not push good ones out of the count.
    """
    removed = []
    for ref in [r for r in list_checkpoints(directory) if r.step <= newest_step][keep:]:
        fs.rmtree(ref.path)
        removed.append(ref.path)
    return removed


def remove_stale_tmp(fs: LocalFS, directory: Path) -> list[Path]:
    """Delete ``.tmp``/``.old`` directories left by writers that are no longer alive."""
    removed = []
    for entry in directory.iterdir():
        match = _HIDDEN.match(entry.name)
        if not match:
            continue
        pid = int(match.group(2))
        if pid != os.getpid() and _alive(pid):
            continue
        fs.rmtree(entry)
        removed.append(entry)
    return removed


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # it exists, under another user
    return True
