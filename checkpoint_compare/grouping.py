"""Assign loaded runs to storage profiles: per profile, its training runs (one, or several
repeats), the hook run that switched the claim to it and the fio sweep measured on it."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import TypeVar

from checkpoint_compare.errors import BadInput, RunsMissing
from checkpoint_compare.records import RunKind, RunRecord
from checkpoint_storage_bench.contract import output_key_clashes


@dataclass
class ProfileRuns:
    """The runs that describe one storage profile.

    Attributes:
        profile: The profile (VolumeAttributesClass) name.
        trainings: Its successful training runs, oldest first: repeats of one measurement
            (a pipeline's `repeats`, or its return to the first profile at the end).
        hook: The hook run that switched the claim to it, if any.
        fio: The fio sweep measured on it, if any.
    """

    profile: str
    trainings: list[RunRecord]
    hook: RunRecord | None = None
    fio: RunRecord | None = None

    @property
    def training(self) -> RunRecord:
        """The newest training run (the one the hook and fio runs are matched to)."""
        return self.trainings[-1]

    @property
    def first_time(self) -> datetime | None:
        return run_time(self.trainings[0])


def run_time(record: RunRecord) -> datetime | None:
    """When the run started, else when it was created; None when unknown (summary files)."""
    return record.started_at or record.created_at


def _time_key(record: RunRecord) -> tuple[bool, datetime | None, str]:
    """Sort key: by time; unknown times (summary files of a writer that recorded none) sort
    last, by file name: never by the order of the arguments nor by a uuid."""
    when = run_time(record)
    return when is None, when, "" if when else Path(record.source).name


def _newest_first(records: Iterable[RunRecord]) -> list[RunRecord]:
    return sorted(records, key=lambda r: (r.created_at is not None, r.created_at), reverse=True)


def _profile_of(record: RunRecord, hooks: list[RunRecord]) -> str | None:
    """A run's profile: given explicitly, recorded as an input, or the class last applied."""
    if record.profile_hint:
        return record.profile_hint
    if record.kind is RunKind.TRAINING:
        return str(record.inputs["storage_profile"])
    if record.kind is RunKind.DATA and record.inputs.get("storage_profile"):
        return str(record.inputs["storage_profile"])
    if record.kind is RunKind.HOOK:
        return str(record.outputs.get("applied_class") or record.inputs["target_class"])
    if record.inputs.get("storage_profile"):
        return str(record.inputs["storage_profile"])
    # A fio sweep measures whatever class the claim had: the last hook that ran before it.
    if record.created_at is None:
        return None
    before = [h for h in hooks if h.succeeded and h.created_at and h.created_at < record.created_at]
    return _profile_of(max(before, key=lambda h: h.created_at), []) if before else None


def group_by_profile(
    records: list[RunRecord], expected: Iterable[str] = (), kind: RunKind = RunKind.TRAINING
) -> tuple[list[ProfileRuns], list[RunRecord]]:
    """Assign runs to profiles; every successful measured run of a profile is used.

    Args:
        records: All loaded runs (other kinds, e.g. the DAG or a compare op, are ignored).
        expected: Profiles that must be present.
        kind: The runs that measure a profile: training runs, or a data workload's.

    Returns:
        The profiles in the order their first training runs started (the pipeline's order),
        and the failed training runs (reported, never used).

    Raises:
        RunsMissing: An expected profile has no training run, the newest one of a profile
            failed or did not finish, or fewer than two profiles remain.
        BadInput: Two profiles' names differ only where output names cannot (``-``/``.``):
            their figures would overwrite each other.
    """
    what = "training" if kind is RunKind.TRAINING else "data-workload"
    hooks = [r for r in records if r.kind is RunKind.HOOK]
    by_profile: dict[str, list[RunRecord]] = {}
    for record in records:
        if record.kind is kind:
            by_profile.setdefault(_profile_of(record, hooks) or "", []).append(record)
    failed = [r for runs in by_profile.values() for r in runs if not r.succeeded]
    if clashes := output_key_clashes([*by_profile, *expected]):
        raise BadInput(
            "profiles whose output names would overwrite each other: "
            + "; ".join(f"{a} and {b}" for a, b in clashes)
            + " (rename one: '-' and '.' both become '_' in an output name)"
        )

    problems = []
    groups = []
    for profile, runs in by_profile.items():
        newest = _newest_first(runs)[0]
        if not newest.succeeded:
            why = f": {newest.message}" if newest.message else ""
            problems.append(
                f"profile {profile}: run {newest.label} {newest.status}{why} (from {newest.source})"
            )
            continue
        trainings = sorted((r for r in runs if r.succeeded), key=_time_key)
        group = ProfileRuns(profile=profile, trainings=trainings)
        for other, attr in ((RunKind.HOOK, "hook"), (RunKind.FIO, "fio")):
            candidates = [
                r
                for r in records
                if r.kind is other and r.succeeded and _profile_of(r, hooks) == profile
            ]
            # The newest one created before the training run: it describes that run's volume.
            if newest.created_at:
                candidates = [
                    r for r in candidates if not r.created_at or r.created_at <= newest.created_at
                ]
            if candidates:
                setattr(group, attr, _newest_first(candidates)[0])
        groups.append(group)
    for profile in expected:
        if profile not in by_profile:
            problems.append(f"profile {profile}: no {what} run found")
    if problems:
        raise RunsMissing("; ".join(problems))
    if len(groups) < 2:
        found = ", ".join(g.profile for g in groups) or "none"
        raise RunsMissing(f"need {what} runs of at least two profiles, found: {found}")
    # Run order decides the default baseline: the profile whose training started first.
    groups.sort(key=lambda g: _time_key(g.trainings[0]))
    return groups, failed


def pick_baseline(groups: list[ProfileRuns], baseline: str | None, what: str) -> str:
    """The baseline of every workload's verdict: the profile named, else the first profile
    run. ``what``: the runs' kind, for the message (``training``, ``scan``, ...).

    Raises:
        BadInput: No profile named and a run has no start time (summary files of a writer
            that recorded none): which profile ran first is unknown, and the order of the
            arguments must not decide the baseline and so the recommendation.
        RunsMissing: The profile named has no successful run.
    """
    untimed = [r.label for g in groups for r in g.trainings if run_time(r) is None]
    if baseline is None and untimed:
        raise BadInput(
            f"the runs {', '.join(untimed)} have no start time (e.g. summary files of a "
            "writer that did not record started_at), so which profile ran first is unknown: "
            "give --baseline PROFILE"
        )
    baseline = baseline or groups[0].profile
    if baseline not in [g.profile for g in groups]:
        raise RunsMissing(f"baseline profile {baseline}: no successful {what} run found")
    return baseline


T = TypeVar("T")


def around_the_others(
    baseline_runs: list[T], started: Callable[[T], datetime | None], others: list[datetime | None]
) -> tuple[list[T], list[T]] | None:
    """The baseline's runs before every other profile's run and after them all, when the
    pipeline returned to the first profile (A…B…A): what its drift is measured between.
    None without a return, or when a start time is unknown (the order is then unknown too).

    >>> from datetime import datetime as d
    >>> around_the_others([d(2026, 1, 1), d(2026, 1, 3)], lambda r: r, [d(2026, 1, 2)])
    ([datetime.datetime(2026, 1, 1, 0, 0)], [datetime.datetime(2026, 1, 3, 0, 0)])
    """
    if not others or None in others:
        return None
    first_other, last_other = min(others), max(others)  # type: ignore[type-var]
    first = [r for r in baseline_runs if (w := started(r)) and w < first_other]
    last = [r for r in baseline_runs if (w := started(r)) and w > last_other]
    return (first, last) if first and last else None


def block_counts(groups: list[ProfileRuns]) -> dict[str, int]:
    """How many blocks each profile's runs make: stretches of its runs with no other
    profile's run between them, in start order over every profile (the pipeline's
    repeats are one block; a return to the first profile is a second). A profile with a run
    of unknown start time counts as one block.

    >>> from datetime import datetime as d
    >>> def run(p, day): return RunRecord(uuid=f"{p}{day}", started_at=d(2026, 1, day))
    >>> a = ProfileRuns("a", [run("a", 1), run("a", 2), run("a", 5)])
    >>> block_counts([a, ProfileRuns("b", [run("b", 3), run("b", 4)])])
    {'a': 2, 'b': 1}
    """
    timed = [(run_time(r), g.profile) for g in groups for r in g.trainings]
    counts = dict.fromkeys((g.profile for g in groups), 1)
    if any(when is None for when, _ in timed):
        return counts
    counts = dict.fromkeys(counts, 0)
    previous = None
    for _, profile in sorted(timed, key=lambda t: t[0]):  # type: ignore[arg-type,return-value]
        if profile != previous:
            counts[profile] += 1
        previous = profile
    return counts
