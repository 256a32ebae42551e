"""Each component declares exactly the outputs its part logs, as the shared contract names them.

A pipeline op can only pass on an output its component declares (``ref: ops.X, value:
outputs.Y``), and the comparison view's columns come from what the run logs: the two lists
must be the same list. ``checkpoint_storage_bench.contract`` is that list in code, so a name
added there (or to the fio spec) without the component fails here, and the other way round.
"""

from __future__ import annotations

import pytest

from checkpoint_storage_bench.contract import (
    DATA_WORKLOAD_OUTPUTS,
    FIO_MEASURES,
    HOOK_OUTPUTS,
    TRAINING_OUTPUTS,
    fio_output,
)
from fio_sweep.spec import load_spec
from tests.bundle.bundle import COMPONENTS, check, current, load_yaml_documents


def declared_outputs(name: str, params: dict) -> list[str]:
    """The output names of a component's newest version, in file order, as Polyaxon reads it."""
    component = check(current(name), params).component
    return [io.name for io in component.outputs or []]


def fio_outputs() -> set[str]:
    """What the fio sweep logs with its default spec: every case's measures, and the overhead."""
    spec = load_spec()
    return {fio_output(c.name, m) for c in spec.cases for m in FIO_MEASURES} | {"fio_overhead_pct"}


@pytest.mark.parametrize(
    ("name", "params", "expected"),
    [
        ("checkpoint-training", {"storage_profile": "x"}, set(TRAINING_OUTPUTS)),
        ("checkpoint-training-pytorchjob", {"storage_profile": "x"}, set(TRAINING_OUTPUTS)),
        ("storage-profile", {"target_class": "x"}, set(HOOK_OUTPUTS)),
        ("fio-sweep", {}, fio_outputs()),
        (
            "data-workload",
            {"storage_profile": "x"},
            {o for outputs in DATA_WORKLOAD_OUTPUTS.values() for o in outputs},
        ),
    ],
    ids=[
        "checkpoint-training",
        "checkpoint-training-pytorchjob",
        "storage-profile",
        "fio-sweep",
        "data-workload",
    ],
)
def test_declared_outputs_are_the_contracts(name: str, params: dict, expected: set[str]) -> None:
    declared = declared_outputs(name, params)
    assert len(declared) == len(set(declared)), f"{name} declares an output twice"
    assert set(declared) == expected, (
        f"{name}: declared but not in the contract {sorted(set(declared) - expected)}; "
        f"in the contract but not declared {sorted(expected - set(declared))}"
    )


def test_the_comparison_fails_when_an_output_is_missing() -> None:
    # The check above must be able to fail: drop one declared output and compare again.
    (doc,) = load_yaml_documents(current("checkpoint-training"))
    declared = {o["name"] for o in doc["outputs"]} - {"ckpt_upload_gbps_median"}
    assert declared != set(TRAINING_OUTPUTS)


def test_outputs_are_optional_and_typed() -> None:
    # Outputs exist only once the run logged them; a required output would fail a run that
    # ended early before Polyaxon ever saw its value.
    for path in sorted(COMPONENTS.glob("*/latest.yaml")):
        (doc,) = load_yaml_documents(path)
        for output in doc.get("outputs") or []:
            assert output.get("isOptional") is True, f"{path}: {output['name']}"
            assert output.get("type") in {"float", "int", "str", "bool"}, f"{path}: {output}"
