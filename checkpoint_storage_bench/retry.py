"""One retry loop for every remote call of the bundle (the Kubernetes API, the cloud
provider's API, the artifact store, the Polyaxon API), in the manner of kopf's ``api.py``:
errors are sorted once, by the caller, into :class:`TemporaryError` (worth another try) or
anything else (raised at once); the delays between tries are data; a server's
``Retry-After`` is honoured; an optional :class:`Deadline` bounds the whole of it.

>>> calls = []
>>> def flaky():
...     calls.append(1)
...     if len(calls) < 3:
...         raise TemporaryError("503 from the server")
...     return "ok"
>>> retry(flaky, what="read claim", backoff=Backoff(delays=(0, 0, 0)))
'ok'
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TypeVar

from checkpoint_storage_bench.errors import BenchError

log = logging.getLogger(__name__)
T = TypeVar("T")

EXIT_DEADLINE = 5


class TemporaryError(Exception):
    """A failure another try may cure (throttling, a 5xx, a dropped connection).

    Not a :class:`BenchError`: it never reaches a user as such. When the tries run out,
    :func:`retry` re-raises it and the caller turns it into its own error.

    Attributes:
        retry_after: Seconds the server asked us to wait (``Retry-After``), if it said.
    """

    def __init__(self, message: str, retry_after: float | None = None) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class DeadlineExceeded(BenchError):
    """The overall deadline passed before the work was done."""

    exit_code = EXIT_DEADLINE


@dataclass(frozen=True)
class Backoff:
    """The delays between tries, as data: ``len(delays) + 1`` tries in all.

    Attributes:
        delays: Seconds to wait before the 2nd, 3rd, … try.
        retry_after_cap: The longest ``Retry-After`` honoured (a server may ask for a lot).
    """

    delays: tuple[float, ...] = (0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 30.0)
    retry_after_cap: float = 120.0

    def __post_init__(self) -> None:
        if any(not math.isfinite(d) or d < 0 for d in self.delays):
            raise ValueError(f"delays must be finite and non-negative: {self.delays}")

    @classmethod
    def exponential(
        cls, initial: float, factor: float = 2.0, cap: float = 30.0, tries: int = 8, **kw: float
    ) -> Backoff:
        """``initial · factor^k`` seconds, capped, for ``tries`` tries in all."""
        if initial < 0 or factor < 1 or cap < initial or tries < 1:
            raise ValueError(f"invalid backoff: {initial=} {factor=} {cap=} {tries=}")
        return cls(tuple(min(cap, initial * factor**k) for k in range(tries - 1)), **kw)

    @property
    def tries(self) -> int:
        return len(self.delays) + 1

    def delay(self, attempt: int, retry_after: float | None = None) -> float:
        """Seconds to wait after failed try number ``attempt`` (0-based).

        A server's ``Retry-After`` wins over our own schedule when it asks for longer.
        """
        ours = self.delays[min(attempt, len(self.delays) - 1)] if self.delays else 0.0
        if retry_after is None or not math.isfinite(retry_after):
            return ours
        return max(ours, min(retry_after, self.retry_after_cap))


@dataclass
class Deadline:
    """One overall deadline shared by every wait and every call of a command.

    Attributes:
        seconds: The budget, from creation (finite and positive).
        clock: A monotonic clock (injectable for tests).
    """

    seconds: float
    clock: Callable[[], float] = time.monotonic
    start: float = field(init=False)

    def __post_init__(self) -> None:
        if not math.isfinite(self.seconds) or self.seconds <= 0:
            raise ValueError(f"the timeout must be a positive number of seconds: {self.seconds}")
        self.start = self.clock()

    def remaining(self) -> float:
        return self.start + self.seconds - self.clock()

    def check(self, what: str) -> float:
        """Return the seconds left, or raise :class:`DeadlineExceeded` naming ``what``."""
        left = self.remaining()
        if left <= 0:
            raise DeadlineExceeded(f"deadline of {self.seconds:g}s passed while {what}")
        return left

    def sleep(self, seconds: float, what: str, sleep: Callable[[float], None] = time.sleep) -> None:
        """Sleep, but never past the deadline (then raise)."""
        left = self.check(what)
        sleep(min(seconds, left))
        self.check(what)


def retry(
    fn: Callable[[], T],
    *,
    what: str,
    backoff: Backoff,
    deadline: Deadline | None = None,
    sleep: Callable[[float], None] = time.sleep,
) -> T:
    """Call ``fn`` until it returns, retrying only :class:`TemporaryError`.

    Args:
        fn: The call; it raises :class:`TemporaryError` for what is worth another try.
        what: What is being done, for log lines and the deadline's message.
        backoff: The delays between tries.
        deadline: Never sleep past it (raises :class:`DeadlineExceeded` instead).
        sleep: Injectable for tests.

    Raises:
        TemporaryError: The last try's error, once every try failed.
        DeadlineExceeded: The deadline passed between tries.
    """
    for attempt in range(backoff.tries):
        if deadline is not None:
            deadline.check(what)
        try:
            return fn()
        except TemporaryError as exc:
            if attempt == backoff.tries - 1:
                raise
            delay = backoff.delay(attempt, exc.retry_after)
            log.warning("%s: %s; try %d failed, next in %.1fs", what, exc, attempt + 1, delay)
            if deadline is not None:
                deadline.sleep(delay, what, sleep)
            else:
                sleep(delay)
    raise AssertionError("unreachable")


def within(fn: Callable[[], T], *, what: str, deadline: Deadline | None) -> T:
    """Call ``fn``, but wait for it only until ``deadline``.

    For a blocking call whose own timeouts cannot be set from here (a kubeconfig ``exec``
    credential plugin, the STS call inside botocore's credential chain, google-auth's
    metadata probe): it runs in a daemon thread, which is left behind when the deadline
    passes; the command ends by its deadline all the same.

    Raises:
        DeadlineExceeded: ``fn`` had not returned by the deadline (naming ``what``).
        Exception: Whatever ``fn`` raised.
    """
    if deadline is None:
        return fn()
    deadline.check(what)
    outcome: list[tuple[bool, object]] = []

    def run() -> None:
        try:
            outcome.append((True, fn()))
        except BaseException as exc:  # noqa: BLE001 - re-raised in the caller's thread
            outcome.append((False, exc))

    thread = threading.Thread(target=run, name=what, daemon=True)
    thread.start()
    thread.join(max(0.0, deadline.remaining()))
    if not outcome:
        raise DeadlineExceeded(f"deadline of {deadline.seconds:g}s passed while {what}")
    ok, value = outcome[0]
    if not ok:
        assert isinstance(value, BaseException)
        raise value
    return value  # type: ignore[return-value]
