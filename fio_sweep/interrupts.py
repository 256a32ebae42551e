"""SIGTERM (how Polyaxon stops a run) and SIGINT as an exception that cleanups can hold off.

While :func:`signals_raise_interrupted` is active, the first signal raises
:class:`Interrupted` in the main thread; it unwinds through fio's wait (which stops fio)
and the scratch directories (which are removed). Code in :func:`deferred_signals` (the
removals themselves) is not cut short: the exception comes when the block ends. Repeated
signals are ignored once the sweep is stopping. This is kept in Python rather than in a
signal mask because Polyaxon's tracking threads would receive a masked signal instead.
"""

from __future__ import annotations

import contextlib
import signal
from collections.abc import Iterator

from fio_sweep.errors import Interrupted

SIGNALS = (signal.SIGTERM, signal.SIGINT)


class _State:
    deferring = 0
    signum: int | None = None
    raised = False


_state = _State()


def _raise(signum: int) -> None:
    _state.raised = True
    raise Interrupted(signum)


def _handler(signum: int, _frame: object) -> None:
    if _state.signum is not None:
        return  # already stopping
    _state.signum = signum
    if not _state.deferring:
        _raise(signum)


@contextlib.contextmanager
def signals_raise_interrupted() -> Iterator[None]:
    """Install the handlers for the block; restore the previous ones afterwards."""
    _state.deferring, _state.signum, _state.raised = 0, None, False
    previous = {sig: signal.signal(sig, _handler) for sig in SIGNALS}
    try:
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)


@contextlib.contextmanager
def deferred_signals() -> Iterator[None]:
    """Hold an interruption until the block is done (cleanup code)."""
    _state.deferring += 1
    try:
        yield
    finally:
        _state.deferring -= 1
        if not _state.deferring and _state.signum is not None and not _state.raised:
            _raise(_state.signum)
