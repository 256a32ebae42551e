"""SIGTERM (how Polyaxon and Kubernetes stop a run) takes the path SIGINT takes: an
exception in the main process, so that every ``finally`` and context manager on the way
out runs and the scratch on the claim (a dataset being generated, the cache, the
workspace) is removed. Without it SIGTERM kills the process where it stands.

The first signal raises :class:`~data_workloads.errors.Interrupted` (exit 128 + N); later
ones are ignored, so that the cleanup it started is not cut short. The scan's DataLoader
workers ignore both signals (the main process stops them); any other process forked with
these handlers raises ``KeyboardInterrupt`` instead, as it would without them.
"""

from __future__ import annotations

import contextlib
import os
import signal
from collections.abc import Iterator

from data_workloads.errors import Interrupted

SIGNALS = (signal.SIGTERM, signal.SIGINT)


@contextlib.contextmanager
def signals_raise_interrupted() -> Iterator[None]:
    """Install the handlers for the block; restore the previous ones afterwards."""
    main_pid = os.getpid()
    stopping: list[int] = []

    def handler(signum: int, _frame: object) -> None:
        if os.getpid() != main_pid:
            raise KeyboardInterrupt
        if stopping:
            return  # already on the way out
        stopping.append(signum)
        raise Interrupted(signum)

    previous = {sig: signal.signal(sig, handler) for sig in SIGNALS}
    try:
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)
