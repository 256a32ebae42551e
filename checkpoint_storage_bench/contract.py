"""The names the parts share, once, in code. docs/contracts.md is the page people read;
this module mirrors it, and producers and consumers import from here instead of restating.

Who uses what: the trainer writes the summary and the metrics, the fio sweep names its
outputs, the verdict reads all of them back, the bundle's components declare them.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

from checkpoint_storage_bench.io_limits import IoLimits

# --------------------------------------------------------------------------- trainer

SUMMARY_SCHEMA = "checkpoint-training/1"
"""The ``schema`` of the trainer's ``--summary-json``."""

STAGES = ("serialize", "write", "fsync", "checksum", "upload", "pause", "total")
"""The stages of one checkpoint's timeline, in order (docs/contracts.md, README).
``checksum`` is the read-back of a file a library wrote (torch, dcp, safetensors), to
checksum it; the raw writer checksums while writing, so it has none."""

CHECKPOINT_DIR_PATTERN = r"step-\d{8}"
"""The name of a published checkpoint directory (``step-NNNNNNNN``, 8 digits): what a
trainer must refuse to write over, checked before torch is imported."""

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

# Many ranks under torchrun (issue 16): every rank writes its shard, rank 0 commits.

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
summary null: it started at step 0). A resumed run's timings cover only part of the run."""

TRAINING_OUTPUTS = (
    RUN_OUTPUTS + STAGE_OUTPUTS + (RESUMED_FROM_STEP,) + DISTRIBUTED_OUTPUTS + RESTORE_OUTPUTS
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
    *DISTRIBUTED_INPUTS,
)
"""Trainer inputs that must be equal for two runs to be compared. The seed says "keep the
checkpoint format, model, dataset, and durability requirements fixed"; the step counts and
device belong to "the whole run" being the same run; a run of 8 ranks writes 8 streams at
once, so it is no baseline for a run of one (world size and parallel mode)."""

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

# ------------------------------------------------------------ sandbox storage profiles
# ``connections/sandbox-profiles.yaml`` (docs/contracts.md): read by the hook's local
# backend (switch, status) and by the sandbox (mounts, media, the agent). One parser, one set
# of checks; each part turns :class:`ProfilesFileError` into its own error and exit code.

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

_PROFILES_KEYS = {"claim", "namespace", "claimPath", "classesFile", "profiles"}
_PROFILE_KEYS = {"path", "description", "volumeAttributesClass"}


class ProfilesFileError(ValueError):
    """The sandbox profiles file is missing, unreadable or malformed."""


@dataclass(frozen=True)
class SandboxProfile:
    """One profile: a directory the claim points at, and the class it emulates there.

    Attributes:
        name: The profile's name (the ``--to`` of a switch).
        path: The directory.
        description: For people.
        volume_attributes_class: The emulated class's name (None: a plain medium).
        driver: The emulated class's ``driverName`` (None: a plain medium).
        class_parameters: The emulated class's ``parameters``, as the cluster has them.
        limits: The block-I/O limits that emulate the class (None: no limit).
    """

    name: str
    path: Path
    description: str = ""
    volume_attributes_class: str | None = None
    driver: str | None = None
    class_parameters: dict[str, str] = field(default_factory=dict)
    limits: IoLimits | None = None


@dataclass(frozen=True)
class SandboxProfiles:
    """The profiles file, every path absolute.

    Attributes:
        source: The file it was read from.
        root: What relative paths were resolved against (absolute).
        claim: The claim name the pipeline passes.
        namespace: The claim's namespace.
        claim_path: The symlink the sandbox agent mounts at the claim's mount path.
        profiles: Name → profile, in the file's order (the first is where a fresh claim starts).
        classes_file: The (first) VolumeAttributesClass manifests file the emulated profiles
            come from.
    """

    source: Path
    root: Path
    claim: str
    namespace: str
    claim_path: Path
    profiles: dict[str, SandboxProfile]
    classes_file: Path | None = None

    @property
    def emulated(self) -> bool:
        """Whether any profile emulates a class (and so needs the kernel's throttle)."""
        return any(p.limits is not None for p in self.profiles.values())

    @property
    def cgroup_name(self) -> str:
        """The claim's cgroup (one per claim and sandbox root, so that two sandboxes on one
        machine never share limits).

        >>> p = SandboxProfiles(Path("f"), Path("/srv/sb"), "ckpt", "ns", Path("/c"), {})
        >>> p.cgroup_name
        'ckpt-0d6525e4a1'
        """
        digest = hashlib.sha256(str(self.root).encode()).hexdigest()[:10]
        return f"{self.claim}-{digest}"

    @property
    def state_file(self) -> Path:
        """Where the hook records the claim's current profile, next to the claim's link
        (several profiles may share one directory: the link alone cannot tell them apart)."""
        return self.claim_path.with_name(self.claim_path.name + ".profile")

    def recorded(self) -> str | None:
        """The profile the last switch recorded (None: none, or unreadable)."""
        try:
            name = json.loads(self.state_file.read_text()).get("profile")
        except (OSError, ValueError, AttributeError):
            return None
        return name if name in self.profiles else None

    def record(self, name: str) -> None:
        """Record ``name`` as the claim's current profile (atomically: write, then rename)."""
        self.state_file.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.state_file.with_name(f".{self.state_file.name}.{os.getpid()}.tmp")
        at = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        tmp.write_text(json.dumps({"profile": name, "at": at}) + "\n")
        os.replace(tmp, self.state_file)

    def current(self) -> SandboxProfile | None:
        """The profile the claim is on: the recorded one when the link leads to its
        directory, else the only profile whose directory the link leads to (None: missing,
        dangling, elsewhere, or ambiguous)."""
        if not self.claim_path.is_symlink() or not self.claim_path.exists():
            return None
        target = self.claim_path.resolve()
        matching = [p for p in self.profiles.values() if p.path.resolve() == target]
        recorded = self.recorded()
        for profile in matching:
            if profile.name == recorded:
                return profile
        return matching[0] if len(matching) == 1 else None


def _read_classes(path: Path) -> dict[str, dict]:
    import yaml

    try:
        docs = list(yaml.safe_load_all(path.read_text()))
    except OSError as exc:
        raise ProfilesFileError(f"cannot read classes file {path}: {exc}") from exc
    except yaml.YAMLError as exc:
        raise ProfilesFileError(f"classes file {path} is not YAML: {exc}") from exc
    classes = {}
    for doc in docs:
        if isinstance(doc, dict) and doc.get("kind") == "VolumeAttributesClass":
            name = (doc.get("metadata") or {}).get("name")
            if name:
                classes[str(name)] = doc
    return classes


def load_sandbox_profiles(path: Path, root: Path) -> SandboxProfiles:
    """Read and check a sandbox profiles file; relative paths resolve against ``root``,
    except ``classesFile``, which is relative to the profiles file itself.

    ``root`` itself is made absolute first: from a relative root, every path would be
    relative, and a symlink written with such a target resolves against the link's own
    directory, not the working directory (a dangling claim link).

    Raises:
        ProfilesFileError: The file (or its classes file) is unreadable or does not follow
            docs/contracts.md.
    """
    import yaml  # the base's other modules do not need yaml; import it where it is used

    root = Path(root).resolve()
    try:
        data = yaml.safe_load(Path(path).read_text())
    except OSError as exc:
        raise ProfilesFileError(f"cannot read profiles file {path}: {exc}") from exc
    except yaml.YAMLError as exc:
        raise ProfilesFileError(f"profiles file {path} is not YAML: {exc}") from exc

    def bad(why: str) -> ProfilesFileError:
        return ProfilesFileError(f"profiles file {path}: {why}")

    if not isinstance(data, dict):
        raise bad("expected a mapping with claim, namespace, claimPath and profiles")
    unknown = set(data) - _PROFILES_KEYS
    if unknown:
        raise bad(f"unknown keys {sorted(unknown)} (known: {sorted(_PROFILES_KEYS)})")
    for key in ("claim", "namespace", "claimPath"):
        if not isinstance(data.get(key), str) or not data[key].strip():
            raise bad(f"{key} must be a non-empty string")
    if not isinstance(data.get("profiles"), dict) or not data["profiles"]:
        raise bad("profiles must be a non-empty mapping of name -> {path, description}")
    classes_file = None
    classes: dict[str, dict] = {}
    where: dict[str, Path] = {}  # class name -> the file that defines it
    if data.get("classesFile") is not None:
        # One file, or a list: the cluster's manifests plus, e.g., a sandbox-only class.
        names = data["classesFile"]
        names = [names] if isinstance(names, str) else names
        if (
            not isinstance(names, list)
            or not names
            or not all(isinstance(n, str) and n.strip() for n in names)
        ):
            raise bad("classesFile must be a path or a non-empty list of paths")
        for name in names:
            one = (Path(path).resolve().parent / name).resolve()
            for vac, doc in _read_classes(one).items():
                if vac in classes:
                    raise bad(f"VolumeAttributesClass {vac} is in both {where[vac]} and {one}")
                classes[vac], where[vac] = doc, one
        classes_file = (Path(path).resolve().parent / names[0]).resolve()
    profiles = {}
    for name, spec in data["profiles"].items():
        if not isinstance(spec, dict):
            raise bad(f"profile {name} must be a mapping, not {spec!r}")
        unknown = set(spec) - _PROFILE_KEYS
        if unknown:
            raise bad(
                f"profile {name}: unknown keys {sorted(unknown)} (known: {sorted(_PROFILE_KEYS)})"
            )
        if not isinstance(spec.get("path"), str) or not spec["path"].strip():
            raise bad(f"profile {name} needs a path")
        emulated: dict = {}
        vac = spec.get("volumeAttributesClass")
        if vac is not None:
            if classes_file is None:
                raise bad(f"profile {name} emulates class {vac}, but there is no classesFile")
            if vac not in classes:
                raise bad(
                    f"profile {name}: no VolumeAttributesClass {vac} in "
                    f"{', '.join(str(p) for p in dict.fromkeys(where.values())) or classes_file} "
                    f"(it has: {', '.join(sorted(classes)) or 'none'})"
                )
            parameters = {k: str(v) for k, v in (classes[vac].get("parameters") or {}).items()}
            try:
                limits = IoLimits.from_class_parameters(parameters)
            except ValueError as exc:
                raise bad(f"profile {name}: class {vac} in {where[vac]}: {exc}") from exc
            emulated = dict(
                volume_attributes_class=str(vac),
                driver=classes[vac].get("driverName"),
                class_parameters=parameters,
                limits=limits,
            )
        profiles[str(name)] = SandboxProfile(
            name=str(name),
            path=root / spec["path"],
            description=str(spec.get("description", "")),
            **emulated,
        )
    return SandboxProfiles(
        source=Path(path),
        root=root,
        claim=data["claim"],
        namespace=data["namespace"],
        claim_path=root / data["claimPath"],
        profiles=profiles,
        classes_file=classes_file,
    )
