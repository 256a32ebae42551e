"""Checkpoint directories on the volume: commit protocol, discovery, verification, retention.

A checkpoint for step N is written into ``.step-0000000N.tmp-OWNER/``: the state file(s),
then ``MANIFEST.json`` (sizes, per-chunk checksums and their algorithm), each fsynced; the
directory is then renamed to ``step-0000000N/`` and the parent fsynced. A directory is a
checkpoint only under its final name *and* with a manifest that parses and matches the
bytes, so a crash at any point leaves at worst a ``.tmp`` directory that is never taken for
a good checkpoint.

OWNER is ``<run>-<host>-<pid>``: the Polyaxon run uuid (``local`` outside Polyaxon), the
pod's (or host's) name and the pid. A pid alone says nothing after a restart (pids are per
pod and are reused), so leftovers are judged by owner (:func:`remove_stale_tmp`).
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
from trainer.provenance import host_name, run_uuid

MANIFEST = "MANIFEST.json"
MANIFEST_SCHEMA = "checkpoint-manifest/1"
# The step zero-padded to 8 digits, longer past 99,999,999 (CHECKPOINT_DIR_PATTERN).
_STEP = r"(\d{8}|[1-9]\d{8,})"
_FINAL = re.compile(rf"^step-{_STEP}$")
# In-progress (.tmp) and replaced (.old) copies; neither is ever a checkpoint.
_HIDDEN = re.compile(rf"^\.step-{_STEP}\.(?:tmp|old)-(?P<owner>.*)$")
# The owner part of a hidden name this trainer writes (Owner.token); another is no owner's.
_OWNER = re.compile(r"^(?P<run>[0-9a-f]{32}|local)-(?P<host>[A-Za-z0-9-]+)-(?P<pid>\d+)$")
LOCAL_RUN = "local"
LAYOUT_STRIPED = "striped"
"""One byte image striped over the files (chunk k in file k mod N)."""
LAYOUT_FILES = "files"
"""Independent files a library wrote; each is checksummed on its own."""
LAYOUT_SHARDED = "sharded"
"""One file per rank, each its rank's shard (:mod:`trainer.ckpt.sharded`)."""
REQUIRED_FIELDS = ("step", "run_id", "format", "checksum", "layout")
"""What every manifest holds besides ``schema`` and ``files`` (``run_id`` null outside
Polyaxon); a sharded one adds ``shard_layout``, ``world_size`` and ``parallel``."""


@dataclass(frozen=True)
class Owner:
    """Who writes a temporary checkpoint directory: run, pod (or host), process."""

    run: str
    host: str
    pid: int

    @classmethod
    def current(cls) -> Owner:
        run = (run_uuid() or "").replace("-", "").lower()
        valid = re.fullmatch(r"[0-9a-f]{32}", run)
        return cls(run if valid else LOCAL_RUN, host_name(), os.getpid())

    @property
    def token(self) -> str:
        return f"{self.run}-{self.host}-{self.pid}"


def final_name(step: int) -> str:
    return f"step-{step:08d}"


def tmp_name(step: int, owner: Owner | None = None) -> str:
    return f".step-{step:08d}.tmp-{(owner or Owner.current()).token}"


def old_name(step: int, owner: Owner | None = None) -> str:
    return f".step-{step:08d}.old-{(owner or Owner.current()).token}"


def manifest_for(
    step: int,
    fmt: str,
    filename: str,
    written: WrittenFile | list[WrittenFile],
    layout: str = LAYOUT_STRIPED,
) -> dict[str, Any]:
    """The manifest of a checkpoint whose ``written`` files are complete.

    ``layout`` striped: the files hold one image, chunk k in file k mod N (one file: the
    image itself); files: independent files a library wrote (dcp, safetensors). Each
    file's checksums are stored under the algorithm's name, ``checksum`` names it.
    """
    files = written if isinstance(written, list) else [written]
    return {
        "schema": MANIFEST_SCHEMA,
        "step": step,
        # Whose checkpoint this is: --resume auto continues only its own run's.
        "run_id": run_uuid(),
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
    fs: LocalFS,
    tmp_dir: Path,
    final_dir: Path,
    manifest: dict[str, Any],
    durable: bool,
    owner: Owner | None = None,
) -> None:
    """Write the manifest, then atomically publish ``tmp_dir`` as ``final_dir``.

    An existing ``final_dir`` (a resumed run saving a step again, over a copy that failed
    verification) is moved aside first, under ``owner``'s name (default: this process),
    and deleted only once the new one is published.
    """
    fs.write_small(tmp_dir / MANIFEST, json.dumps(manifest, indent=1).encode(), durable=durable)
    if durable:
        fs.fsync_dir(tmp_dir)
    replaced = None
    if final_dir.exists():
        replaced = final_dir.with_name(old_name(manifest["step"], owner))
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
    """A checkpoint's manifest, its fields checked for type (the bytes are not read).

    Raises:
        CheckpointCorruptError: Missing, unreadable, not a manifest of this schema, without
            a field every writer writes (:data:`REQUIRED_FIELDS`: it is incomplete), or with
            fields of the wrong types: such a checkpoint is skipped, never a crash.
    """
    try:
        manifest = json.loads((path / MANIFEST).read_text())
    except FileNotFoundError:
        raise CheckpointCorruptError(f"{path.name}: no {MANIFEST} (incomplete)") from None
    except (OSError, ValueError) as exc:
        raise CheckpointCorruptError(f"{path.name}: unreadable {MANIFEST}: {exc}") from None
    if not isinstance(manifest, dict) or manifest.get("schema") != MANIFEST_SCHEMA:
        raise CheckpointCorruptError(f"{path.name}: {MANIFEST} is not a {MANIFEST_SCHEMA}")
    files = manifest.get("files")
    if not (isinstance(files, list) and files and all(isinstance(f, dict) for f in files)):
        raise CheckpointCorruptError(f"{path.name}: {MANIFEST} lacks a file entry")
    for key in REQUIRED_FIELDS:
        if key not in manifest:
            raise CheckpointCorruptError(f"{path.name}: {MANIFEST} has no field {key!r}")
    for key, kind in (("step", int), ("format", str), ("layout", str)):
        if not _is(manifest[key], kind):
            raise CheckpointCorruptError(
                f"{path.name}: {MANIFEST} field {key!r} is {manifest[key]!r}, not a {kind.__name__}"
            )
    if not (manifest["run_id"] is None or isinstance(manifest["run_id"], str)):
        raise CheckpointCorruptError(
            f"{path.name}: {MANIFEST} field 'run_id' is {manifest['run_id']!r}, not a run uuid"
        )
    # Written by several ranks (trainer.ckpt.sharded); absent in a single process's.
    for key, kind in (("world_size", int), ("parallel", str)):
        if key in manifest and not _is(manifest[key], kind):
            raise CheckpointCorruptError(
                f"{path.name}: {MANIFEST} field {key!r} is {manifest[key]!r}, not a {kind.__name__}"
            )
    if "world_size" in manifest and manifest["world_size"] < 1:
        raise CheckpointCorruptError(
            f"{path.name}: {MANIFEST} field 'world_size' is {manifest['world_size']}, not positive"
        )
    check_step(path, manifest["step"], MANIFEST)
    return manifest


def check_step(path: Path, step: Any, what: str) -> None:
    """Refuse a checkpoint whose name and content disagree on its step.

    Resume and retention go by the name, training continues from the step inside: a copy
    renamed (or two swapped) would roll training back and outlive retention, so such a
    checkpoint is corrupt, never loaded.

    Raises:
        CheckpointCorruptError: ``path`` is named for another step than ``step`` (the step
            its ``what`` records), or ``step`` is no step number.
    """
    match = _FINAL.match(path.name)
    if match is None:
        return  # a hidden (.tmp) directory has no published step yet
    if not _is(step, int) or step != int(match.group(1)):
        raise CheckpointCorruptError(
            f"{path.name}: its {what} is of step {step!r}, not the step its name says"
        )


def _is(value: Any, kind: type) -> bool:
    """``isinstance`` where a JSON ``true`` is no number."""
    return isinstance(value, kind) and not (kind is int and isinstance(value, bool))


def file_entry(
    path: Path, entry: dict[str, Any], algorithm: str
) -> tuple[str, int, int, list[int]]:
    """The name, size, chunk size and checksums of a manifest's file entry, type-checked."""
    name, nbytes, chunk, crcs = (entry.get(k) for k in ("name", "bytes", "chunk_bytes", algorithm))
    # A plain file name: a manifest must never make us read outside its own directory.
    if not (isinstance(name, str) and name and name == Path(name).name and name not in (".", "..")):
        raise CheckpointCorruptError(f"{path.name}: {MANIFEST} has an invalid file name {name!r}")
    if not (_is(nbytes, int) and nbytes >= 0):
        raise CheckpointCorruptError(f"{path.name}: {MANIFEST} has an invalid size {nbytes!r}")
    if not (_is(chunk, int) and chunk > 0 and chunk % ALIGN == 0):
        raise CheckpointCorruptError(f"{path.name}: {MANIFEST} has an invalid chunk size {chunk!r}")
    if not (
        isinstance(crcs, list)
        and all(_is(c, int) for c in crcs)
        and len(crcs) == -(-nbytes // chunk)
    ):
        raise CheckpointCorruptError(f"{path.name}: {MANIFEST} has invalid checksums for {name}")
    return name, nbytes, chunk, crcs


def checksum_algorithm(path: Path, manifest: dict[str, Any]) -> str:
    """The checksum algorithm a manifest of :func:`read_manifest` names (it checked that the
    field is there), known to this build.

    Raises:
        CheckpointCorruptError: It is no name, or one this build cannot compute.
    """
    algorithm = manifest["checksum"]
    try:
        if not isinstance(algorithm, str):
            raise ValueError(f"checksum algorithm {algorithm!r} is not a name")
        checksums.get(algorithm)
    except ValueError as exc:
        raise CheckpointCorruptError(f"{path.name}: {exc}") from None
    return algorithm


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
    algorithm = checksum_algorithm(path, manifest)
    layout = manifest["layout"]
    if layout not in (LAYOUT_STRIPED, LAYOUT_FILES):
        raise CheckpointCorruptError(f"{path.name}: {MANIFEST} has an unknown layout {layout!r}")
    # read_manifest checked that "files" is a non-empty list of objects.
    return manifest, verify_entries(fs, path, manifest["files"], layout, algorithm, buffer)


def verify_entries(
    fs: LocalFS,
    path: Path,
    files: list[dict[str, Any]],
    layout: str,
    algorithm: str,
    buffer: AlignedBuffer,
) -> memoryview | None:
    """Read the files of one process's (or one rank's) state and check their manifest
    entries ``files``.

    Returns:
        For a striped image (raw, torch), the image in ``buffer``; for library-written
        files (dcp, safetensors) None: they verified, the library loads them.

    Raises:
        CheckpointCorruptError: A missing or short file, a read error, or a checksum
            mismatch.
    """
    entries = [file_entry(path, e, algorithm) for e in files]
    for name, nbytes, _, _ in entries:
        _check_size(path, name, nbytes)
    if layout == LAYOUT_FILES:
        for entry in files:
            # Files a library wrote, read through once here and again by the library.
            verify_file(fs, path, entry, algorithm, buffer)
        return None
    chunk = entries[0][2]
    total = sum(e[1] for e in entries)
    if any(e[2] != chunk for e in entries) or [e[1] for e in entries] != stripe_sizes(
        total, chunk, len(entries)
    ):
        raise CheckpointCorruptError(f"{path.name}: {MANIFEST} file sizes do not form a stripe")
    data, got = _read(fs, path, [path / e[0] for e in entries], total, buffer, chunk, algorithm)
    for (name, _, _, expected), values in zip(entries, got, strict=True):
        _check_sums(path, name, values, expected)
    return data


def verify_file(
    fs: LocalFS, path: Path, entry: dict[str, Any], algorithm: str, buffer: AlignedBuffer
) -> memoryview:
    """Read one file of the checkpoint at ``path`` into ``buffer`` and check its manifest
    ``entry``: its size and every chunk's ``algorithm`` checksum.

    Raises:
        CheckpointCorruptError: Missing, short, unreadable or not matching its entry.
    """
    name, nbytes, chunk, expected = file_entry(path, entry, algorithm)
    _check_size(path, name, nbytes)
    data, (values,) = _read(fs, path, [path / name], nbytes, buffer, chunk, algorithm)
    _check_sums(path, name, values, expected)
    return data


def _check_size(path: Path, name: str, nbytes: int) -> None:
    try:
        size = (path / name).stat().st_size
    except FileNotFoundError:
        raise CheckpointCorruptError(f"{path.name}: {name} is missing") from None
    if size != nbytes:
        raise CheckpointCorruptError(
            f"{path.name}: {name} has {size} bytes, manifest says {nbytes}"
        )


def _check_sums(path: Path, name: str, values: list[int], expected: list[int]) -> None:
    if list(values) != list(expected):
        bad = next(
            (i for i, (a, b) in enumerate(zip(values, expected, strict=False)) if a != b),
            len(values),
        )
        raise CheckpointCorruptError(f"{path.name}: checksum mismatch in chunk {bad} of {name}")


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


def apply_retention(fs: LocalFS, directory: Path, keep: int, good: set[int]) -> list[Path]:
    """Keep the ``keep`` newest *good* checkpoints; delete what is older than all of them.

    Only ``good`` steps count: the ones this run made durable and the one it resumed from
    (verified). Anything else (a checkpoint a resume skipped as corrupt, one never verified)
    never pushes a good one out; it is deleted only once it is older than every kept one,
    and left alone while fewer than ``keep`` good checkpoints exist.
    """
    refs = list_checkpoints(directory)
    kept = [r for r in refs if r.step in good][:keep]
    if len(kept) < keep:
        return []
    removed = []
    for ref in refs:
        if ref.step < kept[-1].step:
            fs.rmtree(ref.path)
            removed.append(ref.path)
    return removed


def remove_stale_tmp(
    fs: LocalFS, directory: Path, me: Owner | None = None
) -> tuple[list[Path], list[Path]]:
    """Delete the ``.tmp``/``.old`` directories this run's predecessors left.

    A predecessor is an earlier process of the same run: on this pod (or host) one whose
    pid is gone, or that had the pid we have now (a restarted container starts its pids
    over); on another pod, any (a retried run gets a new pod, and only one pod of a run
    writes at a time). Outside Polyaxon (run ``local``) only this host's dead pids count:
    another host's cannot be told. Leftovers of other runs, and hidden names without an
    owner this trainer writes, are left alone.

    Returns:
        The removed entries and the leftovers left alone.
    """
    me = me or Owner.current()
    removed, left = [], []
    for entry in directory.iterdir():
        match = _HIDDEN.match(entry.name)
        if not match:
            continue
        owner = _OWNER.match(match.group("owner"))
        if owner is None:
            left.append(entry)  # no owner to judge it by: never ours to delete
            continue
        run, host, pid = owner.group("run"), owner.group("host"), int(owner.group("pid"))
        same_host = host == me.host
        if run != me.run or (run == LOCAL_RUN and not same_host):
            ours = False
        elif same_host:
            ours = pid == me.pid or not _alive(pid)
        else:
            ours = True
        if ours:
            fs.rmtree(entry)
            removed.append(entry)
        else:
            left.append(entry)
    return removed, left


def checkpoint_run(ref: CheckpointRef) -> tuple[bool, str | None]:
    """Whether a checkpoint's manifest is readable, and the run that wrote it (None when it
    was written outside Polyaxon)."""
    try:
        manifest = read_manifest(ref.path)
    except CheckpointCorruptError:
        return False, None
    return True, manifest["run_id"]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # it exists, under another user
    return True
