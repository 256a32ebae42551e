"""Configuration of a switch: options, the overall deadline and backoff as data."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

from hooks.storage_profile.errors import DeadlineExceeded

SETTLE_MODES = ("kubernetes", "provider")
INFEASIBLE_ACTIONS = ("fail", "rollback")
BACKENDS = ("kubernetes", "local")


@dataclass(frozen=True)
class Backoff:
    """Capped exponential backoff.

    Attributes:
        initial: First delay in seconds.
        factor: Growth per attempt.
        cap: Largest delay we choose ourselves.
        retry_after_cap: Largest ``Retry-After`` we honour (a server may ask for a lot).
        max_attempts: Attempts per single API call before giving up on it.
    """

    initial: float = 0.5
    factor: float = 2.0
    cap: float = 30.0
    retry_after_cap: float = 120.0
    max_attempts: int = 8

    def __post_init__(self) -> None:
        if self.initial < 0 or self.factor < 1 or self.cap < self.initial:
            raise ValueError(f"invalid backoff {self}")
        if self.max_attempts < 1:
            raise ValueError("max_attempts must be at least 1")

    def delay(self, attempt: int, retry_after: float | None = None) -> float:
        """Seconds to wait before retry number ``attempt`` (0-based).

        A server's ``Retry-After`` wins over our own schedule when it asks for longer.
        """
        ours = min(self.cap, self.initial * self.factor**attempt)
        if retry_after is None:
            return ours
        return max(ours, min(retry_after, self.retry_after_cap))


@dataclass
class Deadline:
    """One overall deadline shared by every wait of a switch.

    Attributes:
        seconds: The budget, from creation.
        clock: A monotonic clock (injectable for tests).
    """

    seconds: float
    clock: Callable[[], float] = time.monotonic
    start: float = field(init=False)

    def __post_init__(self) -> None:
        if self.seconds <= 0:
            raise ValueError("the timeout must be positive")
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


@dataclass
class SwitchConfig:
    """Everything ``switch`` was asked to do, validated once.

    Attributes:
        namespace: The claim's namespace.
        claim: The claim's name.
        target: The VolumeAttributesClass (or sandbox profile) to switch to.
        timeout: Overall deadline in seconds.
        pending_grace: How long a ``Pending`` modify status may last.
        settle: ``kubernetes`` or ``provider`` (also wait for the cloud provider).
        on_infeasible: ``fail`` or ``rollback``.
        dry_run: Preflight and print the patch only.
        force: Switch even when the provider's rate limit would be exceeded.
        backoff: Retry schedule for throttled or failing API calls.
        watch_timeout: Longest single watch request, in seconds (re-listed afterwards).
    """

    namespace: str
    claim: str
    target: str
    timeout: float = 1800.0
    pending_grace: float = 120.0
    settle: str = "provider"
    on_infeasible: str = "fail"
    dry_run: bool = False
    force: bool = False
    backoff: Backoff = field(default_factory=Backoff)
    watch_timeout: float = 300.0

    def __post_init__(self) -> None:
        for name in ("namespace", "claim", "target"):
            if not getattr(self, name):
                raise ValueError(f"{name} must not be empty")
        if self.timeout <= 0:
            raise ValueError("--timeout must be positive")
        if self.pending_grace < 0:
            raise ValueError("--pending-grace must not be negative")
        if self.settle not in SETTLE_MODES:
            raise ValueError(f"--settle must be one of {', '.join(SETTLE_MODES)}")
        if self.on_infeasible not in INFEASIBLE_ACTIONS:
            raise ValueError(f"--on-infeasible must be one of {', '.join(INFEASIBLE_ACTIONS)}")
        if self.watch_timeout <= 0:
            raise ValueError("watch_timeout must be positive")
