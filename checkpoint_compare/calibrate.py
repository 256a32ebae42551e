"""Calibrate the verdict: does its 95 % mean 95 %?

``python -m checkpoint_compare.calibrate`` runs many small comparisons whose answer is known
and scores the verdict on them:

- **A/A**: one class under two profile names. Any difference the verdict claims is false;
  at 95 % it may claim one in at most 5 % of the comparisons.
- **A/B**: two classes a factor of two apart (``checkpoint-baseline``, 125 MiB/s, then
  ``checkpoint-throughput``, 250 MiB/s). The verdict should call the faster class better in
  at least 95 % of them.

The classes are the sandbox's emulation (docs/sandbox.md): a loop-device volume of our own
in ``/dev/shm`` with the class's block-I/O limits on it for a cgroup the workload runs in
(root, loop devices and the blkio/io controller needed). ``--volume DIR`` runs on a plain
directory instead, where only A/A can be measured. Each workload runs as the pipeline runs
it (``python -m trainer``, ``python -m data_workloads``), profile by profile in the
pipeline's order: the first profile's repeats back to back, then the second's, optionally
the return to the first. Without the return, one round of runs serves one A/A and one A/B
comparison: A×R, A'×R, B×R, where A/A is A against A' and A/B is A' against B (each pair as
the pipeline would run it, and a third fewer runs); ``--comparisons aa`` (``ab``) makes one
kind only, a round A then A' (A then B). ``--noise writer|cpu`` starts a
neighbour (a writer on the same volume, outside the throttled cgroup, or a busy CPU)
during a random half of the runs, drawn from ``--seed``.

Every run's summary JSON is kept under ``--out`` with ``manifest.json`` (the settings, the
machine, each run and each comparison's score), so ``--rescore DIR`` judges the same runs
again (another verdict, ``--use-repeats K`` to see what fewer repeats would have said)
without running anything. The scores are read from the verdict's own ``--json`` document
through :func:`claim_of`. It prints, per workload, the A/A false-claim rate and the A/B
detection rate, each with its Wilson interval.
"""

from __future__ import annotations

import json
import math
import os
import platform
import random
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, fields
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal

import click

from checkpoint_storage_bench.config_cli import cli, config_options
from checkpoint_storage_bench.errors import BenchError, exit_codes_help

SCHEMA = "checkpoint-compare-calibration/1"
WORKLOADS = ("checkpoint", "scan", "materialize", "workspace")
CLASS_A = "checkpoint-baseline"
CLASS_B = "checkpoint-throughput"
COPY_OF_A = "checkpoint-baseline-copy"
"""The second name of class A in an A/A comparison."""
CLASSES_FILE = Path(__file__).resolve().parent.parent / "connections" / "vac-ebs-gp3.yaml"
NO_DIFFERENCE = "no measurable difference"
"""The verdict's word when it keeps no profile."""
COMPARISON_KINDS = ("both", "aa", "ab")
"""Which comparisons a round makes: A/A and A/B, or one kind only."""
GOAL_FALSE_CLAIMS = 0.05
GOAL_DETECTION = 0.95

EXIT_CODES = {
    0: "calibration done (whatever the rates)",
    1: "unexpected error",
    2: "bad arguments, or an output directory that is not empty",
    3: "the classes cannot be emulated here (no root, loop device or block-I/O controller)",
    4: "a workload run failed",
}


class CalibrationError(BenchError):
    """A one-line reason and the exit code it ends the command with."""

    prog = "calibrate"

    def __init__(self, message: str, code: int) -> None:
        super().__init__(message)
        self.exit_code = code


# --------------------------------------------------------------------------- the plan


@dataclass
class PlannedRun:
    """One run of a workload: its place in the order, the class it runs on, its label, and
    which of its block's repeats it is (0 first; a return to the first profile is a block
    of its own)."""

    index: int
    round: int
    vac: str
    label: str
    repeat: int = 0
    noise: bool = False
    summary: str | None = None
    exit_code: int | None = None
    wall_s: float | None = None
    error: str | None = None


@dataclass
class Comparison:
    """One comparison: ``kind`` ``aa`` or ``ab``; ``profiles`` name → the runs it has, in
    the pipeline's order (the first is the baseline); ``score`` once judged."""

    index: int
    round: int
    kind: str
    profiles: dict[str, list[int]]
    score: dict[str, Any] | None = None

    @property
    def baseline(self) -> str:
        return next(iter(self.profiles))

    @property
    def candidate(self) -> str:
        return list(self.profiles)[1]


def plan(
    pairs: int,
    repeats: int,
    return_to_first: bool,
    seed: int,
    noisy: bool,
    cycles: int = 1,
    comparisons: str = "both",
) -> tuple[list[PlannedRun], list[Comparison]]:
    """The runs, in the order they run, and the comparisons they make: ``pairs`` A/A and
    ``pairs`` A/B, or with ``comparisons`` ``aa`` (``ab``) ``pairs`` of that kind only, a
    round then A and A' (A and B): showing a false-claim rate of at most 5 % takes 73 A/A
    comparisons without a claim, and a B block each would spend a third of the runs. Which
    runs have a neighbour is drawn here (half of them on average, from ``seed``), so a plan
    is the same every time. ``cycles`` above 1 runs each comparison's two profiles that many
    times over, as a pipeline given the profiles ``[A, B, A, B]`` does (each pass a block of
    its own), so no run serves two comparisons.

    >>> runs, comps = plan(1, 2, False, 0, False)
    >>> [(r.vac, r.label) for r in runs][::2]
    [('checkpoint-baseline', 'a'), ('checkpoint-baseline', 'a2'), ('checkpoint-throughput', 'b')]
    >>> [(c.kind, c.profiles) for c in comps]  # doctest: +NORMALIZE_WHITESPACE
    [('aa', {'checkpoint-baseline': [0, 1], 'checkpoint-baseline-copy': [2, 3]}),
     ('ab', {'checkpoint-baseline': [2, 3], 'checkpoint-throughput': [4, 5]})]
    """
    if pairs < 1 or repeats < 1 or cycles < 1:
        raise ValueError("pairs, repeats and cycles must be at least 1")
    if comparisons not in COMPARISON_KINDS:
        raise ValueError(f"comparisons must be one of {', '.join(COMPARISON_KINDS)}, "
                         f"not {comparisons!r}")  # fmt: skip
    aa, ab = comparisons in ("both", "aa"), comparisons in ("both", "ab")
    rng = random.Random(seed)
    runs: list[PlannedRun] = []
    made: list[Comparison] = []

    def block(round_: int, vac: str, label: str) -> list[int]:
        out = []
        for k in range(repeats):
            runs.append(PlannedRun(len(runs), round_, vac, label, k))
            out.append(runs[-1].index)
        return out

    def alternating(round_: int, kind: str, vac: str, name: str, label: str) -> None:
        first: list[int] = []
        other: list[int] = []
        for _ in range(cycles):
            first += block(round_, CLASS_A, "a")
            other += block(round_, vac, label)
        if return_to_first:
            first += block(round_, CLASS_A, "a")
        made.append(Comparison(len(made), round_, kind, {CLASS_A: first, name: other}))

    def returning(round_: int, kind: str, vac: str, name: str, label: str) -> None:
        a = block(round_, CLASS_A, "a")
        other = block(round_, vac, label)
        a_back = block(round_, CLASS_A, "a")
        made.append(Comparison(len(made), round_, kind, {CLASS_A: a + a_back, name: other}))

    for r in range(pairs):
        if cycles > 1 or return_to_first:
            design = alternating if cycles > 1 else returning
            if aa:
                design(r, "aa", CLASS_A, COPY_OF_A, "a2")
            if ab:
                design(r, "ab", CLASS_B, CLASS_B, "b")
        elif aa and ab:
            a, a2, b = block(r, CLASS_A, "a"), block(r, CLASS_A, "a2"), block(r, CLASS_B, "b")
            made.append(Comparison(len(made), r, "aa", {CLASS_A: a, COPY_OF_A: a2}))
            made.append(Comparison(len(made), r, "ab", {CLASS_A: a2, CLASS_B: b}))
        else:
            name, vac, label = (COPY_OF_A, CLASS_A, "a2") if aa else (CLASS_B, CLASS_B, "b")
            a, other = block(r, CLASS_A, "a"), block(r, vac, label)
            made.append(Comparison(len(made), r, "aa" if aa else "ab", {CLASS_A: a, name: other}))
    for run in runs:
        run.noise = noisy and rng.random() < 0.5
    return runs, made


# --------------------------------------------------------------------------- statistics


def wilson(successes: int, n: int, confidence: float = 0.95) -> tuple[float, float] | None:
    """The Wilson score interval of a proportion (good coverage for small n and rates near
    0 or 1, where the normal interval fails); None for n = 0.

    >>> [round(v, 4) for v in wilson(0, 20)]
    [0.0, 0.1611]
    >>> [round(v, 4) for v in wilson(19, 20)]
    [0.7639, 0.9911]
    """
    if n == 0:
        return None
    z = statistics.NormalDist().inv_cdf(1 - (1 - confidence) / 2)
    p = successes / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z / (1 + z * z / n) * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n))
    return max(0.0, centre - half), min(1.0, centre + half)


def claim_of(report: dict[str, Any], profile: str) -> tuple[bool, str]:
    """Whether the verdict's JSON claims a measurable difference for ``profile`` against
    the baseline, and which way (``better``: faster, ``worse``, ``none``).

    The one place that reads the verdict's JSON: ``profiles[P].difference`` (``claimed``,
    ``direction``) where the document has it; the checkpoint document of schema
    ``checkpoint-compare/2`` (its ``comparisons``: the pause or the whole run counts) and the
    data-workload dump before it (``significant``, ``relative``) otherwise.

    >>> claim_of({"profiles": {"b": {"difference": {"claimed": True, "direction": "better"}}}}, "b")
    (True, 'better')
    >>> claim_of({"profiles": [{"profile": "b", "significant": True, "relative": 0.3}]}, "b")
    (True, 'worse')
    """
    profiles = report.get("profiles")
    if isinstance(profiles, dict) and isinstance(profiles.get(profile), dict):
        diff = profiles[profile].get("difference")
        if isinstance(diff, dict) and "claimed" in diff:
            claimed = bool(diff["claimed"])
            return claimed, str(diff.get("direction") or "none") if claimed else "none"
    for comp in report.get("comparisons") or []:
        if isinstance(comp, dict) and comp.get("candidate") == profile:
            pause, runtime = comp.get("pause") or {}, comp.get("runtime") or {}
            claimed = bool(pause.get("counts") or runtime.get("counts"))
            lead = runtime if runtime.get("counts") else pause
            if not claimed:
                return False, "none"
            return True, "better" if (lead.get("estimate") or 0) < 0 else "worse"
    if isinstance(profiles, list):
        for p in profiles:
            if isinstance(p, dict) and p.get("profile") == profile:
                if not p.get("significant"):
                    return False, "none"
                return True, "better" if (p.get("relative") or 0) < 0 else "worse"
    raise ValueError(f"the verdict's JSON has no difference for profile {profile!r}")


# --------------------------------------------------------------------------- settings


@dataclass(frozen=True)
class Settings:
    """What every run of a workload is given (the pipeline's inputs, at small sizes)."""

    model_size: str = "8MiB"
    """checkpoint: the model's size."""
    steps: int = 26
    """checkpoint: training steps a run."""
    checkpoint_every: int = 2
    """checkpoint: steps between checkpoints."""
    checkpoint_format: str = field(default="raw", metadata=cli(flag="--format"))
    """checkpoint: the checkpoint format."""
    dataset_size: str = "32MiB"
    """scan, materialize: the dataset's size."""
    epochs: int = 5
    """scan: epochs a run."""
    num_workers: int = 2
    """scan: loader workers."""
    compute_ms: float = 10.0
    """scan: emulated compute per batch, ms."""
    files: int = 100
    """workspace: files saved a round."""
    file_size: str = "16KiB"
    """workspace: each file's size."""
    rounds: int = 5
    """workspace: rounds a run."""
    repeats: int = 2
    """Runs of each profile back to back, as the pipeline's repeats input."""
    return_to_first: bool = False
    """Return to the first profile at the end, as the pipeline's return_to_first input."""
    cycles: int = 1
    """Run the two profiles this many times over, as the pipeline given the profiles
    [A, B, A, B] for 2 (each pass a block of its own)."""
    comparisons: Literal["both", "aa", "ab"] = "both"
    """Which comparisons to make: both (a round A, A', B serves one of each), or aa (ab)
    only, a round A then A' (A then B)."""
    confidence: float | None = None
    """The verdict's confidence (0.95; with --rescore, the kept runs' own)."""
    noise: Literal["none", "writer", "cpu"] = "none"
    """A neighbour during a random half of the runs: a writer on the same volume, or a busy
    CPU."""
    noise_mbps: float = 200.0
    """The writer's MB/s."""
    seed: int = 0
    """Which runs get the neighbour."""
    run_timeout_s: float = field(default=1800.0, metadata=cli(flag="--run-timeout"))
    """Seconds a run may take before it counts as failed."""


@dataclass(frozen=True)
class Command:
    """What to calibrate, and where."""

    workloads: tuple[str, ...] = field(
        default=(),
        metadata=cli(flag="--workload", click_type=click.Choice(WORKLOADS), multiple=True),
    )
    """Workload to calibrate (repeat; default checkpoint)."""
    pairs: int = 10
    """A/A and A/B comparisons each (of the one kind with --comparisons aa or ab)."""
    out: Path | None = None
    """New or empty directory for the runs and the manifest."""
    rescore: Path | None = field(default=None, metadata=cli(metavar="DIR"))
    """Judge the runs kept in DIR again (nothing runs)."""
    use_repeats: int | None = None
    """With --rescore: the first K runs of each block only."""
    regroup: int | None = None
    """With --rescore: the kept runs as comparisons of K blocks a side (consecutive blocks of
    consecutive rounds, each used once), as profiles alternating K times over run them."""
    volume: str = "loop"
    """loop (the emulated classes; root) or a directory (A/A only)."""
    volume_size: str = "1GiB"
    """Size of the loop volume."""


def workload_argv(
    workload: str, s: Settings, volume: Path, run: PlannedRun, summary: Path
) -> list[str]:
    """The command of one run, as the pipeline's component gives it."""
    common = ["--storage-profile", run.vac, "--summary-json", str(summary), "--no-track"]
    if workload == "checkpoint":
        return [sys.executable, "-m", "trainer",
                "--checkpoint-dir", str(volume / "ckpt" / f"run-{run.index:04d}"),
                "--model-size", s.model_size, "--steps", str(s.steps),
                "--checkpoint-every", str(s.checkpoint_every), "--format", s.checkpoint_format,
                "--device", "cpu", *common]  # fmt: skip
    data = [sys.executable, "-m", "data_workloads", workload, "--data-dir", str(volume / "data")]
    if workload == "workspace":
        return [*data, "--files", str(s.files), "--file-size", s.file_size,
                "--rounds", str(s.rounds), *common]  # fmt: skip
    dataset = ["--dataset-size", s.dataset_size]
    if workload == "scan":
        return [*data, *dataset, "--epochs", str(s.epochs), "--num-workers", str(s.num_workers),
                "--compute-ms", str(s.compute_ms), *common]  # fmt: skip
    if workload == "materialize":
        return [*data, *dataset, *common]
    raise ValueError(f"unknown workload {workload!r} (known: {', '.join(WORKLOADS)})")


# --------------------------------------------------------------------------- the volume


class PlainDirectory:
    """Runs on a directory as it is: no class can be emulated, so only A/A."""

    emulates = False

    def __init__(self, path: Path) -> None:
        if not path.is_dir():
            raise CalibrationError(f"--volume {path}: not a directory", 2)
        self.root = Path(tempfile.mkdtemp(prefix=".calibrate-", dir=path))

    def describe(self) -> str:
        return f"plain directory {self.root.parent} (no class emulated: A/A only)"

    def set_class(self, vac: str) -> None:
        if vac != CLASS_A:
            raise CalibrationError("a plain directory cannot emulate a second class", 2)

    def wrap(self, argv: list[str]) -> list[str]:
        return argv

    def close(self) -> None:
        shutil.rmtree(self.root, ignore_errors=True)


class LoopEmulation:
    """The sandbox's emulation: a loop-device volume of our own, the class's limits on it
    for one cgroup, every run inside that cgroup."""

    emulates = True

    def __init__(self, size: int) -> None:
        import yaml

        from localcluster.emulation import loop_volume
        from localcluster.emulation.io_limits import Cgroup, IoLimits, ThrottleUnavailable

        self._loop = loop_volume
        classes = {
            d["metadata"]["name"]: d
            for d in yaml.safe_load_all(CLASSES_FILE.read_text())
            if isinstance(d, dict) and d.get("kind") == "VolumeAttributesClass"
        }
        self.limits = {
            vac: IoLimits.from_class_parameters(classes[vac].get("parameters") or {})
            for vac in (CLASS_A, CLASS_B)
        }
        name = f"calib-{os.getpid()}"
        self.mount_point = Path(tempfile.mkdtemp(prefix="csb-calibrate-"))
        self.volume = None
        try:
            self.cgroup = Cgroup.find(name)
            self.volume = loop_volume.create(name, self.mount_point, size)
            self.cgroup.create()
        except ThrottleUnavailable as exc:
            self.close()
            raise CalibrationError(f"cannot emulate the classes here: {exc}", 3) from exc
        self.root = self.mount_point

    def describe(self) -> str:
        return f"loop volume {self.volume.describe()}, classes " + "; ".join(
            f"{vac}: {lim.describe()}" for vac, lim in self.limits.items()
        )

    def set_class(self, vac: str) -> None:
        got = self._loop.apply_limits(self.volume, self.cgroup, self.limits[vac])
        if got != self.limits[vac]:
            raise CalibrationError(f"the kernel holds {got} for {vac}, not its limits", 3)

    def wrap(self, argv: list[str]) -> list[str]:
        from localcluster.emulation.io_limits import in_cgroup

        return in_cgroup(argv, self.cgroup)

    def close(self) -> None:
        try:
            if getattr(self, "cgroup", None) is not None:
                self.cgroup.remove()
        finally:
            if self.volume is not None:
                self._loop.remove(self.volume)
            try:
                self.mount_point.rmdir()
            except OSError:
                pass


# --------------------------------------------------------------------------- noise

_WRITER = """
import os, sys, time
path, mbps = sys.argv[1], float(sys.argv[2])
block = os.urandom(1 << 20)
fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o600)
start, written = time.monotonic(), 0
while True:
    os.pwrite(fd, block, (written >> 20) % 128 << 20)
    written += len(block)
    if written % (16 << 20) == 0:
        os.fsync(fd)
    ahead = written / (mbps * 1e6) - (time.monotonic() - start)
    if ahead > 0:
        time.sleep(ahead)
"""


class Neighbour:
    """A background process during a run: a writer on the same volume (outside the
    throttled cgroup: the neighbour's own I/O), or a busy CPU."""

    def __init__(self, kind: str, directory: Path, mbps: float) -> None:
        self.kind, self.directory, self.mbps = kind, directory, mbps
        self.proc: subprocess.Popen | None = None

    def start(self) -> None:
        if self.kind == "writer":
            self.directory.mkdir(parents=True, exist_ok=True)
            argv = [sys.executable, "-c", _WRITER, str(self.directory / "noise.bin"),
                    str(self.mbps)]  # fmt: skip
        else:
            argv = [sys.executable, "-c", "while True: pass"]
        self.proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait()
            self.proc = None
        shutil.rmtree(self.directory, ignore_errors=True)


# --------------------------------------------------------------------------- running


def _write_json(path: Path, data: Any) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(data, indent=2, allow_nan=False) + "\n")
    os.replace(tmp, path)


def _machine() -> dict[str, Any]:
    return {
        "host": platform.node(),
        "kernel": platform.release(),
        "cpus": os.cpu_count(),
        "load_average": [round(v, 2) for v in os.getloadavg()],
        # torch's threads on a few shared cores decide how long a CPU training step takes
        "omp_num_threads": os.environ.get("OMP_NUM_THREADS"),
    }


def _revision() -> str | None:
    try:
        done = subprocess.run(["git", "describe", "--always", "--dirty"], capture_output=True,
                              text=True, timeout=10, cwd=Path(__file__).parent)  # fmt: skip
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout.strip() or None


def score(
    comp: Comparison,
    runs: Sequence[PlannedRun],
    directory: Path,
    workload: str,
    confidence: float,
    use_repeats: int | None = None,
    verdicts: Path | None = None,
) -> dict[str, Any]:
    """Judge one comparison with the verdict (``python -m checkpoint_compare``) from its
    runs' summaries under ``directory``, its JSON written into ``verdicts`` (default
    ``directory/workload``); with ``use_repeats``, the first K runs of each
    block of repeats only (a return to the first profile is a block of its own)."""
    args = [sys.executable, "-m", "checkpoint_compare", "--no-track",
            "--confidence", str(confidence), "--baseline", comp.baseline]  # fmt: skip
    for name, indices in comp.profiles.items():
        chosen = indices
        if use_repeats is not None:
            chosen = [i for i in indices if runs[i].repeat < use_repeats]
        for i in chosen:
            run = runs[i]
            if run.exit_code != 0 or run.summary is None:
                return {"status": "run failed", "run": i}
            args += ["--summary", f"{name}={directory / run.summary}"]
    out = (verdicts or directory / workload) / f"verdict-{comp.index:04d}.json"
    args += ["--json", str(out)]
    done = subprocess.run(args, capture_output=True, text=True, timeout=600)
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or [""])[-1]
        status = "refused" if done.returncode == 3 else "verdict failed"
        return {"status": status, "exit_code": done.returncode, "error": last}
    try:
        report = json.loads(out.read_text())
        claimed, direction = claim_of(report, comp.candidate)
    except (OSError, ValueError) as exc:
        return {"status": "verdict failed", "exit_code": 0, "error": str(exc)}
    # The difference may be claimed while the whole verdict still keeps no profile (the
    # checkpoint verdict also asks the whole run to be measurably faster): both are kept.
    kept = report.get("verdict") if isinstance(report.get("verdict"), str) else None
    return {"status": "scored", "claimed": claimed, "direction": direction, "verdict": kept}


@dataclass(frozen=True)
class Code:
    """The workloads' code every run of a calibration uses: the committed tree of the
    checkout at the start, extracted under the output directory, and its revision. The
    checkout may change while a calibration runs (and the trainer records its revision:
    the verdict refuses runs of two builds); without git, the installed packages."""

    directory: Path | None = None
    revision: str | None = None

    def env(self) -> dict[str, str]:
        env = dict(os.environ)
        if self.directory is not None:
            path = [str(self.directory), env.get("PYTHONPATH", "")]
            env["PYTHONPATH"] = os.pathsep.join(p for p in path if p)
        if self.revision is not None:
            env["CODE_REVISION"] = self.revision
        return env

    @property
    def cwd(self) -> str | None:
        return None if self.directory is None else str(self.directory)


def snapshot(into: Path) -> Code:
    """The committed workload packages of this checkout, extracted into ``into``."""
    repo = Path(__file__).resolve().parent.parent
    packages = ["trainer", "data_workloads", "checkpoint_storage_bench"]
    try:
        rev = subprocess.run(["git", "rev-parse", "HEAD"], cwd=repo, capture_output=True,
                             text=True, timeout=30, check=True).stdout.strip()  # fmt: skip
        archive = subprocess.run(["git", "archive", "--format=tar", rev, *packages], cwd=repo,
                                 capture_output=True, timeout=120, check=True).stdout  # fmt: skip
    except (OSError, subprocess.SubprocessError):
        return Code()
    import io
    import tarfile

    into.mkdir(parents=True)
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        tar.extractall(into, filter="data")
    return Code(into, rev)


def _run_one(
    workload: str, s: Settings, where: Any, run: PlannedRun, out: Path, code: Code
) -> None:
    summary = Path(workload) / f"run-{run.index:04d}-{run.label}.json"
    argv = where.wrap(workload_argv(workload, s, where.root, run, out / summary))
    where.set_class(run.vac)
    (where.root / "ckpt").mkdir(exist_ok=True)  # the claim's parent directory, as mounted
    neighbour = Neighbour(s.noise, where.root / ".noise", s.noise_mbps) if run.noise else None
    started = time.monotonic()
    try:
        if neighbour:
            neighbour.start()
        done = subprocess.run(argv, capture_output=True, text=True, timeout=s.run_timeout_s,
                              env=code.env(), cwd=code.cwd)  # fmt: skip
        run.exit_code = done.returncode
        if done.returncode != 0:
            run.error = (done.stderr.strip().splitlines() or [""])[-1]
    except subprocess.TimeoutExpired:
        run.exit_code, run.error = 124, f"ran past {s.run_timeout_s:g} s"
    finally:
        if neighbour:
            neighbour.stop()
        run.wall_s = round(time.monotonic() - started, 3)
        shutil.rmtree(where.root / "ckpt", ignore_errors=True)
    if run.exit_code == 0:
        run.summary = str(summary)


def _prepare(workload: str, s: Settings, where: Any, code: Code) -> None:
    """Generate the dataset once, unthrottled and outside the cgroup, so that every
    measured run reads the same bytes and none pays for making them."""
    if workload not in ("scan", "materialize"):
        return
    prep = PlannedRun(-1, -1, CLASS_A, "prepare")
    argv = workload_argv("scan", replace_settings(s, epochs=1), where.root, prep,
                         where.root / ".prepare.json")  # fmt: skip
    done = subprocess.run(argv, capture_output=True, text=True, timeout=s.run_timeout_s,
                          env=code.env(), cwd=code.cwd)  # fmt: skip
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or [""])[-1]
        raise CalibrationError(f"{workload}: generating the dataset failed: {last}", 4)


def replace_settings(s: Settings, **changes: Any) -> Settings:
    return Settings(**{**asdict(s), **changes})


def calibrate(
    workloads: Sequence[str], pairs: int, s: Settings, out: Path, where: Any
) -> dict[str, Any]:
    """Run and score every comparison; the manifest is rewritten after every run."""
    code = snapshot(out / "code")
    manifest: dict[str, Any] = {
        "schema": SCHEMA,
        "started_at": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "machine": _machine(),
        "volume": where.describe(),
        "revision": _revision(),
        "workload_code": {"revision": code.revision, "directory": code.cwd},
        "settings": asdict(s),
        "pairs": pairs,
        "workloads": {},
    }
    for workload in workloads:
        runs, comps = plan(pairs, s.repeats, s.return_to_first, s.seed, s.noise != "none",
                           s.cycles, s.comparisons)  # fmt: skip
        if not where.emulates:
            comps = [c for c in comps if c.kind == "aa"]
            used = {i for c in comps for ids in c.profiles.values() for i in ids}
            runs = [r for r in runs if r.index in used]
        entry = {"runs": runs, "comparisons": comps}
        manifest["workloads"][workload] = entry
        (out / workload).mkdir(parents=True, exist_ok=True)
        _prepare(workload, s, where, code)
        by_index = {r.index: r for r in runs}
        for run in runs:
            _run_one(workload, s, where, run, out, code)
            print(f"{workload} run {run.index} {run.label} ({run.vac}"
                  f"{', neighbour' if run.noise else ''}): exit {run.exit_code}, "
                  f"{run.wall_s:.1f} s", file=sys.stderr, flush=True)  # fmt: skip
            for comp in comps:
                ids = [i for ids in comp.profiles.values() for i in ids]
                if comp.score is None and max(ids) == run.index:
                    comp.score = score(comp, _dense(by_index), out, workload, s.confidence)
            _write_json(out / "manifest.json", _plain(manifest))
    manifest["finished_at"] = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    manifest["machine_at_end"] = _machine()
    _write_json(out / "manifest.json", _plain(manifest))
    return _plain(manifest)


def _dense(by_index: dict[int, PlannedRun]) -> list[PlannedRun]:
    """Runs indexable by their plan index (a plain directory drops the A/B runs)."""
    size = max(by_index) + 1
    filler = PlannedRun(-1, -1, "", "")
    return [by_index.get(i, filler) for i in range(size)]


def _plain(value: Any) -> Any:
    if isinstance(value, PlannedRun | Comparison):
        return asdict(value)
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    return value


def _blocks(indices: list[int]) -> list[list[int]]:
    """Runs with consecutive indices: one block of back-to-back runs."""
    blocks: list[list[int]] = []
    for i in indices:
        if blocks and blocks[-1][-1] == i - 1:
            blocks[-1].append(i)
        else:
            blocks.append([i])
    return blocks


def regroup(comparisons: list[dict[str, Any]], cycles: int) -> list[dict[str, Any]]:
    """The kept comparisons as comparisons of ``cycles`` blocks a side: for each kind, each
    profile's blocks in the order they ran, cut into consecutive groups of ``cycles``, every
    block used once (a remainder is left out).

    >>> kept = [{"kind": "aa", "profiles": {"a": [0, 1, 4, 5], "c": [2, 3, 6, 7]}},
    ...         {"kind": "aa", "profiles": {"a": [8, 9, 12, 13], "c": [10, 11, 14, 15]}}]
    >>> [c["profiles"] for c in regroup(kept, 3)]
    [{'a': [0, 1, 4, 5, 8, 9], 'c': [2, 3, 6, 7, 10, 11]}]
    """
    out: list[dict[str, Any]] = []
    for kind in dict.fromkeys(c["kind"] for c in comparisons):
        mine = [c for c in comparisons if c["kind"] == kind]
        names = list(mine[0]["profiles"])
        blocks = {n: [b for c in mine for b in _blocks(c["profiles"][n])] for n in names}
        for g in range(min(len(b) for b in blocks.values()) // cycles):
            profiles = {n: [i for b in blocks[n][g * cycles : (g + 1) * cycles] for i in b]
                        for n in names}  # fmt: skip
            out.append({"index": len(out), "round": g, "kind": kind, "profiles": profiles})
    return out


def rescore(
    directory: Path,
    use_repeats: int | None,
    confidence: float | None,
    regroup_cycles: int | None = None,
) -> dict[str, Any]:
    """Judge the kept runs of ``directory`` again (with ``regroup_cycles``, regrouped: see
    :func:`regroup`). The scores and the verdicts go to a new directory ``rescore-<time>``
    beside the manifest, which keeps the scores (and the verdicts) of the time the runs were
    made."""
    path = directory / "manifest.json"
    try:
        manifest = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise CalibrationError(f"--rescore {directory}: cannot read {path}: {exc}", 2) from exc
    if not isinstance(manifest, dict) or manifest.get("schema") != SCHEMA:
        raise CalibrationError(f"--rescore {directory}: {path} is not a {SCHEMA} manifest", 2)
    confidence = confidence or manifest["settings"]["confidence"]
    manifest["rescored_at"] = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    stamp = manifest["rescored_at"].replace(":", "").replace("-", "")
    into, n = directory / f"rescore-{stamp}", 1
    while into.exists():
        n += 1
        into = directory / f"rescore-{stamp}-{n}"
    for workload, entry in manifest["workloads"].items():
        (into / workload).mkdir(parents=True)
        by_index = {r["index"]: PlannedRun(**r) for r in entry["runs"]}
        runs = _dense(by_index)
        if regroup_cycles is not None:
            entry["comparisons"] = regroup(entry["comparisons"], regroup_cycles)
        for c in entry["comparisons"]:
            comp = Comparison(**{**c, "score": None})
            c["score"] = score(comp, runs, directory, workload, confidence, use_repeats,
                               into / workload)  # fmt: skip
    manifest["rescored_with"] = {"use_repeats": use_repeats, "regroup": regroup_cycles,
                                 "confidence": confidence, "revision": _revision()}  # fmt: skip
    _write_json(into / "manifest.json", manifest)
    return manifest


# --------------------------------------------------------------------------- the table


@dataclass
class Rates:
    """One workload's scores."""

    workload: str
    aa_claims: int = 0
    aa_scored: int = 0
    ab_detected: int = 0
    ab_wrong_way: int = 0
    ab_scored: int = 0
    aa_kept_a_profile: int = 0
    ab_kept_faster: int = 0
    verdicts_read: int = 0
    not_scored: dict[str, int] = field(default_factory=dict)


def rates(manifest: dict[str, Any]) -> list[Rates]:
    out = []
    for workload, entry in manifest["workloads"].items():
        r = Rates(workload)
        for c in entry["comparisons"]:
            s = c.get("score") or {"status": "not judged"}
            if s["status"] != "scored":
                key = f"{c['kind']} {s['status']}"
                r.not_scored[key] = r.not_scored.get(key, 0) + 1
                continue
            kept = s.get("verdict")
            r.verdicts_read += kept is not None
            if c["kind"] == "aa":
                r.aa_scored += 1
                r.aa_claims += bool(s["claimed"])
                r.aa_kept_a_profile += kept is not None and kept != NO_DIFFERENCE
            else:
                r.ab_kept_faster += kept == CLASS_B
                r.ab_scored += 1
                r.ab_detected += bool(s["claimed"]) and s["direction"] == "better"
                r.ab_wrong_way += bool(s["claimed"]) and s["direction"] == "worse"
        out.append(r)
    return out


def _rate(k: int, n: int, goal: float, at_most: bool) -> str:
    if n == 0:
        return "none judged"
    low, high = wilson(k, n)
    met = k / n <= goal if at_most else k / n >= goal
    shown = high <= goal if at_most else low >= goal
    state = "goal shown" if shown else "goal met (not yet shown)" if met else "GOAL NOT MET"
    return f"{k}/{n} = {k / n:.0%} (95% Wilson {low:.0%}–{high:.0%}): {state}"


def table(manifest: dict[str, Any]) -> str:
    s = manifest["settings"]
    cycles = s.get("cycles", 1)  # a manifest from before the option ran the profiles once
    cycled = f", the profiles {cycles} times over (A B A B …)" if cycles > 1 else ""
    kinds = s.get("comparisons", "both")  # a manifest from before the option made both
    if kinds != "both":
        cycled += ", A/A comparisons only" if kinds == "aa" else ", A/B comparisons only"
    lines = [
        f"calibration {manifest.get('started_at', '?')} – {manifest.get('finished_at', '?')}, "
        f"{manifest['machine']['host']} ({manifest['machine']['cpus']} CPUs, load "
        f"{manifest['machine']['load_average']}), verdict {manifest.get('revision')}",
        f"volume: {manifest['volume']}",
        f"repeats {s['repeats']}{' + return to first' if s['return_to_first'] else ''}"
        f"{cycled}, "
        f"noise {s['noise']}, confidence {s['confidence']:.0%}",
    ]
    if manifest.get("rescored_with"):
        lines.append(f"rescored {manifest['rescored_at']}: {manifest['rescored_with']}")
    for r in rates(manifest):
        lines.append(f"{r.workload}:")
        lines.append(f"  A/A false claims (goal ≤ {GOAL_FALSE_CLAIMS:.0%}): "
                     + _rate(r.aa_claims, r.aa_scored, GOAL_FALSE_CLAIMS, True))  # fmt: skip
        if r.ab_scored or any(k.startswith("ab") for k in r.not_scored):
            wrong = f"; {r.ab_wrong_way} called the faster class worse" if r.ab_wrong_way else ""
            lines.append(f"  A/B detected (goal ≥ {GOAL_DETECTION:.0%}): "
                         + _rate(r.ab_detected, r.ab_scored, GOAL_DETECTION, False) + wrong)  # fmt: skip
        for key, n in sorted(r.not_scored.items()):
            lines.append(f"  {key}: {n}")
        if r.verdicts_read:
            lines.append(f"  the verdict (whole run) kept a profile in {r.aa_kept_a_profile} "
                         f"A/A and kept the faster class in {r.ab_kept_faster} A/B")  # fmt: skip
    return "\n".join(lines)


# --------------------------------------------------------------------------- the command


@click.command(
    context_settings={"help_option_names": ["-h", "--help"]},
    epilog=exit_codes_help(EXIT_CODES),
)
@config_options(Command)
@config_options(Settings)
def main(**options: Any) -> None:
    """Measure the verdict's false-claim rate (A/A) and detection rate (A/B)."""
    command = Command(**{f.name: options.pop(f.name) for f in fields(Command)})
    if command.rescore is not None:
        if command.out is not None:
            raise CalibrationError("--rescore and --out do not go together", 2)
        if command.regroup is not None and command.regroup < 1:
            raise CalibrationError(f"--regroup must be at least 1, not {command.regroup}", 2)
        click.echo(table(rescore(command.rescore, command.use_repeats, options["confidence"],
                                 command.regroup)))  # fmt: skip
        return
    _run(command, Settings(**options))


def _run(command: Command, s: Settings) -> None:
    from checkpoint_storage_bench.units import parse_size

    if command.out is None:
        raise CalibrationError("--out DIR is needed (where the runs are kept)", 2)
    if command.use_repeats is not None or command.regroup is not None:
        raise CalibrationError("--use-repeats and --regroup go with --rescore", 2)
    if command.pairs < 1 or s.repeats < 1:
        raise CalibrationError("--pairs and --repeats must be at least 1", 2)
    if s.cycles < 1:
        raise CalibrationError(f"--cycles must be at least 1, not {s.cycles}", 2)
    if s.comparisons == "ab" and command.volume != "loop":
        raise CalibrationError("--comparisons ab needs the emulated classes (--volume loop): "
                               "a plain directory has one class, A/A only", 2)  # fmt: skip
    s = replace_settings(s, confidence=0.95 if s.confidence is None else s.confidence)
    if not 0 < s.confidence < 1:  # type: ignore[operator]
        raise CalibrationError(f"--confidence must be in (0, 1), got {s.confidence}", 2)
    out = command.out
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise CalibrationError(f"--out {out} exists and is not empty: nothing is "
                               "written over a calibration's runs", 2)  # fmt: skip
    try:
        size = parse_size(command.volume_size)
    except ValueError as exc:
        raise CalibrationError(f"--volume-size: {exc}", 2) from exc
    out.mkdir(parents=True, exist_ok=True)
    out = out.resolve()
    volume = command.volume
    where = LoopEmulation(size) if volume == "loop" else PlainDirectory(Path(volume))
    # A terminated calibration still unmounts its volume and removes its cgroup.
    previous = signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    try:
        manifest = calibrate(command.workloads or ["checkpoint"], command.pairs, s, out, where)
    finally:
        signal.signal(signal.SIGTERM, previous)
        where.close()
    click.echo(table(manifest))
    failed = [r for e in manifest["workloads"].values() for r in e["runs"] if r["exit_code"]]
    if failed:
        raise CalibrationError(f"{len(failed)} run(s) failed, e.g. run {failed[0]['index']}: "
                               f"{failed[0]['error']}", 4)  # fmt: skip


if __name__ == "__main__":
    main(prog_name="python -m checkpoint_compare.calibrate")
