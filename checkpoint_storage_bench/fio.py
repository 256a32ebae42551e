"""Running fio and reading its JSON: shared by the fio sweep and the trainer's
benchmark (which measures fio as its reference).

Reading fio 3.x ``--output-format=json`` into the few numbers the sweep reports.

fio prints some notes (``fio: pid=..., err=28/...``) on stdout before the JSON, so the
document starts at the first line that begins with ``{``. With ``group_reporting=1`` the
``numjobs`` clones come back as one entry; without it, entries of the same job are summed.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import subprocess
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import Any

from checkpoint_storage_bench.processes import stop_group

DIRECTIONS = ("read", "write")
PERCENTILES = {"lat_p50_us": "50.000000", "lat_p99_us": "99.000000", "lat_p999_us": "99.900000"}
MB = 1e6


class FioOutputError(ValueError):
    """fio's output holds no JSON document with jobs."""


@dataclass
class Measures:
    """One case's results. Latencies are completion latency (``clat``) in microseconds.

    Totals add read and write; latencies are the worse of the two directions (percentiles
    of different streams cannot be merged exactly). ``directions`` keeps each one apart.
    """

    bw_bytes: float = 0.0
    iops: float = 0.0
    lat_p50_us: float | None = None
    lat_p99_us: float | None = None
    lat_p999_us: float | None = None
    runtime_s: float = 0.0
    errors: int = 0
    error_messages: list[str] = field(default_factory=list)
    directions: dict[str, dict[str, float | None]] = field(default_factory=dict)

    @property
    def bw_mbps(self) -> float:
        """Bandwidth in MB/s (1 MB = 1e6 bytes)."""
        return self.bw_bytes / MB


def extract_json(stdout: str) -> dict[str, Any]:
    """The JSON document in fio's stdout, skipping any note lines before it.

    Raises:
        FioOutputError: No JSON document with a ``jobs`` list.
    """
    start = 0 if stdout.startswith("{") else stdout.find("\n{") + 1
    if start == 0 and not stdout.startswith("{"):
        raise FioOutputError("fio printed no JSON")
    try:
        # raw_decode: fio may print more lines after the document.
        doc, _ = json.JSONDecoder().raw_decode(stdout[start:])
    except json.JSONDecodeError as exc:
        raise FioOutputError(f"fio's JSON output is malformed: {exc}") from exc
    if not isinstance(doc, dict) or not isinstance(doc.get("jobs"), list) or not doc["jobs"]:
        raise FioOutputError("fio's JSON output has no jobs")
    return doc


def parse_jobs(doc: dict[str, Any], jobname: str | None = None) -> Measures:
    """Aggregate the entries of one job (all entries when ``jobname`` is None)."""
    jobs = [j for j in doc["jobs"] if jobname is None or j.get("jobname") == jobname]
    if not jobs:
        raise FioOutputError(f"fio's JSON output has no job named {jobname!r}")
    out = Measures()
    for name in DIRECTIONS:
        stats = [j[name] for j in jobs if j.get(name, {}).get("total_ios", 0) > 0]
        if not stats:
            continue
        direction: dict[str, float | None] = {
            "bw_bytes": float(sum(s["bw_bytes"] for s in stats)),
            "iops": float(sum(s["iops"] for s in stats)),
            "io_bytes": float(sum(s["io_bytes"] for s in stats)),
            "runtime_s": max(s["runtime"] for s in stats) / 1000,
        }
        for key, pct in PERCENTILES.items():
            values = [s["clat_ns"]["percentile"][pct] for s in stats if _has_pct(s, pct)]
            direction[key] = max(values) / 1000 if values else None
        out.directions[name] = direction
        out.bw_bytes += direction["bw_bytes"] or 0.0
        out.iops += direction["iops"] or 0.0
        out.runtime_s = max(out.runtime_s, direction["runtime_s"] or 0.0)
        for key in PERCENTILES:
            value = direction[key]
            current = getattr(out, key)
            if value is not None and (current is None or value > current):
                setattr(out, key, value)
    for job in jobs:
        errno_ = int(job.get("error", 0) or 0)
        # total_err counts errors that continue_on_error let pass; error is the first one.
        count = int(job.get("total_err", 0) or 0) or (1 if errno_ else 0)
        out.errors += count
        if errno_:
            out.error_messages.append(f"errno {errno_} ({os.strerror(errno_)})")
    return out


def _has_pct(stats: dict[str, Any], pct: str) -> bool:
    return pct in stats.get("clat_ns", {}).get("percentile", {})


KILL_GRACE_S = 5.0
# fio's messages when an I/O engine cannot be loaded or set up (libaio, io_uring).
_ENGINE_UNAVAILABLE = re.compile(
    r"engine \S+ not loadable|failed to load engine|io_queue_init|io_setup|"
    r"io_uring_(queue_init|setup)"
)


@dataclass(frozen=True)
class FioRun:
    """What one fio process returned."""

    returncode: int
    stdout: str
    stderr: str

    @property
    def notes(self) -> list[str]:
        """fio's messages: stderr, and the lines it prints on stdout before the JSON
        (``fio: pid=..., err=28/...``)."""
        preamble = "" if self.stdout.startswith("{") else self.stdout.split("\n{", 1)[0]
        lines = (line.strip() for line in (self.stderr + "\n" + preamble).splitlines())
        return [line for line in lines if line]

    @property
    def message(self) -> str:
        """fio's last message, for the summary notes."""
        return self.notes[-1] if self.notes else ""

    @property
    def engine_error(self) -> str | None:
        """fio's message when it failed because the I/O engine cannot be used here."""
        if self.returncode == 0:
            return None
        return next((line for line in self.notes if _ENGINE_UNAVAILABLE.search(line)), None)


def run_fio(
    args: list[str],
    on_tick: Callable[[], None] | None = None,
    tick_s: float = 1.0,
    cleanup_guard: Callable[[], AbstractContextManager[object]] = contextlib.nullcontext,
) -> FioRun:
    """Run fio with an argument list (never a shell) and wait for it.

    fio runs in its own process group, so a terminal's Ctrl-C reaches only us; whatever ends
    the wait (an exception from a signal handler, too) first stops fio and its job processes,
    so no file is written after the caller's cleanup.

    Args:
        args: The full command, starting with the fio binary.
        on_tick: Called every ``tick_s`` seconds while fio runs (progress display).
        tick_s: The tick interval.
        cleanup_guard: Held while fio is being stopped (the sweep defers signals there).
    """
    proc = subprocess.Popen(
        args,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        while True:
            try:
                stdout, stderr = proc.communicate(timeout=tick_s)
                return FioRun(proc.returncode, stdout, stderr)
            except subprocess.TimeoutExpired:
                if on_tick is not None:
                    on_tick()
    finally:
        if proc.poll() is None:
            # Not interruptible half-way: the caller removes fio's files right after this.
            # SIGTERM makes fio stop its jobs; SIGKILL follows if that takes too long.
            with cleanup_guard():
                stop_group(proc.pid, grace=KILL_GRACE_S, popen=proc)
