"""Assign loaded runs to storage profiles: per profile, its training run, the hook run that
switched the claim to it and the fio sweep measured on it."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime

from checkpoint_compare.errors import RunsMissing
from checkpoint_compare.records import RunKind, RunRecord


@dataclass
class ProfileRuns:
    """The runs that describe one storage profile.

    Attributes:
        profile: The profile (VolumeAttributesClass) name.
        training: The training run measured on it.
        hook: The hook run that switched the claim to it, if any.
        fio: The fio sweep measured on it, if any.
        ignored: Older runs of the same profile that were not used.
    """

    profile: str
    training: RunRecord
    hook: RunRecord | None = None
    fio: RunRecord | None = None
    ignored: list[RunRecord] = field(default_factory=list)


def _run_time(record: RunRecord) -> tuple[bool, datetime | None]:
    """Sort key: when the run started (else was created); unknown times sort last."""
    when = record.started_at or record.created_at
    return when is None, when


def _newest_first(records: Iterable[RunRecord]) -> list[RunRecord]:
    return sorted(records, key=lambda r: (r.created_at is not None, r.created_at), reverse=True)


def _profile_of(record: RunRecord, hooks: list[RunRecord]) -> str | None:
    """A run's profile: given explicitly, recorded as an input, or the class last applied."""
    if record.profile_hint:
        return record.profile_hint
    if record.kind is RunKind.TRAINING:
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
    records: list[RunRecord], expected: Iterable[str] = ()
) -> tuple[list[ProfileRuns], list[RunRecord]]:
    """Assign runs to profiles; the newest training run of each profile is the one compared.

    Args:
        records: All loaded runs (other kinds, e.g. the DAG or a compare op, are ignored).
        expected: Profiles that must be present.

    Returns:
        The profiles in the order their training runs were created, and the failed
        training runs (reported, never used).

    Raises:
        RunsMissing: An expected profile has no training run, the newest one of a profile
            failed or did not finish, or fewer than two profiles remain.
    """
    hooks = [r for r in records if r.kind is RunKind.HOOK]
    by_profile: dict[str, list[RunRecord]] = {}
    for record in records:
        if record.kind is RunKind.TRAINING:
            by_profile.setdefault(_profile_of(record, hooks) or "", []).append(record)
    failed = [r for runs in by_profile.values() for r in runs if not r.succeeded]

    problems = []
    groups = []
    for profile, runs in by_profile.items():
        newest, *older = _newest_first(runs)
        if not newest.succeeded:
            why = f": {newest.message}" if newest.message else ""
            problems.append(
                f"profile {profile}: run {newest.label} {newest.status}{why} (from {newest.source})"
            )
            continue
        group = ProfileRuns(profile=profile, training=newest, ignored=older)
        for kind, attr in ((RunKind.HOOK, "hook"), (RunKind.FIO, "fio")):
            candidates = [
                r
                for r in records
                if r.kind is kind and r.succeeded and _profile_of(r, hooks) == profile
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
            problems.append(f"profile {profile}: no training run found")
    if problems:
        raise RunsMissing("; ".join(problems))
    if len(groups) < 2:
        found = ", ".join(g.profile for g in groups) or "none"
        raise RunsMissing(f"need training runs of at least two profiles, found: {found}")
    # Run order decides the default baseline: the profile whose training started first.
    groups.sort(key=lambda g: _run_time(g.training))
    return groups, failed
