"""The names the parts share, once, in code. docs/contracts.md is the page people read;
this module mirrors it, and producers and consumers import from here instead of restating.

Who uses what: the trainer writes the summary and the metrics, the fio sweep names its
outputs, the verdict reads all of them back, the bundle's components declare them.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from datetime import UTC, datetime

# --------------------------------------------------------------------------- trainer

SUMMARY_SCHEMA = "checkpoint-training/1"
"""The ``schema`` of the trainer's ``--summary-json``."""

STAGES = ("serialize", "write", "fsync", "upload", "pause", "total")
"""The stages of one checkpoint's timeline, in order (docs/contracts.md, README)."""

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

TRAINING_OUTPUTS = RUN_OUTPUTS + STAGE_OUTPUTS
"""Every output the training job logs, hence every output its component declares."""

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
)
"""Trainer inputs that must be equal for two runs to be compared. The seed says "keep the
checkpoint format, model, dataset, and durability requirements fixed"; the step counts and
device belong to "the whole run" being the same run."""

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


def fio_output(case: str, measure: str) -> str:
    """The output name of one fio case's measure.

    >>> fio_output("seqwrite-1m", "bw_mbps")
    'fio_seqwrite_1m_bw_mbps'
    """
    return f"fio_{output_key(case)}_{measure}"


FIO_OUTPUT = re.compile(rf"^fio_(?P<case>.+)_(?P<measure>{'|'.join(FIO_MEASURES)})$")
FIO_METRIC = re.compile(r"^fio[.-](?P<case>.+)[.-](?P<measure>bw_mbps|iops|lat_p\d+_us)$")
"""Metrics are logged as ``fio.<case>.<measure>``; Polyaxon stores the name with ``-``."""

# ---------------------------------------------------------------- storage-profile hook

SWITCH_SCHEMA = "storage-profile-switch/1"
HOOK_INPUTS = ("claim", "namespace", "driver", "volume_handle", "previous_class", "target_class")
HOOK_OUTPUTS = ("applied_class", "k8s_settle_s", "provider_settle_s", "total_settle_s")
VAC_PARAMETER_PREFIX = "vac_"
"""Each of the target class's parameters is recorded as ``vac_<parameter>``."""

# The ledger of switches, kept on the claim itself (docs/contracts.md): every switch the
# hook makes appends one entry; preflight counts them against the driver's window, and the
# verdict refuses a profile whose claim was switched inside its measured interval.
LEDGER_ANNOTATION = "checkpoint-storage-bench.io/class-switches"
"""Annotation on the claim: a JSON list of ``{"at": ISO-8601 UTC, "from": str|null,
"to": str, "holder": str|null}``, oldest first, at most :data:`LEDGER_MAX_ENTRIES`."""
LEDGER_MAX_ENTRIES = 32


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
    data = json.loads(text)
    if not isinstance(data, list):
        raise ValueError(f"{LEDGER_ANNOTATION} is not a JSON list")
    entries = []
    for item in data:
        if not isinstance(item, dict) or not isinstance(item.get("to"), str):
            raise ValueError(f"{LEDGER_ANNOTATION}: not a ledger entry: {item!r}")
        at = datetime.fromisoformat(str(item.get("at")).replace("Z", "+00:00"))
        if at.tzinfo is None:
            raise ValueError(f"{LEDGER_ANNOTATION}: time without a zone: {item!r}")
        entries.append(LedgerEntry(at, item.get("from"), item["to"], item.get("holder")))
    return sorted(entries, key=lambda e: e.at)


def format_ledger(entries: list[LedgerEntry]) -> str:
    """The annotation's value: the newest :data:`LEDGER_MAX_ENTRIES` entries, compact JSON."""
    kept = sorted(entries, key=lambda e: e.at)[-LEDGER_MAX_ENTRIES:]
    return json.dumps([e.to_json() for e in kept], separators=(",", ":"))


LEASE_PREFIX = "storage-profile-"
"""The ``coordination.k8s.io`` Lease that makes a pipeline the claim's only switcher is
named ``storage-profile-<claim>``, in the claim's namespace."""


def lease_name(claim: str) -> str:
    """The name of the Lease guarding ``claim``.

    >>> lease_name("training-checkpoints")
    'storage-profile-training-checkpoints'
    """
    return f"{LEASE_PREFIX}{claim}"


MODIFICATION_WINDOWS: dict[str, tuple[int, float]] = {
    "ebs.csi.aws.com": (4, 24 * 3600.0),
    "pd.csi.storage.gke.io": (1, 4 * 3600.0),
}
"""CSI driver → (modifications allowed, per rolling window in seconds). EBS: 4 per 24 h
since 2026-01-15, each after the previous one completed; GKE Hyperdisk: once per 4 h. A
driver not listed has no known limit."""

# ------------------------------------------------- trainer under torchrun (issue 16)
# Appended, not merged into the tables above, so the parts' edits of those stay apart.

PARALLEL_MODES = ("none", "ddp", "fsdp")
"""``--parallel``: one process; DDP (replicated model, the checkpoint split across ranks);
FSDP2 ``fully_shard`` (each rank writes its local shards)."""

DISTRIBUTED_CHECKPOINT_KEYS = (
    "world_size",
    "ranks",
    "aggregate_gbps",
    "slowest_pause_s",
    "commit_s",
)
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

DISTRIBUTED_CHECKPOINT_METRICS = {
    "aggregate_gbps": "ckpt_aggregate_gbps",
    "slowest_pause_s": "ckpt_slowest_pause_s",
}
"""Per-checkpoint field → the Polyaxon metric rank 0 logs (only when several ranks wrote)."""

DISTRIBUTED_INPUTS = ("world_size", "parallel")
"""Trainer inputs recorded by every run (1 and none for one process)."""

DISTRIBUTED_OUTPUTS = ("world_size", "ckpt_aggregate_gbps_median", "ckpt_slowest_pause_s_median")
"""Run-level outputs: ``world_size`` always; the medians only when several ranks wrote."""

# A run of 8 ranks writes 8 streams at once: it is no baseline for a run of one.
COMPARABLE_INPUTS = COMPARABLE_INPUTS + DISTRIBUTED_INPUTS

TRAINING_OUTPUTS = TRAINING_OUTPUTS + DISTRIBUTED_OUTPUTS
