"""checkpoint_storage_bench.retry: the one retry loop, bounded by Retry-After and a deadline."""

from __future__ import annotations

import pytest

from checkpoint_storage_bench import retry as retry_module
from checkpoint_storage_bench.retry import (
    Backoff,
    Deadline,
    DeadlineExceeded,
    TemporaryError,
    retry,
)


def test_retry_honours_retry_after_and_gives_up() -> None:
    slept: list[float] = []
    calls = []

    def always() -> None:
        calls.append(1)
        raise TemporaryError("429", retry_after=7)

    with pytest.raises(TemporaryError):
        retry(always, what="x", backoff=Backoff(delays=(1, 2)), sleep=slept.append)
    assert len(calls) == 3 and slept == [7, 7]
    assert Backoff(delays=(1,), retry_after_cap=5).delay(0, 600) == 5


def test_retry_does_not_retry_other_errors() -> None:
    def broken() -> None:
        raise KeyError("permanent")

    with pytest.raises(KeyError):
        retry(broken, what="x", backoff=Backoff(delays=(0, 0)), sleep=lambda s: None)


def test_deadline_bounds_the_retries() -> None:
    now = [0.0]
    deadline = Deadline(5, clock=lambda: now[0])

    def advance(seconds: float) -> None:
        now[0] += seconds

    def always() -> None:
        raise TemporaryError("503")

    with pytest.raises(DeadlineExceeded) as info:
        retry(always, what="read claim", backoff=Backoff(delays=(3, 3, 3)), deadline=deadline,
              sleep=advance)  # fmt: skip
    assert info.value.exit_code == retry_module.EXIT_DEADLINE
    assert now[0] == 5


@pytest.mark.parametrize("seconds", [0, -1, float("nan"), float("inf")])
def test_deadline_refuses_non_finite_or_non_positive(seconds: float) -> None:
    with pytest.raises(ValueError):
        Deadline(seconds)
