"""A line at most every 30 s while the hook waits, at the default log level.

An EBS ``optimizing`` phase can last hours; a log that stays silent that long looks hung.
The line says what Kubernetes reports, what the provider reports (state and progress),
how long the switch has run and how much of ``--timeout`` is left.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

from checkpoint_storage_bench.retry import Deadline
from hooks.storage_profile.config import HEARTBEAT_INTERVAL


def duration(seconds: float) -> str:
    """``3725`` -> ``"1h02m05s"``; ``65`` -> ``"1m05s"``; ``4.2`` -> ``"4s"``.

    >>> duration(3725), duration(65), duration(4.2)
    ('1h02m05s', '1m05s', '4s')
    """
    total = max(0, int(seconds))
    hours, rest = divmod(total, 3600)
    minutes, secs = divmod(rest, 60)
    if hours:
        return f"{hours}h{minutes:02d}m{secs:02d}s"
    if minutes:
        return f"{minutes}m{secs:02d}s"
    return f"{secs}s"


@dataclass
class Heartbeat:
    """What the switch is waiting for, printed at most every ``interval`` seconds.

    Attributes:
        echo: Where the line goes (the progress stream, stderr).
        interval: Seconds between two lines at most often.
        kubernetes: The claim's state as last seen.
        provider: The provider's state as last seen (``what`` of its last sleep).
        short_watches: Watches of the claim that ended at once without an event (each one
            backed off before the next).
        clock: Monotonic clock (injectable).
    """

    echo: Callable[[str], None]
    interval: float = HEARTBEAT_INTERVAL
    kubernetes: str = "not read yet"
    provider: str = "not asked yet"
    clock: Callable[[], float] = time.monotonic
    deadline: Deadline | None = None
    phase: str = "kubernetes"
    short_watches: int = 0
    _last: float = field(default=0.0, init=False)

    def __post_init__(self) -> None:
        self._last = self.clock()

    def seconds_to_next(self) -> float:
        return max(0.0, self._last + self.interval - self.clock())

    def beat(self) -> None:
        """Print the line if ``interval`` passed since the last one."""
        now = self.clock()
        if now - self._last < self.interval:
            return
        self._last = now
        timing = ""
        if self.deadline is not None:
            elapsed = now - self.deadline.start
            timing = f"; elapsed {duration(elapsed)}, {duration(self.deadline.remaining())} left"
        watches = ""
        if self.short_watches:
            watches = f"; {self.short_watches} watches ended at once without an event, backing off"
        self.echo(
            f"waiting: kubernetes: {self.kubernetes}; provider: {self.provider}{watches}{timing}"
        )


@dataclass
class BeatingDeadline(Deadline):
    """The switch's deadline; its sleeps (every wait sleeps through it) keep the heartbeat.

    While the provider is waited for, the ``what`` of each sleep is the provider's state
    ("EC2: optimizing, 60%"), so any provider that sleeps through the deadline shows up.
    """

    heartbeat: Heartbeat | None = None

    def sleep(self, seconds: float, what: str, sleep: Callable[[float], None] = time.sleep) -> None:
        if self.heartbeat is None:
            super().sleep(seconds, what, sleep)
            return
        if self.heartbeat.phase == "provider":
            self.heartbeat.provider = what
        end = self.clock() + seconds
        while True:
            left = end - self.clock()
            if left <= 0:
                break
            super().sleep(min(left, max(0.01, self.heartbeat.seconds_to_next())), what, sleep)
            self.heartbeat.beat()
