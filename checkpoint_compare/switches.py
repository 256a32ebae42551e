"""Was the claim switched to another class while a training run was measuring?

The storage-profile hook keeps a ledger of every switch on the claim itself (the annotation
``contract.LEDGER_ANNOTATION``) and logs it after its own switch as the output
``contract.LEDGER_OUTPUT``. The newest hook run of a pipeline therefore holds every switch
made before it, by this pipeline or anyone else who used the hook; entries from all hook
runs are merged. A switch to a class other than the profile's, between a training run's
start and end, means the run did not measure its profile: the verdict refuses it.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime

from checkpoint_compare.errors import BadInput, NotComparable
from checkpoint_compare.grouping import ProfileRuns
from checkpoint_compare.records import RunRecord
from checkpoint_storage_bench.contract import LEDGER_OUTPUT, LedgerEntry, parse_ledger

Claim = tuple[str | None, str | None]  # (namespace, claim)


def _ledger(hook: RunRecord) -> list[LedgerEntry] | None:
    """The ledger a hook run recorded, or None when it recorded none.

    Raises:
        BadInput: It recorded something that is not a ledger.
    """
    value = hook.outputs.get(LEDGER_OUTPUT, hook.inputs.get(LEDGER_OUTPUT))
    if value in (None, ""):
        return None
    text = value if isinstance(value, str) else json.dumps(value)
    try:
        return parse_ledger(text)
    except (ValueError, TypeError) as exc:  # json.JSONDecodeError is a ValueError
        raise BadInput(f"{hook.source}: hook run {hook.label}: {LEDGER_OUTPUT}: {exc}") from exc


def _utc(when: datetime) -> datetime:
    return when if when.tzinfo else when.replace(tzinfo=UTC)


def check_switches(groups: list[ProfileRuns], hook_runs: list[RunRecord]) -> list[str]:
    """Refuse a profile whose claim was switched to another class inside one of its training
    runs' measured intervals.

    Returns:
        Notes for the report (what could not be checked).

    Raises:
        NotComparable: Naming each switch, its time and holder, and the run it fell into.
        BadInput: A hook run recorded a malformed ledger.
    """
    ledgers: dict[Claim, dict[str, LedgerEntry]] = {}
    for hook in hook_runs:
        entries = _ledger(hook)
        if entries is not None:
            claim = (hook.inputs.get("namespace"), hook.inputs.get("claim"))
            merged = ledgers.setdefault(claim, {})
            merged |= {json.dumps(e.to_json(), sort_keys=True): e for e in entries}
    if not ledgers:
        return [
            f"no hook run recorded the claim's ledger (output {LEDGER_OUTPUT!r}): switches "
            "of the claim's class during the measured runs were not checked"
        ]
    notes, problems = [], []
    for group in groups:
        hook = group.hook
        claim = (hook.inputs.get("namespace"), hook.inputs.get("claim")) if hook else None
        if claim in ledgers:
            entries = list(ledgers[claim].values())
        elif len(ledgers) == 1:  # one claim in the pipeline: it is this profile's
            entries = list(next(iter(ledgers.values())).values())
        else:
            notes.append(f"profile {group.profile}: no ledger of its claim: switches not checked")
            continue
        for run in group.trainings:
            if run.started_at is None or run.finished_at is None:
                notes.append(
                    f"run {run.label} has no measured interval: switches during it not checked"
                )
                continue
            start, end = _utc(run.started_at), _utc(run.finished_at)
            for entry in entries:
                if start < _utc(entry.at) < end and entry.to_class != group.profile:
                    holder = f" by {entry.holder}" if entry.holder else ""
                    problems.append(
                        f"profile {group.profile}: its claim was switched from "
                        f"{entry.from_class} to {entry.to_class} at "
                        f"{entry.at.isoformat()}{holder}, inside run {run.label}'s measured "
                        f"interval ({start.isoformat()} – {end.isoformat()})"
                    )
    if problems:
        raise NotComparable("; ".join(problems))
    return notes
