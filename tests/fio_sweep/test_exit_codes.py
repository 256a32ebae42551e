"""One table of exit codes (fio_sweep.errors.EXIT_CODES): the errors carry them, click maps
them to the exit, and --help, docs/fio-sweep.md and docs/contracts.md list exactly it."""

from __future__ import annotations

import ast
import inspect
import re
import signal
from pathlib import Path

from checkpoint_storage_bench.errors import BenchError, exit_codes_help
from fio_sweep import cli, errors
from fio_sweep.errors import EXIT_CODES, FioSweepError, Interrupted

from .helpers import run_cli

REPO = Path(__file__).resolve().parents[2]


def error_classes() -> list[type[FioSweepError]]:
    return [
        c
        for _, c in inspect.getmembers(errors, inspect.isclass)
        if issubclass(c, FioSweepError) and c.__module__ == errors.__name__
    ]


def test_every_error_is_a_bench_error_with_a_listed_code() -> None:
    classes = error_classes()
    assert len(classes) >= 6
    for cls in classes:
        assert issubclass(cls, BenchError) and cls.prog == "fio-sweep"
        assert cls.exit_code in EXIT_CODES, cls
        assert not hasattr(cls, "temporary"), cls  # nothing reads it
    produced = {c.exit_code for c in classes} | {0, 2}  # 0: success; 2: click usage errors too
    assert produced == {c for c in EXIT_CODES if isinstance(c, int)}
    assert Interrupted(signal.SIGTERM).exit_code == 143 and "128+N" in EXIT_CODES


def test_the_cli_maps_no_error_by_hand() -> None:
    tree = ast.parse(Path(cli.__file__).read_text())
    assert not [n for n in ast.walk(tree) if isinstance(n, ast.Try)]
    assert "sys.exit" not in Path(cli.__file__).read_text()


def test_help_lists_the_table() -> None:
    result = run_cli("--help")
    assert result.exit_code == 0
    assert exit_codes_help(EXIT_CODES).replace("\b\n", "") in result.output.replace("\n  ", "\n")


def _ordered() -> list[tuple[str, str]]:
    ints = sorted((c, t) for c, t in EXIT_CODES.items() if isinstance(c, int))
    rest = [(c, t) for c, t in EXIT_CODES.items() if not isinstance(c, int)]
    return [(str(c), t) for c, t in ints + rest]


def test_the_fio_sweep_page_lists_the_table() -> None:
    page = (REPO / "docs" / "fio-sweep.md").read_text()
    table = page.split("| code | meaning |\n|---|---|\n", 1)[1].split("\n\n", 1)[0]
    rows = re.findall(r"^\| `([^`]+)` \| (.+) \|$", table, re.MULTILINE)
    assert rows == _ordered()


def test_the_contract_lists_the_table() -> None:
    contracts = (REPO / "docs" / "contracts.md").read_text()
    (bullet,) = re.findall(r"^- fio sweep: (.+?)\.$", contracts, re.MULTILINE | re.DOTALL)
    listed = re.findall(r"`([^`]+)` (.+?)(?=, `|$)", " ".join(bullet.split()))
    assert listed == [(c, t) for c, t in _ordered() if c not in ("0", "1", "2")]
    common = re.search(r"^Every CLI: (.+)$", contracts, re.MULTILINE)
    assert common and all(f"`{c}`" in common[1] for c in ("0", "1", "2"))
