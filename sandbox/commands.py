"""What the sandbox's commands do, step by step: start everything, submit a pipeline,
follow it, print the comparison; and the demo, which chains them.

``sandbox/cli.py`` only parses options and calls these; each step raises a
:class:`sandbox.errors.SandboxError` that click turns into one line and an exit code.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import shlex
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from localcluster.emulation.io_limits import BlockDevice, ThrottleUnavailable, probe
from localcluster.emulation.sandbox_profiles import SandboxProfiles
from sandbox import claim
from sandbox.components import ensure_project, find_components, pipeline_twin, register
from sandbox.config import (
    DEFAULT_OWNER,
    MEDIA_PROFILES_FILE,
    REPO_ROOT,
    load_agent_settings,
    prepare_media,
)
from sandbox.errors import ConfigError, ServerUnavailableError
from sandbox.pipeline import comparison, follow, get_run, runs_table_url, submit
from sandbox.server import Sandbox

Echo = Callable[[str], None]

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


def emulation_or_media(
    sb: Sandbox, echo: Echo = print, made: list[claim.ClaimVolume] | None = None
) -> Sandbox:
    """The sandbox as it is when the kernel can emulate its profiles' classes (or none
    needs emulating); else the same sandbox on the plain media profiles, said in one line.

    For the default profiles file only: a profiles file the user named is used as it is
    (and refused, exit 3, where its emulation is impossible). The claim's volumes are made
    on the way (appended to ``made``); a fallback removes them again.
    """
    profiles = sb.agent.profiles
    if profiles is None or not profiles.emulated:
        return sb
    volumes: list[claim.ClaimVolume] = []
    try:
        devices = emulation_devices(profiles, echo, volumes)
    except ThrottleUnavailable as exc:
        claim.remove_created(profiles, volumes)
        echo(f"sandbox: cannot emulate the volume classes on this machine: {exc}")
        echo(
            f"sandbox: NOT AN EMULATION: falling back to {MEDIA_PROFILES_FILE.name}, two "
            "plain media (the local disk and memory); the comparison shows the machinery, "
            "not what the classes would do"
        )
        media = load_agent_settings(sb.paths.root, sb.agent.agent_file, MEDIA_PROFILES_FILE)
        return dataclasses.replace(sb, agent=media)
    if made is not None:
        made.extend(volumes)
    for profile in profiles.profiles.values():
        what = (
            f"emulates {profile.volume_attributes_class} ({profile.limits.describe()}) "
            f"on {devices[profile.path].name} ({devices[profile.path].id})"
            if profile.limits
            else f"{profile.path} as it is (no emulation)"
        )
        echo(f"sandbox: profile {profile.name} {what}")
    return sb


def emulation_devices(
    profiles: SandboxProfiles, echo: Echo = print, made: list[claim.ClaimVolume] | None = None
) -> dict[Path, BlockDevice]:
    """Make the claim's volumes (saying which device backs the claim and how fast it writes
    unthrottled; appended to ``made``) and check the kernel can throttle them: each emulated
    profile's directory → its device.

    Raises:
        ThrottleUnavailable: No volume, a volume too slow, or no throttle here.
    """
    for volume in claim.prepare_volumes(profiles):
        echo(f"sandbox: {volume.describe()}")
        if made is not None:
            made.append(volume)
    return {
        p.path: probe(p.path, profiles.cgroup_name)[1]
        for p in profiles.profiles.values()
        if p.limits is not None
    }


def start_all(
    sb: Sandbox, owner: str, project: str, echo: Echo = print, fallback: bool = False
) -> Sandbox:
    """Media, server, project and agent; each step is skipped when already done.

    With ``fallback`` (the default profiles file), profiles that emulate volume classes
    fall back to plain media where the kernel cannot throttle (see
    :func:`emulation_or_media`). Returns the sandbox as started.

    Raises:
        ConfigError: The profiles emulate classes the kernel cannot throttle here (before
            anything is started).
    """
    created: list[claim.ClaimVolume] = []
    if fallback:
        sb = emulation_or_media(sb, echo, created)
    elif sb.agent.profiles is not None and sb.agent.profiles.emulated:
        try:
            emulation_devices(sb.agent.profiles, echo, created)
        except ThrottleUnavailable as exc:
            claim.remove_created(sb.agent.profiles, created)
            raise ConfigError(claim.cannot_emulate(sb.agent.profiles, str(exc))) from exc
    try:
        return _start(sb, owner, project, echo)
    except BaseException:
        if sb.agent.profiles is not None:
            claim.remove_created(sb.agent.profiles, created)
        raise


def _start(sb: Sandbox, owner: str, project: str, echo: Echo) -> Sandbox:
    claim.claim_cgroup(sb.agent.profiles)  # refuse an impossible emulation before starting
    if sb.agent.profiles:
        prepare_media(sb.agent.profiles)
    sb.paths.state.mkdir(parents=True, exist_ok=True)
    echo(f"sandbox: server on {sb.url} (log {sb.paths.server_log})")
    sb.start_server()
    ensure_project(owner, project, sb.client)
    limits, killed = sb.start_agent()
    if killed:
        echo(
            f"sandbox: ended {len(killed)} process(es) an earlier agent left in the claim's cgroup"
        )
    if limits:
        echo(f"sandbox: {claim.summary(limits)}")
    echo(f"sandbox: agent running (log {sb.paths.agent_log})")
    return sb


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
        values.update(DATA_DEMO_PARAMS, workload=workload)
    profiles = sb.agent.profiles
    if sb.agent.profiles_file:
        values["profiles_file"] = str(sb.agent.profiles_file)
    if profiles:
        values.update(namespace=profiles.namespace, claim=profiles.claim)
        values["profiles"] = json.dumps(list(profiles.profiles))
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


def compare_op(ops: list[Any]) -> Any | None:
    """The pipeline's verdict op (the last job named ``compare``), if it ran."""
    found = [op for op in ops if op.kind == "job" and op.name == "compare"]
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


def print_comparison(
    sb: Sandbox, project: str, pipeline: str, ops: list[Any], echo: Echo = print
) -> None:
    """The verdict module's report on the runs the pipeline's compare op gathered, else
    our own profile-by-profile table; then the compare op's verdict and recommendation.

    ``ops`` are every run below the pipeline (nested stages included), oldest first.
    """
    # The list of runs may leave out outputs and inputs: read the ones used in full.
    compare = compare_op(ops)
    if compare is not None:
        compare = get_run(sb.client, DEFAULT_OWNER, project, compare.uuid)
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
    for line in recommendation_lines(compare):
        echo(line)


def run_demo(
    sb: Sandbox,
    project: str,
    polyaxonfile: Path,
    overrides: dict[str, str],
    timeout: float,
    echo: Echo = print,
    fallback: bool = False,
    workload: str = "checkpoint",
) -> str:
    """Start everything, run the pipeline through the hub, follow it, print the comparison,
    and always the runs-table URL and the stop command. Returns the pipeline's uuid.

    ``fallback``: see :func:`start_all`. ``workload``: see :func:`demo_params`.

    Raises:
        SandboxError: Whatever step failed (the runs table is printed first).
    """
    sb = start_all(sb, DEFAULT_OWNER, project, echo=echo, fallback=fallback)
    values = demo_params(sb, polyaxonfile, overrides, workload)
    uuid = submit_pipeline(sb, polyaxonfile, values, project, True, echo=echo)
    try:
        ops = follow(sb.client, DEFAULT_OWNER, project, uuid, timeout, echo=echo)
        echo("")
        print_comparison(sb, project, uuid, ops, echo=echo)
    finally:
        echo("")
        echo(f"runs table: {runs_table_url(sb.url, DEFAULT_OWNER, project, uuid)}")
        echo(f"the server keeps running; stop it with: {stop_hint(sb)}")
    return uuid
