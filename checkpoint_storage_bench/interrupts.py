"""SIGTERM (how Polyaxon and Kubernetes stop a run) takes the path SIGINT takes: an
exception in the main process, so that every ``finally`` and context manager on the way out
runs and the scratch a run made on the claim is removed. Without it SIGTERM kills the
process where it stands.

While :func:`signals_raise` is active, the first signal raises the part's own exception
(built from the signal number, so the part maps it to its exit code, 128 + N) in the main
thread; later ones are ignored, so that the cleanup it started is not cut short. Code inside
:func:`deferred_signals` (the removals themselves) is not cut short either: the exception
comes when the block ends. A process forked with these handlers (a DataLoader worker)
raises ``KeyboardInterrupt`` instead, as it would without them. This is kept in Python
rather than in a signal mask because Polyaxon's tracking threads would receive a masked
signal instead.

>>> import os, signal
>>> class Stopped(Exception): pass
>>> try:
...     with signals_raise(Stopped):
...         with deferred_signals():
...             os.kill(os.getpid(), signal.SIGTERM)
...             print("cleanup finished")
... except Stopped as exc:
...     print("then", signal.Signals(exc.args[0]).name)
cleanup finished
then SIGTERM
"""

from __future__ import annotations

import contextlib
import os
import signal
from collections.abc import Callable, Iterator

SIGNALS = (signal.SIGTERM, signal.SIGINT)


class _State:
    deferring = 0
    signum: int | None = None
    raised = False
    main_pid = 0
    make: Callable[[int], BaseException] = KeyboardInterrupt


_state = _State()


def _raise(signum: int) -> None:
    _state.raised = True
    raise _state.make(signum)


def _handler(signum: int, _frame: object) -> None:
    if os.getpid() != _state.main_pid:
        raise KeyboardInterrupt
    if _state.signum is not None:
        return  # already on the way out
    _state.signum = signum
    if not _state.deferring:
        _raise(signum)


@contextlib.contextmanager
def signals_raise(make: Callable[[int], BaseException]) -> Iterator[None]:
    """Install the handlers for the block (the first signal raises ``make(signum)``);
    restore the previous ones afterwards."""
    _state.deferring, _state.signum, _state.raised = 0, None, False
    _state.main_pid, _state.make = os.getpid(), make
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
