"""Every command line a component or pipeline op runs is accepted by the real CLI it calls.

The command lines come from compiling the components and the pipeline's ops with Polyaxon's
converter (the same argv the pod would run). Each is then given to the CLI's own entry point
(``python -m MODULE``, run with ``runpy`` as ``-m`` does) twice:

* with ``--help`` appended: click parses every option before it prints the help, so an
  unknown flag or a missing value fails (exit 2), and every flag must be listed in the help;
* as a dry parse: ``click.Command.invoke`` is replaced, so click parses and converts every
  value (choices, numbers, existing files) and the command stops before doing anything.

One process per CLI checks all of that CLI's command lines: a process per command line would
spend most of its time importing torch again.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest

from tests.bundle.bundle import (
    PIPELINE,
    PROFILES_PIPELINE,
    ROOT,
    compile_component,
    current_versions,
    is_dag,
    joined,
    load_dag,
    pipeline_jobs,
)
from tests.bundle.params import REAL_PARAMS, SMALL_PIPELINE, SMALL_THREE

# argv: MODULE, then a JSON list of argument lists. Prints a JSON list of results.
# Leaf commands stop once their arguments are parsed and converted. A group runs its own
# callback through Command.invoke before it parses its subcommand, so groups go on.
CHECK_CLI = """
import contextlib, io, json, runpy, sys, click

invoke = click.Command.invoke

def parsed(self, ctx):
    if isinstance(self, click.Group):
        return invoke(self, ctx)
    print("ARGUMENTS-PARSED", ctx.command_path)
    raise SystemExit(0)

def run(module, args, dry):
    out, err = io.StringIO(), io.StringIO()
    click.Command.invoke = parsed if dry else invoke
    sys.argv = [module, *args]
    code = 0
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            runpy.run_module(module, run_name="__main__", alter_sys=True)
        except SystemExit as exit:
            code = exit.code if isinstance(exit.code, int) else (0 if exit.code is None else 1)
    return {"code": code, "stdout": out.getvalue(), "stderr": err.getvalue()}

module, lines = sys.argv[1], json.loads(sys.argv[2])
results = [
    {"help": run(module, [*args, "--help"], dry=False), "dry": run(module, args, dry=True)}
    for args in lines
]
print(json.dumps(results))
"""


def command_lines() -> dict[str, list[str]]:
    """Every argv the bundle can run, by where it comes from."""
    lines: dict[str, list[str]] = {}
    for path in current_versions():
        if is_dag(path):
            continue  # its jobs come through the pipelines below
        for i, params in enumerate(REAL_PARAMS[path.parent.name]):
            job = compile_component(path, params)
            if "pytorchJobSpec" in job.manifest:
                for replica, pod in job.replicas().items():
                    lines[f"{path.parent.name}/{path.stem}[{i}]/{replica}"] = pod.argv
            else:
                lines[f"{path.parent.name}/{path.stem}[{i}]"] = job.argv
    pipelines = {
        "pipeline": (PIPELINE, {}),
        "pipeline-small": (PIPELINE, SMALL_PIPELINE),
        "profiles-small": (PROFILES_PIPELINE, SMALL_THREE),
    }
    for name, (path, params) in pipelines.items():
        dag = load_dag(path, params)
        jobs = pipeline_jobs(path, params)
        for job, pod in jobs.items():
            lines[f"{name}:{job}"] = pod.argv
        # compare as the server runs it: with the runs its join found (every job below).
        (general, compare) = _compare_of(dag, jobs)
        runs = joined(jobs, {"switch", "fio", "train"})
        lines[f"{name}:{compare}+joins"] = general.compile_op("compare", extra={"runs": runs}).argv
    return lines


def _compare_of(dag, jobs) -> tuple:
    """The DAG that holds the compare op (the general pipeline, maybe nested) and its path."""
    (path,) = [job for job in jobs if job.endswith("/compare")]
    return (dag if path == "pipeline/compare" else dag.children("comparison")[0]), path


# What the Kubeflow operator sets in a PyTorchJob pod; the kubelet expands $(VAR) with it.
OPERATOR_ENV = {"MASTER_ADDR": "train-master-0", "MASTER_PORT": "23456", "RANK": "1"}


def module_and_args(argv: list[str]) -> tuple[str, list[str]]:
    """The module a command line runs and its arguments: ``python -m M ...``, or torchrun's
    ``-m M ...`` read with torchrun's own parser (which must accept its options)."""
    if argv[0] == "torchrun":
        from torch.distributed.run import get_args_parser

        expanded = [re.sub(r"\$\((\w+)\)", lambda m: OPERATOR_ENV[m[1]], a) for a in argv]
        options = get_args_parser().parse_args(expanded[1:])
        assert options.module, f"torchrun without -m: {argv}"
        return options.training_script, list(options.training_script_args)
    assert argv[:2] == ["python", "-m"], f"not a `python -m` command line: {argv}"
    return argv[2], argv[3:]


def flags(args: list[str]) -> list[str]:
    """The option names in an argument list (``--name=value`` counts as ``--name``)."""
    return [arg.split("=", 1)[0] for arg in args if arg.startswith("--")]


def check_cli(module: str, lines: list[list[str]]) -> list[dict]:
    """``--help`` and the dry parse of each argument list, through ``python -m module``."""
    result = subprocess.run(
        [sys.executable, "-c", CHECK_CLI, module, json.dumps(lines)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,
    )
    if result.returncode != 0:  # e.g. the CLI is not in the tree: every line fails with this
        failed = {"code": None, "stdout": "", "stderr": f"python -m {module}: {result.stderr}"}
        return [{"help": failed, "dry": failed} for _ in lines]
    return json.loads(result.stdout.splitlines()[-1])


LINES = command_lines()


@pytest.fixture(scope="module")
def results() -> dict[tuple[str, ...], dict]:
    """The checks of every distinct command line, by argv."""
    by_module: dict[str, set[tuple[str, ...]]] = {}
    for argv in LINES.values():
        by_module.setdefault(module_and_args(argv)[0], set()).add(tuple(argv))
    results = {}
    for module, argvs in by_module.items():
        ordered = sorted(argvs)
        checked = check_cli(module, [module_and_args(list(argv))[1] for argv in ordered])
        results.update(zip(ordered, checked, strict=True))
    return results


def test_the_command_lines_cover_every_cli() -> None:
    modules = {module_and_args(argv)[0] for argv in LINES.values()}
    assert modules == {
        "trainer",
        "hooks.storage_profile",
        "fio_sweep",
        "checkpoint_compare",
        "data_workloads",
    }


@pytest.mark.parametrize("source", list(LINES))
def test_the_cli_accepts_the_command_line(source: str, results) -> None:
    argv = LINES[source]
    help_run, dry_run = results[tuple(argv)]["help"], results[tuple(argv)]["dry"]
    module, args = module_and_args(argv)
    assert help_run["code"] == 0, f"{argv}\n{help_run['stdout']}{help_run['stderr']}"
    listed = set(re.findall(r"--[a-z0-9][a-z0-9-]*", help_run["stdout"]))
    missing = [flag for flag in flags(args) if flag not in listed]
    assert not missing, f"{missing} not in the help of {module}:\n{help_run['stdout']}"
    assert dry_run["code"] == 0, f"{argv}\n{dry_run['stdout']}{dry_run['stderr']}"
    # The command that parsed them is the one the argv names (e.g. the hook's `switch`).
    command = " ".join([module.split(".")[-1], *args[: args.index(flags(args)[0])]])
    assert re.search(rf"^ARGUMENTS-PARSED .*{re.escape(command)}$", dry_run["stdout"], re.M), (
        dry_run["stdout"]
    )


def test_a_wrong_flag_or_value_is_refused() -> None:
    # The checks above must be able to fail: the trainer's pipeline command, slightly wrong.
    module, args = module_and_args(LINES["pipeline:pipeline/comparison[0]/stages[0]/train[0]"])
    wrong_flag = [a.replace("--checkpoint-every", "--checkpoint-each") for a in args]
    # A value only the dry parse converts: --help stops before values are checked.
    wrong_value = [*args, "--device", "gpu"]
    flag_result, value_result = check_cli(module, [wrong_flag, wrong_value])
    assert flag_result["help"]["code"] == 2 and flag_result["dry"]["code"] == 2
    assert "--checkpoint-each" in flag_result["dry"]["stderr"]
    assert value_result["help"]["code"] == 0
    assert value_result["dry"]["code"] == 2 and "gpu" in value_result["dry"]["stderr"]
