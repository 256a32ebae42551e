"""Reading fio 3.x ``--output-format=json`` into the few numbers the sweep reports.

fio prints some notes (``fio: pid=..., err=28/...``) on stdout before the JSON, so the
document starts at the first line that begins with ``{``. With ``group_reporting=1`` the
``numjobs`` clones come back as one entry; without it, entries of the same job are summed.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from typing import Any

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
