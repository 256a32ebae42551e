"""The calibration command: its plan (the pipeline's order), its statistics, the one reader
of the verdict's JSON, its refusals, and a small real calibration with its rescore."""

from __future__ import annotations

import doctest
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from checkpoint_compare import calibrate
from checkpoint_compare.calibrate import (
    CLASS_A,
    CLASS_B,
    COPY_OF_A,
    claim_of,
    plan,
    table,
    wilson,
)

ROOT = Path(__file__).resolve().parents[2]


def test_doctests():
    result = doctest.testmod(calibrate)
    assert result.attempted >= 6 and result.failed == 0


def test_plan_runs_each_profiles_repeats_back_to_back_then_the_next_profile():
    runs, comps = plan(2, 3, False, 0, False)
    assert [r.label for r in runs] == ["a"] * 3 + ["a2"] * 3 + ["b"] * 3 + ["a"] * 3 + [
        "a2"
    ] * 3 + ["b"] * 3
    assert [r.vac for r in runs[:9]] == [CLASS_A] * 6 + [CLASS_B] * 3
    assert [r.index for r in runs] == list(range(18))
    aa, ab, aa2, ab2 = comps
    # A/A: A, then the same class under a second name; A/B: that second block, then B.
    assert aa.kind == "aa" and aa.profiles == {CLASS_A: [0, 1, 2], COPY_OF_A: [3, 4, 5]}
    assert ab.kind == "ab" and ab.profiles == {CLASS_A: [3, 4, 5], CLASS_B: [6, 7, 8]}
    assert (aa.baseline, aa.candidate, ab.baseline, ab.candidate) == (
        CLASS_A, COPY_OF_A, CLASS_A, CLASS_B,
    )  # fmt: skip
    assert aa2.profiles[CLASS_A] == [9, 10, 11] and ab2.profiles[CLASS_B] == [15, 16, 17]
    assert [runs[i].repeat for i in range(9)] == [0, 1, 2] * 3


def test_plan_with_the_return_to_first_gives_each_baseline_its_return_runs():
    runs, (aa, ab) = plan(1, 2, True, 0, False)
    assert [r.vac for r in runs] == [CLASS_A] * 8 + [CLASS_B] * 2 + [CLASS_A] * 2
    assert aa.profiles == {CLASS_A: [0, 1, 4, 5], COPY_OF_A: [2, 3]}
    assert ab.profiles == {CLASS_A: [6, 7, 10, 11], CLASS_B: [8, 9]}
    # The return is a block of its own: --use-repeats 1 keeps its first run too.
    assert [runs[i].repeat for i in ab.profiles[CLASS_A]] == [0, 1, 0, 1]


def test_plan_with_cycles_alternates_the_profiles_each_pass_a_block_of_its_own():
    # As the pipeline given the profiles [A, B, A, B]: no run serves two comparisons.
    runs, (aa, ab) = plan(1, 2, False, 0, False, 2)
    assert [r.label for r in runs] == ["a", "a", "a2", "a2"] * 2 + ["a", "a", "b", "b"] * 2
    assert aa.profiles == {CLASS_A: [0, 1, 4, 5], COPY_OF_A: [2, 3, 6, 7]}
    assert ab.profiles == {CLASS_A: [8, 9, 12, 13], CLASS_B: [10, 11, 14, 15]}
    assert [runs[i].vac for i in ab.profiles[CLASS_B]] == [CLASS_B] * 4
    assert [runs[i].vac for i in aa.profiles[COPY_OF_A]] == [CLASS_A] * 4
    assert [runs[i].repeat for i in ab.profiles[CLASS_A]] == [0, 1, 0, 1]
    # The return adds one more block of the first profile after the last pass.
    runs, (aa, ab) = plan(1, 1, True, 0, False, 2)
    assert [r.label for r in runs] == ["a", "a2", "a", "a2", "a", "a", "b", "a", "b", "a"]
    assert aa.profiles == {CLASS_A: [0, 2, 4], COPY_OF_A: [1, 3]}
    assert ab.profiles == {CLASS_A: [5, 7, 9], CLASS_B: [6, 8]}
    # One cycle is the plan without cycles.
    assert plan(2, 2, True, 3, True, 1) == plan(2, 2, True, 3, True)


def test_plan_of_one_kind_runs_only_that_kind_a_round_its_two_profiles():
    # A/A only: a round is A then A' (no B block spent on an A/B that is not wanted).
    runs, comps = plan(2, 2, False, 0, False, comparisons="aa")
    assert [r.label for r in runs] == ["a", "a", "a2", "a2"] * 2
    assert [r.vac for r in runs] == [CLASS_A] * 8
    assert [(c.kind, c.round, c.profiles) for c in comps] == [
        ("aa", 0, {CLASS_A: [0, 1], COPY_OF_A: [2, 3]}),
        ("aa", 1, {CLASS_A: [4, 5], COPY_OF_A: [6, 7]}),
    ]
    # A/B only: A then B.
    runs, (ab,) = plan(1, 2, False, 0, False, comparisons="ab")
    assert [r.vac for r in runs] == [CLASS_A] * 2 + [CLASS_B] * 2
    assert ab.kind == "ab" and ab.profiles == {CLASS_A: [0, 1], CLASS_B: [2, 3]}
    # With the return and with profiles that alternate, each comparison as in both kinds.
    runs, (aa,) = plan(1, 1, True, 0, False, comparisons="aa")
    assert [r.label for r in runs] == ["a", "a2", "a"]
    assert aa.profiles == {CLASS_A: [0, 2], COPY_OF_A: [1]}
    runs, (aa,) = plan(1, 2, False, 0, False, 2, comparisons="aa")
    assert [r.label for r in runs] == ["a", "a", "a2", "a2"] * 2
    assert aa.profiles == {CLASS_A: [0, 1, 4, 5], COPY_OF_A: [2, 3, 6, 7]}
    assert [c.profiles for c in plan(1, 2, False, 0, False, 2, comparisons="ab")[1]] == [
        p for c in plan(1, 2, False, 0, False, 2)[1] if c.kind == "ab"
        for p in [{k: [i - 8 for i in v] for k, v in c.profiles.items()}]
    ]  # fmt: skip
    # Both kinds is the plan as it was.
    assert plan(2, 2, True, 3, True, 2, comparisons="both") == plan(2, 2, True, 3, True, 2)
    with pytest.raises(ValueError, match="comparisons"):
        plan(1, 2, False, 0, False, comparisons="ba")


def test_the_neighbour_is_drawn_from_the_seed_for_about_half_of_the_runs():
    first = [r.noise for r in plan(50, 2, False, 7, True)[0]]
    again = [r.noise for r in plan(50, 2, False, 7, True)[0]]
    other = [r.noise for r in plan(50, 2, False, 8, True)[0]]
    assert first == again and first != other
    assert 0.35 < sum(first) / len(first) < 0.65
    assert not any(r.noise for r in plan(50, 2, False, 7, False)[0])


@pytest.mark.parametrize(
    ("k", "n", "low", "high"),
    [(0, 20, 0.0, 0.1611), (19, 20, 0.7639, 0.9911), (5, 10, 0.2366, 0.7634),
     (1, 100, 0.0018, 0.0545)],
)  # fmt: skip
def test_wilson_interval_matches_the_textbook(k, n, low, high):
    got = wilson(k, n)
    assert got == (pytest.approx(low, abs=1e-4), pytest.approx(high, abs=1e-4))
    assert wilson(0, 0) is None


def test_claim_of_reads_the_one_schema_and_the_documents_before_it():
    three = {"profiles": {"a": {"difference": None},
                          "b": {"difference": {"claimed": False, "direction": "better"}}}}  # fmt: skip
    assert claim_of(three, "b") == (False, "none")
    two = {"profiles": {"b": {"cost": {}}}, "comparisons": [
        {"candidate": "b", "pause": {"counts": True, "estimate": -0.2},
         "runtime": {"counts": False, "estimate": 0.5}},
    ]}  # fmt: skip
    assert claim_of(two, "b") == (True, "better")
    two["comparisons"][0]["runtime"]["counts"] = True
    assert claim_of(two, "b") == (True, "worse")
    dump = {"profiles": [{"profile": "a"}, {"profile": "b", "significant": False}]}
    assert claim_of(dump, "b") == (False, "none")
    with pytest.raises(ValueError, match="no difference for profile 'c'"):
        claim_of(three, "c")


def _manifest(scores: list[tuple[str, dict]]) -> dict:
    return {
        "started_at": "2026-12-04T09:00:00Z",
        "finished_at": "2026-12-04T10:00:00Z",
        "machine": {"host": "vm", "cpus": 2, "load_average": [9.0, 9.0, 9.0]},
        "volume": "loop volume",
        "revision": "abc",
        "settings": {
            "repeats": 2,
            "return_to_first": False,
            "noise": "writer",
            "confidence": 0.95,
        },  # fmt: skip
        "workloads": {
            "checkpoint": {
                "runs": [],
                "comparisons": [
                    {"index": i, "kind": kind, "score": score}
                    for i, (kind, score) in enumerate(scores)
                ],
            }
        },  # fmt: skip
    }


def test_the_table_counts_false_claims_detections_wrong_ways_and_what_was_not_judged():
    no = {"status": "scored", "claimed": False, "direction": "none"}
    better = {"status": "scored", "claimed": True, "direction": "better"}
    worse = {"status": "scored", "claimed": True, "direction": "worse"}
    text = table(_manifest([
        ("aa", no), ("aa", worse), ("aa", no), ("aa", no),
        ("ab", better), ("ab", worse), ("ab", no), ("ab", better),
        ("ab", {"status": "refused", "exit_code": 3, "error": "x"}),
        ("aa", {"status": "run failed", "run": 3}),
    ]))  # fmt: skip
    assert "A/A false claims (goal ≤ 5%): 1/4 = 25%" in text
    assert "A/B detected (goal ≥ 95%): 2/4 = 50%" in text
    assert text.count("GOAL NOT MET") == 2
    assert "1 called the faster class worse" in text
    assert "ab refused: 1" in text and "aa run failed: 1" in text
    clean = table(_manifest([("aa", no)] * 80 + [("ab", better)] * 80))
    assert "0/80 = 0% (95% Wilson 0%–5%): goal shown" in clean
    assert "80/80 = 100% (95% Wilson 95%–100%): goal shown" in clean
    few = table(_manifest([("aa", no)] * 3))
    assert "goal met (not yet shown)" in few
    assert "the verdict (whole run)" not in few  # scores of a verdict that did not say
    assert "repeats 2, noise writer" in few  # a manifest from before cycles: once each
    cycled = _manifest([("aa", no)])
    cycled["settings"] |= {"cycles": 2, "return_to_first": True}
    assert "repeats 2 + return to first, the profiles 2 times over (A B A B …)" in table(cycled)
    cycled["settings"]["comparisons"] = "aa"
    assert "(A B A B …), A/A comparisons only, noise writer" in table(cycled)


def test_the_table_says_how_often_the_whole_verdict_kept_a_profile():
    def scored(claimed: bool, direction: str, kept: str) -> dict:
        return {"status": "scored", "claimed": claimed, "direction": direction, "verdict": kept}

    text = table(_manifest([
        ("aa", scored(False, "none", "no measurable difference")),
        ("aa", scored(True, "worse", CLASS_A)),
        ("ab", scored(True, "better", CLASS_B)),
        ("ab", scored(True, "better", "no measurable difference")),
    ]))  # fmt: skip
    assert "A/B detected (goal ≥ 95%): 2/2" in text
    assert (
        "the verdict (whole run) kept a profile in 1 A/A and kept the faster class in 1 A/B" in text
    )


def _cli(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "checkpoint_compare.calibrate", *args],
        capture_output=True, text=True, cwd=cwd, timeout=900,
    )  # fmt: skip


@pytest.mark.parametrize(
    ("args", "message"),
    [(["--use-repeats", "1", "--out", "{tmp}/new"], "--use-repeats and --regroup go with --rescore"),
     (["--regroup", "3", "--out", "{tmp}/new"], "--use-repeats and --regroup go with --rescore"),
     (["--out", "{tmp}/full"], "exists and is not empty"),
     (["--pairs", "0", "--out", "{tmp}/new"], "--pairs and --repeats must be at least 1"),
     (["--cycles", "0", "--out", "{tmp}/new"], "--cycles must be at least 1, not 0"),
     (["--confidence", "1.5", "--out", "{tmp}/new"], "--confidence must be in (0, 1)"),
     (["--rescore", "{tmp}/full"], "cannot read"),
     (["--rescore", "{tmp}/full", "--out", "{tmp}/new"], "do not go together"),
     (["--volume", "{tmp}/missing", "--out", "{tmp}/new"], "not a directory"),
     (["--comparisons", "ab", "--volume", "{tmp}", "--out", "{tmp}/new"],
      "--comparisons ab needs the emulated classes"),
     ([], "--out DIR is needed")],
)  # fmt: skip
def test_bad_arguments_are_one_line_and_exit_2(tmp_path, args, message):
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "kept.json").write_text("{}")
    done = _cli(*(a.format(tmp=tmp_path) for a in args))
    assert done.returncode == 2, done.stderr
    assert done.stderr.startswith("calibrate: ") and message in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1
    assert (tmp_path / "full" / "kept.json").read_text() == "{}"


@pytest.mark.slow
def test_a_small_a_a_calibration_on_a_directory_is_scored_and_rescored(tmp_path):
    plain = tmp_path / "disk"
    plain.mkdir()
    out = tmp_path / "cal"
    done = _cli("--workload", "workspace", "--pairs", "1", "--files", "8", "--rounds", "3",
                "--volume", str(plain), "--comparisons", "aa", "--out", str(out))  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "A/A comparisons only" in done.stdout
    assert "workspace:" in done.stdout and "A/A false claims (goal ≤ 5%):" in done.stdout
    assert "A/B detected" not in done.stdout  # no second class on a plain directory
    manifest = json.loads((out / "manifest.json").read_text())
    runs = manifest["workloads"]["workspace"]["runs"]
    assert [(r["label"], r["exit_code"]) for r in runs] == [("a", 0)] * 2 + [("a2", 0)] * 2
    (comp,) = manifest["workloads"]["workspace"]["comparisons"]
    assert comp["kind"] == "aa" and comp["score"]["status"] == "scored"
    verdict = json.loads((out / "workspace" / "verdict-0000.json").read_text())
    assert claim_of(verdict, COPY_OF_A) == (comp["score"]["claimed"], comp["score"]["direction"])
    assert list(plain.iterdir()) == []  # its scratch directory is gone
    # Rescored from the kept summaries with one run a side: nothing runs again.
    again = _cli("--rescore", str(out), "--use-repeats", "1")
    assert again.returncode == 0, again.stderr
    assert "use_repeats': 1" in again.stdout
    (rescored,) = out.glob("rescore-*")
    assert (
        json.loads((rescored / "manifest.json").read_text())["workloads"]["workspace"][
            "comparisons"
        ][0]["score"]["status"]
        == "scored"
    )
    one_a_side = json.loads((rescored / "workspace" / "verdict-0000.json").read_text())
    assert [len(p["runs"]) for p in one_a_side["profiles"].values()] == [1, 1]
    # What the runs were first judged with is kept as it was.
    assert json.loads((out / "manifest.json").read_text()) == manifest
    assert json.loads((out / "workspace" / "verdict-0000.json").read_text()) == verdict


def _can_make_loop_volumes() -> bool:
    return (
        os.geteuid() == 0
        and shutil.which("losetup") is not None
        and Path("/dev/loop-control").exists()
    )


@pytest.mark.skipif(not _can_make_loop_volumes(), reason="needs root and loop devices")
def test_the_emulation_holds_each_class_limits_and_leaves_nothing_behind():
    from localcluster.emulation import loop_volume

    where = calibrate.LoopEmulation(64 * 1024 * 1024)
    try:
        for vac in (CLASS_B, CLASS_A):
            where.set_class(vac)
            assert loop_volume.read_limits(where.volume, where.cgroup) == where.limits[vac]
        assert where.limits[CLASS_B].write_bps == 2 * where.limits[CLASS_A].write_bps
        assert where.wrap(["true"])[-1] == "true"
        backing, cgroup = where.volume.backing_file, where.cgroup
    finally:
        where.close()
    assert not backing.exists() and not cgroup.exists()
    assert not os.path.ismount(where.mount_point)


def test_runs_use_one_committed_snapshot_of_the_workloads_code(tmp_path):
    # Other commits may land while a calibration runs, and the trainer records its
    # revision: every run gets the tree committed at the start, under one revision.
    code = calibrate.snapshot(tmp_path / "code")
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True,
                          text=True, check=True).stdout.strip()  # fmt: skip
    assert code.revision is not None and len(code.revision) == 40
    assert (
        code.revision == head
        or subprocess.run(
            ["git", "merge-base", "--is-ancestor", code.revision, head], cwd=ROOT
        ).returncode
        == 0
    )  # a commit by someone else may land in between
    for package in ("trainer", "data_workloads", "checkpoint_storage_bench"):
        assert (tmp_path / "code" / package / "__init__.py").is_file()
    env = code.env()
    assert env["CODE_REVISION"] == code.revision
    assert env["PYTHONPATH"].split(os.pathsep)[0] == str(tmp_path / "code")
    assert code.cwd == str(tmp_path / "code")
    found = subprocess.run(
        [sys.executable, "-c", "import trainer; print(trainer.__file__)"],
        env=env, cwd=code.cwd, capture_output=True, text=True, check=True,
    )  # fmt: skip
    assert found.stdout.strip().startswith(str(tmp_path / "code"))


def test_help_and_docs_list_every_exit_code():
    done = _cli("--help")
    assert done.returncode == 0
    docs = (ROOT / "docs" / "compare.md").read_text()
    for code, text in calibrate.EXIT_CODES.items():
        assert f"{code}  {text}" in done.stdout
        assert f"| `{code}` | {text} |" in docs
