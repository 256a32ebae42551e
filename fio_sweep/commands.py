"""Running a whole sweep: cases one after another, the overhead check, progress, summary."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import shutil
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

from checkpoint_storage_bench.contract import FIO_SCHEMA
from checkpoint_storage_bench.fio import (
    PERCENTILES,
    FioOutputError,
    FioRun,
    Measures,
    extract_json,
    parse_jobs,
    run_fio,
)
from checkpoint_storage_bench.interrupts import deferred_signals
from checkpoint_storage_bench.tracking import Tracker
from checkpoint_storage_bench.units import format_bytes
from fio_sweep.config import Config
from fio_sweep.errors import FioJobError
from fio_sweep.runner import (
    Target,
    check_directory,
    check_space,
    device_supports_direct_io,
    find_fio,
    resolve_target,
    scratch_dir,
    supports_direct_io,
)
from fio_sweep.spec import SYNC_ENGINES, Case, Spec, load_spec, writers_case

OVERHEAD_THRESHOLD_PCT = 10.0
FALLBACK_ENGINE = "psync"
METRICS = ("bw_mbps", "iops", *PERCENTILES)


@dataclass
class CaseResult:
    """A case as it actually ran (after fallbacks), its measures and notes."""

    case: Case
    measures: Measures
    notes: list[str] = field(default_factory=list)

    @property
    def failed(self) -> bool:
        return self.measures.errors > 0

    def measure(self, name: str) -> float | None:
        """A headline measure by its summary name; None when the case failed."""
        return None if self.failed else getattr(self.measures, name)

    def to_dict(self) -> dict[str, Any]:
        m = self.measures
        return {
            **self.case.to_dict(),
            "bw_bytes": m.bw_bytes,
            "bw_mbps": m.bw_mbps,
            "iops": m.iops,
            "lat_p50_us": m.lat_p50_us,
            "lat_p99_us": m.lat_p99_us,
            "lat_p999_us": m.lat_p999_us,
            "runtime_s": m.runtime_s,
            "errors": m.errors,
            "directions": m.directions,
            "notes": self.notes + m.error_messages,
        }


class Progress:
    """Case i of n, elapsed time and an ETA from the cases' runtimes, on a stream.

    On a terminal the running line is redrawn every tick; elsewhere (logs) a line is written
    every ``log_every_s`` seconds so the log stays short.
    """

    def __init__(self, estimates_s: list[float], stream: TextIO | None = None) -> None:
        self.estimates_s = estimates_s
        self.stream = stream if stream is not None else sys.stderr
        self.tty = self.stream.isatty()
        self.log_every_s = 10.0
        self.sweep_start = time.monotonic()
        self.case_start = self.sweep_start
        self.index = 0
        self.label = ""
        self._last_log = 0.0

    def start(self, index: int, label: str, case: Case) -> None:
        self.index, self.label = index, label
        self.case_start = self._last_log = time.monotonic()
        self._write(
            f"{self._prefix()} {label}: rw={case.rw} bs={format_bytes(case.bs)} "
            f"size={format_bytes(case.size)} "
            f"iodepth={case.iodepth} numjobs={case.numjobs} (up to {case.runtime}s)",
            final=True,
        )

    def tick(self) -> None:
        now = time.monotonic()
        if not self.tty and now - self._last_log < self.log_every_s:
            return
        self._last_log = now
        self._write(
            f"{self._prefix()} {self.label}: {now - self.case_start:.0f}s, "
            f"sweep {now - self.sweep_start:.0f}s elapsed, ETA ~{self.eta_s():.0f}s",
            final=not self.tty,
        )

    def done(self, result: CaseResult) -> None:
        m = result.measures
        if result.failed:
            text = f"FAILED ({'; '.join(m.error_messages) or 'see notes'})"
        else:
            p99 = f"{m.lat_p99_us:.0f}" if m.lat_p99_us is not None else "-"
            text = f"{m.bw_mbps:.1f} MB/s, {m.iops:.0f} IOPS, p99 {p99} us"
        elapsed = time.monotonic() - self.case_start
        self._write(f"{self._prefix()} {self.label}: {text} ({elapsed:.1f}s)", final=True)

    def eta_s(self) -> float:
        """Seconds left: the rest of the current case's runtime plus the later cases'."""
        current = max(0.0, self.estimates_s[self.index] - (time.monotonic() - self.case_start))
        return current + sum(self.estimates_s[self.index + 1 :])

    def _prefix(self) -> str:
        return f"[fio {self.index + 1}/{len(self.estimates_s)}]"

    def _write(self, text: str, final: bool) -> None:
        if self.tty:
            self.stream.write("\r\x1b[2K" + text + ("\n" if final else ""))
        else:
            self.stream.write(text + "\n")
        self.stream.flush()


class Runner:
    """Runs cases with one fio binary, remembering engine fallbacks across cases."""

    def __init__(self, fio: str, progress: Progress) -> None:
        self.fio = fio
        self.progress = progress
        self.engine_fallbacks: dict[str, str] = {}

    def run(self, case: Case, where: Path, raw_device: bool, direct_ok: bool) -> CaseResult:
        """Run one case in ``where`` (a scratch directory, or the raw device).

        Args:
            case: The case.
            where: The scratch directory (a subdirectory per case is made and removed) or,
                for a raw device, the device.
            raw_device: Whether ``where`` is a device.
            direct_ok: Whether O_DIRECT works there; if not, direct cases run buffered.
        """
        notes: list[str] = []
        if case.direct and not direct_ok:
            case = dataclasses.replace(case, direct=False)
            notes.append(f"O_DIRECT is not supported in {where} (e.g. tmpfs): ran buffered")
        if case.ioengine in self.engine_fallbacks:
            case, note = self._fallback(case, self.engine_fallbacks[case.ioengine])
            notes.append(note)
        run = self._attempt(case, where, raw_device)
        if run.engine_error and case.ioengine not in SYNC_ENGINES:
            self.engine_fallbacks[case.ioengine] = run.engine_error
            case, note = self._fallback(case, run.engine_error)
            notes.append(note)
            run = self._attempt(case, where, raw_device)
        try:
            measures = parse_jobs(extract_json(run.stdout), case.name)
        except FioOutputError as exc:
            measures = Measures(errors=1, error_messages=[str(exc)])
        if run.returncode != 0 and measures.errors == 0:
            measures.errors = 1
        if run.returncode != 0:
            measures.error_messages.append(
                f"fio exited with {run.returncode}: {run.message or 'no message'}"
            )
        return CaseResult(case, measures, notes)

    def _attempt(self, case: Case, where: Path, raw_device: bool) -> FioRun:
        """One fio run; in a directory, its files go into a subdirectory removed afterwards."""
        if raw_device:
            return run_fio(
                self._command(case, f"--filename={where}"),
                self.progress.tick,
                cleanup_guard=deferred_signals,
            )
        case_dir = where / case.name
        case_dir.mkdir()
        try:
            return run_fio(
                self._command(case, f"--directory={case_dir}"),
                self.progress.tick,
                cleanup_guard=deferred_signals,
            )
        finally:
            with deferred_signals():
                shutil.rmtree(case_dir, ignore_errors=True)

    def _command(self, case: Case, location: str) -> list[str]:
        return [
            self.fio,
            "--output-format=json",
            "--eta=never",
            "--group_reporting=1",
            *case.fio_args(),
            location,
        ]

    @staticmethod
    def _fallback(case: Case, reason: str) -> tuple[Case, str]:
        note = f"ioengine {case.ioengine} unavailable ({reason}): ran with {FALLBACK_ENGINE}"
        if case.iodepth > 1:
            note += f", which keeps one I/O in flight (iodepth {case.iodepth} not reached)"
        return dataclasses.replace(case, ioengine=FALLBACK_ENGINE), note


def outputs_for(results: list[CaseResult], overhead: dict[str, Any] | None) -> dict[str, float]:
    """The scalar Polyaxon outputs (comparison-view columns), as named in the contract."""
    outputs: dict[str, float | None] = {}
    for r in results:
        key = r.case.output_key
        outputs[f"fio_{key}_bw_mbps"] = r.measure("bw_mbps")
        outputs[f"fio_{key}_iops"] = r.measure("iops")
        outputs[f"fio_{key}_lat_p99_us"] = r.measure("lat_p99_us")
    if overhead is not None:
        outputs["fio_overhead_pct"] = overhead["overhead_pct"]
    return {k: v for k, v in outputs.items() if v is not None}


def overhead_check(
    on_target: CaseResult, on_reference: CaseResult, reference_dir: Path, same_io: bool = True
) -> dict[str, Any]:
    """How much slower the case ran on the target than on the reference path, in percent.

    Positive: the target (the claim) is slower. Flagged above 10%, as the seed advises.
    When one side had to run buffered and the other direct (a tmpfs reference without
    O_DIRECT), the two are not comparable and no percentage is given.
    """
    target_bw = on_target.measure("bw_mbps")
    reference_bw = on_reference.measure("bw_mbps")
    pct = None
    if target_bw is not None and reference_bw and same_io:
        pct = (reference_bw - target_bw) / reference_bw * 100
    return {
        "note": None
        if same_io
        else "not compared: one side ran O_DIRECT and the other buffered (no O_DIRECT there)",
        "case": on_target.case.name,
        "reference_dir": str(reference_dir),
        "target_bw_mbps": target_bw,
        "reference_bw_mbps": reference_bw,
        "overhead_pct": pct,
        "threshold_pct": OVERHEAD_THRESHOLD_PCT,
        "flagged": pct is not None and pct > OVERHEAD_THRESHOLD_PCT,
        "reference": on_reference.to_dict(),
    }


@dataclass
class Plan:
    """Everything checked before fio writes a byte."""

    fio: str
    fio_version: str
    spec: Spec
    target: Target
    reference: Target | None


def prepare(config: Config) -> Plan:
    """Validate the spec, the paths, the free space and the fio binary, in that order."""
    spec = load_spec(config.spec)
    if config.writers is not None:
        spec = spec.with_case(writers_case(config.writers))
    spec = spec.scaled(config.size_scale, config.runtime)
    target = resolve_target(config.mount, config.target, config.allow_raw_device)
    reference = check_directory(config.reference_dir) if config.reference_dir else None
    if target.raw_device:
        check_space(target, max(c.size for c in spec.cases))
    else:
        check_space(target, max(c.bytes_needed for c in spec.cases))
    if reference is not None:
        check_space(reference, spec.case(spec.overhead_case).bytes_needed)
    return Plan(*find_fio(), spec, target, reference)


def run_sweep(plan: Plan, config: Config, tracker: Tracker, stream: TextIO | None = None) -> dict:
    """Run every case, then the overhead check; log to the tracker; return the summary.

    Raises:
        FioJobError: After the summary is written, when any case failed.
    """
    spec = plan.spec
    tracker.log_inputs(
        mount=str(config.mount),
        target=str(plan.target.path),
        spec=spec.source,
        size_scale=config.size_scale,
        runtime_override=config.runtime,
        reference_dir=str(config.reference_dir) if config.reference_dir else None,
        case_count=len(spec.cases),
        writers=config.writers,
        # Set by the pipeline for each profile's stage, as for the trainer.
        storage_profile=os.environ.get("STORAGE_PROFILE"),
    )
    tracker.log_meta(fio_version=plan.fio_version)
    overhead_case = spec.case(spec.overhead_case)
    runs = list(spec.cases) + ([overhead_case] if plan.reference else [])
    progress = Progress([c.runtime + c.ramp_time for c in runs], stream)
    runner = Runner(plan.fio, progress)

    results: list[CaseResult] = []
    with contextlib.ExitStack() as stack:
        if plan.target.raw_device:
            where, direct_ok = plan.target.path, device_supports_direct_io(plan.target.path)
        else:
            where = stack.enter_context(scratch_dir(plan.target))
            direct_ok = supports_direct_io(where)
        for i, case in enumerate(spec.cases):
            progress.start(i, case.name, case)
            result = runner.run(case, where, plan.target.raw_device, direct_ok)
            progress.done(result)
            results.append(result)
            tracker.log_metrics(0, {f"fio.{case.name}.{m}": result.measure(m) for m in METRICS})

    overhead = None
    if plan.reference is not None:
        progress.start(len(spec.cases), f"{overhead_case.name}@reference", overhead_case)
        with scratch_dir(plan.reference) as ref_where:
            ref_direct_ok = supports_direct_io(ref_where)
            on_ref = runner.run(overhead_case, ref_where, False, ref_direct_ok)
        progress.done(on_ref)
        on_target = next(r for r in results if r.case.name == overhead_case.name)
        same_io = not overhead_case.direct or direct_ok == ref_direct_ok
        overhead = overhead_check(on_target, on_ref, plan.reference.path, same_io)

    outputs = outputs_for(results, overhead)
    tracker.log_outputs(**outputs)
    summary = {
        "schema": FIO_SCHEMA,
        "mount": str(config.mount),
        "target": str(plan.target.path),
        "raw_device": plan.target.raw_device,
        "spec": spec.source,
        "fio_version": plan.fio_version,
        "size_scale": config.size_scale,
        "runtime_override": config.runtime,
        "writers": config.writers,
        "cases": [r.to_dict() for r in results],
        "overhead": overhead,
        "outputs": outputs,
    }
    if config.summary_json is not None:
        config.summary_json.parent.mkdir(parents=True, exist_ok=True)
        config.summary_json.write_text(json.dumps(summary, indent=2) + "\n")
        tracker.log_artifact(config.summary_json, name="fio_sweep_summary")
    failed = [r.case.name for r in results if r.failed]
    if overhead is not None and overhead["reference"]["errors"]:
        failed.append(f"{overhead_case.name}@reference")
    if failed:
        raise FioJobError(f"fio failed for {', '.join(failed)} (details in the summary notes)")
    return summary
