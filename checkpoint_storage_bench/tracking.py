"""Polyaxon tracking for every CLI in the bundle.

Inside a Polyaxon run (the agent sets ``POLYAXON_RUN_INSTANCE``) we log to that run, so
the values become columns of Polyaxon's comparison view. Outside one we log an offline run
under ``$POLYAXON_OFFLINE_ROOT`` that ``polyaxon ops push`` can upload later. ``--no-track``
gives a tracker that records nothing.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

DEFAULT_OFFLINE_ROOT = "/tmp/plx/offline"
DEFAULT_OWNER = "local"
DEFAULT_PROJECT = "checkpoint-storage"


def in_polyaxon_run() -> bool:
    """Whether this process was started by a Polyaxon agent for a run."""
    return bool(os.environ.get("POLYAXON_RUN_INSTANCE"))


def polyaxon_run(environ: dict[str, str] | None = None) -> tuple[str, str, str] | None:
    """``(owner, project, run uuid)`` inside a Polyaxon run (``POLYAXON_RUN_INSTANCE`` =
    ``owner.project.runs.uuid``), else None."""
    environ = os.environ if environ is None else environ
    parts = (environ.get("POLYAXON_RUN_INSTANCE") or "").split(".")
    if len(parts) == 4 and parts[2] == "runs" and parts[3]:
        return parts[0], parts[1], parts[3]
    return None


def outermost_run(
    owner: str,
    project: str,
    run_uuid: str,
    parent_of: Callable[[str, str, str], str | None],
) -> str:
    """The run at the top of ``run_uuid``'s tree: its pipeline's pipeline, and so on (the
    run itself when it has none). A pipeline may nest another (the two-profile pipeline
    wraps the general one, whose stages nest a DAG each), so only the top is the
    ``controller`` of every run below it."""
    seen = {run_uuid}
    current = run_uuid
    while (parent := parent_of(owner, project, current)) is not None and parent not in seen:
        seen.add(parent)
        current = parent
    return current


def offline_root() -> Path:
    """Where offline runs are written (read on every call, unlike polyaxon's import-time read)."""
    return Path(os.environ.get("POLYAXON_OFFLINE_ROOT", DEFAULT_OFFLINE_ROOT))


def _scalar(value: Any) -> Any:
    """Polyaxon columns need scalars: keep numbers, bools and strings, stringify the rest."""
    if value is None or isinstance(value, bool | int | float | str):
        return value
    return str(value)


class Tracker:
    """A thin wrapper over ``polyaxon.tracking`` that can also be disabled.

    Attributes:
        run_uuid: The uuid of the Polyaxon run logged to, or None when disabled.
        run_dir: For offline runs, the directory holding ``run.plx.json``.
    """

    def __init__(self, run: Any | None, run_dir: Path | None = None) -> None:
        self._run = run
        self.run_uuid: str | None = getattr(run, "run_uuid", None) if run else None
        self.run_dir = run_dir

    @property
    def enabled(self) -> bool:
        return self._run is not None

    def log_inputs(self, **values: Any) -> None:
        if self._run:
            self._run.log_inputs(**{k: _scalar(v) for k, v in values.items()})

    def log_outputs(self, **values: Any) -> None:
        if self._run:
            self._run.log_outputs(**{k: _scalar(v) for k, v in values.items() if v is not None})

    def log_meta(self, **values: Any) -> None:
        if self._run:
            self._run.log_meta(**{k: _scalar(v) for k, v in values.items() if v is not None})

    def log_metrics(self, step: int, values: Mapping[str, float | None]) -> None:
        if self._run:
            clean = {k: float(v) for k, v in values.items() if v is not None}
            if clean:
                self._run.log_metrics(step=step, **clean)

    def log_tags(self, tags: list[str]) -> None:
        if self._run and tags:
            self._run.log_tags(tags)

    def log_progress(self, fraction: float) -> None:
        """The run's progress bar in Polyaxon's UI (0..1; traceml throttles the updates)."""
        if self._run and hasattr(self._run, "log_progress"):
            self._run.log_progress(min(1.0, max(0.0, float(fraction))))

    def outputs_path(self, rel_path: str, store: bool = False) -> str | None:
        """Where the run's outputs live: the local directory Polyaxon syncs to the artifacts
        store (created), or with ``store`` the same place in the store itself (s3://…,
        gs://…). None when disabled, or with ``store`` when no artifacts store is
        configured (outside a Polyaxon run)."""
        if not self._run:
            return None
        if store and self._run.get_artifacts_store_connection() is None:
            return None
        return self._run.get_outputs_path(
            rel_path, ensure_path=not store, is_dir=True, use_store_path=store
        )

    def set_readme(self, markdown: str) -> None:
        """The run's readme: Polyaxon renders it on the run's page."""
        if self._run:
            self._run.set_readme(markdown, async_req=False)

    def log_artifact(self, path: Path, name: str | None = None, kind: str = "file") -> None:
        if self._run:
            self._run.log_artifact(path=str(path), name=name, kind=kind)

    def end(self) -> None:
        if self._run:
            self._run.end()


def _init_run(name: str, tags: list[str]) -> tuple[Any, Path | None]:
    # Imported lazily: polyaxon is slow to import and reads env vars at import time.
    from polyaxon import tracking
    from polyaxon._contexts import paths as ctx_paths

    if in_polyaxon_run():
        run = tracking.init(track_code=False, track_env=False, track_logs=False)
        if tags:
            run.log_tags(tags)
        return run, None

    root = offline_root()
    root.mkdir(parents=True, exist_ok=True)
    ctx_paths.CONTEXT_OFFLINE_ROOT = str(root)
    ctx_paths.CONTEXT_OFFLINE_FORMAT = f"{root}/{{}}"
    run = tracking.init(
        is_offline=True,
        owner=os.environ.get("POLYAXON_OWNER", DEFAULT_OWNER),
        project=os.environ.get("POLYAXON_PROJECT", DEFAULT_PROJECT),
        name=name,
        tags=tags or None,
        track_code=False,
        track_env=False,
        track_logs=False,
    )
    return run, root / "runs" / run.run_uuid


@contextmanager
def tracked_run(
    name: str, tags: list[str] | None = None, enabled: bool = True
) -> Iterator[Tracker]:
    """Open a tracked run for the duration of the block and always end it.

    Args:
        name: The run name for offline runs (inside Polyaxon the run already has one).
        tags: Tags to attach.
        enabled: False yields a tracker that logs nothing.

    Yields:
        The tracker.
    """
    if not enabled:
        yield Tracker(None)
        return
    # Polyaxon's end() resets sys.stdout/stderr to the process's originals, which would
    # send later output past any redirection (a test runner's, a wrapper's).
    saved_streams = sys.stdout, sys.stderr
    run, run_dir = _init_run(name, tags or [])
    tracker = Tracker(run, run_dir)
    try:
        yield tracker
    except BaseException as exc:
        # Mark the run failed before end(), which would otherwise record success.
        try:
            run.log_failed(reason=type(exc).__name__, message=str(exc)[:500])
        except Exception as track_exc:  # noqa: BLE001
            log.warning("polyaxon tracking log_failed() failed: %s", track_exc)
        raise
    finally:
        # end() persists offline runs; a tracking failure must not hide the real error.
        try:
            tracker.end()
        except Exception as exc:  # noqa: BLE001
            log.warning("polyaxon tracking end() failed: %s", exc)
        sys.stdout, sys.stderr = saved_streams
