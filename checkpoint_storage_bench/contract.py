"""The names the parts share, once, in code. docs/contracts.md is the page people read;
this module mirrors it, and producers and consumers import from here instead of restating.

Who uses what: the trainer writes the summary and the metrics, the fio sweep names its
outputs, the verdict reads all of them back, the bundle's components declare them.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

# --------------------------------------------------------------------------- trainer

SUMMARY_SCHEMA = "checkpoint-training/1"
"""The ``schema`` of the trainer's ``--summary-json``."""

STAGES = ("serialize", "write", "fsync", "checksum", "upload", "pause", "total")
"""The stages of one checkpoint's timeline, in order (docs/contracts.md, README).
``checksum`` is the read-back of a file a library wrote (torch, dcp, safetensors), to
checksum it; the raw writer checksums while writing, so it has none."""

CHECKPOINT_DIR_PATTERN = r"step-(?:\d{8}|[1-9]\d{8,})"
"""The name of a published checkpoint directory (``step-NNNNNNNN``: the step zero-padded to
8 digits, more digits from step 100,000,000 on, one name per step): what a trainer must
refuse to write over, checked before torch is imported."""

RUN_STARTED_AT = "started_at"
RUN_FINISHED_AT = "finished_at"
"""Summary keys: when the training job started and ended (ISO 8601 UTC to the second,
``2026-12-01T23:41:29Z``), so the verdict orders summary files by time as it orders
tracked runs."""

RESTORE_OUTPUTS = ("restore_s", "restore_bytes", "restore_gbps")
"""Trainer outputs and summary keys: seconds to load and verify the newest checkpoint (its
files read back, every checksum checked, the state built), its bytes and GB/s; absent
(summary: null) when no restore was measured."""

RESTORE_MEASURED = "restore_measured"
"""Summary key and run meta (outputs are numbers): when the restore was measured: ``resume`` (the run
continued from a checkpoint) or ``end`` (``--restore-check``: the newest checkpoint loaded
back once training ended)."""

CHECKPOINT_METRICS = {f"{s}_s": f"ckpt_{s}_s" for s in STAGES} | {
    "bytes": "ckpt_bytes",
    "write_gbps": "ckpt_write_gbps",
    "upload_gbps": "ckpt_upload_gbps",
}
"""Per-checkpoint field of the summary → the Polyaxon metric logged once per checkpoint."""

LOSS_METRIC = "loss"

RUN_OUTPUTS = (
    "runtime_s",
    "steps_per_s",
    "final_loss",
    "checkpoint_count",
    "checkpoint_bytes",
    "ckpt_pause_s_total",
    "ckpt_pause_share",
)
"""Run-level outputs copied from the summary as they are."""

STAGE_OUTPUTS = tuple(f"ckpt_{s}_s_median" for s in STAGES) + (
    "ckpt_pause_s_min",
    "ckpt_pause_s_max",
    "ckpt_write_gbps_median",
    "ckpt_upload_gbps_median",
)
"""Outputs summarizing the per-checkpoint figures (comparison-view columns)."""

# Many ranks under torchrun: every rank writes its shard, rank 0 commits.

PARALLEL_MODES = ("none", "ddp", "fsdp")
"""``--parallel``: one process; DDP (replicated model, the checkpoint split across ranks);
FSDP2 ``fully_shard`` (each rank writes its local shards)."""

WORLD_SIZE = "world_size"
"""Ranks that wrote each checkpoint (1 for one process): trainer input and output, and a key
of the summary (top level, and per checkpoint of several ranks)."""

DISTRIBUTED_CHECKPOINT_METRICS = {
    "aggregate_gbps": "ckpt_aggregate_gbps",
    "slowest_pause_s": "ckpt_slowest_pause_s",
}
"""Per-checkpoint field of a checkpoint several ranks wrote → the Polyaxon metric rank 0 logs
(none for one process): all ranks' bytes / wall time from the first rank's first write to the
commit; the slowest rank's pause, the one training waits on. Each has the output
``<metric>_median``."""

DISTRIBUTED_CHECKPOINT_KEYS = (WORLD_SIZE, "ranks", *DISTRIBUTED_CHECKPOINT_METRICS, "commit_s")
"""Extra keys of a checkpoint written by several ranks, in the summary's ``checkpoints``:
``ranks`` is the list of per-rank stage dicts (:data:`RANK_STAGE_KEYS`)."""

RANK_STAGE_KEYS = (
    "rank",
    "bytes",
    "serialize_s",
    "write_s",
    "fsync_s",
    "upload_s",
    "pause_s",
    "total_s",
    "write_gbps",
    "io_mode",
)
"""One rank's figures of one checkpoint (an entry of ``ranks``)."""

DISTRIBUTED_INPUTS = (WORLD_SIZE, "parallel")
"""Trainer inputs recorded by every run (1 and none for one process)."""

DISTRIBUTED_OUTPUTS = (
    WORLD_SIZE,
    *(f"{metric}_median" for metric in DISTRIBUTED_CHECKPOINT_METRICS.values()),
)
"""Run-level outputs: ``world_size`` always; the medians only when several ranks wrote."""

RESUMED_FROM_STEP = "resumed_from_step"
"""Trainer output and summary key: the step a resumed run continued from (output 0 and
summary null: it started at step 0, so only a step past 0 is a resume). A resumed run's
timings cover only part of the run."""

DIVERGED_AT_STEP = "diverged_at_step"
"""Trainer output and summary key: the first logged step whose loss was not finite (NaN or
infinity); output 0 and summary null while the loss stayed finite. The loss itself is then
null in the summary and missing from the outputs and the ``loss`` metric (neither takes a
non-finite number), so this is what tells a diverged run from one that logged no loss."""

SIGNED_FIGURES = frozenset({"final_loss", LOSS_METRIC})
"""The only numbers of a training run that may be negative (a loss). Every other number it
records (outputs, per-checkpoint metrics, summary figures: seconds, bytes, rates, shares,
counts, steps) is >= 0, and ``runtime_s`` > 0: a run that took no time measured nothing."""

TRAINING_OUTPUTS = (
    RUN_OUTPUTS
    + STAGE_OUTPUTS
    + (RESUMED_FROM_STEP, DIVERGED_AT_STEP)
    + DISTRIBUTED_OUTPUTS
    + RESTORE_OUTPUTS
)
"""Every output the training job logs, hence every output its component declares."""

IMAGE_INPUT = "image"
"""Trainer input: the image reference the run was started with (``repo:tag`` or
``repo@sha256:…``; env ``IMAGE_REF``)."""

PROVENANCE_KEYS = (
    IMAGE_INPUT,
    "code_revision",
    "image_digest",
    "node_name",
    "gpu_model",
    "gpu_count",
    "cuda_version",
    "torch_version",
    "cpu_count",
)
"""What ran where: the summary's ``provenance``. :data:`IMAGE_INPUT` is a run input; the
others are run meta."""

# ------------------------------------------------------------- what makes runs comparable

COMPARABLE_INPUTS = (
    "model_size_bytes",
    "param_count",
    "dataset_seed",
    "checkpoint_format",
    "durability",
    "async_checkpoint",
    "steps",
    "checkpoint_every",
    "batch_size",
    "seq_len",
    "device",
    "io_streams",
    "overlap",
    "upload_to",
    *DISTRIBUTED_INPUTS,
)
"""Trainer inputs that must be equal for two runs to be compared. The seed says "keep the
checkpoint format, model, dataset, and durability requirements fixed"; the step counts and
device belong to "the whole run" being the same run; a run of 8 ranks writes 8 streams at
once, so it is no baseline for a run of one (world size and parallel mode); and the writer's
own settings (streams per checkpoint, serialize/write overlap, an upload stage) change the
pause as much as a volume can, so a difference in them would be credited to the storage."""

REQUIRED_INPUTS = ("model_size_bytes", "dataset_seed", "checkpoint_format", "durability")
"""Without these a comparison cannot be vouched for, so a training run must record them."""

COMPARABLE_META = ("code_revision", "image_digest")
"""The trainer build: runs of different code or images measure different writers."""

# ------------------------------------------------------------------------- fio sweep

FIO_SCHEMA = "fio-sweep/1"
FIO_MEASURES = ("bw_mbps", "iops", "lat_p99_us")
"""The per-case measures the fio sweep logs as outputs (``fio_<case>_<measure>``)."""


def output_key(name: str) -> str:
    """A name as part of a Polyaxon output name: ``.`` and ``-`` become ``_``.

    >>> output_key("seqwrite-1m.direct")
    'seqwrite_1m_direct'
    """
    return name.replace(".", "_").replace("-", "_")


def output_key_clashes(names: Iterable[str]) -> list[tuple[str, str]]:
    """Pairs of distinct names with one :func:`output_key` (``gp3-fast`` and ``gp3.fast``):
    their outputs would overwrite each other, so a plan or a verdict refuses them.

    >>> output_key_clashes(["gp3-fast", "gp3.fast", "io2"])
    [('gp3-fast', 'gp3.fast')]
    """
    seen: dict[str, str] = {}
    clashes = []
    for name in dict.fromkeys(names):
        key = output_key(name)
        if key in seen:
            clashes.append((seen[key], name))
        else:
            seen[key] = name
    return clashes


def fio_output(case: str, measure: str) -> str:
    """The output name of one fio case's measure.

    >>> fio_output("seqwrite-1m", "bw_mbps")
    'fio_seqwrite_1m_bw_mbps'
    """
    return f"fio_{output_key(case)}_{measure}"


FIO_OUTPUT = re.compile(rf"^fio_(?P<case>.+)_(?P<measure>{'|'.join(FIO_MEASURES)})$")
FIO_METRIC = re.compile(r"^fio[.-](?P<case>.+)[.-](?P<measure>bw_mbps|iops|lat_p\d+_us)$")
"""Metrics are logged as ``fio.<case>.<measure>``; Polyaxon stores the name with ``-``."""

# --------------------------------------------------------------------------- verdict

VERDICT_CONFIDENCE = 0.95
"""The confidence of the verdict's intervals unless asked otherwise (``--confidence``)."""

VERDICT_WARMUP = 1
"""Checkpoints at the start of each run the verdict reports as warm-up and leaves out."""

MIN_BUDGET_CHECKPOINTS = 5
"""The fewest measured checkpoints (after the warm-up) a run needs for a one-sided upper
bound of its median pause at :data:`VERDICT_CONFIDENCE`: the largest of n pauses bounds the
median with confidence 1 − 2⁻ⁿ, 0.97 for 5, 0.94 for 4. Below it no profile can meet a pause
budget (``--max-pause-s``, ``--max-pause-share``) with confidence, whatever it measures: the
modification plan says so before anything is switched (a test holds it equal to what the
verdict's bound needs)."""

VERDICT_RUNS_PER_BLOCK: dict[str, int] = {
    "checkpoint": 2,
    "scan": 2,
    "materialize": 1,
    "workspace": 1,
}
"""Runs of one block (a profile's repeats back to back) the verdict counts as independent, by
workload: the calibrated designs (docs/compare.md, "Calibration"). A workspace's p99 save
latency and a materialize run's one figure move with whatever shares their block (the
neighbour, the device's state): counting two of its runs back to back, the workspace's A/A
comparisons claimed a difference in 7 of 150 (two passes) and 7 of 95 (three passes), and
materialize's at the pipeline's 64 MiB in 6 of 150 (two passes); counting one, in 0, 1 and 0,
and materialize still detected the factor of two in 60 of 60. The verdict's row reads it
(``checkpoint_compare.table``) and the plan says what more repeats in one block buy."""


@dataclass(frozen=True)
class CalibratedRuns:
    """What the calibration (docs/compare.md, "Calibration") measured for a workload, in runs
    a side of a comparison as the verdict counts them (at most ``VERDICT_RUNS_PER_BLOCK`` a
    block of back-to-back runs), a neighbour (a writer on the volume, or a busy core) beside
    half the runs: how often the verdict detected a factor of two between classes (A/B), and
    how often it claimed a difference between one class under two names (A/A)."""

    missed: int
    """The most runs a side measured that detected it in fewer than 95 % of comparisons
    (0: no design missed)."""
    met: int | None
    """The fewest runs a side that showed both goals: detections at least 95 % and false
    claims at most 5 %, each beyond its 95 % interval (None: no design measured did)."""


CALIBRATED_RUNS: dict[str, CalibratedRuns] = {
    "checkpoint": CalibratedRuns(missed=0, met=4),
    "scan": CalibratedRuns(missed=0, met=2),
    "materialize": CalibratedRuns(missed=1, met=2),
    "workspace": CalibratedRuns(missed=3, met=4),
}
"""A storage-bound scan's epochs give every run several samples, and two runs a side, back to
back, showed both goals. So did a checkpoint's pauses with the profiles alternating (A B A B,
4 counted a side); back to back (2 counted) their rates met the goals without showing them
(a slower-class run whose checkpoints the emulated throttle let through in a burst looks like
the faster class), so such a comparison is not a calibrated answer: the plan says so before
any switch and names the alternation. Materialize has one figure a run, moved by a busy machine
as much as by the class, and counts one run a block: with one block a side, or the return to
the first profile (the candidate still one block, 1 run counted), it missed it; profiles that
alternate (A B A B, 2 counted a side) showed both goals with a neighbour writing or computing
in half the runs, though (256 MiB) not on a machine whose two cores other work
oversubscribed threefold, where the transform's CPU stretched either class's run. The
workspace's p99 counts one run a block too: three passes (A B A B A B, 3 counted a side)
missed it, four passes showed both. A design measured to miss cannot reach a 95 % answer,
so the plan refuses it before any switch; the verdict, which may be given runs no plan
vetted, says of each comparison whose runs a side fall short of ``met`` that it is not a
calibrated answer (``checkpoint_compare.verdict``)."""

PLAN_ANSWERABLE_OUTPUT = "answerable"
"""The plan op's output: whether the pipeline's settings can answer every question asked of
the verdict at its confidence (false: see :data:`PLAN_ANSWER_LIMITS_OUTPUT`)."""
PLAN_ANSWER_LIMITS_OUTPUT = "answer_limits"
"""The plan op's output: why not, one sentence per limit, joined by ``"; "``."""
PLAN_ANSWER_NOTES_OUTPUT = "answer_notes"
"""The plan op's output: what the settings answer less well than they seem to (not a
calibrated answer, repeats that buy a steadier estimate only), one sentence per note, joined
by ``"; "``."""

VERDICT_OUTPUT = "verdict"
RECOMMENDED_PROFILE_OUTPUT = "recommended_profile"
VERDICT_OUTPUTS = (
    VERDICT_OUTPUT,
    "verdict_reason",
    "verdict_outcome",
    RECOMMENDED_PROFILE_OUTPUT,
    "recommendation_reason",
    "baseline_profile",
    "candidate_profile",
    "profile_count",
    "confidence",
    "pause_speedup",
    "pause_delta_s",
    "pause_delta_ci_low_s",
    "pause_delta_ci_high_s",
    "runtime_delta_s",
    "runtime_delta_ci_low_s",
    "runtime_delta_ci_high_s",
    "final_loss_delta",
    "failed_runs",
    "baseline_drift_runtime_s",
    "baseline_drift_pause_s",
    "cost_delta_usd_per_checkpoint",
    "cost_delta_usd_per_1000_ckpt",
    "storage_delta_usd_per_month",
    "run_cost_delta_usd",
    "breakeven_checkpoints_per_month",
    "workload",
)
"""The compare op's outputs about the whole comparison (the best candidate against the
baseline); each is logged only when it is known. ``workload`` names the workload judged
(one of :data:`WORKLOADS`); a data workload's headline figures are named from its row of the
verdict's table (``<stem>_delta_<unit>``, ``<profile>_<headline>``)."""

PROFILE_FIGURES = (
    "pause_s_median",
    "warmup_pause_s_median",
    "runtime_s",
    "runs",
    "run_cost_usd",
    "pause_diff_ci_low_s",
    "pause_diff_ci_high_s",
)
"""The compare op's outputs per profile, named by :func:`profile_output`; the two
``pause_diff_*`` are a candidate's interval against the baseline."""


def profile_output(profile: str, figure: str) -> str:
    """The compare op's output name of one profile's figure, the profile first.

    >>> profile_output("checkpoint-throughput", "pause_diff_ci_low_s")
    'checkpoint_throughput_pause_diff_ci_low_s'
    """
    if figure not in PROFILE_FIGURES:
        raise ValueError(f"{figure!r} is not a profile figure (one of {PROFILE_FIGURES})")
    return f"{output_key(profile)}_{figure}"


def headline_outputs(stem: str, unit: str) -> dict[str, str]:
    """The compare op's outputs about a workload's headline figure, named from its stem and
    unit (the checkpoint's ``pause`` and ``s`` give the names in :data:`VERDICT_OUTPUTS`):
    the baseline's median ÷ the candidate's, the candidate's shift and its interval, the
    baseline's drift.

    >>> headline_outputs("epoch_time", "s")["delta"]
    'epoch_time_delta_s'
    """
    return {
        "speedup": f"{stem}_speedup",
        "delta": f"{stem}_delta_{unit}",
        "delta_low": f"{stem}_delta_ci_low_{unit}",
        "delta_high": f"{stem}_delta_ci_high_{unit}",
        "drift": f"baseline_drift_{stem}_{unit}",
    }


def profile_headline_figures(stem: str, unit: str) -> dict[str, str]:
    """The compare op's outputs per profile about a workload's headline figure, each after
    the profile's output key (the checkpoint's ``pause`` and ``s`` give the names in
    :data:`PROFILE_FIGURES`): the profile's median, and a candidate's interval against the
    baseline.

    >>> profile_headline_figures("epoch_time", "s")["median"]
    'epoch_time_s_median'
    """
    return {
        "median": f"{stem}_{unit}_median",
        "diff_low": f"{stem}_diff_ci_low_{unit}",
        "diff_high": f"{stem}_diff_ci_high_{unit}",
    }


# ---------------------------------------------------------------- storage-profile hook

SWITCH_SCHEMA = "storage-profile-switch/1"
LEDGER_OUTPUT = "ledger"
"""The hook logs the claim's ledger after its switch (the value of :data:`LEDGER_ANNOTATION`,
as :func:`format_ledger` writes it) as this output: the verdict refuses a profile whose
claim was switched to another class inside a training run's measured interval."""
HOOK_OUTPUTS = (
    "applied_class",
    "k8s_settle_s",
    "provider_settle_s",
    "total_settle_s",
    "unbound_noop",
    LEDGER_OUTPUT,
)
VAC_PARAMETER_PREFIX = "vac_"
"""Each of the target class's parameters is recorded as ``vac_<parameter>``."""

# The ledger of switches, kept on the claim itself (docs/contracts.md): every switch the
# hook makes appends one entry; preflight counts them against the driver's window, and the
# verdict refuses a profile whose claim was switched inside its measured interval.
LEDGER_ANNOTATION = "checkpoint-storage-bench.io/class-switches"
"""Annotation on the claim: a JSON list of ``{"at": ISO-8601 UTC, "from": str|null,
"to": str, "holder": str|null}``, oldest first, at most :data:`LEDGER_MAX_ENTRIES`."""
LEDGER_MAX_ENTRIES = 32
LEDGER_TIME_MARGIN = timedelta(days=366)
"""Longer than any modification window: an entry's time must leave this much room before
the calendar ends (or starts), else the ledger is refused as not a ledger."""


@dataclass(frozen=True)
class LedgerEntry:
    """One switch of a claim's class, as recorded in :data:`LEDGER_ANNOTATION`."""

    at: datetime
    from_class: str | None
    to_class: str
    holder: str | None = None

    def to_json(self) -> dict[str, str | None]:
        at = self.at.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        return {"at": at, "from": self.from_class, "to": self.to_class, "holder": self.holder}


def parse_ledger(text: str | None) -> list[LedgerEntry]:
    """The entries of a ledger annotation, oldest first; ``None`` or ``""`` is an empty ledger.

    Raises:
        ValueError: The annotation is not a ledger (someone else wrote it by hand).

    >>> parse_ledger('[{"at": "2026-12-01T10:00:00Z", "from": "a", "to": "b"}]')[0].to_class
    'b'
    """
    if not text:
        return []
    try:
        data = json.loads(text)
    except RecursionError:
        # A hand-made annotation nested thousands deep: json gives up with RecursionError.
        raise ValueError(f"{LEDGER_ANNOTATION} is nested too deeply to be a ledger") from None
    if not isinstance(data, list):
        raise ValueError(f"{LEDGER_ANNOTATION} is not a JSON list")
    entries = []
    for item in data:
        if (
            not isinstance(item, dict)
            or not isinstance(item.get("to"), str)
            or not isinstance(item.get("from"), str | None)
            or not isinstance(item.get("holder"), str | None)
        ):
            raise ValueError(f"{LEDGER_ANNOTATION}: not a ledger entry: {_short(item)}")
        at = datetime.fromisoformat(str(item.get("at")).replace("Z", "+00:00"))
        if at.tzinfo is None:
            raise ValueError(f"{LEDGER_ANNOTATION}: time without a zone: {_short(item)}")
        if not _in_calendar(at):
            raise ValueError(f"{LEDGER_ANNOTATION}: time out of range: {_short(item)}")
        entries.append(LedgerEntry(at, item.get("from"), item["to"], item.get("holder")))
    return sorted(entries, key=lambda e: e.at)


def _in_calendar(at: datetime) -> bool:
    """Whether ``at`` leaves :data:`LEDGER_TIME_MARGIN` before the calendar ends (or starts):
    every reader adds or subtracts a modification window and writes the time back in UTC,
    which would overflow at the calendar's ends."""
    try:
        utc = at.astimezone(UTC)
    except OverflowError:
        return False
    low = datetime.min.replace(tzinfo=UTC) + LEDGER_TIME_MARGIN
    high = datetime.max.replace(tzinfo=UTC) - LEDGER_TIME_MARGIN
    return low <= utc <= high


def _short(item: object, limit: int = 200) -> str:
    """An entry as shown in an error: ``repr``, cut (a hand-made annotation may be huge)."""
    text = repr(item)
    return text if len(text) <= limit else text[:limit] + "…"


def format_ledger(entries: list[LedgerEntry]) -> str:
    """The annotation's value: the newest :data:`LEDGER_MAX_ENTRIES` entries, compact JSON."""
    kept = sorted(entries, key=lambda e: e.at)[-LEDGER_MAX_ENTRIES:]
    return json.dumps([e.to_json() for e in kept], separators=(",", ":"))


LEASE_PREFIX = "storage-profile-"
"""The ``coordination.k8s.io`` Lease that makes a pipeline the claim's only switcher is
named ``storage-profile-<claim>``, in the claim's namespace (see :func:`lease_name` for a
claim name too long for that)."""
LEASE_NAME_MAX = 253
"""A Lease's name is a DNS-1123 subdomain: kube-apiserver refuses a longer one (422)."""
LEASE_HASH_CHARS = 10


def lease_name(claim: str) -> str:
    """The name of the Lease guarding ``claim``: ``storage-profile-<claim>`` when that fits
    in :data:`LEASE_NAME_MAX` characters; else the claim's name cut short (without a
    trailing ``-`` or ``.``), ``-`` and the first :data:`LEASE_HASH_CHARS` hex digits of the
    SHA-256 of the whole claim name: always a valid name, the same for the same claim, and
    different for two long claims that share their beginning.

    >>> lease_name("training-checkpoints")
    'storage-profile-training-checkpoints'
    >>> len(lease_name("a" * 253))
    253
    """
    name = f"{LEASE_PREFIX}{claim}"
    if len(name) <= LEASE_NAME_MAX:
        return name
    digest = hashlib.sha256(claim.encode()).hexdigest()[:LEASE_HASH_CHARS]
    head = name[: LEASE_NAME_MAX - LEASE_HASH_CHARS - 1].rstrip("-.")
    return f"{head}-{digest}"


MODIFICATION_WINDOWS: dict[str, tuple[int, float]] = {
    "ebs.csi.aws.com": (4, 24 * 3600.0),
    "pd.csi.storage.gke.io": (1, 4 * 3600.0),
}
"""CSI driver → (modifications allowed, per rolling window in seconds). EBS: 4 per 24 h
since 2026-01-15, each after the previous one completed; GKE Hyperdisk: once per 4 h. A
driver not listed has no known limit."""

# ------------------------------------------------------------ sandbox storage profiles
# ``connections/sandbox-profiles.yaml`` (docs/contracts.md): its names; the parser and the
# claim's state file are ``localcluster.emulation.sandbox_profiles``.

SANDBOX_PROFILES_FILE = "connections/sandbox-profiles.yaml"
"""Default profiles file, relative to the sandbox root (``$SANDBOX_ROOT``, else the repo)."""
SANDBOX_MEDIA_PROFILES_FILE = "connections/sandbox-profiles-media.yaml"
"""Two plain media (the local disk, memory): what the demo uses where the kernel cannot
throttle. Not an emulation of any class."""

SANDBOX_DRIVER = "local"
"""The hook's ``driver`` for a profile that is a plain directory (a medium as it is)."""
SANDBOX_EMULATED_DRIVER = "local-throttled"
"""The hook's ``driver`` for a profile that emulates a VolumeAttributesClass with block-I/O
limits on the local disk; its ``vac_*`` parameters are the class's own."""


# ------------------------------------------------------------------- data workloads
# ``python -m data_workloads scan|materialize|workspace`` (docs/data-workloads.md): the
# other workloads teams put on the same kind of claim, measured in their own terms.

WORKLOADS = ("checkpoint", "scan", "materialize", "workspace")
"""The profiles pipeline's ``workload`` input: the checkpointing training run (the default),
or one of the data workloads."""

DATA_WORKLOADS = WORKLOADS[1:]
"""The subcommands of ``python -m data_workloads``."""

DATA_FORMATS = ("webdataset", "files", "parquet", "mds")
"""``--dataset-format``: WebDataset tar shards, a directory of many small files, Parquet
files (row groups), or MosaicML Streaming's MDS shards."""

DATA_LOADERS = ("ours", "webdataset", "streaming", "arrow", "torch")
"""``scan --loader``: ours (batches read straight into shared slots) or the library a team
would use on the format: the ``webdataset`` package, MosaicML ``streaming``'s
StreamingDataset, pyarrow's Parquet batches as Hugging Face ``datasets`` streams them
(``arrow``), a plain map-style ``torch`` Dataset of files. A scan records it in its config
(the input ``loader``): runs of one loader compare with runs of the same loader only."""

LOADER_FORMATS = {
    "ours": DATA_FORMATS,
    "webdataset": ("webdataset",),
    "streaming": ("mds",),
    "arrow": ("parquet",),
    "torch": ("files",),
}
"""The formats each loader reads."""

DATA_SUMMARY_SCHEMA = "data-workload/1"
"""The ``schema`` of ``python -m data_workloads ... --summary-json``."""

DATASET_MANIFEST_SCHEMA = "data-workload-dataset/1"
"""The ``schema`` of a generated dataset's ``manifest.json`` (what makes it reusable)."""

# Every name a data workload writes (outputs, per-epoch and per-round metrics, summary
# keys) is spelled here once; the writers and the verdict import them.

DATASET_RECORDS = "dataset_records"
DATASET_BYTES = "dataset_bytes"
DATASET_GENERATED = "dataset_generated"
DATASET_OUTPUTS = (DATASET_RECORDS, DATASET_BYTES, DATASET_GENERATED)
"""Outputs of scan and materialize: the dataset measured (its records, its bytes on the
volume) and whether this run generated it (False: it was reused, after verification). Its
format is the input ``dataset_format`` (an output of the same name would shadow the input in
Polyaxon's templates)."""

SCAN_PREFIX = "scan_"
"""A scan's outputs and metrics are its epoch figures' names with this prefix."""
SCAN_EPOCH_S = "scan_epoch_s"
SCAN_AU = "scan_au"
SCAN_AU_OK = "scan_au_ok"
SCAN_SAMPLES_PER_S = "scan_samples_per_s"
SCAN_MBPS = "scan_mbps"
SCAN_FIRST_BATCH_S = "scan_first_batch_s"
SCAN_WAIT_P50_MS = "scan_wait_p50_ms"
SCAN_WAIT_P99_MS = "scan_wait_p99_ms"
SCAN_CACHE_KEPT_OUT = "scan_cache_kept_out"
"""A scan's figures, one name each: the epoch time and accelerator utilization (per-epoch
metrics and the median epoch's outputs, as are the rates), batch waits, and whether every
epoch read the whole dataset from the device."""

SCAN_OUTPUTS = (
    SCAN_EPOCH_S,
    SCAN_AU,
    SCAN_AU_OK,
    SCAN_SAMPLES_PER_S,
    SCAN_MBPS,
    SCAN_FIRST_BATCH_S,
    SCAN_WAIT_P50_MS,
    SCAN_WAIT_P99_MS,
    SCAN_CACHE_KEPT_OUT,
)
"""Scan outputs: the median epoch's figures (AU = emulated compute time / wall time;
``scan_au_ok`` = AU ≥ ``min_au``), batch waits over all epochs, and whether every epoch read
the whole dataset from the device (null where the file system does not count block reads)."""


def scan_epoch_field(figure: str) -> str:
    """The field of an entry of the summary's ``details.epochs`` holding one epoch's value of
    a scan figure: its name without :data:`SCAN_PREFIX`.

    >>> scan_epoch_field(SCAN_EPOCH_S)
    'epoch_s'
    """
    if figure not in SCAN_OUTPUTS:
        raise ValueError(f"{figure!r} is not a scan figure (one of {SCAN_OUTPUTS})")
    return figure.removeprefix(SCAN_PREFIX)


SCAN_EPOCH_METRICS = {
    scan_epoch_field(m): m for m in (SCAN_EPOCH_S, SCAN_AU, SCAN_SAMPLES_PER_S, SCAN_MBPS)
}
"""A scan epoch's figure in the summary's ``details.epochs`` (``epoch_s``, ``au``,
``samples_per_s``, ``mbps``) → the metric logged once per epoch at step
:data:`DATA_SUMMARY_EPOCH`."""

MATERIALIZE_STAGES = ("read", "transform", "write", "fsync")
"""The timed stages of building a cache, like a checkpoint's."""


def materialize_stage_output(stage: str) -> str:
    """The output name of one materialize stage's seconds.

    >>> materialize_stage_output("fsync")
    'materialize_fsync_s'
    """
    if stage not in MATERIALIZE_STAGES:
        raise ValueError(f"{stage!r} is not a materialize stage (one of {MATERIALIZE_STAGES})")
    return f"materialize_{stage}_s"


MATERIALIZE_TOTAL_S = "materialize_total_s"
"""Materialize's total time: one figure per run."""
MATERIALIZE_WRITE_MBPS = "materialize_write_mbps"
MATERIALIZE_OUTPUT_BYTES = "materialize_output_bytes"

MATERIALIZE_OUTPUTS = (
    MATERIALIZE_TOTAL_S,
    *(materialize_stage_output(s) for s in MATERIALIZE_STAGES),
    MATERIALIZE_WRITE_MBPS,
    MATERIALIZE_OUTPUT_BYTES,
)
"""Materialize outputs: total and per-stage seconds, output MB/s (written bytes / write +
fsync time) and bytes."""

WORKSPACE_OPERATIONS = ("save", "list", "reopen")
"""A notebook workspace's operations: save (write, fsync, rename into place, directory
fsync), list (walk and stat the tree, as ``git status``), reopen (read a file back)."""

WORKSPACE_QUANTILES = {"p50": 50, "p99": 99, "max": 100}
"""The latency figures of each operation: name → percentile."""


def workspace_output(operation: str, quantile: str) -> str:
    """The output name of one workspace operation's latency figure, in milliseconds.

    >>> workspace_output("save", "p99")
    'workspace_save_p99_ms'
    """
    if operation not in WORKSPACE_OPERATIONS:
        raise ValueError(f"{operation!r} is not a workspace operation ({WORKSPACE_OPERATIONS})")
    if quantile not in WORKSPACE_QUANTILES:
        raise ValueError(f"{quantile!r} is not a workspace figure ({tuple(WORKSPACE_QUANTILES)})")
    return f"workspace_{operation}_{quantile}_ms"


WORKSPACE_OUTPUTS = tuple(
    workspace_output(op, q) for op in WORKSPACE_OPERATIONS for q in WORKSPACE_QUANTILES
)
"""Workspace outputs: latency percentiles per operation, in milliseconds."""

WORKSPACE_SAVE_P99_MS = workspace_output("save", "p99")
"""A workspace's p99 save latency: a metric per round (step: the round, from 0) and an
output."""

DATA_WORKLOAD_OUTPUTS = {
    "scan": DATASET_OUTPUTS + SCAN_OUTPUTS,
    "materialize": DATASET_OUTPUTS + MATERIALIZE_OUTPUTS,
    "workspace": WORKSPACE_OUTPUTS,
}
"""Every output each data workload logs (the component declares their union)."""

DATA_WORKLOAD_METRICS = {
    "scan": tuple(SCAN_EPOCH_METRICS.values()),
    "materialize": (),
    "workspace": (WORKSPACE_SAVE_P99_MS,),
}
"""Every metric each data workload logs: a scan's per epoch, a workspace's per round."""

# The data figures the verdict reads by name (it names them only through these).
WORKLOAD_INPUT = "workload"
"""The run input (and summary key) naming the workload, one of :data:`WORKLOADS`."""

DROP_CACHE_INPUT = "drop_cache"
"""The scan's input saying whether the page cache was dropped before each epoch: a scan that
kept it measured memory, not the volume."""

_DATASET_INPUTS = (
    "dataset_format", "codec", "dataset_size", "record_size", "shard_size", "row_group_size",
)  # fmt: skip
DATA_COMPARABLE_INPUTS = {
    "scan": (
        WORKLOAD_INPUT, "seed", *_DATASET_INPUTS, "loader", "epochs", "num_workers",
        "batch_size", "prefetch_factor", "shuffle_buffer", "compute_ms", DROP_CACHE_INPUT,
    ),
    "materialize": (WORKLOAD_INPUT, "seed", *_DATASET_INPUTS, "output_shard_size"),
    "workspace": (WORKLOAD_INPUT, "seed", "files", "file_size", "rounds"),
}  # fmt: skip
"""Each data workload's inputs that must be equal for two runs to be compared (the dataset
and what reads or writes it: a loader, its workers or its prefetch changes an epoch as much as
a volume can). Every one is an input the workload records."""

DATA_FORMAT_BOUND_INPUTS = {
    "shard_size": ("webdataset", "parquet", "mds"),
    "row_group_size": ("parquet",),
}
"""Dataset inputs compared only for the formats they shape: a shard size means nothing to a
directory of files, a row group only to Parquet."""

DATA_REQUIRED_INPUTS = {
    "scan": ("dataset_format", "dataset_size"),
    "materialize": ("dataset_format", "dataset_size"),
    "workspace": ("files",),
}
"""Without these a data run's comparison cannot be vouched for, so each run records them."""

WORKLOAD_BUDGETS = {
    "checkpoint": ("max_pause_s", "max_pause_share"),
    "scan": ("min_au",),
    "materialize": (),
    "workspace": ("max_p99_ms",),
}
"""The budget each workload's verdict tests, as the verdict's options (``--max-pause-s``, ...)
and the plan's: a budget of another workload is not tested, so it answers nothing."""
CADENCE_INPUT = "checkpoints_per_month"
"""The checkpoint cadence the verdict prices a training profile's month with (GPU time paused
+ storage): an input of the checkpoint workload's verdict, not a budget."""

DATA_SUMMARY_CONFIG = "config"
DATA_SUMMARY_OUTPUTS = "outputs"
DATA_SUMMARY_DETAILS = "details"
"""The data summary's sections: the settings (as the run's inputs), the outputs
(:data:`DATA_WORKLOAD_OUTPUTS`) and the workload's details."""

DATA_SUMMARY_KEYS = (
    "schema",
    WORKLOAD_INPUT,
    "storage_profile",
    "run_uuid",
    RUN_STARTED_AT,
    RUN_FINISHED_AT,
    DATA_SUMMARY_CONFIG,
    DATA_SUMMARY_OUTPUTS,
    DATA_SUMMARY_DETAILS,
)
"""The top-level keys of a :data:`DATA_SUMMARY_SCHEMA` summary, every one always present."""

DATA_SUMMARY_EPOCHS, DATA_SUMMARY_ROUNDS = "epochs", "rounds"
"""The data summary's ``details`` lists: a scan's epochs (objects with
:data:`DATA_SUMMARY_EPOCH` and the figures of :data:`SCAN_EPOCH_METRICS`, named without the
``scan_`` prefix) and a workspace's rounds (each round's p99 save latency, ms)."""

DATA_SUMMARY_EPOCH = "epoch"
"""An entry of ``details.epochs``: its epoch number, from 0 (the step of its metrics)."""
