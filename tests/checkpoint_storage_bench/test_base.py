"""The shared base: its doctests, the retry loop, and that it imports no part."""

from __future__ import annotations

import ast
import doctest
import importlib
from pathlib import Path

import pytest

from checkpoint_storage_bench import retry as retry_module
from checkpoint_storage_bench.retry import (
    Backoff,
    Deadline,
    DeadlineExceeded,
    TemporaryError,
    retry,
)

BASE = Path(__file__).resolve().parents[2] / "checkpoint_storage_bench"
PARTS = {"trainer", "hooks", "fio_sweep", "checkpoint_compare", "sandbox"}
REPO = BASE.parent


@pytest.mark.parametrize("module", sorted(p.stem for p in BASE.glob("*.py")))
def test_doctests(module: str) -> None:
    result = doctest.testmod(importlib.import_module(f"checkpoint_storage_bench.{module}"))
    assert result.failed == 0


def _imported(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module.split(".")[0])
        elif isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
    return names


@pytest.mark.parametrize("package", sorted(PARTS | {"checkpoint_storage_bench"}))
def test_parts_import_only_the_base(package: str) -> None:
    others = PARTS - {package.split(".")[0]}
    if package == "checkpoint_storage_bench":
        others = PARTS
    for path in (REPO / package).rglob("*.py"):
        crossing = _imported(path) & others
        assert not crossing, f"{path.relative_to(REPO)} imports {sorted(crossing)}"


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


def test_commands_that_print_a_state_take_output_text_or_json() -> None:
    import click
    from click.testing import CliRunner

    from checkpoint_storage_bench.config_cli import output_option

    @click.command()
    @output_option
    def show(as_json: bool) -> None:
        click.echo("json" if as_json else "text")

    run = CliRunner().invoke
    assert [run(show, a).output for a in ([], ["-o", "json"], ["--output", "text"])] == [
        "text\n",
        "json\n",
        "text\n",
    ]
    # --json names a file to write on every CLI: here it is no option at all.
    assert run(show, ["--json"]).exit_code == 2
    assert run(show, ["-o", "yaml"]).exit_code == 2
