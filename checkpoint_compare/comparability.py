"""Whether runs can be compared at all: the inputs and the build that must be the same."""

from __future__ import annotations

from checkpoint_compare.errors import NotComparable
from checkpoint_compare.grouping import ProfileRuns
from checkpoint_storage_bench.contract import COMPARABLE_INPUTS, COMPARABLE_META, REQUIRED_INPUTS


def check_comparable(groups: list[ProfileRuns]) -> None:
    """Refuse runs whose fixed inputs differ.

    Raises:
        NotComparable: Naming every input that differs and its value per profile.
    """
    missing = [
        f"{g.profile} ({g.training.label}) does not record {key}"
        for g in groups
        for key in REQUIRED_INPUTS
        if g.training.inputs.get(key) is None
    ]
    if missing:
        raise NotComparable("runs are not comparable: " + "; ".join(missing))
    differences = []
    for key in COMPARABLE_META:
        # Among the runs that recorded it: a local run may have no image digest, and one
        # run without it must not switch the check off for the others.
        values = {g.profile: v for g in groups if (v := g.training.meta.get(key)) not in (None, "")}
        if len(set(map(repr, values.values()))) > 1:
            shown = ", ".join(f"{p}={v!r}" for p, v in values.items())
            differences.append(f"{key} differs ({shown}): a different trainer build")
    for key in COMPARABLE_INPUTS:
        values = {g.profile: g.training.inputs.get(key) for g in groups}
        if len({repr(v) for v in values.values()}) > 1:
            shown = ", ".join(f"{p}={v!r}" for p, v in values.items())
            differences.append(f"{key} differs ({shown})")
    if differences:
        raise NotComparable("runs are not comparable: " + "; ".join(differences))
