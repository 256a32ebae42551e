"""What each profile costs: the pricing file and the cost figures of the verdict.

Storage is billed per month for what is provisioned (EBS gp3: size, IOPS above the
included 3000, throughput above the included 125 MiB/s; GKE Hyperdisk Balanced: the same
with 3000 IOPS and 140 MiB/s included), prorated by time. A training run is billed for GPU
time. The figures show both sides so a team can see whether the storage change outweighs
the GPU time it saves.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from checkpoint_compare.errors import BadInput
from checkpoint_storage_bench.units import parse_quantity

DEFAULT_PRICING = Path(__file__).resolve().parents[1] / "connections" / "pricing.yaml"


def check_amount(value: Any, what: str) -> None:
    """A price, size or budget: a finite number >= 0 (ValueError naming ``what`` if not)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"{what} must be a number >= 0, got {value!r}")
    if not math.isfinite(value) or value < 0:
        raise ValueError(f"{what} must be a finite number >= 0, got {value!r}")


@dataclass(frozen=True)
class VolumeType:
    """List prices of one volume type (USD).

    Attributes:
        name: Type name (``gp3``, ``local``).
        storage_gib_month: Per GiB-month of provisioned size.
        iops_included: IOPS included in the storage price.
        iops_month: Per provisioned IOPS-month above ``iops_included``.
        throughput_included_mibps: Throughput (MiB/s) included.
        throughput_mibps_month: Per MiB/s-month above ``throughput_included_mibps``.
        note: The assumption behind these prices, shown next to the numbers.
        as_of: The date the list prices were read (they change).
    """

    name: str
    storage_gib_month: float
    iops_included: float = 0
    iops_month: float = 0
    throughput_included_mibps: float = 0
    throughput_mibps_month: float = 0
    note: str = ""
    as_of: str = ""

    def __post_init__(self) -> None:
        for key in (
            "storage_gib_month",
            "iops_included",
            "iops_month",
            "throughput_included_mibps",
            "throughput_mibps_month",
        ):
            check_amount(getattr(self, key), f"volume type {self.name}: {key}")

    def monthly(self, size_gib: float, iops: float, throughput_mibps: float) -> float:
        """USD per month for a volume of this type with these provisioned figures."""
        return (
            size_gib * self.storage_gib_month
            + max(0.0, iops - self.iops_included) * self.iops_month
            + max(0.0, throughput_mibps - self.throughput_included_mibps)
            * self.throughput_mibps_month
        )


@dataclass(frozen=True)
class ProfilePrice:
    """A profile's provisioned figures: volume type, IOPS, throughput (MiB/s)."""

    type: str
    iops: float = 0
    throughput: float = 0

    def __post_init__(self) -> None:
        if not isinstance(self.type, str):
            raise ValueError(f"type must be a volume type name, got {self.type!r}")
        check_amount(self.iops, "iops")
        check_amount(self.throughput, "throughput")


@dataclass(frozen=True)
class Pricing:
    """The pricing file, validated.

    Attributes:
        source: Where it was read from.
        region: The region the list prices are for.
        hours_per_month: Hours in a billing month (AWS uses 730).
        volume_size_gib: Size of the checkpoint volume.
        gpu_hourly_usd: Price of the training job's GPUs per hour.
        types: Volume types by name.
        profiles: Profile (VolumeAttributesClass) name → provisioned figures.
        drivers: CSI driver recorded by the hook → volume type that overrides the profile's
            (``local`` for the sandbox, whose profiles are directories on this machine).
    """

    source: str
    region: str
    hours_per_month: float
    volume_size_gib: float
    gpu_hourly_usd: float
    types: dict[str, VolumeType]
    profiles: dict[str, ProfilePrice]
    drivers: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for key in ("hours_per_month", "volume_size_gib", "gpu_hourly_usd"):
            check_amount(getattr(self, key), key)
        if self.hours_per_month == 0:
            raise ValueError("hours_per_month must be > 0")
        for name, price in self.profiles.items():
            if price.type not in self.types:
                raise ValueError(f"profile {name}: unknown volume type {price.type!r}")
        for driver, type_name in self.drivers.items():
            if type_name not in self.types:
                raise ValueError(f"driver {driver}: unknown volume type {type_name!r}")


def _section(data: dict[str, Any], key: str) -> dict[str, Any]:
    value = data.get(key)
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise ValueError(f"{key} must be a mapping, not {type(value).__name__}")
    return value


def _entries(data: dict[str, Any], key: str) -> dict[str, dict[str, Any]]:
    """A section whose every entry is itself a mapping of fields."""
    section = _section(data, key)
    for name, fields in section.items():
        if not isinstance(fields, dict):
            raise ValueError(f"{key}.{name} must be a mapping of fields, got {fields!r}")
    return section


def load_pricing(
    path: Path, gpu_hourly: float | None = None, volume_gib: float | None = None
) -> Pricing:
    """Read and validate a pricing file; command-line values override its defaults.

    Raises:
        BadInput: The file is missing, not YAML, or a section or value is invalid.
    """
    try:
        data = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise BadInput(f"cannot read pricing file {path}: {exc}") from exc
    if not isinstance(data, dict):
        raise BadInput(f"pricing file {path}: expected a mapping at the top")
    try:
        types = {
            name: VolumeType(name=name, **fields)
            for name, fields in _entries(data, "volume_types").items()
        }
        profiles = {
            name: _profile_price(name, fields)
            for name, fields in _entries(data, "profiles").items()
        }
        defaults = _section(data, "defaults")
        return Pricing(
            source=str(path),
            region=str(data.get("region", "")),
            hours_per_month=defaults.get("hours_per_month", 730),
            volume_size_gib=volume_gib if volume_gib is not None else defaults["volume_size_gib"],
            gpu_hourly_usd=gpu_hourly if gpu_hourly is not None else defaults["gpu_hourly_usd"],
            types=types,
            profiles=profiles,
            drivers={str(k): v for k, v in _section(data, "drivers").items()},
        )
    except (TypeError, ValueError) as exc:
        raise BadInput(f"pricing file {path}: {exc}") from exc
    except KeyError as exc:
        raise BadInput(f"pricing file {path}: defaults.{exc.args[0]} is missing") from exc


def _profile_price(name: str, fields: dict[str, Any]) -> ProfilePrice:
    try:
        return ProfilePrice(**fields)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"profile {name}: {exc}") from exc


@dataclass
class ProfileCost:
    """Cost figures of one profile (USD).

    Attributes:
        profile: Profile name.
        known: False when the profile is not priced; all figures are then None.
        volume_type: The volume type priced.
        iops: Provisioned IOPS priced.
        throughput_mibps: Provisioned throughput priced.
        storage_month: The volume for a month.
        storage_run: The volume over the run's duration.
        gpu_run: The GPUs over the run's duration.
        run_total: storage_run + gpu_run.
        assumptions: Where each figure came from.
    """

    profile: str
    known: bool
    volume_type: str | None = None
    iops: float | None = None
    throughput_mibps: float | None = None
    storage_month: float | None = None
    storage_run: float | None = None
    gpu_run: float | None = None
    run_total: float | None = None
    assumptions: list[str] = field(default_factory=list)


def _hook_value(hook: dict[str, Any], *keys: str) -> Any:
    for key in keys:
        if hook.get(key) not in (None, ""):
            return hook[key]
    return None


MIB = 2**20


def class_iops(value: Any) -> float:
    """A class's ``iops`` parameter as Kubernetes writes it ("6000", "3k").

    Raises:
        ValueError: Not a quantity.
    """
    return parse_quantity(value if isinstance(value, str) else str(value))


def class_throughput_mibps(value: Any) -> float:
    """A class's ``throughput`` parameter in MiB/s.

    EBS writes a plain number of MiB/s ("250"); GKE a quantity of bytes per second with a
    suffix ("290Mi" = 290 MiB/s). A value with a suffix is read as bytes per second.

    >>> class_throughput_mibps("290Mi"), class_throughput_mibps("250"), class_throughput_mibps(125)
    (290.0, 250.0, 125.0)

    Raises:
        ValueError: Not a quantity.
    """
    text = value if isinstance(value, str) else str(value)
    number = parse_quantity(text)
    return number / MIB if text[-1:].isalpha() else number


def profile_cost(
    pricing: Pricing, profile: str, runtime_s: float, hook: dict[str, Any]
) -> ProfileCost:
    """Price a profile for a run of ``runtime_s`` seconds.

    The provisioned figures come from the hook's record when it has them (``vac_iops``,
    ``vac_throughput``, ``vac_type``, as inputs or outputs), else from the pricing file's
    ``profiles``. A hook that used a driver listed under ``drivers`` sets the type (the
    sandbox's ``local``; ``pd.csi.storage.gke.io`` is Hyperdisk Balanced).

    Raises:
        BadInput: The hook recorded an IOPS or throughput that is not a Kubernetes quantity.
    """
    price = pricing.profiles.get(profile)
    driver = hook.get("driver")
    type_name = pricing.drivers.get(driver) if driver else None
    assumptions = []
    if type_name:
        assumptions.append(f"driver {driver!r} recorded by the hook: priced as {type_name}")
    type_name = type_name or _hook_value(hook, "vac_type") or (price.type if price else None)
    if type_name is None or type_name not in pricing.types:
        why = f"unknown volume type {type_name!r}" if type_name else "not in the pricing file"
        return ProfileCost(
            profile=profile, known=False, assumptions=[f"{profile}: {why}; cost not computed"]
        )
    vtype = pricing.types[type_name]
    hook_iops, hook_throughput = _hook_value(hook, "vac_iops"), _hook_value(hook, "vac_throughput")
    try:
        iops = class_iops(hook_iops) if hook_iops is not None else (price.iops if price else 0)
        throughput = (
            class_throughput_mibps(hook_throughput)
            if hook_throughput is not None
            else (price.throughput if price else 0)
        )
    except ValueError as exc:
        raise BadInput(f"profile {profile}: the hook's class parameters: {exc}") from exc
    origin = "the hook's record" if hook_iops is not None else pricing.source
    if vtype.note:
        dated = f" (list prices as of {vtype.as_of})" if vtype.as_of else ""
        assumptions.append(f"{type_name}: {vtype.note}{dated}")
    assumptions.append(
        f"{profile}: {type_name}, {iops:g} IOPS, {throughput:g} MiB/s (from {origin}), "
        f"{pricing.volume_size_gib:g} GiB"
    )
    month = vtype.monthly(pricing.volume_size_gib, iops, throughput)
    hours = runtime_s / 3600
    storage_run = month * hours / pricing.hours_per_month
    gpu_run = pricing.gpu_hourly_usd * hours
    return ProfileCost(
        profile=profile,
        known=True,
        volume_type=type_name,
        iops=iops,
        throughput_mibps=throughput,
        storage_month=month,
        storage_run=storage_run,
        gpu_run=gpu_run,
        run_total=storage_run + gpu_run,
        assumptions=assumptions,
    )


@dataclass
class CostDelta:
    """Candidate − baseline, in USD.

    Attributes:
        gpu_per_checkpoint: GPU time saved (negative) or lost per checkpoint, from the
            median pause difference.
        gpu_per_1000_checkpoints: The same for 1,000 checkpoints.
        storage_month: Extra storage per month.
        run_total: Difference in the cost of one run (GPU + storage over its duration).
        breakeven_checkpoints_month: Checkpoints per month above which the saved GPU time
            pays for the extra storage; None when there is no saving or no extra cost.
    """

    gpu_per_checkpoint: float
    gpu_per_1000_checkpoints: float
    storage_month: float
    run_total: float
    breakeven_checkpoints_month: float | None


def cost_delta(
    pricing: Pricing, base: ProfileCost, cand: ProfileCost, pause_delta_s: float
) -> CostDelta | None:
    """Cost difference of a candidate; None when either profile is not priced."""
    if not (base.known and cand.known):
        return None
    per_ckpt = pause_delta_s * pricing.gpu_hourly_usd / 3600
    storage_month = cand.storage_month - base.storage_month
    breakeven = storage_month / -per_ckpt if per_ckpt < 0 and storage_month > 0 else None
    return CostDelta(
        gpu_per_checkpoint=per_ckpt,
        gpu_per_1000_checkpoints=per_ckpt * 1000,
        storage_month=storage_month,
        run_total=cand.run_total - base.run_total,
        breakeven_checkpoints_month=breakeven,
    )


def general_assumptions(pricing: Pricing) -> list[str]:
    """The assumptions that hold for every figure."""
    region = f" ({pricing.region})" if pricing.region else ""
    return [
        f"prices from {pricing.source}{region}; list prices, no discounts or taxes",
        f"GPU price {pricing.gpu_hourly_usd:g} USD/hour for the job's GPUs; the GPUs are idle "
        "while a checkpoint pauses training, so pause time is billed GPU time",
        f"storage billed per month of {pricing.hours_per_month:g} hours, prorated by time; "
        "'per run' assumes the profile is held only while the run lasts, 'per month' that "
        "it stays applied",
        "cost per 1,000 checkpoints counts GPU time only (median pause difference × 1,000)",
    ]
