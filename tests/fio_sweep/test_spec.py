"""Sweep specs: shipped defaults, matrix expansion and every invalid input."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from fio_sweep.errors import SpecError
from fio_sweep.spec import CASE_KEYS, Case, expand_matrix, load_spec, parse_spec, shipped_specs

MiB = 1024**2


def test_default_spec_has_the_seed_profiles_and_a_checkpoint_write():
    spec = load_spec()
    cases = {c.name: c for c in spec.cases}
    rand = cases["randread_4k"]
    assert (rand.rw, rand.bs, rand.ioengine, rand.iodepth, rand.numjobs) == (
        "randread",
        4096,
        "libaio",
        64,
        4,
    )
    seq = cases["seqread_1m"]
    assert (seq.rw, seq.bs, seq.iodepth) == ("read", MiB, 16)
    write = cases["seqwrite_1m"]
    assert (write.rw, write.direct, write.end_fsync, write.fallocate) == (
        "write",
        True,
        True,
        "none",
    )
    assert spec.overhead_case == "seqwrite_1m"
    # A claim of 10 GiB holds the largest case (files are removed between cases).
    assert max(c.bytes_needed for c in spec.cases) <= 10 * 1024**3


def test_every_shipped_spec_loads():
    assert {"default", "checkpoint-matrix"} <= set(shipped_specs())
    for name in shipped_specs():
        assert load_spec(name).cases


def test_matrix_expands_the_product_with_named_cases():
    spec = load_spec("checkpoint-matrix")
    got = {(c.name, c.bs, c.iodepth) for c in spec.cases if c.name.startswith("ckptwrite_")}
    assert got == {
        ("ckptwrite_1m_qd1", MiB, 1),
        ("ckptwrite_1m_qd16", MiB, 16),
        ("ckptwrite_8m_qd1", 8 * MiB, 1),
        ("ckptwrite_8m_qd16", 8 * MiB, 16),
    }
    assert all(c.rw == "write" and c.end_fsync for c in spec.cases)


def test_matrix_without_placeholders_appends_key_and_value():
    items = expand_matrix({"name": "w", "rw": "write", "matrix": {"bs": ["1M", "4M"]}})
    assert [i["name"] for i in items] == ["w_bs1m", "w_bs4m"]
    assert [i["bs"] for i in items] == ["1M", "4M"]
    assert all("matrix" not in i for i in items)


def test_case_values_override_defaults():
    spec = parse_spec(
        {"defaults": {"size": "8M", "runtime": 5}, "cases": [{"name": "a", "rw": "read"}]}
    )
    assert (spec.cases[0].size, spec.cases[0].runtime) == (8 * MiB, 5)
    spec = parse_spec(
        {"defaults": {"size": "8M"}, "cases": [{"name": "a", "rw": "read", "size": "2M"}]}
    )
    assert spec.cases[0].size == 2 * MiB


def test_fio_args_are_one_option_per_element():
    case = Case(name="w", rw="write", bs=MiB, size=4 * MiB, end_fsync=True, rwmixread=None)
    args = case.fio_args()
    assert "--bs=1048576" in args and "--size=4194304" in args and "--end_fsync=1" in args
    assert all(a.startswith("--") and " " not in a for a in args)


def test_scaling_keeps_whole_blocks_and_at_least_one():
    case = Case(name="w", rw="write", bs=MiB, size=1024 * MiB, runtime=60)
    assert case.scaled(0.01).size == 10 * MiB
    assert case.scaled(1e-9).size == MiB
    assert case.scaled(1.0, runtime=2).runtime == 2


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ({"cases": [{"name": "a", "rw": "read", "blocksize": "4k"}]}, "unknown key 'blocksize'"),
        ({"cases": [{"name": "a", "rw": "read"}], "extra": 1}, "unknown key 'extra'"),
        (
            {"defaults": {"sise": "1G"}, "cases": [{"name": "a", "rw": "read"}]},
            "unknown key 'sise'",
        ),
        ({"cases": [{"name": "a", "rw": "read", "size": "-1G"}]}, "size must not be negative"),
        ({"cases": [{"name": "a", "rw": "read", "size": -5}]}, "size must not be negative"),
        ({"cases": [{"name": "a", "rw": "read", "size": 0}]}, "size must be at least 1"),
        ({"cases": [{"name": "a", "rw": "read", "size": "1Q"}]}, "unknown size unit"),
        ({"cases": [{"name": "a", "rw": "read", "bs": "1M", "size": "4k"}]}, "smaller than bs"),
        ({"cases": [{"name": "a", "rw": "trim"}]}, "rw must be one of"),
        ({"cases": [{"name": "a", "rw": "read", "ioengine": "rados"}]}, "ioengine must be one of"),
        ({"cases": [{"name": "a", "rw": "read", "iodepth": 0}]}, "iodepth must be between"),
        ({"cases": [{"name": "a", "rw": "read", "numjobs": "4"}]}, "numjobs must be a whole"),
        ({"cases": [{"name": "a", "rw": "read", "direct": "yes"}]}, "direct must be true or false"),
        ({"cases": [{"name": "a", "rw": "read", "direct": True, "bs": 1000}]}, "multiple of 512"),
        ({"cases": [{"name": "a;rm -rf /", "rw": "read"}]}, "case name"),
        ({"cases": [{"name": "a", "rw": "read", "runtime": 0}]}, "runtime must be between"),
        ({"cases": [{"name": "a"}]}, "'name' and 'rw' are required"),
        ({"cases": []}, "non-empty list"),
        ({"cases": [{"name": "a.b", "rw": "read"}, {"name": "a-b", "rw": "read"}]}, "same output"),
        ({"cases": [{"name": "a", "rw": "read"}], "overhead_case": "b"}, "overhead_case 'b'"),
        ({"cases": [{"name": "a", "rw": "read", "matrix": {"bs": []}}]}, "non-empty list"),
        ({"cases": [{"name": "a", "rw": "read", "matrix": {"colour": [1]}}]}, "unknown key"),
        ({"cases": [{"name": "a_{qd}", "rw": "read", "matrix": {"bs": ["4k"]}}]}, "template"),
        ([1, 2], "a spec is a mapping"),
    ],
)
def test_invalid_specs_are_refused_with_a_specific_message(raw, message):
    with pytest.raises(SpecError, match=message):
        parse_spec(raw)


def test_unreadable_and_malformed_spec_files(tmp_path: Path):
    with pytest.raises(SpecError, match="cannot read spec .*missing.yaml.*shipped: "):
        load_spec(tmp_path / "missing.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("cases: [\n")
    with pytest.raises(SpecError, match="not valid YAML"):
        load_spec(bad)


def test_user_spec_file_is_accepted(tmp_path: Path):
    path = tmp_path / "mine.yaml"
    path.write_text(yaml.safe_dump({"cases": [{"name": "r", "rw": "randread", "bs": "4k"}]}))
    spec = load_spec(path)
    assert spec.source == str(path) and spec.cases[0].bs == 4096


# Every YAML type in every place of a spec: a wrong one is a SpecError naming the place
# (exit 2 on the command line), never a TypeError or AttributeError from deeper down.
ANY_YAML = [["a"], {"a": 1}, 1, 1.5, True, None, "x", "", [[1]], [{"a": 1}], -1]


def _placed(raw_of, values=ANY_YAML):
    return [raw_of(v) for v in values]


@pytest.mark.parametrize(
    "raw",
    [
        *[
            raw
            for key in ("description", "defaults", "overhead_case", "cases")
            for raw in _placed(lambda v, k=key: {"cases": [{"name": "a", "rw": "read"}], k: v})
        ],
        *[
            raw
            for key in sorted(CASE_KEYS | {"matrix"})
            for raw in _placed(lambda v, k=key: {"cases": [{"name": "a", "rw": "read", k: v}]})
        ],
        *[
            raw
            for key in sorted(CASE_KEYS - {"name", "description"})
            for raw in _placed(
                lambda v, k=key: {"cases": [{"name": "a", "rw": "read", "matrix": {k: [v]}}]}
            )
        ],
        *[
            {"cases": [{"name": name, "rw": "read", "matrix": {"bs": ["4k"]}}]}
            for name in ("a_{bs.x}", "a_{bs[x]}", "a_{bs!z}", "a_{}", "a_{0}")
        ],
    ],
)
def test_a_value_of_any_yaml_type_anywhere_is_accepted_or_a_spec_error(raw):
    try:
        parse_spec(raw)
    except SpecError as exc:
        assert "\n" not in str(exc)


@pytest.mark.parametrize(
    ("key", "value", "message"),
    [
        ("overhead_case", ["a"], "'overhead_case' must be a case name, got ['a']"),
        ("overhead_case", {"a": 1}, "'overhead_case' must be a case name"),
        ("description", ["x"], "'description' must be a string"),
        ("defaults", ["x"], "'defaults' must be a mapping"),
        ("cases", "a", "'cases' must be a non-empty list"),
    ],
)
def test_a_top_level_key_of_the_wrong_type_is_named(key, value, message):
    raw = {"cases": [{"name": "a", "rw": "read"}], key: value}
    with pytest.raises(SpecError, match=re.escape(message)):
        parse_spec(raw)
