"""Following a pipeline (sandbox/pipeline.py): the runs table URL, the nested runs' labels,
`follow` and its timeout, the comparison text, and the verdict re-run with the compare
op's joined runs and budget."""

from __future__ import annotations

import base64
import json

import pytest

from sandbox.pipeline import comparison, runs_table_url


def test_comparison_lists_each_profile_with_its_fio_headline():
    from polyaxon.schemas import V1Run

    ops = [
        V1Run(name="fio-baseline", outputs={"fio_seqwrite_bw_mbps": 120.5}),
        V1Run(name="train-baseline", inputs={"storage_profile": "checkpoint-baseline"},
              outputs={"ckpt_pause_s_total": 1.5, "ckpt_pause_s_median": 0.5,
                       "ckpt_write_s_median": 0.4, "runtime_s": 10.0, "final_loss": 2.5}),
        V1Run(name="train-throughput", inputs={"storage_profile": "checkpoint-throughput"},
              outputs={"ckpt_pause_s_total": 0.5, "runtime_s": 9.0}),
    ]  # fmt: skip
    text = comparison(ops)
    assert "profile checkpoint-baseline (train-baseline)" in text
    assert "fio_seqwrite_bw_mbps = 120.5 MB/s" in text
    assert "write 0.400s" in text and "final loss:       2.5000" in text
    assert "profile checkpoint-throughput" in text
    assert comparison([V1Run(name="x", outputs={})]).startswith("no training run")


def test_runs_table_url_selects_columns_and_pipeline():
    url = runs_table_url("http://h:1", "default", "p", "abc")
    token = url.split("search=")[1].replace("%3D", "=")
    search = json.loads(base64.b64decode(token))
    assert search["query"] == "controller:abc, kind:job"  # every job, however deeply nested
    assert "in.storage_profile" in search["columns"].split(",")
    url = runs_table_url("http://h:1", "default", "p", "abc", name="train")
    search = json.loads(base64.b64decode(url.split("search=")[1].replace("%3D", "=")))
    assert search["query"] == "controller:abc, kind:job, name:train"


def test_a_data_workloads_runs_table_shows_its_own_figures_not_the_trainings():
    from checkpoint_storage_bench.contract import DATA_WORKLOAD_OUTPUTS
    from sandbox.pipeline import TABLE_COLUMNS, table_columns

    assert table_columns("checkpoint") == TABLE_COLUMNS
    for workload, outputs in DATA_WORKLOAD_OUTPUTS.items():
        columns = table_columns(workload)
        figures = [c.removeprefix("out.") for c in columns if c.startswith("out.")]
        assert not any(f.startswith("ckpt_") for f in figures), columns
        # Every figure one the workload logs, beside the fio bandwidth and the recommendation.
        assert set(figures) - set(outputs) == {"fio_seqwrite_1m_bw_mbps", "recommended_profile"}
        assert columns[:2] == ("name", "in.storage_profile")


def test_follow_stops_a_pipeline_that_outlives_its_timeout(monkeypatch):
    from polyaxon.schemas import V1Run

    from sandbox import pipeline
    from sandbox.errors import FollowTimeoutError

    stopped = []
    monkeypatch.setattr(pipeline, "get_run", lambda c, o, p, uuid: V1Run(
        uuid=uuid, name="p", status="running"))  # fmt: skip
    monkeypatch.setattr(pipeline, "pipeline_ops", lambda *_: [
        V1Run(uuid="1" * 32, name="train", status="running")])  # fmt: skip
    monkeypatch.setattr(pipeline, "stop_run", lambda c, o, p, uuid: stopped.append(uuid))
    with pytest.raises(FollowTimeoutError, match="still running after 0s; stopped it") as err:
        pipeline.follow(None, "default", "p", "a" * 32, 0.05, echo=lambda _: None, every=0.02)
    assert stopped == ["a" * 32]
    assert err.value.exit_code == 7


def U(key: str) -> str:
    """A run uuid for a short test name (the SDK checks that uuids are uuids)."""
    import uuid

    return uuid.uuid5(uuid.NAMESPACE_URL, key).hex


def _run(key, name, kind, parent=None, **kw):
    from polyaxon.schemas import V1Run

    pipeline = {"uuid": U(parent), "name": "x"} if parent else None
    return V1Run(uuid=U(key), name=name, kind=kind, pipeline=pipeline, **kw)


T0 = 1_700_000_000  # started_at, seconds: the order the runs ran in


def _at(minute: int) -> dict:
    from datetime import UTC, datetime

    return {"started_at": datetime.fromtimestamp(T0 + 60 * minute, tz=UTC)}


# The tree the CE server makes for checkpoint-storage-profiles with two profiles and two
# repeats: plan, stages (a mapping of stage DAGs), each with switch, fio and a mapping of
# training runs; compare and release. "r" is the submitted pipeline (the controller). In
# creation order: the server creates every stage's switch and fio ahead of running them.
NESTED = [
    _run("p", "plan", "job", "r", **_at(0)),
    _run("m", "stages", "matrix", "r"),
    _run("s0", "stages", "dag", "m", inputs={"profile": "checkpoint-baseline", "stage": 0}),
    _run("w0", "switch", "job", "s0", **_at(1)),
    _run("f0", "fio", "job", "s0", outputs={"fio_seqwrite_1m_bw_mbps": 131.0}, **_at(2)),
    _run("s1", "stages", "dag", "m", inputs={"profile": "checkpoint-throughput", "stage": 1}),
    _run("w1", "switch", "job", "s1", **_at(5)),
    _run("f1", "fio", "job", "s1", outputs={"fio_seqwrite_1m_bw_mbps": 262.0}, **_at(6)),
    _run("t0", "train", "matrix", "s0"),
    _run("t00", "train", "job", "t0", inputs={"repeat": 0, "storage_profile": "checkpoint-baseline"},
         outputs={"ckpt_pause_s_total": 6.0, "ckpt_pause_s_median": 0.7}, **_at(3)),
    _run("t01", "train", "job", "t0", inputs={"repeat": 1, "storage_profile": "checkpoint-baseline"},
         outputs={"ckpt_pause_s_total": 6.2, "ckpt_pause_s_median": 0.72}, **_at(4)),
    _run("t1", "train", "matrix", "s1"),
    _run("t10", "train", "job", "t1", inputs={"repeat": 0, "storage_profile": "checkpoint-throughput"},
         outputs={"ckpt_pause_s_total": 3.0, "ckpt_pause_s_median": 0.4}, **_at(7)),
    _run("c", "compare", "job", "r", **_at(8)),
    _run("l", "release", "job", "r", **_at(9)),
]  # fmt: skip


def test_labels_follow_the_nesting_and_name_each_mapping_run():
    from sandbox.pipeline import labels

    names = labels(NESTED, U("r"))
    assert names[U("p")] == "plan" and names[U("c")] == "compare"
    assert names[U("s0")] == "stages[0] checkpoint-baseline"
    assert names[U("s1")] == "stages[1] checkpoint-throughput"
    assert names[U("f1")] == "stages[1]/fio"
    assert names[U("t01")] == "stages[0]/train[1]"
    assert names[U("t10")] == "stages[1]/train[0]"
    # A run whose parent is not in the list (or the root itself) is named by itself.
    assert labels([_run("x", "switch", "job", "elsewhere")], U("r")) == {U("x"): "switch"}


def test_follow_prints_every_nested_run_once_per_status_and_no_matrix_line(monkeypatch):
    from polyaxon.schemas import V1Run

    from sandbox import pipeline

    states = iter(["running", "succeeded"])
    monkeypatch.setattr(pipeline, "get_run", lambda c, o, p, uuid: V1Run(
        uuid=uuid, name="checkpoint-storage-profiles", status=next(states)))  # fmt: skip
    queries = []

    def runs(c, o, p, query=None):
        queries.append(query)
        return [r.model_copy(update={"status": "succeeded"}) for r in NESTED]

    monkeypatch.setattr(pipeline, "list_runs", runs)
    lines: list[str] = []
    ops = pipeline.follow(None, "default", "p", U("r"), 60, echo=lines.append, every=0.01)
    assert queries == [f"controller:{U('r')}"] * 2  # the whole tree, not the children
    assert len(ops) == len(NESTED)
    assert len(lines) == len(NESTED) - 3  # one line per run, none for the three matrices
    assert any(line.split() == ["stages[0]/train[1]", "succeeded"] for line in lines)


def test_the_comparison_pairs_each_training_run_with_its_stages_fio_sweep():
    text = comparison(NESTED)
    blocks = text.split("profile ")[1:]
    assert len(blocks) == 3  # every training run, repeats included
    assert blocks[0].startswith("checkpoint-baseline") and "131.0 MB/s" in blocks[0]
    assert "131.0 MB/s" in blocks[1]  # the second repeat: the same stage's sweep
    assert blocks[2].startswith("checkpoint-throughput") and "262.0 MB/s" in blocks[2]


def test_the_verdict_is_rerun_with_the_compare_ops_joined_runs_and_budget():
    from sandbox.commands import last_job, recommendation_lines, verdict_args

    compare = _run("c", "compare", "job", "r", inputs={
        "runs": [U("w0"), U("f0"), U("t00")], "profiles": ["a", "b", "c", "a"], "max_pause_s": 0.6,
        "checkpoints_per_month": 2000.0, "gpu_hourly": None, "allow_resumed": False},
        outputs={"verdict": "c is faster", "recommended_profile": "b",
                 "recommendation_reason": "b meets the budget and is the cheapest"})  # fmt: skip
    assert last_job([*NESTED[:-2], compare, NESTED[-1]], "compare") is compare
    assert last_job(NESTED[:3], "compare") is None
    assert verdict_args(compare) == [
        f"--run={U('w0')}", f"--run={U('f0')}", f"--run={U('t00')}", "--baseline=a", "--expect=a", "--expect=b",
        "--expect=c", "--max-pause-s=0.6", "--checkpoints-per-month=2000.0",
    ]  # fmt: skip
    assert verdict_args(_run("c", "compare", "job", "r", inputs={})) is None
    # Once it ran, the verdict records the profiles it compared as one string in the input.
    for recorded in ("a,b,c", '["a", "b", "c"]'):
        ran = compare.model_copy(update={"inputs": {"runs": ["x"], "profiles": recorded}})
        assert verdict_args(ran)[1:] == ["--baseline=a", "--expect=a", "--expect=b", "--expect=c"]
    lines = recommendation_lines(compare)
    assert "  recommended profile: b" in lines and any("cheapest" in line for line in lines)
    assert recommendation_lines(None) == ["the pipeline's compare op left no verdict"]


def test_the_demo_prints_what_the_plan_said_before_any_switch():
    from sandbox.commands import plan_lines

    said = {"answerable": True, "answer_limits": "", "answer_notes": "not calibrated; steadier"}
    plan = _run("p", "plan", "job", "r", outputs=said)
    assert plan_lines(plan) == [
        "what the pipeline's plan said before any switch:",
        "  notes: not calibrated; steadier",
    ]
    limited = plan.model_copy(update={"outputs": {**said, "answer_limits": "repeats 1: one run"}})
    assert plan_lines(limited)[1] == "  limits: repeats 1: one run"
    quiet = plan.model_copy(update={"outputs": {"answer_limits": "", "answer_notes": ""}})
    assert plan_lines(quiet) == [] and plan_lines(None) == []
