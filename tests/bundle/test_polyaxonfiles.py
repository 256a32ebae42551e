"""Every component, operation and pipeline file passes Polyaxon's own checks."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from polyaxon.exceptions import PolyaxonfileError

from tests.bundle.bundle import (
    COMPONENTS,
    PIPELINE,
    POLYAXONFILES,
    PROFILES_PIPELINE,
    ROOT,
    all_polyaxonfiles,
    check,
    component_names,
    current,
    load_dag,
)
from tests.bundle.params import REAL_PARAMS, SMALL_PIPELINE, SMALL_THREE

POLYAXON = [sys.executable, "-m", "polyaxon"]
FILES = all_polyaxonfiles()


def polyaxon_check(*args: str) -> subprocess.CompletedProcess[str]:
    """Run the ``polyaxon check`` CLI, as an author or CI would."""
    return subprocess.run(
        [*POLYAXON, "check", *args], capture_output=True, text=True, cwd=ROOT, timeout=60
    )


# One interpreter runs the real `polyaxon` command (polyaxon.cli:cli) once per file: a
# process per file would spend most of the time importing polyaxon again.
LINT_ALL = """
import json, sys
from click.testing import CliRunner
from polyaxon.cli import cli
results = {}
for path in sys.argv[1:]:
    r = CliRunner().invoke(cli, ["check", "--lint", "-f", path])
    results[path] = {"exit_code": r.exit_code, "output": r.output}
print(json.dumps(results))
"""


def lint(paths: list[Path]) -> dict[str, dict]:
    """``polyaxon check --lint -f FILE`` for each file: exit code and output by path."""
    result = subprocess.run(
        [sys.executable, "-c", LINT_ALL, *map(str, paths)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout.splitlines()[-1])


@pytest.fixture(scope="module")
def lint_results() -> dict[str, dict]:
    return lint(FILES)


def test_the_bundle_has_every_kind_of_file() -> None:
    assert {"checkpoint-training", "storage-profile", "fio-sweep"} <= set(component_names())
    assert PIPELINE in FILES
    assert len(list(POLYAXONFILES.glob("*.yaml"))) >= 3


@pytest.mark.parametrize("path", FILES, ids=lambda p: str(p.relative_to(ROOT)))
def test_polyaxon_check_lint(path: Path, lint_results) -> None:
    result = lint_results[str(path)]
    assert result["exit_code"] == 0, result["output"]
    assert "Polyaxonfile valid" in result["output"]


GENERAL = COMPONENTS / "checkpoint-storage-profiles" / "v1.1.yaml"


@pytest.mark.parametrize(
    ("old", "new", "lint_only", "message"),
    [
        # A schema error: lint catches it.
        ("trigger: all_done", "trigger: whenever", True, "whenever"),
        # A dependency on an op that does not exist: only the full check builds the DAG.
        ("dependencies: [stages]", "dependencies: [stages-typo]", False, "stages-typo"),
    ],
)
def test_polyaxon_check_fails_on_a_broken_pipeline(
    tmp_path: Path, old: str, new: str, lint_only: bool, message: str
) -> None:
    # The checks above must be able to fail: the general pipeline, broken.
    shutil.copytree(COMPONENTS, tmp_path / "components")
    shutil.copytree(POLYAXONFILES, tmp_path / "polyaxonfiles")
    broken = tmp_path / "components" / GENERAL.parent.name / GENERAL.name
    assert old in GENERAL.read_text()
    broken.write_text(GENERAL.read_text().replace(old, new, 1))
    result = polyaxon_check(*(["--lint"] if lint_only else []), "-f", str(broken))
    assert result.returncode != 0
    assert message in result.stdout + result.stderr
    if lint_only:
        assert lint([broken])[str(broken)]["exit_code"] != 0
    with pytest.raises(PolyaxonfileError):
        check(broken)
    # Through the two-profile pipeline that nests it: Polyaxon reads the nested component's
    # schema, but builds a nested DAG's graph only when the server runs it, so `polyaxon
    # check` passes an orphan dependency there. The bundle's tests build every nested DAG.
    wrapper = tmp_path / "polyaxonfiles" / PIPELINE.name
    if lint_only:
        with pytest.raises(PolyaxonfileError):
            check(wrapper)
    else:
        check(wrapper)  # passes: the nested graph is not built here
        (nested,) = load_dag(wrapper).children("comparison")
        with pytest.raises(Exception, match=message):
            nested.order()


def test_polyaxon_check_with_params_cli() -> None:
    result = polyaxon_check(
        "-f", str(POLYAXONFILES / "switch-throughput.yaml"), "-P", "settle=kubernetes"
    )
    assert result.returncode == 0, result.stdout + result.stderr
    bad = polyaxon_check("-f", str(POLYAXONFILES / "switch-throughput.yaml"), "-P", "settle=soon")
    assert bad.returncode != 0
    assert "soon" in bad.stdout + bad.stderr


@pytest.mark.parametrize(
    ("path", "params"),
    [
        (p, params)
        for p in sorted(COMPONENTS.glob("*/*.yaml"))
        # Released history takes the plain params of its time; the current version all.
        for params in REAL_PARAMS[p.parent.name][: 1 if p.name == "v1.0.yaml" else None]
    ]
    + [(p, {}) for p in sorted(POLYAXONFILES.glob("*.yaml"))]
    + [(PIPELINE, SMALL_PIPELINE), (PROFILES_PIPELINE, SMALL_THREE)],
    ids=lambda x: str(x.relative_to(ROOT)) if isinstance(x, Path) else ",".join(x) or "defaults",
)
def test_check_polyaxonfile_with_real_params(path: Path, params: dict) -> None:
    operation = check(path, params)
    passed = {k: p.value for k, p in (operation.params or {}).items()}
    assert passed.items() >= params.items()


@pytest.mark.parametrize(
    ("name", "params", "message"),
    [
        ("checkpoint-training", {}, "non optional inputs"),
        ("checkpoint-training", {"storage_profile": "x", "checkpoint_dir": "/tmp/x"}, "regex"),
        ("checkpoint-training", {"storage_profile": "x", "device": "gpu"}, "gpu"),
        ("checkpoint-training", {"storage_profile": "x", "steps": 0}, "greater than"),
        ("storage-profile", {"target_class": "x", "backend": "docker"}, "docker"),
        ("storage-profile", {"target_class": "x", "on_infeasible": "retry"}, "retry"),
        ("fio-sweep", {"mount": "/data"}, "regex"),
        ("fio-sweep", {"size_scale": 0}, "greater than"),
        ("storage-profile-plan", {}, "non optional inputs"),
        ("storage-profile-release", {}, "non optional inputs"),
        ("storage-profile-renew", {"lease_duration": 0}, "greater than"),
        ("storage-profile-renew", {"backend": "docker"}, "docker"),
        ("checkpoint-stage", {"profile": "x", "repeats": 0}, "greater than"),
        ("checkpoint-storage-profiles", {"repeats": 21}, "less than"),
        ("checkpoint-storage-profiles", {"backend": "docker"}, "docker"),
    ],
)
def test_bad_params_are_refused(name: str, params: dict, message: str) -> None:
    with pytest.raises(PolyaxonfileError) as error:
        check(current(name), params)
    assert re.search(message, str(error.value.__cause__ or error.value))


def test_every_component_input_has_a_type_and_a_description() -> None:
    for path in sorted(COMPONENTS.glob("*/v*.yaml")):
        component = check(path, REAL_PARAMS[path.parent.name][0]).component
        assert re.fullmatch(r"[-a-zA-Z0-9_]+", component.name), path
        assert component.name == path.parent.name, path
        assert component.description, path
        for io in [*component.inputs, *(component.outputs or [])]:
            assert io.type and io.description, f"{path}: {io.name}"
    for path in (PIPELINE,):
        component = check(path).component
        assert component.description, path
        for io in component.inputs:
            assert io.type and io.description, f"{path}: {io.name}"
