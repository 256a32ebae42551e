"""The comparison pipeline's shape, read the way Polyaxon reads it.

The general pipeline (``components/checkpoint-storage-profiles``, run by
``polyaxonfiles/checkpoint-storage-profiles.yaml``) maps a nested stage component (switch ->
fio -> training x repeats) over the ordered profiles, after a modification plan, and ends
with the verdict (joins) and the release of the claim's lease. The two-profile pipeline
(``polyaxonfiles/checkpoint-storage-pipeline.yaml``) is a wrapper over it. Mapping values and
join queries are rendered with Polyaxon's own parser, the mapping's runs made with its own
``get_ops_from_suggestions``, every nested DAG built and validated by Polyaxon.
"""

from __future__ import annotations

import re

import pytest
import yaml

from hooks.storage_profile.errors import PreflightRefused
from hooks.storage_profile.lease import refuse_after_failure
from tests.bundle.bundle import (
    COMPONENTS,
    PIPELINE,
    PIPELINE_UUID,
    PROFILES_PIPELINE,
    check,
    compile_component,
    current,
    load_dag,
    load_yaml_documents,
    pipeline_jobs,
)

THREE = ["gp3-baseline", "gp3-tuned", "io2"]
GENERAL = current("checkpoint-storage-profiles")
STAGE = current("checkpoint-stage")


@pytest.fixture(scope="module")
def three():
    """Three profiles, two training runs each, and back to the first at the end."""
    return load_dag(PROFILES_PIPELINE, {"profiles": THREE, "repeats": 2, "return_to_first": True})


@pytest.fixture(scope="module")
def stages(three):
    return three.children("stages")


@pytest.fixture(scope="module")
def jobs(three):
    """Every job of the three-profile run, compiled, in the order the tree runs them."""
    return three.jobs()


def ancestors(upstream: dict[str, set[str]], op: str) -> set[str]:
    """Every op that must finish before ``op`` may start."""
    seen: set[str] = set()
    todo = list(upstream[op])
    while todo:
        name = todo.pop()
        if name not in seen:
            seen.add(name)
            todo.extend(upstream[name])
    return seen


def test_the_pipeline_runs_plan_stages_verdict_release_in_order(three) -> None:
    assert three.run.concurrency == 1
    assert three.order() == ["plan", "stages", "compare", "restore", "release"]
    upstream = three.upstream()
    assert upstream["plan"] == set()  # first: nothing is switched before the plan
    assert ancestors(upstream, "release") == {"plan", "stages", "compare", "restore"}


def test_the_profiles_map_to_stages_strictly_in_order(three) -> None:
    matrix = three.matrix("stages")
    assert matrix.kind == "mapping"
    assert matrix.concurrency == 1  # one stage at a time on the same claim
    assert three.mapping("stages") == [
        {"profile": "gp3-baseline", "stage": 0},
        {"profile": "gp3-tuned", "stage": 1},
        {"profile": "io2", "stage": 2},
        {"profile": "gp3-baseline", "stage": 3},  # return_to_first: A…B…A
    ]
    without = load_dag(PROFILES_PIPELINE, {"profiles": THREE})
    assert [v["profile"] for v in without.mapping("stages")] == THREE


def test_a_refused_plan_stops_the_comparison_before_any_switch(three) -> None:
    # Default trigger (all_succeeded): a plan that exits 3 leaves the stages upstream-failed.
    assert three.ops["stages"].trigger in (None, "all_succeeded")
    assert three.ops["stages"].dependencies == ["plan"]
    plan = three.compile_op("plan").argv
    assert plan[plan.index("--profiles") + 1] == ",".join(THREE)
    assert "--return-to-first" in plan


@pytest.mark.parametrize("path", [PROFILES_PIPELINE, PIPELINE], ids=["general", "two-profile"])
def test_the_plan_counts_the_restore_switch_when_one_is_asked_for(path) -> None:
    # The restore is one more modification in the same window: the plan must count it.
    params = {"profiles": THREE} if path == PROFILES_PIPELINE else {}
    counted = ["--restore-after", "--restore-class=gp3-old"]
    for restore, expected in ((False, counted[1:]), (True, counted)):
        asked = {**params, "restore_after": restore, "restore_class": "gp3-old"}
        (plan,) = [p for p in pipeline_jobs(path, asked).values() if p.run_name == "plan"]
        assert [a for a in plan.argv if a.startswith("--restore")] == expected, restore


@pytest.mark.parametrize(
    ("path", "params"),
    [
        (PROFILES_PIPELINE, {"profiles": ["gp3-a"]}),
        (PROFILES_PIPELINE, {"profiles": ["gp3-a", "gp3-a"]}),
        (PIPELINE, {"baseline_class": "gp3-a", "throughput_class": "gp3-a"}),
        (PROFILES_PIPELINE, {"profiles": ["gp3-fast", "gp3.fast"]}),
    ],
    ids=["one", "twice", "two-profile-same-class", "same-output-name"],
)
def test_a_plan_that_compares_nothing_is_refused_before_any_switch(path, params) -> None:
    # The plan op's own command line, run: a usage error (exit 2) before it asks the API
    # server anything, so every stage is upstream-failed and nothing is switched.
    from click.testing import CliRunner

    from hooks.storage_profile import cli

    (plan,) = [p for p in pipeline_jobs(path, params).values() if p.run_name == "plan"]
    assert plan.argv[:3] == ["python", "-m", "hooks.storage_profile"]
    result = CliRunner().invoke(cli.main, plan.argv[3:], catch_exceptions=False)
    assert result.exit_code == 2, result.output
    assert "--profiles" in result.stderr


def test_each_stage_switches_measures_then_trains_repeats_times(stages) -> None:
    assert len(stages) == 4
    for stage in stages:
        assert stage.run.concurrency == 1
        # The default workload: the training; the data workload's op is skipped.
        assert [n for n in stage.order() if stage.runs(n)] == ["switch", "fio", "renew", "train"]
        upstream = stage.upstream()
        assert ancestors(upstream, "train") == {"switch", "fio", "renew"}
        assert ancestors(upstream, "data") == {"switch", "fio", "renew"}
        # The Lease is renewed after the sweep, right before the training runs.
        assert stage.ops["renew"].dependencies == ["fio"]
        assert stage.ops["train"].dependencies == ["renew"]
        assert stage.ops["data"].dependencies == ["renew"]
        # A failed switch or fio leaves the training upstream-failed: nothing is measured on
        # the wrong class. The only conditions choose the workload.
        for name, op in stage.ops.items():
            assert op.trigger in (None, "all_succeeded"), name
            assert not op.conditions or name in ("train", "data"), name
        train = stage.matrix("train")
        assert train.kind == "mapping" and train.concurrency == 1
        assert stage.mapping("train") == [{"repeat": 0}, {"repeat": 1}]
        # No switch between the repeats: one switch op per stage, before every training.
        switches = [n for n, op in stage.ops.items() if "/storage-profile/" in op.path_ref]
        assert switches == ["switch"]


def test_a_stage_labels_its_runs_with_the_class_its_switch_applied(stages) -> None:
    for stage in stages:
        profile = stage.inputs["profile"]
        assert stage.resolve_params("switch")["target_class"] == profile
        assert stage.compile_op("fio").env["STORAGE_PROFILE"] == profile
        for i, values in enumerate(stage.mapping("train")):
            pod = stage.compile_op("train", extra=values, index=i)
            assert pod.env["STORAGE_PROFILE"] == profile
        for op in ("fio", "train"):
            label = stage.ops[op].params["storage_profile"]
            assert (label.ref, label.value) == ("ops.switch", "outputs.applied_class")


def test_stages_differ_only_in_their_profile(stages) -> None:
    # Model, dataset seed, format, durability, steps, placement: the same for every stage.
    def fair(inputs: dict) -> dict:
        return {k: v for k, v in inputs.items() if k not in ("profile", "stage")}

    assert all(fair(s.inputs) == fair(stages[0].inputs) for s in stages)
    assert [s.inputs["stage"] for s in stages] == [0, 1, 2, 3]


def test_every_training_run_writes_its_own_checkpoint_directory(jobs) -> None:
    dirs = []
    for pod in jobs.values():
        if pod.run_name == "train":
            dirs.append(pod.argv[pod.argv.index("--checkpoint-dir") + 1])
    assert len(dirs) == 4 * 2
    assert len(set(dirs)) == len(dirs)
    for a in dirs:
        assert not any(b != a and b.startswith(a + "/") for b in dirs)


def test_one_lease_holder_for_every_switch_and_the_release(three, stages, jobs) -> None:
    # The switches of every stage, the optional restore and the release share one holder:
    # this pipeline's uuid. A nested stage's own pipeline would be a different one per stage.
    switches = [pod for pod in jobs.values() if pod.argv[3:4] == ["switch"]]
    assert len(switches) == 4 + 1  # every stage, and the restore
    assert {_holder(pod.argv) for pod in switches} == {PIPELINE_UUID}
    release = three.compile_op("release").argv
    assert release[release.index("--holder") + 1] == PIPELINE_UUID
    assert all(s.inputs["holder"] == PIPELINE_UUID for s in stages)
    # Every stage's renewal renews that same holder's Lease, for the same duration.
    renewals = [pod for pod in jobs.values() if pod.argv[3:4] == ["renew"]]
    assert len(renewals) == 4
    assert {_holder(pod.argv) for pod in renewals} == {PIPELINE_UUID}
    assert {pod.argv[pod.argv.index("--lease-duration") + 1] for pod in renewals} == {
        str(three.inputs["lease_duration"])
    }


def test_after_a_failed_stage_no_later_stage_switches_but_a_restore_does(three, jobs) -> None:
    # A mapping starts its next stage after a failed one; that stage's switch refuses
    # (--stop-after-failure: an op of the holder's pipeline failed). The restore, asked for,
    # still puts the claim back; a switch on its own has no pipeline to stop.
    switches = {path: pod.argv for path, pod in jobs.items() if pod.argv[3:4] == ["switch"]}
    staged = [argv for path, argv in switches.items() if "/stages[" in path]
    assert len(staged) == 4 and all("--stop-after-failure" in argv for argv in staged)
    assert "--stop-after-failure" not in switches["pipeline/restore"]
    alone = compile_component(current("storage-profile"), {"target_class": "fast"}).argv
    assert "--stop-after-failure" not in alone


def run_tree(dag) -> dict[str, str | None]:
    """Every run the server makes for ``dag`` (its own included), by stand-in uuid, with the
    uuid of its ``pipeline``: a mapping op is a matrix run whose children are its runs."""
    parents: dict[str, str | None] = {dag.uuid: None}

    def walk(d) -> None:
        for name in d.order():
            op = d.ops[name]
            if op.conditions and "workload" in op.conditions and not d.runs(name):
                continue
            if op.matrix is None:
                parents[d.op_uuid(name)] = d.uuid
                continue
            parents[d.op_uuid(name)] = d.uuid  # the matrix run
            if op.component.run.kind == "dag":
                for child in d.children(name):
                    parents[child.uuid] = d.op_uuid(name)
                    walk(child)
            else:
                for i in range(len(d.mapping(name))):
                    parents[d.op_uuid(f"{name}[{i}]")] = d.op_uuid(name)

    walk(dag)
    return parents


@pytest.mark.parametrize("path", [PROFILES_PIPELINE, PIPELINE], ids=["general", "two-profile"])
def test_after_a_failed_first_stage_the_second_stages_switch_refuses(path) -> None:
    # The server's records for the whole tree: every run's controller is the outermost
    # run (haupt: the parent's controller, else the parent), however deep it is nested.
    dag = load_dag(path, {"profiles": THREE} if path == PROFILES_PIPELINE else {})
    parents = run_tree(dag)

    def controller(run: str) -> str | None:
        top = parents[run]
        while top is not None and parents[top] is not None:
            top = parents[top]
        return top

    def parent_of(owner: str, project: str, run: str) -> str | None:
        return parents[run]

    jobs = dag.jobs()
    (first_train, *_) = [p for p in jobs if "/stages[0]/train[" in p]
    failed = {jobs[first_train].run_uuid: "train"}

    def failed_below(owner: str, project: str, root: str) -> list[str]:
        return [name for run, name in failed.items() if controller(run) == root]

    switch = next(pod for p, pod in jobs.items() if p.endswith("/stages[1]/switch"))
    assert "--stop-after-failure" in switch.argv
    environ = {"POLYAXON_RUN_INSTANCE": switch.env["POLYAXON_RUN_INSTANCE"]}
    with pytest.raises(PreflightRefused, match=r"has failed op\(s\) \(train\)"):
        refuse_after_failure(environ, parent_of, failed_below)
    # Nested in the wrapper, the Lease's holder is not the controller of any run.
    holder = _holder(switch.argv)
    assert (holder == PIPELINE_UUID) == (path == PROFILES_PIPELINE)
    assert all(controller(run) == PIPELINE_UUID for run in parents if run != PIPELINE_UUID)
    failed.clear()  # nothing failed: the second stage switches
    refuse_after_failure(environ, parent_of, failed_below)


def test_the_restore_switches_back_only_a_claim_its_pipeline_switched(jobs) -> None:
    # With trigger all_done the restore also runs after a refused plan: its switch then does
    # nothing (--only-if-switched: no switch of the claim by this pipeline's holder).
    switches = {path: pod.argv for path, pod in jobs.items() if pod.argv[3:4] == ["switch"]}
    assert "--only-if-switched" in switches["pipeline/restore"]
    assert _holder(switches["pipeline/restore"]) == PIPELINE_UUID
    staged = [argv for path, argv in switches.items() if "/stages[" in path]
    assert staged and not any("--only-if-switched" in argv for argv in staged)
    alone = compile_component(current("storage-profile"), {"target_class": "fast"}).argv
    assert "--only-if-switched" not in alone


def _holder(argv: list[str]) -> str | None:
    (flag,) = [a for a in argv if a.startswith("--holder=")] or [None]
    return flag.split("=", 1)[1] if flag else None


def test_the_release_is_last_and_runs_whatever_happened(three) -> None:
    release = three.ops["release"]
    assert release.trigger == "all_done"
    assert not release.conditions
    assert set(release.dependencies) == {"compare", "restore"}


def test_compare_gathers_the_stage_runs_with_joins(three) -> None:
    compare = three.ops["compare"]
    assert compare.dependencies == ["stages"]
    # No hand-wired per-profile params: the runs come from joins on this comparison.
    assert not any(re.match(r"(baseline|throughput)_", k) for k in compare.params)
    runs, figures, fio = three.joins("compare")
    # Every job below this run has it as its controller, at any depth of nesting.
    assert runs.query == f"controller: {PIPELINE_UUID}, kind: job, name: switch|fio|train|data"
    assert runs.sort == "created_at"
    assert {k: p.value for k, p in runs.params.items()} == {"runs": "globals.uuid"}
    assert figures.query.endswith("name: train, status: succeeded")
    assert fio.query.endswith("name: fio, status: succeeded")
    declared = {io.name: io for io in compare.component.inputs}
    for join in (runs, figures, fio):
        for name, param in join.params.items():
            # A join gives a list: the input must say so (Polyaxon validates it on the server).
            assert declared[name].is_list, name
            assert param.value.split(".")[0] in ("globals", "inputs", "outputs"), param
    assert three.resolve_params("compare")["profiles"] == THREE


def test_the_joined_runs_and_profiles_reach_the_verdicts_command_line(three, jobs) -> None:
    runs = [pod.run_uuid for pod in jobs.values() if pod.run_name in ("switch", "fio", "train")]
    assert len(runs) == 4 * (1 + 1 + 2)
    argv = three.compile_op("compare", extra={"runs": runs}).argv
    assert [a.removeprefix("--run=") for a in argv if a.startswith("--run=")] == runs
    assert [a for a in argv if a.startswith(("--baseline", "--expect"))] == [
        "--baseline=gp3-baseline",
        *[f"--expect={p}" for p in THREE],
    ]


def test_placement_is_the_same_for_every_pod_that_mounts_the_claim() -> None:
    placement = {
        "node_selector": {"node.kubernetes.io/instance-type": "p5.48xlarge"},
        "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
        "affinity": {
            "podAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": [
                    {"labelSelector": {"matchLabels": {"team": "ml"}}, "topologyKey": "zone"}
                ]
            }
        },
    }
    dag = load_dag(PROFILES_PIPELINE, {"profiles": THREE, **placement})
    measuring = 0
    for path, pod in dag.jobs().items():
        spec = pod.spec
        if pod.mounts():
            measuring += 1
            assert spec.get("nodeSelector") == placement["node_selector"], path
            assert spec.get("tolerations") == placement["tolerations"], path
            assert spec.get("affinity") == placement["affinity"], path
        else:  # API-only ops go wherever there is room
            assert not {"nodeSelector", "tolerations", "affinity"} & set(spec), path
    assert measuring == 3 * (1 + 2)  # fio and the default 2 training runs of every stage


def test_resources_reach_every_measuring_pod_and_no_other() -> None:
    small = {"requests": {"cpu": "500m", "memory": "1Gi"}, "limits": {"memory": "6Gi"}}
    for workload in ("checkpoint", "scan"):
        dag = load_dag(
            PROFILES_PIPELINE, {"profiles": THREE, "resources": small, "workload": workload}
        )
        measuring = [pod for pod in dag.jobs().values() if pod.mounts()]
        # fio and the workload's default 2 runs of every stage
        assert len(measuring) == 3 * (1 + 2), workload
        assert all(pod.main["resources"] == small for pod in measuring), workload
        others = [pod for pod in dag.jobs().values() if not pod.mounts()]
        assert others and all(pod.main["resources"] != small for pod in others)


def test_upload_is_off_by_default_and_reaches_every_training_run() -> None:
    def uploads(params: dict) -> list[str | None]:
        dag = load_dag(PROFILES_PIPELINE, {"profiles": THREE, **params})
        return [
            next((a for a in pod.argv if a.startswith("--upload-to")), None)
            for pod in dag.jobs().values()
            if pod.run_name == "train"
        ]

    assert uploads({}) == [None] * 3 * 2  # three stages, two training runs each
    assert uploads({"upload_to": "s3://bucket/x"}) == ["--upload-to=s3://bucket/x"] * 3 * 2


def test_restoring_the_claim_is_optional_and_off_by_default(three) -> None:
    restore = three.ops["restore"]
    assert three.inputs["restore_after"] is False
    assert restore.conditions == "{{ restore_after }}"
    assert restore.params["restore_after"].context_only
    assert restore.trigger == "all_done"  # also after a failure, when asked for
    assert three.resolve_params("restore")["target_class"] == three.inputs["restore_class"]


def test_profiles_are_inputs_not_hard_coded() -> None:
    for path in (GENERAL, STAGE, PIPELINE):
        (doc,) = load_yaml_documents(path)
        raw_ops = yaml.safe_dump(doc["run"]["operations"])
        assert "checkpoint-baseline" not in raw_ops and "checkpoint-throughput" not in raw_ops


def test_every_op_bypasses_the_cache(three, stages) -> None:
    for dag in (three, stages[0], load_dag()):
        for name, op in dag.ops.items():
            assert op.cache and op.cache.disable, name


def test_every_op_references_a_versioned_component_by_path() -> None:
    # One source of truth: a plain pathRef to components/<name>/<version>.yaml, which the
    # sandbox rewrites to hubRef <owner>/<name>:<version> when it registers components.
    for path in (PIPELINE, GENERAL, STAGE):
        (doc,) = load_yaml_documents(path)
        for op in doc["run"]["operations"]:
            keys = set(op) & {"pathRef", "hubRef", "component", "urlRef", "dagRef"}
            assert keys == {"pathRef"}, (path, op["name"])
            pattern = r"(?:\.\./components|\.\.)/([-a-zA-Z0-9_]+)/(v\d+\.\d+)\.yaml"
            match = re.fullmatch(pattern, op["pathRef"])
            assert match, op["pathRef"]
            assert (path.parent / op["pathRef"]).resolve() == (
                COMPONENTS / match[1] / f"{match[2]}.yaml"
            )


# ---- the two-profile pipeline: same name and inputs, a wrapper over the general one ----


def test_the_two_profile_pipeline_keeps_its_name_and_inputs() -> None:
    wrapper = check(PIPELINE).component
    general = check(GENERAL).component
    assert wrapper.name == "checkpoint-storage-comparison"
    own = {io.name for io in wrapper.inputs}
    assert {"baseline_class", "throughput_class", "restore_after", "switch_timeout"} <= own
    # Every input of the general pipeline, the two classes instead of the list, and the
    # controller set by the wrapper itself.
    listed = {"baseline_class", "throughput_class", "passes"}  # the list, built by the wrapper
    assert own == {io.name for io in general.inputs} - {"profiles", "controller"} | listed
    (op,) = wrapper.run.operations
    passed = {k for k, p in op.params.items() if not p.context_only}
    assert passed == own - listed | {"controller"}
    defaults = {io.name: io.value for io in wrapper.inputs}
    assert all(defaults[k] == io.value for io in general.inputs if (k := io.name) in defaults)


def test_the_two_profile_pipeline_compares_its_two_classes() -> None:
    wrapper = load_dag(params={"baseline_class": "gp3-slow", "throughput_class": "gp3-fast"})
    assert wrapper.matrix("comparison").concurrency == 1
    (general,) = wrapper.children("comparison")
    assert general.inputs["profiles"] == ["gp3-slow", "gp3-fast"]
    assert [v["profile"] for v in general.mapping("stages")] == ["gp3-slow", "gp3-fast"]
    # More passes alternate the two, each pass a block of its own.
    params = {"baseline_class": "gp3-slow", "throughput_class": "gp3-fast", "passes": 2}
    (general,) = load_dag(params=params).children("comparison")
    assert general.inputs["profiles"] == ["gp3-slow", "gp3-fast"] * 2
    # Nested one level deeper, its runs' controller is the wrapper: the join looks there.
    assert general.inputs["controller"] == wrapper.uuid != general.uuid
    (runs, *_) = general.joins("compare")
    assert runs.query.startswith(f"controller: {wrapper.uuid},")
    # Its lease holder is the general pipeline's own uuid, for every switch and the release.
    release = general.compile_op("release").argv
    assert release[release.index("--holder") + 1] == general.uuid


def test_the_two_profile_pipeline_runs_the_seeds_ops() -> None:
    names = [pod.run_name for pod in pipeline_jobs().values()]
    assert names == [
        "plan",
        *["switch", "fio", "renew", "train", "train"] * 2,  # the default 2 runs a profile
        "compare",
        "restore",
        "release",
    ]


SWITCH_TIMEOUT_INPUTS = {
    "storage-profile": (current("storage-profile"), "timeout"),
    "checkpoint-stage": (current("checkpoint-stage"), "switch_timeout"),
    "checkpoint-storage-profiles": (current("checkpoint-storage-profiles"), "switch_timeout"),
    "checkpoint-storage-pipeline": (PIPELINE, "switch_timeout"),
}


@pytest.mark.parametrize("name", sorted(SWITCH_TIMEOUT_INPUTS))
def test_the_switch_timeout_default_is_the_hooks_own_for_the_default_settle(name: str) -> None:
    # A deadline shorter than the hook's own for settle=provider fails a switch while EBS is
    # still optimizing (hours): the bundle defaults to what the CLI defaults to.
    from hooks.storage_profile.config import DEFAULT_TIMEOUT

    path, timeout = SWITCH_TIMEOUT_INPUTS[name]
    (doc,) = load_yaml_documents(path)
    inputs = {io["name"]: io for io in doc["inputs"]}
    assert inputs[timeout]["value"] == DEFAULT_TIMEOUT[inputs["settle"]["value"]], name
