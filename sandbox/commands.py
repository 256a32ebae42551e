"""What the sandbox's commands do, step by step: start everything, submit a pipeline,
follow it, print the comparison; and the demo, which chains them.

``sandbox/cli.py`` only parses options and calls these; each step raises a
:class:`sandbox.errors.SandboxError` that click turns into one line and an exit code.
"""

from __future__ import annotations

import importlib.util
import json
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml

from checkpoint_storage_bench.contract import (
    CADENCE_INPUT,
    PLAN_ANSWER_LIMITS_OUTPUT,
    PLAN_ANSWER_NOTES_OUTPUT,
    WORKLOAD_BUDGETS,
)
from sandbox.components import find_components, pipeline_twin, register
from sandbox.config import DEFAULT_OWNER, REPO_ROOT
from sandbox.errors import ConfigError, ServerUnavailableError
from sandbox.local import LocalRuntime
from sandbox.on_node import NodeRuntime, node_state_dir
from sandbox.pipeline import (
    comparison,
    follow,
    get_run,
    runs_table_url,
    submit,
    table_columns,
)
from sandbox.runtime import Echo, Runtime
from sandbox.server import RUNS_STOP_WAIT, Sandbox

# The general pipeline: every profile of the sandbox's profiles file, in its order.
DEFAULT_PIPELINE = REPO_ROOT / "polyaxonfiles" / "checkpoint-storage-profiles.yaml"
DEFAULT_COMPONENTS = REPO_ROOT / "components"
# Small enough for a 2-core laptop to finish the whole pipeline in a few minutes. Only the
# ones the pipeline declares as inputs are passed. size_scale 0.05: fio's seqwrite_1m
# writes 205 MiB, 0.4 s even at the fastest class's 500 MiB/s; at 0.02 (82 MiB, 0.16 s)
# the throttle's first slice, let through at once, put that class's figure 24% above its
# limit (648 vs 524 MB/s). A 32 MiB model makes an 88 MB checkpoint
# (weights and optimizer state): about 0.7 s of writing at the baseline class's 125 MiB/s
# and 0.35 s at 250 MiB/s, well above the noise of a shared CPU; 12 checkpoints give the
# verdict a median to compare, not one sample.
DEMO_PARAMS = {
    "backend": "local",
    "size_scale": "0.05",
    "fio_runtime": "2",
    "model_size": "32MiB",
    "steps": "60",
    "checkpoint_every": "5",
    "device": "cpu",
    # A pause budget, so the verdict recommends a profile: the cheapest whose median pause
    # is below 0.6 s with confidence. At the demo's sizes the baseline class (125 MiB/s,
    # ~0.7 s to write 88 MB) misses it and both faster classes meet it.
    "max_pause_s": "0.6",
    # The cadence that prices each profile's month (GPU time paused + storage).
    "checkpoints_per_month": "2000",
}


# ``demo --workload scan|materialize|workspace``: the same pipeline with a data workload in
# every stage instead of the training. 32 MiB decoded (as many of shards on the claim, the
# records stored uncompressed): a quarter of a second per epoch at the baseline class's
# 125 MiB/s, generated once by the first stage and reused by the others; the pipeline's five
# epochs per run (four samples after the warm-up: the verdict's 95 % interval). 5 ms of
# compute per batch: about 0.18 s an epoch, so the baseline class starves it (measured: 63 %
# AU) and the 500 MiB/s class keeps it fed (93 %); an AU budget of 80 % between the two, so
# that the recommendation is the cheapest class that feeds it.
DATA_DEMO_PARAMS = {
    "dataset_size": "32MiB",
    "num_workers": "2",
    "compute_ms": "5",
    "min_au": "0.8",
}

# Materialize has one figure a run and the workspace a p99 per round, both moved by a busy
# machine as much as by the class: their calibration (docs/compare.md) needed more runs a side
# than one block of repeats counts (each counts one), so their demo runs the profiles several
# times over (A B C A B C ...), as the plan asks before any switch: the passes that showed
# both goals, at the pipeline's (calibrated) 64 MiB dataset and workspace.
DATA_DEMO_SIZES = {"materialize": {"dataset_size": "64MiB"}}
DATA_DEMO_CYCLES = {"materialize": 2, "workspace": 4}


def stop_hint(sb: Sandbox) -> str:
    """The command that stops this sandbox."""
    root = "" if sb.paths.root == REPO_ROOT else f" --root {shlex.quote(str(sb.paths.root))}"
    return f"{shlex.quote(sys.executable)} -m sandbox stop{root}"


def require_server(sb: Sandbox) -> None:
    """Raise ServerUnavailableError unless this sandbox's server answers."""
    if not sb.healthy():
        raise ServerUnavailableError(
            f"no sandbox server answers at {sb.url}; start it with "
            f"{shlex.quote(sys.executable)} -m sandbox start"
        )


def runtime(
    name: str, profiles_file: Path | None = None, node_state: Path | None = None
) -> Runtime:
    """The runtime ``name`` (``local`` or ``node``) with its options: the local one falls
    back to plain media only for the default profiles file; the node one reads the node's
    state from ``node_state`` (default: that of ``python -m localcluster start --node``)."""
    if name == LocalRuntime.name:
        return LocalRuntime(fallback=profiles_file is None)
    if name == NodeRuntime.name:
        return NodeRuntime(node_state or node_state_dir())
    raise ConfigError(f"unknown runtime {name!r}: expected local or node")


def runtimes() -> list[Runtime]:
    """Every runtime, as ``stop`` and ``status`` see them (no options needed)."""
    return [LocalRuntime(), NodeRuntime(node_state_dir())]


def running_runtime(sb: Sandbox) -> Runtime:
    """The runtime whose processes run in this sandbox (the local one when none runs)."""
    every = runtimes()
    return next((rt for rt in every if rt.running(sb)), every[0])


def stop(sb: Sandbox) -> list[str]:
    """Stop the unfinished runs, every runtime's processes (whichever started them), then
    the server. Returns what was stopped."""
    agents = any(rt.running(sb) for rt in runtimes())
    runs = sb.stop_unfinished_runs(wait=RUNS_STOP_WAIT if agents else 0)
    stopped = [f"{len(runs)} unfinished run(s)"] if runs else []
    for rt in runtimes():
        stopped += rt.stop(sb)
    return stopped + sb.stop_server()


def declared_inputs(polyaxonfile: Path) -> set[str]:
    """The inputs a polyaxonfile declares; an operation file (``pathRef``) declares its
    component's.

    Raises:
        ConfigError: The file (or the component it references) cannot be read.
    """
    try:
        spec = yaml.safe_load(polyaxonfile.read_text()) or {}
    except (OSError, yaml.YAMLError) as exc:
        raise ConfigError(f"cannot read pipeline {polyaxonfile}: {exc}") from exc
    if not isinstance(spec, dict):
        raise ConfigError(f"{polyaxonfile} is not a polyaxonfile")
    if spec.get("pathRef") and not spec.get("inputs"):
        return declared_inputs(polyaxonfile.parent / str(spec["pathRef"]))
    return {i.get("name") for i in spec.get("inputs") or [] if isinstance(i, dict)}


def demo_params(
    sb: Sandbox,
    pipeline: Path,
    overrides: dict[str, str],
    workload: str = "checkpoint",
    place: dict[str, str] | None = None,
) -> dict[str, str]:
    """The demo's pipeline inputs: small sizes, the local hook backend, this sandbox's API,
    and every profile of the profiles file, in its order (a pipeline that takes a list);
    with a data ``workload``, that workload and its small sizes. ``place``: what the place
    the pods run in changes (the node's), then the user's ``overrides`` over everything."""
    declared = declared_inputs(pipeline)
    values = dict(DEMO_PARAMS, api_host=sb.url)
    if workload != "checkpoint":
        values.update(DATA_DEMO_PARAMS, **DATA_DEMO_SIZES.get(workload, {}), workload=workload)
        # Only the workload's own budget: another's answers nothing for it.
        foreign = {n for w, names in WORKLOAD_BUDGETS.items() if w != workload for n in names}
        values = {k: v for k, v in values.items() if k not in foreign | {CADENCE_INPUT}}
    profiles = sb.agent.profiles
    if sb.agent.profiles_file:
        values["profiles_file"] = str(sb.agent.profiles_file)
    if profiles:
        values.update(namespace=profiles.namespace, claim=profiles.claim)
        cycles = DATA_DEMO_CYCLES.get(workload, 1)
        values["profiles"] = json.dumps(list(profiles.profiles) * cycles)
    values.update(place or {})
    values = {k: v for k, v in values.items() if k in declared}
    values.update(overrides)
    return values


def submit_pipeline(
    sb: Sandbox,
    polyaxonfile: Path,
    params: dict[str, str],
    project: str,
    hub: bool,
    components_dir: Path = DEFAULT_COMPONENTS,
    echo: Echo = print,
) -> str:
    """Register the components and submit the hubRef twin (with ``hub``, else the pathRef
    twin); returns the run's uuid."""
    if hub:
        for ref in register(find_components(components_dir), DEFAULT_OWNER, sb.url):
            echo(f"sandbox: registered {ref}")
    twin = pipeline_twin(
        polyaxonfile, sb.paths.generated / polyaxonfile.name, DEFAULT_OWNER if hub else None
    )
    echo(f"sandbox: submitting {twin} (generated from {polyaxonfile})")
    uuid = submit(sb.client, sb.url, twin, DEFAULT_OWNER, project, params)
    echo(f"sandbox: pipeline {uuid} submitted; {sb.url}/ui/{DEFAULT_OWNER}/{project}/runs/{uuid}")
    return uuid


def submit_and_follow(
    sb: Sandbox,
    polyaxonfile: Path,
    params: dict[str, str],
    project: str,
    hub: bool,
    timeout: float,
    components_dir: Path = DEFAULT_COMPONENTS,
    echo: Echo = print,
) -> tuple[str, list[Any]]:
    """:func:`submit_pipeline`, then follow it to its end (RunFailedError if it fails)."""
    uuid = submit_pipeline(sb, polyaxonfile, params, project, hub, components_dir, echo)
    return uuid, follow(sb.client, DEFAULT_OWNER, project, uuid, timeout, echo=echo)


# The compare op's inputs that are the verdict's flags (the component's own mapping).
COMPARE_FLAGS = {
    "gpu_hourly": "--gpu-hourly",
    "max_pause_s": "--max-pause-s",
    "max_pause_share": "--max-pause-share",
    "checkpoints_per_month": "--checkpoints-per-month",
    "warmup": "--warmup",
    "practical_floor_s": "--practical-floor-s",
    "min_au": "--min-au",
    "max_p99_ms": "--max-p99-ms",
}


def last_job(ops: list[Any], name: str) -> Any | None:
    """The pipeline's last job named ``name`` (``plan``, ``compare``), if it ran."""
    found = [op for op in ops if op.kind == "job" and op.name == name]
    return found[-1] if found else None


def profile_list(value: Any) -> list[str]:
    """The compare op's ``profiles`` input: a list as the pipeline passed it, or the
    comma-separated string the verdict records in its place once it ran (or JSON)."""
    if isinstance(value, list):
        return [str(v) for v in value]
    if not isinstance(value, str) or not value.strip():
        return []
    if value.lstrip().startswith("["):
        try:
            return [str(v) for v in json.loads(value)]
        except ValueError:
            pass
    return [v.strip() for v in value.split(",") if v.strip()]


def verdict_args(compare: Any) -> list[str] | None:
    """The verdict's arguments as the pipeline's compare op had them: the runs its joins
    gathered (``runs``), the profiles (the first the baseline, each one expected) and the
    budget; None when the op has no joined runs (it never got that far)."""
    inputs = compare.inputs or {}
    runs = inputs.get("runs") or []
    if not runs:
        return None
    args = [f"--run={uuid}" for uuid in runs]
    profiles = list(dict.fromkeys(profile_list(inputs.get("profiles"))))
    if profiles:
        args.append(f"--baseline={profiles[0]}")
        args += [f"--expect={p}" for p in profiles]
    for name, flag in COMPARE_FLAGS.items():
        if inputs.get(name) is not None:
            args.append(f"{flag}={inputs[name]}")
    if inputs.get("allow_resumed"):
        args.append("--allow-resumed")
    return args


def recommendation_lines(compare: Any | None) -> list[str]:
    """The pipeline's own verdict and recommendation: the compare op's outputs."""
    out = (compare.outputs if compare is not None else None) or {}
    if not out.get("verdict") and "recommended_profile" not in out:
        return ["the pipeline's compare op left no verdict"]
    return [
        "the pipeline's verdict (its compare op's outputs):",
        f"  verdict:             {out.get('verdict') or '-'}",
        # The verdict records the string "none" when no profile meets the budget.
        f"  recommended profile: {out.get('recommended_profile') or 'none'}",
        f"  why:                 {out.get('recommendation_reason') or '-'}",
    ]


def plan_lines(plan: Any | None) -> list[str]:
    """What the pipeline's plan op said its settings answer, before any switch: its limits
    and notes (outputs), each joined by ``; ``; nothing when it said neither."""
    out = (plan.outputs if plan is not None else None) or {}
    keys = {"limits": PLAN_ANSWER_LIMITS_OUTPUT, "notes": PLAN_ANSWER_NOTES_OUTPUT}
    said = [f"  {word}: {out[key]}" for word, key in keys.items() if out.get(key)]
    return ["what the pipeline's plan said before any switch:", *said] if said else []


def print_comparison(
    sb: Sandbox, project: str, pipeline: str, ops: list[Any], echo: Echo = print
) -> None:
    """The verdict module's report on the runs the pipeline's compare op gathered, else
    our own profile-by-profile table; then the compare op's verdict and recommendation.

    ``ops`` are every run below the pipeline (nested stages included), oldest first.
    """
    # The list of runs may leave out outputs and inputs: read the ones used in full.
    compare, plan = (
        op if op is None else get_run(sb.client, DEFAULT_OWNER, project, op.uuid)
        for op in (last_job(ops, "compare"), last_job(ops, "plan"))
    )
    args = verdict_args(compare) if compare is not None else None
    reported = False
    if args and importlib.util.find_spec("checkpoint_compare") is not None:
        # --no-track: the pipeline's own compare op already logged the verdict to its run.
        done = subprocess.run(
            [sys.executable, "-m", "checkpoint_compare", "--api-host", sb.url, "--no-track"]
            + ["--project", f"{DEFAULT_OWNER}/{project}", *args],
            cwd=REPO_ROOT,
            check=False,
        )
        reported = done.returncode == 0
        if not reported:
            echo("sandbox: checkpoint_compare failed; the raw outputs instead:")
    if not reported:
        full = [
            get_run(sb.client, DEFAULT_OWNER, project, op.uuid) if op.kind == "job" else op
            for op in ops
        ]
        echo(comparison(full))
    echo("")
    for line in [*recommendation_lines(compare), *plan_lines(plan)]:
        echo(line)


def run_demo(
    rt: Runtime,
    sb: Sandbox,
    project: str,
    polyaxonfile: Path,
    overrides: dict[str, str],
    timeout: float,
    echo: Echo = print,
    workload: str = "checkpoint",
) -> str:
    """Start everything in runtime ``rt``, submit the pipeline there (:meth:`Runtime.place`
    says where its pods run), follow it, print the comparison, and always the runs-table
    URL and the stop command. ``workload``: see :func:`demo_params`. Returns the pipeline's
    uuid.

    Raises:
        SandboxError: Whatever step failed (the runs table is printed first).
    """
    sb = rt.start(sb, DEFAULT_OWNER, project, echo=echo)
    values = demo_params(sb, polyaxonfile, overrides, workload, place=rt.place(sb, echo))
    uuid = submit_pipeline(sb, polyaxonfile, values, project, rt.hub, echo=echo)
    try:
        ops = follow(sb.client, DEFAULT_OWNER, project, uuid, timeout, echo=echo)
        echo("")
        print_comparison(sb, project, uuid, ops, echo=echo)
    finally:
        echo("")
        url = runs_table_url(sb.url, DEFAULT_OWNER, project, uuid, table_columns(workload))
        echo(f"runs table: {url}")
        echo(f"the server keeps running; stop it with: {stop_hint(sb)}")
    return uuid
