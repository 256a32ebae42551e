"""Sharded checkpoints: what each rank of many writes, and how a checkpoint is resumed.

A checkpoint of step N written by W ranks is one directory, published like any other
(:mod:`trainer.ckpt.checkpointer` writes it, :mod:`trainer.ckpt.store` publishes it):
``step-0000000N/`` holds every rank's files — ``shard-0000r-of-0000W.<ext>``, striped over
``--io-streams`` files as one process's are (``.00-of-02`` …) — and one global
``MANIFEST.json`` (``"layout": "sharded"``, ``shard_layout`` the format's own, ``world_size``,
``parallel``, and per file its name, size, chunk checksums and rank).

What each rank writes (:func:`split_state`): the leaves of the state that are DTensors (FSDP2)
as this rank's local piece; the replicated tensors under DDP split across the ranks by size
(largest first onto the least-loaded rank), so no rank writes it all; under FSDP the few
replicated tensors FSDP leaves (AdamW's step counts) in every shard, so that a rank resumes
from its own shard alone; each rank's own RNG state in its own shard.

Resuming (:func:`restore`) takes the newest checkpoint every rank can verify: rank 0 reads
the manifest and shares it, each rank verifies the shards it loads (DDP: all of them, as
every rank holds the whole replica; FSDP: its own), and all ranks agree before any loads
a byte. A checkpoint of another world size or ``--parallel`` mode is refused
(:class:`trainer.errors.WorldSizeError`, exit 2): shards are not resharded. A world of one
process resumes through the same routine, reading a single process's checkpoint.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from trainer.ckpt import store
from trainer.ckpt.formats import Format, flatten, load_verified, unflatten
from trainer.ckpt.fs import LocalFS
from trainer.ckpt.io import AlignedBuffer
from trainer.config import FORMATS
from trainer.distributed import Ranks, refusal
from trainer.errors import (
    CheckpointCorruptError,
    ConfigError,
    TrainerError,
    WorldSizeError,
)
from trainer.restore import Restored

log = logging.getLogger(__name__)


def shard_name(rank: int, world_size: int, filename: str) -> str:
    """The file of one rank's shard, named after the format's file.

    >>> shard_name(3, 8, "state.ckpt")
    'shard-00003-of-00008.ckpt'
    """
    return f"shard-{rank:05d}-of-{world_size:05d}{Path(filename).suffix}"


def assign(sizes: list[int], world_size: int) -> list[int]:
    """The rank that writes each tensor: largest first onto the least-loaded rank.

    Deterministic (ties go to the lower index and rank), so every rank computes the same
    split from the same state without talking.

    >>> assign([10, 1, 7, 3, 3], 2)
    [0, 1, 1, 1, 0]
    """
    owners = [0] * len(sizes)
    load = [0] * world_size
    for i in sorted(range(len(sizes)), key=lambda i: (-sizes[i], i)):
        rank = min(range(world_size), key=lambda r: (load[r], r))
        owners[i] = rank
        load[rank] += sizes[i]
    return owners


def _is_dtensor(t: torch.Tensor) -> bool:
    from torch.distributed.tensor import DTensor

    return isinstance(t, DTensor)


def placements_json(placements: Any) -> list[list[Any]]:
    out = []
    for p in placements:
        if p.is_shard():
            out.append(["shard", p.dim])
        elif p.is_replicate():
            out.append(["replicate"])
        else:
            raise TypeError(f"cannot checkpoint a DTensor placed as {p!r}")
    return out


def placements(data: list[list[Any]]) -> tuple[Any, ...]:
    from torch.distributed.tensor import Replicate, Shard

    return tuple(Shard(int(p[1])) if p[0] == "shard" else Replicate() for p in data)


def split_state(state: dict[str, Any], ranks: Ranks, step: int) -> dict[str, Any]:
    """This rank's shard of the trainer's state (``train._state``), ready to stage.

    The shard holds the state's structure (small JSON, in every shard), the ids and
    tensors of the leaves this rank writes, how to rebuild its DTensors, and its own RNG.
    """
    rest = {k: v for k, v in state.items() if k != "rng"}
    leaves: list[torch.Tensor] = []
    skeleton = flatten(rest, leaves)
    sharded = [_is_dtensor(t) for t in leaves]
    replicated = [i for i, is_d in enumerate(sharded) if not is_d]
    if ranks.parallel == "ddp":
        owners = assign(
            [leaves[i].numel() * leaves[i].element_size() for i in replicated], ranks.world_size
        )
        kept = {i for i, owner in zip(replicated, owners, strict=True) if owner == ranks.rank}
    else:
        kept = set(replicated)  # FSDP leaves only a few small ones unsharded
    ids, tensors, dtensors = [], [], {}
    for i, t in enumerate(leaves):
        if sharded[i]:
            ids.append(i)
            tensors.append(t.to_local())
            dtensors[str(i)] = {
                "shape": list(t.shape),
                "stride": list(t.stride()),
                "placements": placements_json(t.placements),
            }
        elif i in kept:
            ids.append(i)
            tensors.append(t)
    return {
        "shard": {
            "rank": ranks.rank,
            "world_size": ranks.world_size,
            "parallel": ranks.parallel,
            "step": step,
        },
        "skeleton": skeleton,
        "leaf_count": len(leaves),
        "ids": ids,
        "tensors": tensors,
        "dtensors": dtensors,
        "rng": state.get("rng"),
    }


def merge_shards(shards: list[dict[str, Any]], own: dict[str, Any], ranks: Ranks) -> dict[str, Any]:
    """The state to load on this rank from the shards it read (``own`` among them).

    Raises:
        CheckpointCorruptError: A leaf of the state is in none of the shards.
    """
    skeleton = own["skeleton"]
    leaves: dict[int, torch.Tensor] = {}
    for shard in shards:
        leaves.update(zip(shard["ids"], shard["tensors"], strict=True))
    for key, meta in own["dtensors"].items():
        from torch.distributed.tensor import DTensor

        i = int(key)
        leaves[i] = DTensor.from_local(
            leaves[i].to(ranks.device),
            ranks.mesh,
            placements(meta["placements"]),
            shape=torch.Size(meta["shape"]),
            stride=tuple(meta["stride"]),
            run_check=False,
        )
    count = own["leaf_count"]
    missing = [i for i in range(count) if i not in leaves]
    if missing:
        raise CheckpointCorruptError(f"{len(missing)} tensors of the state are in no shard read")
    state = unflatten(skeleton, [leaves[i] for i in range(count)])
    state["rng"] = own["rng"]
    return state


def check_world(manifest: dict[str, Any], name: str, world_size: int, parallel: str) -> None:
    """Refuse a checkpoint written by another number of ranks or another ``--parallel`` mode.

    A manifest without these keys is a single process's (world size 1, parallel none).

    Raises:
        WorldSizeError: They differ (exit 2).
    """
    saved_world = manifest.get("world_size", 1)
    saved_mode = manifest.get("parallel", "none")
    if saved_world != world_size:
        hint = (
            "a single process"
            if saved_world == 1
            else f"torchrun --nproc-per-node {saved_world} (or the same world across nodes)"
        )
        raise WorldSizeError(
            f"--resume: {name} was written by {saved_world} rank(s), this run has {world_size}; "
            f"shards are not resharded: resume it with {hint}, or use a new checkpoint dir"
        )
    if saved_mode != parallel:
        raise WorldSizeError(
            f"--resume: {name} was written with --parallel {saved_mode}, this run uses "
            f"--parallel {parallel}"
        )


# ------------------------------------------------------------------------ resuming


def prepare_dir(fs: LocalFS, directory: Path, ranks: Ranks) -> tuple[list[Path], list[Path]]:
    """Rank 0 removes the hidden directories this run's predecessors left while the others
    wait; returns them and the leftovers left alone (on other ranks: nothing)."""
    found: tuple[list[Path], list[Path]] = ([], [])
    if ranks.is_main:
        found = store.remove_stale_tmp(fs, directory)
    ranks.barrier()
    return found


def _head(path: Path) -> dict[str, Any]:
    try:
        return {"manifest": store.read_manifest(path)}
    except CheckpointCorruptError as exc:
        return {"error": str(exc)}


def _entries(
    manifest: dict[str, Any], name: str, world_size: int, every_rank: bool = True
) -> list[list[dict[str, Any]]]:
    """The manifest's files of each rank, in rank order, checked for shape (with
    ``every_rank``, at least one file of each: DCP may leave a rank none to write)."""
    files = manifest.get("files")
    if manifest.get("layout") != store.LAYOUT_SHARDED or not isinstance(files, list):
        raise CheckpointCorruptError(f"{name}: {store.MANIFEST} is not a sharded manifest")
    if "shard_layout" not in manifest:
        raise CheckpointCorruptError(f"{name}: {store.MANIFEST} has no field 'shard_layout'")
    by_rank: list[list[dict[str, Any]]] = [[] for _ in range(world_size)]
    for entry in files:
        rank = entry.get("rank") if isinstance(entry, dict) else None
        if not isinstance(rank, int) or isinstance(rank, bool):
            raise CheckpointCorruptError(f"{name}: a shard entry lacks its rank")
        if not 0 <= rank < world_size:
            raise CheckpointCorruptError(f"{name}: {store.MANIFEST} names rank {rank}")
        by_rank[rank].append(entry)
    if every_rank and not all(by_rank):
        raise CheckpointCorruptError(f"{name}: {store.MANIFEST} does not list a shard per rank")
    return by_rank


def _load_shards(
    fs: LocalFS,
    path: Path,
    manifest: dict[str, Any],
    fmt: Format,
    ranks: Ranks,
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Verify and load the shards this rank needs; returns them and its own.

    A rank's files are one striped image (raw, torch: one file, or one per stream) or
    files a library wrote (safetensors), as one process's are (``shard_layout``).
    """
    by_rank = _entries(manifest, path.name, ranks.world_size)
    wanted = range(ranks.world_size) if manifest["parallel"] == "ddp" else [ranks.rank]
    algorithm = store.checksum_algorithm(path, manifest)
    layout = manifest["shard_layout"]
    if layout != fmt.layout:
        raise CheckpointCorruptError(
            f"{path.name}: shard layout {layout!r} is not what format {fmt.name!r} writes"
        )
    shards = []
    for rank in wanted:
        entries = by_rank[rank]
        # Each shard gets its own buffer: loaded tensors are views into it until applied.
        data = store.verify_entries(fs, path, entries, layout, algorithm, AlignedBuffer())
        if data is None:
            shard = fmt.load_dir(path, [e["name"] for e in entries])
        else:
            shard = fmt.load(data)
        info = shard.get("shard", {}) if isinstance(shard, dict) else {}
        if info.get("rank") != rank or info.get("step") != manifest["step"]:
            raise CheckpointCorruptError(
                f"{path.name}: {entries[0]['name']} holds rank {info.get('rank')}'s shard of "
                f"step {info.get('step')}, the manifest says rank {rank}, step {manifest['step']}"
            )
        skeleton = shard.get("skeleton")
        store.check_step(
            path, skeleton.get("step") if isinstance(skeleton, dict) else None, entries[0]["name"]
        )
        shards.append(shard)
    own = next(s for s in shards if s["shard"]["rank"] == ranks.rank)
    return shards, own


def _read_state(
    fs: LocalFS, path: Path, manifest: dict[str, Any], fmt: Format, ranks: Ranks
) -> Callable[[], dict[str, Any]]:
    """Verify what this rank loads of the checkpoint at ``path``; returns what builds its
    state once every rank agrees it verified.

    A world of one reads a single process's checkpoint (any format); several ranks read
    their shards.
    """
    if ranks.world_size == 1:
        manifest, data = store.read_verified(fs, path, AlignedBuffer())
        state = load_verified(fmt, path, manifest, data)
        store.check_step(path, state.get("step"), "state")
        return lambda: state
    if fmt.collective:
        # DCP reads any rank's files for any other (a replicated tensor was written once):
        # every rank verifies them all, then all load together.
        _entries(manifest, path.name, ranks.world_size, every_rank=False)
        algorithm = store.checksum_algorithm(path, manifest)
        store.verify_entries(
            fs, path, manifest["files"], store.LAYOUT_FILES, algorithm, AlignedBuffer()
        )
        return lambda: fmt.load_collective(path, ranks)
    shards, own = _load_shards(fs, path, manifest, fmt, ranks)
    return lambda: merge_shards(shards, own, ranks)


def restore(
    directory: Path,
    fmt: Format,
    fs: LocalFS,
    model: torch.nn.Module,
    opt: torch.optim.Optimizer,
    ranks: Ranks,
    say: Callable[[str], None],
    check_config: Callable[[dict[str, Any], str], None],
) -> Restored | None:
    """Load the newest checkpoint every rank verifies; returns its step and the seconds it
    took from its manifest to its state loaded (None: none exist).

    Anything incomplete or corrupt is skipped with a message, never loaded. Every rank
    takes the same decision at each checkpoint: rank 0 lists them and shares each
    manifest, and the ranks' verdicts are exchanged before anything is loaded (a world of
    one exchanges nothing).

    Raises:
        WorldSizeError: The newest checkpoint was written by another world size or mode.
        CheckpointCorruptError: Checkpoints exist but none verifies (on every rank):
            starting over would silently throw the run's progress away.
    """
    many = ranks.world_size > 1
    names = ranks.broadcast(
        [ref.path.name for ref in store.list_checkpoints(directory)] if ranks.is_main else None
    )
    for name in names:
        started = time.monotonic()  # the loaded checkpoint's time, not the skipped ones'
        path = directory / name
        head = ranks.broadcast(_head(path) if ranks.is_main else None)
        if "error" in head:
            say(f"resume: skipping {head['error']}")
            continue
        manifest = head["manifest"]
        if manifest.get("format") not in FORMATS:
            say(f"resume: skipping {name}: {store.MANIFEST} names no known format")
            continue
        ranks.agree(refusal(_check_resumable, manifest, name, fmt, ranks))
        problem = None
        try:
            build = _read_state(fs, path, manifest, fmt, ranks)
        except CheckpointCorruptError as exc:
            problem = str(exc)
        problems = [(r, p) for r, p in enumerate(ranks.all_gather(problem)) if p]
        if problems:
            say(
                "resume: skipping "
                + "; ".join(f"rank {r}: {p}" if many else p for r, p in problems)
            )
            continue
        state: dict[str, Any] = {}
        try:
            state = build()
            check_config(state.get("config", {}), name)
            _load_model(model, state["model"], name)
        except TrainerError as exc:
            refused: TrainerError | None = exc
        else:
            refused = None
        ranks.agree(refused)
        opt.load_state_dict(state["optimizer"])
        torch.set_rng_state(state["rng"]["torch"].clone())  # needs its own storage
        if "cuda" in state["rng"] and ranks.device.type == "cuda":
            torch.cuda.set_rng_state(state["rng"]["cuda"].clone(), ranks.device)
        seconds = time.monotonic() - started
        shards = f", {ranks.world_size} shards verified" if many else ""
        say(f"resume: continuing from {name} (step {state['step']}){shards}")
        return Restored(int(state["step"]), seconds)
    if names:
        ranks.agree(
            CheckpointCorruptError(
                f"--resume: none of the {len(names)} checkpoints in {directory} is complete and "
                "verified" + (" on every rank" if many else "")
            )
        )
    return None


def _load_model(model: torch.nn.Module, saved: dict[str, Any], name: str) -> None:
    """Load the saved weights, or refuse a checkpoint of another model shape (one the same
    settings built in another version of the trainer): exit 2, not a traceback.

    Raises:
        ConfigError: The saved tensors do not fit the model.
    """
    try:
        model.load_state_dict(saved)
    except RuntimeError as exc:
        first = " ".join(str(exc).split())[:200]
        raise ConfigError(
            f"--resume: {name} holds a model of another shape than this run builds ({first}); "
            "use a new checkpoint dir"
        ) from None


def _check_resumable(manifest: dict[str, Any], name: str, fmt: Format, ranks: Ranks) -> None:
    """Refuse the newest readable checkpoint when this run cannot continue it as it is:
    another world size or ``--parallel`` mode, or another ``--format``.

    A checkpoint in another format is healthy data, not a corrupt one to skip: skipping
    it would roll the run back to an older one, or end in "none verifies" (exit 6).

    Raises:
        WorldSizeError: Another world size or mode (exit 2).
        ConfigError: Another format (exit 2).
    """
    check_world(manifest, name, ranks.world_size, ranks.parallel)
    saved = manifest.get("format")
    if saved != fmt.name:
        raise ConfigError(
            f"--resume: {name} was written with --format {saved}, this run uses --format "
            f"{fmt.name}: resume it with --format {saved}, or use a new checkpoint dir"
        )
