"""The data-workload component's inputs are the CLI's settings: same defaults, same choices,
and each subcommand gets only its own options (click refuses the others)."""

from __future__ import annotations

import subprocess
import sys
import typing
from dataclasses import MISSING, fields

import pytest

from checkpoint_storage_bench.contract import DATA_WORKLOADS
from data_workloads.config import MaterializeConfig, ScanConfig, WorkspaceConfig
from tests.bundle.bundle import check, compile_component, current

CONFIGS = {"scan": ScanConfig, "materialize": MaterializeConfig, "workspace": WorkspaceConfig}
# Given by the component itself (the summary's path; the profile through STORAGE_PROFILE).
NOT_INPUTS = {"summary_json", "storage_profile"}
# Loader tuning and the cache switch stay on the command line: a pipeline's measurement always
# drops the cache, and keeps the loader as the CLI's defaults set it.
CLI_ONLY = {"drop_cache", "prefetch_factor", "shuffle_buffer"}


def inputs() -> dict[str, object]:
    component = check(current("data-workload"), {"storage_profile": "x"}).component
    return {io.name: io for io in component.inputs}


def test_every_setting_is_an_input_with_the_configs_default_and_choices() -> None:
    ios = inputs()
    assert ios["workload"].value == "scan"
    # Not validated by the component (the stage hands it `checkpoint` when it skips the op);
    # the subcommand is the check: anything but a data workload is refused.
    assert ios["workload"].validation is None
    assert run_data_workloads("checkpoint").returncode == 2
    for cls in CONFIGS.values():
        hints = typing.get_type_hints(cls)
        for f in fields(cls):
            if f.name in CLI_ONLY:
                assert f.name not in ios, f.name
            if f.name in NOT_INPUTS | CLI_ONLY:
                continue
            io = ios[f.name]
            if f.default is not MISSING and f.name != "data_dir":
                assert io.value == f.default, (cls.__name__, f.name, io.value, f.default)
            if typing.get_origin(hints[f.name]) is typing.Literal:
                assert io.validation.options == list(typing.get_args(hints[f.name])), f.name


@pytest.mark.parametrize("workload", DATA_WORKLOADS)
def test_each_subcommand_gets_only_its_own_options(workload: str) -> None:
    argv = compile_component(
        current("data-workload"), {"storage_profile": "x", "workload": workload}
    ).argv
    assert argv[3] == workload
    given = {a.split("=")[0][2:].replace("-", "_") for a in argv[4:] if a.startswith("--")}
    given -= {"no_track", "no_generate"}
    own = {f.name for f in fields(CONFIGS[workload])}
    assert given <= own, given - own
    assert given >= own - NOT_INPUTS - CLI_ONLY - {"track"}


def run_data_workloads(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "data_workloads", *args], capture_output=True, text=True, timeout=120
    )
