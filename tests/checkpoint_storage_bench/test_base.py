"""The shared base as a whole: its doctests pass, and it imports no part (nor a part another)."""

from __future__ import annotations

import ast
import doctest
import importlib
from pathlib import Path

import pytest

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
