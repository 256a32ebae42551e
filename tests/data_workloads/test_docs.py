"""The pages people read state the pipeline's data-workload defaults as the bundle has them."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[2]


def _input_default(path: Path, name: str) -> object:
    doc = yaml.safe_load(path.read_text())
    (value,) = [i.get("value") for i in doc["inputs"] if i["name"] == name]
    return value


def test_the_docs_state_the_pipelines_epochs_default() -> None:
    pipelines = [
        REPO / "polyaxonfiles" / "checkpoint-storage-pipeline.yaml",
        REPO / "components" / "checkpoint-storage-profiles" / "latest.yaml",
        REPO / "components" / "checkpoint-stage" / "latest.yaml",
    ]
    (default,) = {_input_default(p, "epochs") for p in pipelines}
    contracts = " ".join((REPO / "docs" / "contracts.md").read_text().split())
    stated = re.findall(r"`epochs` \(default (\d+)\)", contracts)
    page = " ".join((REPO / "docs" / "data-workloads.md").read_text().split())
    stated += re.findall(r"`epochs` \(default (\d+)\)", page)
    assert len(stated) == 2 and set(stated) == {str(default)}, stated


def test_the_loader_table_names_every_loader_with_the_formats_it_reads() -> None:
    from checkpoint_storage_bench.contract import LOADER_FORMATS

    page = (REPO / "docs" / "data-workloads.md").read_text()
    rows = re.findall(r"^\| `(\w+)`(?: \(default\))? \| ([^|]+) \|", page, re.MULTILINE)
    table = {name: cell.strip() for name, cell in rows if name in LOADER_FORMATS}
    assert set(table) == set(LOADER_FORMATS)
    assert table.pop("ours") == "every format"
    for name, cell in table.items():
        assert re.findall(r"`(\w+)`", cell) == list(LOADER_FORMATS[name]), name
