"""The pipeline's shape: order, triggers, fairness, profiles as inputs, one source per component."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from tests.bundle.bundle import COMPONENTS, PIPELINE, ROOT, load_dag

PROFILE_OPS = ["switch-{}", "fio-{}", "train-{}"]
EXPECTED_ORDER = [
    *[op.format("baseline") for op in PROFILE_OPS],
    *[op.format("throughput") for op in PROFILE_OPS],
    "compare",
    "restore",
]


@pytest.fixture(scope="module")
def dag():
    return load_dag()


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


def test_ops_run_one_after_another_in_the_expected_order(dag) -> None:
    assert dag.run.concurrency == 1
    assert dag.order() == EXPECTED_ORDER
    # Even without the concurrency limit nothing could overlap: every op waits for all
    # the ops before it, so the dependencies alone make a single chain.
    upstream = dag.upstream()
    for i, op in enumerate(EXPECTED_ORDER):
        assert ancestors(upstream, op) == set(EXPECTED_ORDER[:i]), op


def test_baseline_training_finishes_before_the_throughput_switch(dag) -> None:
    assert "train-baseline" in ancestors(dag.upstream(), "switch-throughput")


def test_a_failed_switch_stops_its_profile(dag) -> None:
    # Default trigger (all_succeeded) on every measurement: a failed switch leaves its fio
    # and training ops upstream-failed, never run on the wrong class, and the pipeline fails.
    upstream = dag.upstream()
    for profile in ("baseline", "throughput"):
        for op in (f"fio-{profile}", f"train-{profile}", "compare"):
            assert f"switch-{profile}" in ancestors(upstream, op)
    for name, op in dag.ops.items():
        if name != "restore":
            assert op.trigger in (None, "all_succeeded"), name
            assert not op.conditions, name


def test_restoring_the_claim_is_optional_and_off_by_default(dag) -> None:
    restore = dag.ops["restore"]
    assert dag.inputs["restore_after"] is False
    assert restore.conditions == "{{ restore_after }}"
    assert restore.params["restore_after"].context_only
    assert restore.params["restore_after"].value == "inputs.restore_after"
    assert restore.trigger == "all_done"  # also after a failure, when asked for
    assert dag.resolve_params("restore")["target_class"] == dag.inputs["restore_class"]


def test_every_op_bypasses_the_cache(dag) -> None:
    for name, op in dag.ops.items():
        assert op.cache and op.cache.disable, name


def test_every_op_references_a_versioned_component_by_path() -> None:
    # One source of truth: a plain pathRef to components/<name>/<version>.yaml, which the
    # sandbox rewrites to hubRef <owner>/<name>:<version> when it registers components.
    raw = yaml.safe_load(PIPELINE.read_text())
    for op in raw["run"]["operations"]:
        assert set(op) & {"pathRef", "hubRef", "component", "urlRef", "dagRef"} == {"pathRef"}
        match = re.fullmatch(r"\.\./components/([-a-zA-Z0-9_]+)/(v\d+\.\d+)\.yaml", op["pathRef"])
        assert match, op["pathRef"]
        assert (PIPELINE.parent / op["pathRef"]).resolve() == (
            COMPONENTS / match[1] / f"{match[2]}.yaml"
        )


def test_profiles_are_inputs_not_hard_coded(dag) -> None:
    for name, op in dag.ops.items():
        target = op.params.get("target_class")
        if target is not None:
            assert target.ref == "dag" and target.value.startswith("inputs."), name
    raw_ops = yaml.safe_dump(yaml.safe_load(PIPELINE.read_text())["run"]["operations"])
    assert "checkpoint-baseline" not in raw_ops
    assert "checkpoint-throughput" not in raw_ops
    other = load_dag(params={"baseline_class": "gp3-slow", "throughput_class": "gp3-fast"})
    assert other.resolve_params("switch-baseline")["target_class"] == "gp3-slow"
    assert other.resolve_params("switch-throughput")["target_class"] == "gp3-fast"
    assert other.compile_op("train-throughput").env["STORAGE_PROFILE"] == "gp3-fast"


def test_profiles_differ_only_in_their_class(dag) -> None:
    # Model, dataset seed, checkpoint format and durability come from the same DAG inputs.
    def params(op: str) -> dict:
        return {k: (p.ref, p.value) for k, p in dag.ops[op].params.items()}

    fair = {"model_size", "seed", "checkpoint_format", "durability", "steps", "checkpoint_every"}

    def without_label(op: str) -> dict:
        label = params(op).pop("storage_profile")
        assert label == (f"ops.switch-{op.split('-')[1]}", "outputs.applied_class")
        return {k: v for k, v in params(op).items() if k != "storage_profile"}

    baseline = params("train-baseline")
    assert fair <= set(baseline)
    assert all(baseline[k][0] == "dag" for k in fair)
    assert without_label("train-baseline") == without_label("train-throughput")
    assert without_label("fio-baseline") == without_label("fio-throughput")
    switch_baseline, switch_throughput = params("switch-baseline"), params("switch-throughput")
    assert switch_baseline.pop("target_class") != switch_throughput.pop("target_class")
    assert switch_baseline == switch_throughput


def test_each_profile_trains_into_its_own_checkpoint_directory(dag) -> None:
    def checkpoint_dir(op: str) -> str:
        argv = dag.compile_op(op).argv
        return argv[argv.index("--checkpoint-dir") + 1]

    baseline, throughput = checkpoint_dir("train-baseline"), checkpoint_dir("train-throughput")
    assert baseline != throughput
    assert not baseline.startswith(throughput) and not throughput.startswith(baseline)


def test_compare_gathers_both_profiles(dag) -> None:
    params = dag.ops["compare"].params
    assert params["pipeline"].ref == "dag" and params["pipeline"].value == "globals.uuid"
    for profile in ("baseline", "throughput"):
        assert params[f"{profile}_run"].ref == f"ops.train-{profile}"
        assert params[f"{profile}_run"].value == "globals.uuid"
        assert params[f"{profile}_runtime_s"].value == "outputs.runtime_s"
        assert params[f"{profile}_class"].ref == f"ops.switch-{profile}"
        # Not passed by reference: the server drops a falsy upstream output (a 0.0 settle
        # time when the claim was already on the class) and the op would not compile.
        assert f"{profile}_total_settle_s" not in params
        assert params[f"{profile}_fio_run"].ref == f"ops.fio-{profile}"


def test_a_third_profile_needs_only_a_copy_of_an_op_block(tmp_path: Path) -> None:
    # What the pipeline's header says to do, done mechanically: copy throughput's three ops,
    # rename them, chain them after train-throughput and add train-fast to compare's deps.
    text = PIPELINE.read_text()
    start = text.index("    - name: switch-throughput")
    block = text[start : text.index("    # ---- verdict ----")]
    copy = (
        block.replace("-throughput", "-fast")
        .replace("inputs.throughput_class", "inputs.fast_class")
        .replace("dependencies: [train-baseline]", "dependencies: [train-throughput]")
    )
    text = text.replace("    # ---- verdict ----", copy + "    # ---- verdict ----")
    text = text.replace(
        "dependencies: [train-baseline, train-throughput]",
        "dependencies: [train-baseline, train-throughput, train-fast]",
    )
    text = text.replace(
        "inputs:\n",
        "inputs:\n  - {name: fast_class, type: str, value: checkpoint-fast}\n",
        1,
    )
    (tmp_path / "polyaxonfiles").mkdir()
    (tmp_path / "components").symlink_to(ROOT / "components")
    three = tmp_path / "polyaxonfiles" / "three.yaml"
    three.write_text(text)

    dag = load_dag(three)
    assert dag.order() == [
        *EXPECTED_ORDER[:6],
        *[op.format("fast") for op in PROFILE_OPS],
        "compare",
        "restore",
    ]
    assert dag.compile_op("train-fast").env["STORAGE_PROFILE"] == "checkpoint-fast"
