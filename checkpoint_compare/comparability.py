"""Whether runs can be compared at all: the inputs, the build, the hardware and the image
that must be the same, and runs that were resumed part-way.

Every training run of every profile (repeats included) is checked.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from checkpoint_compare.errors import NotComparable
from checkpoint_compare.grouping import ProfileRuns
from checkpoint_compare.records import RunRecord
from checkpoint_compare.table import CHECKPOINT, WorkloadRow
from checkpoint_storage_bench.contract import (
    COMPARABLE_META,
    IMAGE_INPUT,
    SANDBOX_DRIVER,
    SANDBOX_EMULATED_DRIVER,
    WORLD_SIZE,
)


def _runs(groups: list[ProfileRuns]) -> list[tuple[str, RunRecord]]:
    """Every measured run, labelled by its profile and the run (its uuid, or its summary's
    file): which run to look at."""
    return [(f"{g.profile} ({r.label})", r) for g in groups for r in g.trainings]


def _recorded(value: Any) -> bool:
    return value not in (None, "")


def _differs(
    runs: list[tuple[str, RunRecord]],
    get: Callable[[RunRecord], Any],
    identity: Callable[[Any], Any] = repr,
) -> str | None:
    """``label=value, …`` when the runs that recorded a value do not all agree.

    Among the runs that recorded it: a local run may have no image digest or GPU, and one
    run without it must not switch the check off for the others.
    """
    values = {label: v for label, run in runs if _recorded(v := get(run))}
    if len({identity(v) for v in values.values()}) > 1:
        return ", ".join(f"{label}={v!r}" for label, v in values.items())
    return None


def image_identity(reference: str) -> str:
    """What identifies an image: its digest when the reference pins one
    (``repo@sha256:…``), else the reference itself (a tag may move, but two different
    references are not vouched to be one image).

    >>> image_identity("registry.example.com/ml/bench:0.2@sha256:abc")
    'sha256:abc'
    >>> image_identity("registry.example.com/ml/bench:0.2")
    'registry.example.com/ml/bench:0.2'
    """
    return reference.split("@", 1)[1] if "@" in reference else reference


def check_comparable(
    row: WorkloadRow, groups: list[ProfileRuns], allow_resumed: bool = False
) -> list[str]:
    """Refuse runs that do not measure the same thing, for every workload: the inputs of
    its row (those bound to a dataset format only where that format is compared), the
    build, GPU, image and claim, the row's own refusals (a scan served by the page cache),
    and a resumed run ranked against an uninterrupted one.

    Returns:
        Notes for the report (resumed runs compared because ``allow_resumed``).

    Raises:
        NotComparable: Naming every difference with its value per run.
    """
    runs = _runs(groups)
    what = "runs" if row is CHECKPOINT else f"{row.name} runs"
    if missing := missing_inputs(runs, row.required):
        raise NotComparable(f"{what} are not comparable: " + "; ".join(missing))
    formats = {r.inputs.get("dataset_format") for _, r in runs}
    keys = tuple(
        k for k in row.comparable if k not in row.format_bound or formats & set(row.format_bound[k])
    )
    differences = provenance_differences(runs) + claim_differences(groups)
    differences += input_differences(runs, keys) + row.refusals(runs)
    if differences:
        raise NotComparable(f"{what} are not comparable: " + "; ".join(differences))
    return _resumed(runs, allow_resumed)


def missing_inputs(runs: list[tuple[str, RunRecord]], keys: tuple[str, ...]) -> list[str]:
    """``label does not record key`` for each of ``keys`` a run did not record."""
    return [
        f"{label} does not record {key}"
        for label, run in runs
        for key in keys
        if run.inputs.get(key) is None
    ]


def input_differences(runs: list[tuple[str, RunRecord]], keys: tuple[str, ...]) -> list[str]:
    """``key differs (label=value, …)`` for each of ``keys`` the runs do not agree on (a run
    that did not record it counts as one more value, None)."""
    differences = []
    for key in keys:
        values = {label: run.inputs.get(key) for label, run in runs}
        if len({repr(v) for v in values.values()}) > 1:
            shown = ", ".join(f"{p}={v!r}" for p, v in values.items())
            differences.append(f"{key} differs ({shown})")
    return differences


def provenance_differences(runs: list[tuple[str, RunRecord]]) -> list[str]:
    """What ran the measurement, among the runs that recorded it: the build, the GPU, the
    image and the number of writers. Every workload's runs are held to it."""
    differences = []
    for key in COMPARABLE_META:
        if shown := _differs(runs, lambda r, k=key: r.meta.get(k)):
            differences.append(f"{key} differs ({shown}): a different trainer build")
    if shown := _differs(runs, lambda r: r.meta.get("gpu_model")):
        differences.append(f"gpu_model differs ({shown}): different hardware")
    if shown := _differs(runs, lambda r: r.inputs.get(IMAGE_INPUT), image_identity):
        differences.append(f"{IMAGE_INPUT} differs ({shown}): a different image")
    if shown := _differs(runs, lambda r: r.outputs.get(WORLD_SIZE)):
        differences.append(f"{WORLD_SIZE} differs ({shown}): a different number of writers")
    return differences


SANDBOX_DRIVERS = (SANDBOX_DRIVER, SANDBOX_EMULATED_DRIVER)
"""The sandbox hook's drivers: a profile there is a directory of its own (its volume handle)
behind the one claim path, so only the claim is compared."""


def claim_differences(groups: list[ProfileRuns]) -> list[str]:
    """The volume measured, as the profiles' hook runs recorded it: a profile measured on
    another claim (namespace/claim) or another volume (its handle) says nothing about a
    class change of this one. Among the profiles whose hook recorded it (the volume not for
    the sandbox's profiles, each a directory by design)."""
    differences = []
    for what, keys in (("claim", ("namespace", "claim")), ("volume", ("volume_handle",))):
        seen = {
            g.profile: "/".join(str(g.hook.inputs.get(k)) for k in keys)
            for g in groups
            if g.hook is not None
            and all(_recorded(g.hook.inputs.get(k)) for k in keys)
            and not (what == "volume" and g.hook.inputs.get("driver") in SANDBOX_DRIVERS)
        }
        if len(set(seen.values())) > 1:
            shown = ", ".join(f"{p}={v}" for p, v in seen.items())
            differences.append(f"the {what} differs ({shown}): not one volume measured")
    return differences


def _resumed(runs: list[tuple[str, RunRecord]], allow: bool) -> list[str]:
    resumed = [
        (label, run, step) for label, run in runs if (step := run.resumed_from_step) is not None
    ]
    if not resumed or len(resumed) == len(runs):
        return []  # nothing resumed, or every run was: like against like
    listed = ", ".join(f"{label} from step {step}" for label, _, step in resumed)
    if not allow:
        raise NotComparable(
            f"runs resumed part-way ({listed}) time only part of a run, so they are not "
            "ranked against uninterrupted runs; give --allow-resumed to compare them anyway"
        )
    return [f"resumed part-way and compared anyway (--allow-resumed): {listed}"]
