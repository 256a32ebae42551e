"""The trainer under torchrun: ranks, process groups and model wrapping.

``torchrun --nproc-per-node N -m trainer --parallel ddp|fsdp ...`` starts N copies of the
trainer; torchrun sets ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK`` (and the rendezvous address)
in each one's environment. :func:`join` gives every process its :class:`Ranks`; a world of
one process is a :class:`Ranks` too (:class:`OneProcess`), whose collectives are local no-ops:
it creates no process group, and the trainer writes and reads it as a single process,
whatever ``--parallel`` says.

Two process groups:

- the training group (the default one): NCCL on CUDA, gloo on the CPU; it carries DDP's
  gradient all-reduce, FSDP's all-gathers and reduce-scatters, and the loss average;
- the checkpoint group: always gloo, so the checkpoint protocol (every rank reports its
  shard durable, rank 0 commits and tells the others) runs on the CPU with its own timeout,
  and from the asynchronous checkpoint's background thread without interleaving with the
  training collectives of the main thread.
"""

from __future__ import annotations

import math
import os
import signal
import sys
import threading
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, NoReturn

import torch
import torch.distributed as dist
from torch import nn

from trainer.config import PARALLEL
from trainer.errors import EXIT_UNEXPECTED, ConfigError, RankFailedError, TrainerError


@dataclass(frozen=True)
class WorldEnv:
    """Where this process sits in the job, from torchrun's environment."""

    rank: int
    world_size: int
    local_rank: int


def world_env(environ: dict[str, str] | None = None) -> WorldEnv:
    """Read ``RANK``, ``WORLD_SIZE`` and ``LOCAL_RANK``; a plain ``python -m trainer`` is 0/1/0.

    Raises:
        ConfigError: The variables are not integers or do not fit together.

    >>> world_env({"RANK": "1", "WORLD_SIZE": "4", "LOCAL_RANK": "1"})
    WorldEnv(rank=1, world_size=4, local_rank=1)
    >>> world_env({})
    WorldEnv(rank=0, world_size=1, local_rank=0)
    >>> world_env({"RANK": "3", "WORLD_SIZE": "4"})  # one process per pod
    WorldEnv(rank=3, world_size=4, local_rank=0)
    """
    env = os.environ if environ is None else environ
    try:
        world = int(env.get("WORLD_SIZE", "1"))
        rank = int(env.get("RANK", "0"))
        # Without LOCAL_RANK one process runs per host (a PyTorchJob pod started without
        # torchrun: RANK is the pod's index), so its device is the first.
        local = int(env.get("LOCAL_RANK", "0"))
    except ValueError:
        raise ConfigError(
            "RANK, WORLD_SIZE and LOCAL_RANK must be integers (as torchrun sets them), got "
            f"{env.get('RANK')!r}, {env.get('WORLD_SIZE')!r}, {env.get('LOCAL_RANK')!r}"
        ) from None
    if world < 1 or not 0 <= rank < world or local < 0:
        raise ConfigError(f"RANK={rank} does not fit WORLD_SIZE={world} (LOCAL_RANK={local})")
    return WorldEnv(rank, world, local)


def is_main_process() -> bool:
    """Rank 0 (or a single process): the one that tracks, prints and writes the summary."""
    return world_env().rank == 0


def effective_parallel(parallel: str, world_size: int) -> str:
    """The mode a run really uses: a world of one process is the single-process path."""
    return parallel if world_size > 1 else "none"


@dataclass
class Ranks:
    """This process's place in a multi-process job and the groups it talks over.

    Attributes:
        rank: This process's rank, 0 … world_size-1.
        world_size: Processes in the job.
        local_rank: Rank on this node (the CUDA device index).
        parallel: ddp or fsdp; none for a world of one.
        device: The device this rank trains on.
        ckpt_group: The gloo group of the checkpoint protocol (None for a world of one).
        timeout_s: How long a checkpoint collective may wait for the slowest rank.
        mesh: FSDP's device mesh (set by :func:`wrap`).
    """

    rank: int
    world_size: int
    local_rank: int
    parallel: str
    device: torch.device
    ckpt_group: Any
    timeout_s: float
    mesh: Any = field(default=None, repr=False)

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def batch_index(self, step: int) -> int:
        """Which batch of the synthetic dataset this rank trains on at ``step``.

        Each rank sees its own batches (data parallelism); with one rank this is ``step``.
        """
        return step * self.world_size + self.rank

    def mean(self, value: torch.Tensor) -> float:
        """The average of a scalar over all ranks (the job's loss), on the training group."""
        total = value.detach().reshape(1).clone()
        # gloo has no AVG reduction; SUM then divide works on every backend.
        dist.all_reduce(total, op=dist.ReduceOp.SUM)
        return total.item() / self.world_size

    def barrier(self) -> None:
        self._guard(lambda: dist.barrier(group=self.ckpt_group), "a barrier")

    def broadcast(self, obj: Any) -> Any:
        """Rank 0's ``obj``, on every rank."""
        box = [obj if self.is_main else None]
        self._guard(
            lambda: dist.broadcast_object_list(box, src=0, group=self.ckpt_group),
            "rank 0's message",
        )
        return box[0]

    def gather(self, obj: Any) -> list[Any] | None:
        """Every rank's ``obj``, in rank order, on rank 0 (None elsewhere)."""
        out: list[Any] | None = [None] * self.world_size if self.is_main else None
        self._guard(
            lambda: dist.gather_object(obj, out, dst=0, group=self.ckpt_group),
            "every rank's report",
        )
        return out

    def all_gather(self, obj: Any) -> list[Any]:
        """Every rank's ``obj``, in rank order, on every rank."""
        out: list[Any] = [None] * self.world_size
        self._guard(
            lambda: dist.all_gather_object(out, obj, group=self.ckpt_group), "every rank's report"
        )
        return out

    def _guard(self, op, what: str) -> None:
        """Run a checkpoint collective; a peer that died or hung becomes RankFailedError."""
        try:
            op()
        except RuntimeError as exc:
            # gloo raises RuntimeError for both: "Connection closed by peer" when a rank
            # died, "Timed out waiting ..." past the group's timeout.
            text = _one_line(exc)
            if "timed out" in text.lower() or "timeout" in text.lower():
                why = f"timed out after {self.timeout_s:g}s (--checkpoint-timeout)"
            else:
                why = "failed: a rank died or closed its connection"
            raise RankFailedError(f"rank {self.rank} waiting for {what} {why}: {text}") from exc

    def agree(self, problem: TrainerError | None) -> None:
        """Stop every rank when any rank refuses to go on; each raises its own refusal, or
        the lowest rank's.

        For the refusals every rank reaches at the same point (a checkpoint of another
        world size, format or model): once one rank exits, torchrun sends SIGTERM to the
        others, and a rank still on its way out would die of the signal (-15) instead of
        exiting with the refusal's code. So each rank first binds SIGTERM to its code
        (:func:`keep_exit_code`), and no rank leaves before every rank has done so.

        Raises:
            TrainerError: ``problem``, or another rank's.
        """
        found = self.all_gather(None if problem is None else (type(problem), problem.message))
        refusal = next((f for f in found if f is not None), None)
        if refusal is None:
            return
        error = problem if problem is not None else refusal[0](refusal[1])
        keep_exit_code(error)
        try:
            self.barrier()
        except RankFailedError:
            pass  # a rank already left: the refusal is still this rank's reason to stop
        raise error

    def close(self) -> None:
        if dist.is_initialized():
            dist.destroy_process_group()


class OneProcess(Ranks):
    """A world of one process: every collective is the process's own value, no group exists.

    The single-process fast paths (the overlapped O_DIRECT writer, ``--io-streams``,
    ``--async``) must not pay for a process group or a collective call.
    """

    def mean(self, value: torch.Tensor) -> float:
        return value.item()

    def barrier(self) -> None:
        pass

    def broadcast(self, obj: Any) -> Any:
        return obj

    def gather(self, obj: Any) -> list[Any] | None:
        return [obj]

    def all_gather(self, obj: Any) -> list[Any]:
        return [obj]

    def agree(self, problem: TrainerError | None) -> None:
        if problem is not None:
            raise problem

    def close(self) -> None:
        pass


def refusal(check: Callable[..., Any], *args: Any) -> TrainerError | None:
    """What ``check(*args)`` refuses, as a value the ranks can agree on (:meth:`Ranks.agree`)."""
    try:
        check(*args)
    except TrainerError as error:
        return error
    return None


def keep_exit_code(error: TrainerError) -> None:
    """This rank will stop with ``error``: a SIGTERM from now on ends it with the error's
    exit code (and its message), not as killed by the signal.

    torchrun stops every rank still running once one has exited; a rank that already
    knows why it stops must say so in torchrun's report. Only the main thread can bind a
    signal; elsewhere (the background checkpoint thread) this does nothing.
    """
    if threading.current_thread() is not threading.main_thread():
        return
    signal.signal(signal.SIGTERM, lambda signum, frame: exit_rank(error))


def exit_rank(error: BaseException) -> NoReturn:
    """End this rank now: a trainer error with its message and exit code, anything else
    with its traceback and exit 1.

    Not through the interpreter's shutdown: with torch's threads and process groups it
    can take seconds, long enough for torchrun's SIGTERM to overtake it (the rank that
    failed first is then reported as killed, and another as the root cause), and it can
    abort in a C++ destructor (SIGABRT). The process group is destroyed first, so no peer
    waits on it.
    """
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # leaving already, with our own code
    try:
        if dist.is_initialized():
            dist.destroy_process_group()
    finally:
        if isinstance(error, TrainerError):
            error.show()
            code = error.exit_code
        else:
            traceback.print_exception(error)
            code = EXIT_UNEXPECTED
        for stream in (sys.stdout, sys.stderr):
            stream.flush()
        os._exit(code)


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return text[:300] + ("…" if len(text) > 300 else "")


def resolve_device(name: str, local_rank: int | None = None) -> torch.device:
    """This rank's device: ``cuda:LOCAL_RANK`` on a GPU node (one GPU per rank), else cpu;
    ``local_rank`` None (a single process): the current CUDA device."""
    if name == "cpu" or (name == "auto" and not torch.cuda.is_available()):
        return torch.device("cpu")
    if not torch.cuda.is_available():
        raise ConfigError("--device cuda was asked for but no CUDA device is available")
    if local_rank is None:
        return torch.device("cuda")
    if local_rank >= torch.cuda.device_count():
        raise ConfigError(
            f"LOCAL_RANK {local_rank} has no GPU: this node has {torch.cuda.device_count()} "
            "(start torchrun with --nproc-per-node at most the GPU count)"
        )
    return torch.device("cuda", local_rank)


def group_timeout(seconds: float) -> timedelta:
    """A process group's timeout: whole milliseconds, rounded up (gloo refuses a timeout of
    zero on every rank, which a sub-millisecond one would truncate to).

    >>> group_timeout(0.0004), group_timeout(3.0)
    (datetime.timedelta(microseconds=1000), datetime.timedelta(seconds=3))
    """
    return timedelta(milliseconds=math.ceil(seconds * 1000))


def init(
    rank: int,
    world_size: int,
    local_rank: int,
    parallel: str,
    device_name: str,
    timeout_s: float,
    init_method: str = "env://",
) -> Ranks:
    """Join the job: the training group (NCCL on CUDA, gloo on the CPU) and a gloo group
    for the checkpoint protocol with ``timeout_s``."""
    device = resolve_device(device_name, local_rank)
    kwargs: dict[str, Any] = {}
    if device.type == "cuda":
        torch.cuda.set_device(device)
        kwargs["device_id"] = device
    dist.init_process_group(
        "nccl" if device.type == "cuda" else "gloo",
        init_method=init_method,
        rank=rank,
        world_size=world_size,
        **kwargs,
    )
    ckpt_group = dist.new_group(backend="gloo", timeout=group_timeout(timeout_s))
    return Ranks(rank, world_size, local_rank, parallel, device, ckpt_group, timeout_s)


def join(cfg: Any) -> Ranks:
    """This process's place: the torchrun job ``cfg`` runs in, or a world of one.

    Raises:
        ConfigError: As :func:`setup`, or the device asked for is not there.
    """
    ranks = setup(cfg)
    if ranks is not None:
        return ranks
    device = resolve_device(cfg.device)
    return OneProcess(0, 1, 0, "none", device, None, cfg.checkpoint_timeout)


def setup(cfg: Any) -> Ranks | None:
    """Join the torchrun job ``cfg`` runs in, or None for a single process (no group).

    Raises:
        ConfigError: ``--parallel none`` under a multi-process torchrun.
    """
    env = world_env()
    if env.world_size == 1:
        return None
    if cfg.parallel == "none":
        raise ConfigError(
            f"started as one of {env.world_size} processes (torchrun) with --parallel none: "
            "pass --parallel ddp or --parallel fsdp, or start a single process"
        )
    return init(
        env.rank, env.world_size, env.local_rank, cfg.parallel, cfg.device, cfg.checkpoint_timeout
    )


def wrap(model: nn.Module, ranks: Ranks) -> nn.Module:
    """Wrap the model for data-parallel training: DDP (replicated) or FSDP2 (sharded);
    a world of one trains the model as it is.

    FSDP2 shards each transformer block, then the root (embeddings, final norm, head), so
    one block's parameters are gathered at a time.
    """
    if ranks.world_size == 1:
        return model
    if ranks.parallel == "ddp":
        from torch.nn.parallel import DistributedDataParallel

        ids = [ranks.device.index] if ranks.device.type == "cuda" else None
        return DistributedDataParallel(model, device_ids=ids)
    if ranks.parallel == "fsdp":
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard

        ranks.mesh = init_device_mesh(ranks.device.type, (ranks.world_size,))
        for block in model.blocks:
            fully_shard(block, mesh=ranks.mesh)
        fully_shard(model, mesh=ranks.mesh)
        return model
    raise ConfigError(f"unknown --parallel {ranks.parallel!r}; choose from {', '.join(PARALLEL)}")


@dataclass
class RankData:
    """The synthetic dataset as one rank sees it: its own batch at every step."""

    data: Any
    ranks: Ranks

    def batch(self, step: int) -> torch.Tensor:
        return self.data.batch(self.ranks.batch_index(step))
