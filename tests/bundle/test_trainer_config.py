"""The checkpoint-training component's inputs agree with the trainer's TrainConfig.

TrainConfig (trainer/config.py) is the one source of the trainer's settings; the component
restates them as Polyaxon inputs. These tests fail when the two drift apart: an input with
no setting (or a setting with no input), another type, another default, other choices, or
bounds that let through a value the trainer refuses (the pod would then fail with exit 2
after being scheduled on a GPU node) or refuse one it takes.
"""

from __future__ import annotations

import types
import typing
from dataclasses import MISSING, fields
from pathlib import Path
from typing import Any, Literal

import pytest

from tests.bundle.bundle import COMPONENTS, load_yaml_documents
from trainer.config import TrainConfig
from trainer.errors import ConfigError

COMPONENT = COMPONENTS / "checkpoint-training" / "latest.yaml"

FIELD_OF_INPUT = {"checkpoint_format": "format"}
"""Component input → TrainConfig field, where the names differ."""

NOT_SETTINGS = {
    "image": "the job image the component runs; the trainer records it from env IMAGE_REF",
    "nproc_per_node": "ranks per pod: torchrun's --nproc-per-node and the GPU limit",
    "repeat": "which of a stage's repeated runs this is: recorded with the run, not a setting",
    "node_selector": "pod placement (Kubernetes nodeSelector)",
    "tolerations": "pod placement (Kubernetes tolerations)",
    "affinity": "pod placement (Kubernetes affinity)",
    "resources": "the pod's requests and limits (Kubernetes resources)",
}
"""Inputs that are no TrainConfig field, and why."""

NOT_INPUTS = {"summary_json": "the component writes it next to the run's checkpoints"}
"""TrainConfig fields the component sets itself instead of taking an input, and why."""

COMPONENT_DEFAULTS = {
    # The CLI default is sized for a laptop and the tests; on a GPU node the component
    # checkpoints a model of realistic size.
    "model_size": "1GiB",
    # A retried or resumed Polyaxon run continues its own checkpoints; by hand, the CLI
    # refuses a directory with checkpoints unless told.
    "resume": "auto",
}
"""Deliberate differences between the component's default and the CLI's."""

POLYAXON_TYPES = {"int": int, "float": float, "bool": bool, "str": str}


def component_inputs() -> dict[str, dict[str, Any]]:
    (doc,) = load_yaml_documents(COMPONENT)
    return {io["name"]: io for io in doc["inputs"]}


def settings() -> dict[str, Any]:
    """TrainConfig field → its type annotation."""
    hints = typing.get_type_hints(TrainConfig)
    return {f.name: hints[f.name] for f in fields(TrainConfig)}


def field_for(input_name: str) -> str:
    return FIELD_OF_INPUT.get(input_name, input_name)


def accepted_types(annotation: Any) -> set[type]:
    """The Python types a field's values can have (a Literal of strings is a str)."""
    if typing.get_origin(annotation) is Literal:
        return {type(arg) for arg in typing.get_args(annotation)}
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        return set().union(*(accepted_types(a) for a in typing.get_args(annotation))) - {type(None)}
    return {str} if annotation is Path else {annotation}


def default_of(name: str) -> Any:
    (f,) = [f for f in fields(TrainConfig) if f.name == name]
    return f.default


def config_allows(tmp_path: Path, name: str, value: Any) -> bool:
    try:
        TrainConfig(checkpoint_dir=tmp_path, **{name: value})
    except ConfigError:
        return False
    return True


def component_allows(validation: dict[str, Any], value: float) -> bool:
    checks = {
        "ge": lambda b: value >= b,
        "gt": lambda b: value > b,
        "le": lambda b: value <= b,
        "lt": lambda b: value < b,
    }
    return all(checks[k](v) for k, v in validation.items() if k in checks)


INPUTS = component_inputs()
SETTINGS = settings()
MAPPED = sorted(name for name in INPUTS if name not in NOT_SETTINGS)


def test_every_input_is_a_setting_and_every_setting_an_input():
    unknown = [n for n in INPUTS if n not in NOT_SETTINGS and field_for(n) not in SETTINGS]
    assert not unknown, f"component inputs that TrainConfig does not have: {unknown}"
    exposed = {field_for(n) for n in INPUTS}
    missing = [f for f in SETTINGS if f not in exposed and f not in NOT_INPUTS]
    assert not missing, f"TrainConfig fields the component does not expose: {missing}"


@pytest.mark.parametrize("name", MAPPED)
def test_input_type_matches(name):
    io = INPUTS[name]
    assert POLYAXON_TYPES[io["type"]] in accepted_types(SETTINGS[field_for(name)]), (
        f"input {name} is {io['type']}, TrainConfig.{field_for(name)} is {SETTINGS[field_for(name)]}"
    )


@pytest.mark.parametrize("name", MAPPED)
def test_input_default_matches(name, tmp_path):
    io, field = INPUTS[name], field_for(name)
    if "value" not in io:
        # No default: the input is required, or optional and then left out of the command.
        assert not io.get("isOptional") or default_of(field) in (None, MISSING), (
            f"input {name} is optional without a value, so the trainer's default "
            f"{default_of(field)!r} applies: declare it as the input's value"
        )
        return
    if field in COMPONENT_DEFAULTS:
        assert io["value"] == COMPONENT_DEFAULTS[field], f"{name}: {io['value']!r}"
        assert config_allows(tmp_path, field, io["value"])
        return
    assert io["value"] == default_of(field), (
        f"input {name} defaults to {io['value']!r}, TrainConfig.{field} to {default_of(field)!r}"
    )


@pytest.mark.parametrize("name", MAPPED)
def test_input_choices_match(name):
    annotation = SETTINGS[field_for(name)]
    options = (INPUTS[name].get("validation") or {}).get("options")
    if typing.get_origin(annotation) is Literal:
        assert options is not None, f"input {name} has no options; TrainConfig allows {annotation}"
        assert sorted(options) == sorted(typing.get_args(annotation)), name
    else:
        assert options is None, f"input {name} has options {options}; TrainConfig has none"


@pytest.mark.parametrize("name", [n for n in MAPPED if INPUTS[n]["type"] in ("int", "float")])
def test_input_bounds_match_what_the_trainer_accepts(name, tmp_path):
    io, field = INPUTS[name], field_for(name)
    validation = io.get("validation") or {}
    probes = [-1, 0, 1, 2] if io["type"] == "int" else [-1.0, 0.0, 1e-9, 1.0]
    for value in probes:
        assert component_allows(validation, value) == config_allows(tmp_path, field, value), (
            f"input {name}={value!r}: the component "
            f"{'allows' if component_allows(validation, value) else 'refuses'} it, "
            f"the trainer {'allows' if config_allows(tmp_path, field, value) else 'refuses'} it"
        )


def test_a_drifted_component_fails_these_checks(tmp_path):
    # The checks must be able to fail: a default, a choice and a bound, each drifted.
    drifted_default = {**INPUTS["keep"], "value": 3}
    assert drifted_default["value"] != default_of("keep")
    drifted_options = sorted([*INPUTS["durability"]["validation"]["options"], "fdatasync"])
    assert drifted_options != sorted(typing.get_args(SETTINGS["durability"]))
    assert component_allows({"ge": 0}, 0) != config_allows(tmp_path, "steps", 0)
