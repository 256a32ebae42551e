"""What one verdict is asked to do, declared once: a dataclass per section, a docstring per
field, and the command line generated from them (:mod:`checkpoint_storage_bench.config_cli`).

The sections are :class:`Sources` (where the runs come from), :class:`Prices`,
:class:`Selection` (which runs and profiles), :class:`~checkpoint_compare.comparison.Thresholds`
(what makes a difference count), :class:`~checkpoint_compare.table.Budget` (every
workload's budget, and the checkpoint cadence: each workload tests its own) and
:class:`Reports`. Nothing after the CLI parses arguments.

>>> from checkpoint_compare.config import from_options
>>> config = from_options({"summaries": (("gp3", Path("a.json")), ("io2", Path("b.json")))})
>>> config.sources.summaries[1], config.thresholds.confidence, config.reports.track
(('io2', PosixPath('b.json')), 0.95, True)
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

import click

from checkpoint_compare.comparison import Thresholds
from checkpoint_compare.cost import DEFAULT_PRICING
from checkpoint_compare.table import Budget
from checkpoint_storage_bench.config_cli import FiniteFloat, cli
from checkpoint_storage_bench.tracking import in_polyaxon_run


class KeyValue(click.ParamType):
    """``KEY=VALUE`` as a (key, value) pair; with ``key_optional`` a bare VALUE has the key
    None. The value is made a :class:`~pathlib.Path` when ``path`` is set."""

    name = "key=value"

    def __init__(self, key_optional: bool = False, path: bool = False) -> None:
        self.key_optional, self.path = key_optional, path

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None):  # noqa: ANN201
        if isinstance(value, tuple):  # a default, already converted
            return value
        key, sep, text = str(value).partition("=")
        if not sep:
            if not self.key_optional:
                self.fail(f"expected PROFILE=PATH, got {value!r}", param, ctx)
            key, text = "", str(value)
        if not text or (sep and not key):
            self.fail(f"empty profile or value in {value!r}", param, ctx)
        return (key or None, Path(text) if self.path else text)


@dataclass(frozen=True)
class Sources:
    """Where the runs come from: exactly one of an offline root, summary files or the
    Polyaxon API."""

    offline_root: Path | None = None
    """Offline Polyaxon runs."""
    summaries: tuple[tuple[str, Path], ...] = field(
        default=(),
        metadata=cli(
            flag="--summary", metavar="PROFILE=PATH", click_type=KeyValue(path=True), multiple=True
        ),
    )
    """Trainer (or data workload) summary JSON of a profile (repeat per profile; several of
    one profile are its repeats)."""
    api_host: str | None = None
    """Polyaxon server URL (not needed inside a Polyaxon run)."""
    project: str | None = None
    """OWNER/NAME on the server."""
    pipeline: str | None = None
    """Uuid of the pipeline (DAG) run whose runs to compare."""
    runs: tuple[tuple[str | None, str], ...] = field(
        default=(),
        metadata=cli(
            flag="--run", metavar="[PROFILE=]UUID", click_type=KeyValue(key_optional=True),
            multiple=True,
        ),
    )  # fmt: skip
    """A run to compare; PROFILE overrides what the run recorded (repeat)."""
    token: str | None = field(default=None, metadata=cli(envvar="POLYAXON_AUTH_TOKEN"))
    """API token, if the server needs one."""

    def __post_init__(self) -> None:
        api = self.uses_api
        chosen = [bool(self.offline_root), bool(self.summaries), api]
        if sum(chosen) != 1:
            raise click.UsageError(
                "give exactly one source: --offline-root DIR, --summary PROFILE=PATH ..., or "
                "the Polyaxon API (--pipeline UUID and/or --run [PROFILE=]UUID, with "
                "--api-host URL --project OWNER/NAME outside a Polyaxon run)"
            )
        if api and not in_polyaxon_run() and not (self.api_host and self.project):
            raise click.UsageError("outside a Polyaxon run the API needs --api-host and --project")
        if api and not (self.pipeline or self.runs or in_polyaxon_run()):
            raise click.UsageError("the API source needs --pipeline UUID or --run [PROFILE=]UUID")

    @property
    def uses_api(self) -> bool:
        api = bool(self.api_host or self.pipeline or (self.runs and not self.offline_root))
        # Inside the pipeline's compare op, no source means: the runs of my own pipeline.
        return api or (in_polyaxon_run() and not (self.offline_root or self.summaries))

    @property
    def run_profiles(self) -> dict[str, str | None]:
        """Run uuid → the profile it stands for (None: what the run recorded)."""
        return {uuid: profile for profile, uuid in self.runs}


@dataclass(frozen=True)
class Prices:
    """What storage and GPU time cost."""

    pricing_path: Path = field(default=DEFAULT_PRICING, metadata=cli(flag="--pricing"))
    """Pricing file."""
    gpu_hourly: float | None = field(default=None, metadata=cli(click_type=FiniteFloat()))
    """GPU USD/hour (the pricing file's otherwise)."""
    volume_gib: float | None = field(default=None, metadata=cli(click_type=FiniteFloat()))
    """Volume size, GiB (the pricing file's otherwise)."""


@dataclass(frozen=True)
class Selection:
    """Which profiles and runs the verdict is about."""

    baseline: str | None = None
    """Baseline profile (default: the first one run; required for runs without start times,
    e.g. summaries)."""
    expected: tuple[str, ...] = field(
        default=(),
        metadata=cli(flag="--expect", metavar="PROFILE", click_type=str, multiple=True),
    )
    """A profile that must be present (repeat); missing ones exit 3."""
    allow_resumed: bool = False
    """Rank runs resumed part-way (their timings cover only part of a run) against
    uninterrupted ones; refused (exit 3) without it."""


@dataclass(frozen=True)
class Reports:
    """What the verdict writes and logs besides what it prints."""

    html_path: Path | None = field(default=None, metadata=cli(flag="--html"))
    """Write the HTML report."""
    json_path: Path | None = field(default=None, metadata=cli(flag="--json"))
    """Write the JSON report."""
    markdown_path: Path | None = field(default=None, metadata=cli(flag="--markdown"))
    """Write the markdown report (tracked runs get it as their readme in any case)."""
    track: bool = True
    """Log the verdict as outputs of a Polyaxon run (offline outside one)."""


@dataclass(frozen=True)
class CompareConfig:
    """One verdict's settings, a section each."""

    sources: Sources
    prices: Prices = Prices()
    selection: Selection = Selection()
    thresholds: Thresholds = Thresholds()
    budget: Budget = Budget()
    reports: Reports = Reports()


SECTIONS: tuple[tuple[str, type], ...] = tuple(
    (f.name, f.type if isinstance(f.type, type) else globals()[f.type])
    for f in fields(CompareConfig)
)
"""(field of :class:`CompareConfig`, its section class), in the order ``--help`` lists them."""


def from_options(options: Mapping[str, Any]) -> CompareConfig:
    """The config from the parsed options (a field's name → its value; a missing one keeps
    its default).

    Raises:
        click.UsageError: No source, or several.
    """
    return CompareConfig(
        **{
            name: section(**{f.name: options[f.name] for f in fields(section) if f.name in options})
            for name, section in SECTIONS
        }
    )
