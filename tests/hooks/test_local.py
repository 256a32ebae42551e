"""``--backend local``: sandbox profiles are directories; the claim path is a symlink; a
profile that names a VolumeAttributesClass is emulated by block-I/O limits in the claim's
cgroup (those tests need root and a block-I/O controller: they skip with one line
elsewhere, never when ``CI`` is set)."""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path

import pytest
import yaml

from hooks.storage_profile.local import SandboxProfiles, repoint
from localcluster.emulation.io_limits import MIB, ThrottleUnavailable, probe
from tests.hooks.helpers import load_summary, run_hook

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def sandbox(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A sandbox root with the shipped media profiles, its tmpfs profile moved under tmp."""
    root = tmp_path / "sandbox"
    (root / "connections").mkdir(parents=True)
    spec = yaml.safe_load((ROOT / "connections" / "sandbox-profiles-media.yaml").read_text())
    spec["profiles"]["checkpoint-throughput"]["path"] = str(tmp_path / "shm" / "media")
    (root / "connections" / "sandbox-profiles.yaml").write_text(yaml.safe_dump(spec))
    (root / ".sandbox" / "media" / "disk").mkdir(parents=True)
    (tmp_path / "shm" / "media").mkdir(parents=True)
    monkeypatch.setenv("SANDBOX_ROOT", str(root))
    return root


def local(*extra: str, to: str = "checkpoint-throughput", claim: str = "training-checkpoints"):
    return run_hook(
        "switch", "--backend", "local", "-n", "sandbox", "--claim", claim, "--to", to, *extra
    )


def test_shipped_profiles_files_match_the_contract():
    # The default emulates the cluster's classes, from the cluster's own manifests.
    loaded = SandboxProfiles.load(ROOT / "connections" / "sandbox-profiles.yaml", root=ROOT)
    assert (loaded.claim, loaded.namespace) == ("training-checkpoints", "sandbox")
    assert loaded.claim_path == ROOT / ".sandbox/claims/training-checkpoints"
    assert loaded.classes_file == ROOT / "connections" / "vac-ebs-gp3.yaml"
    base, fast = loaded.profiles["checkpoint-baseline"], loaded.profiles["checkpoint-throughput"]
    assert base.path == fast.path == ROOT / ".sandbox/volumes/training-checkpoints"
    assert base.class_parameters == {"type": "gp3", "iops": "3000", "throughput": "125"}
    assert (base.limits.write_bps, base.limits.write_iops) == (125 * MIB, 3000)
    assert (fast.limits.read_bps, fast.limits.read_iops) == (250 * MIB, 6000)
    assert base.driver == "ebs.csi.aws.com" and loaded.emulated
    # The fallback is two plain media.
    media = SandboxProfiles.load(ROOT / "connections" / "sandbox-profiles-media.yaml", root=ROOT)
    assert media.profiles["checkpoint-baseline"].path == ROOT / ".sandbox/media/disk"
    assert media.profiles["checkpoint-throughput"].path == Path("/dev/shm/checkpoint-bench/media")
    assert not media.emulated


def test_switch_repoints_the_claim_and_reports(sandbox: Path, tmp_path: Path):
    link = sandbox / ".sandbox" / "claims" / "training-checkpoints"
    first = local(to="checkpoint-baseline")
    assert first.exit_code == 0, first.output
    assert link.is_symlink() and link.resolve() == sandbox / ".sandbox" / "media" / "disk"

    summary = tmp_path / "s.json"
    second = local("--summary-json", str(summary))
    assert second.exit_code == 0, second.output
    assert link.resolve() == tmp_path / "shm" / "media"
    data = load_summary(summary)
    assert data["driver"] == "local" and data["backend"] == "local"
    assert data["volume_handle"] == str(tmp_path / "shm" / "media")
    assert (data["previous_class"], data["applied_class"]) == (
        "checkpoint-baseline",
        "checkpoint-throughput",
    )
    assert data["outcome"] == "settled" and data["k8s_settle_s"] is not None
    assert data["class_parameters"]["description"] == "tmpfs (memory)"
    # Files written through the claim land in the profile's directory.
    (link / "ckpt").write_text("x")
    assert (tmp_path / "shm" / "media" / "ckpt").read_text() == "x"

    again = local("--summary-json", str(summary))
    assert again.exit_code == 0
    assert load_summary(summary)["outcome"] == "already-settled"


def test_repoint_is_atomic(tmp_path: Path):
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir()
    b.mkdir()
    link = tmp_path / "claims" / "c"
    repoint(link, a)
    missing = []
    stop = threading.Event()

    def reader() -> None:
        while not stop.is_set():
            try:
                os.readlink(link)
            except FileNotFoundError:
                missing.append(1)

    thread = threading.Thread(target=reader)
    thread.start()
    for i in range(300):
        repoint(link, b if i % 2 == 0 else a)
    stop.set()
    thread.join()
    assert missing == []
    assert os.readlink(link) == str(a)
    assert sorted(p.name for p in link.parent.iterdir()) == ["c"]  # no temp links left


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (dict(to="checkpoint-nvme"), "unknown sandbox profile checkpoint-nvme"),
        (dict(claim="other"), "the sandbox has claim sandbox/training-checkpoints"),
    ],
)
def test_refusals(sandbox: Path, args: dict, message: str):
    result = local(**args)
    assert result.exit_code == 3, result.output
    assert message in result.stderr


def test_missing_profile_directory_is_refused(sandbox: Path, tmp_path: Path):
    (tmp_path / "shm" / "media").rmdir()
    result = local()
    assert result.exit_code == 3
    assert "of profile checkpoint-throughput does not exist" in result.stderr
    assert not (sandbox / ".sandbox" / "claims" / "training-checkpoints").exists()


def test_a_real_directory_at_the_claim_path_is_never_replaced(sandbox: Path):
    claim = sandbox / ".sandbox" / "claims" / "training-checkpoints"
    claim.mkdir(parents=True)
    (claim / "data").write_text("keep")
    result = local()
    assert result.exit_code == 3
    assert (claim / "data").read_text() == "keep"


def test_missing_profiles_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("SANDBOX_ROOT", str(tmp_path))
    result = local()
    assert result.exit_code == 3
    assert "cannot read profiles file" in result.stderr


def test_dry_run_changes_nothing(sandbox: Path):
    result = local("--dry-run")
    assert result.exit_code == 0, result.output
    assert "would point" in result.stderr
    assert not (sandbox / ".sandbox" / "claims" / "training-checkpoints").exists()


def test_status_local(sandbox: Path):
    assert local(to="checkpoint-baseline").exit_code == 0
    result = run_hook(
        "status",
        "--backend",
        "local",
        "-n",
        "sandbox",
        "--claim",
        "training-checkpoints",
        "--output",
        "json",
    )
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["currentProfile"] == "checkpoint-baseline"
    assert data["profiles"]["checkpoint-throughput"]["exists"] is True
    assert data["limits"]["summary"] == "no limit"
    assert data["profiles"]["checkpoint-baseline"]["volumeAttributesClass"] is None
    text = run_hook(
        "status", "--backend", "local", "-n", "sandbox", "--claim", "training-checkpoints"
    )
    assert "current        checkpoint-baseline" in text.stdout
    # The block names the limits in force too (none on plain media).
    assert "  limits         no limit" in text.stdout.splitlines()


def test_a_malformed_profiles_file_is_refused_like_the_sandbox_refuses_it(tmp_path: Path):
    # The same parser (checkpoint_storage_bench.contract) and the same message as
    # `python -m sandbox`; here it is a preflight refusal.
    bad = tmp_path / "profiles.yaml"
    bad.write_text(yaml.safe_dump({"claim": "training-checkpoints", "namespace": "sandbox",
                                   "claimPath": "c", "profiles": {"a": {}}}))  # fmt: skip
    result = local("--profiles-file", str(bad))
    assert result.exit_code == 3, result.output
    assert f"profiles file {bad}: profile a needs a path" in result.stderr


def test_a_relative_sandbox_root_still_makes_a_link_that_resolves(
    sandbox: Path, monkeypatch: pytest.MonkeyPatch
):
    # With SANDBOX_ROOT relative, a link target written relative too would resolve against
    # the link's own directory: dangling, yet reported settled.
    monkeypatch.chdir(sandbox.parent)
    monkeypatch.setenv("SANDBOX_ROOT", sandbox.name)
    result = local(to="checkpoint-baseline")
    assert result.exit_code == 0, result.output
    link = sandbox / ".sandbox" / "claims" / "training-checkpoints"
    assert link.resolve(strict=True) == sandbox / ".sandbox" / "media" / "disk"
    (link / "written-through-the-claim").write_text("x")
    assert (sandbox / ".sandbox" / "media" / "disk" / "written-through-the-claim").exists()


def test_a_switch_that_leaves_a_dangling_link_is_not_reported_settled(
    sandbox: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
):
    from hooks.storage_profile import local as local_backend

    monkeypatch.setattr(
        local_backend, "repoint", lambda link, target: repoint(link, Path("nowhere"))
    )
    summary = tmp_path / "s.json"
    result = local("--summary-json", str(summary), to="checkpoint-baseline")
    assert result.exit_code == 1, result.output
    assert "does not lead to" in result.stderr
    assert load_summary(summary)["outcome"] != "settled"


# -- emulated classes: block-I/O limits in the claim's cgroup ------------------------------


def _emulated_root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A sandbox root whose profiles emulate the shipped gp3 classes on tmp_path's disk."""
    root = tmp_path / "sandbox"
    (root / "connections").mkdir(parents=True)
    spec = yaml.safe_load((ROOT / "connections" / "sandbox-profiles.yaml").read_text())
    # The shipped classes files (one, or a list), made absolute for the copied profiles file.
    files = spec["classesFile"]
    files = [files] if isinstance(files, str) else files
    spec["classesFile"] = [str(ROOT / "connections" / f) for f in files]
    (root / "connections" / "sandbox-profiles.yaml").write_text(yaml.safe_dump(spec))
    (root / ".sandbox" / "volumes" / "training-checkpoints").mkdir(parents=True)
    monkeypatch.setenv("SANDBOX_ROOT", str(root))
    return root


@pytest.fixture
def emulated(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """The emulated sandbox, where the kernel can throttle; its cgroup removed at the end."""
    root = _emulated_root(tmp_path, monkeypatch)
    profiles = SandboxProfiles.load()
    try:
        group, _ = probe(root / ".sandbox" / "volumes", profiles.cgroup_name)
    except ThrottleUnavailable as exc:
        if os.environ.get("CI"):
            pytest.fail(f"CI must be able to throttle block I/O: {exc}")
        pytest.skip(f"needs root and a block-I/O controller: {exc}")
    try:
        yield root, group
    finally:
        group.remove()


def test_a_switch_sets_the_classes_limits_and_reads_them_back(emulated, tmp_path: Path):
    root, group = emulated
    summary = tmp_path / "s.json"
    first = local("--summary-json", str(summary), to="checkpoint-baseline")
    assert first.exit_code == 0, first.output
    data = load_summary(summary)
    assert data["driver"] == "local-throttled" and data["outcome"] == "settled"
    # The class's own parameters (the verdict prices the profile from them).
    assert data["class_parameters"] == {"type": "gp3", "iops": "3000", "throughput": "125"}
    ((device, limits),) = group.limits().items()  # read back from the kernel
    assert (limits.write_bps, limits.read_bps, limits.write_iops) == (125 * MIB, 125 * MIB, 3000)
    assert any("token bucket" in n for n in data["notes"])

    second = local("--summary-json", str(summary), to="checkpoint-throughput")
    assert second.exit_code == 0, second.output
    data = load_summary(summary)
    assert (data["previous_class"], data["applied_class"]) == (
        "checkpoint-baseline",
        "checkpoint-throughput",
    )
    assert group.limits()[device].write_bps == 250 * MIB
    assert group.limits()[device].write_iops == 6000
    # The data stays: both classes share the claim's directory.
    link = root / ".sandbox" / "claims" / "training-checkpoints"
    assert link.resolve() == root / ".sandbox" / "volumes" / "training-checkpoints"

    again = local("--summary-json", str(summary), to="checkpoint-throughput")
    assert again.exit_code == 0 and load_summary(summary)["outcome"] == "already-settled"

    # Limits changed behind the hook's back are not "already settled": they are set again.
    group.clear()
    fixed = local("--summary-json", str(summary), to="checkpoint-throughput")
    assert fixed.exit_code == 0 and load_summary(summary)["outcome"] == "settled"
    assert group.limits()[device].write_bps == 250 * MIB

    status = run_hook("status", "--backend", "local", "-n", "sandbox",
                      "--claim", "training-checkpoints", "--output", "json")  # fmt: skip
    info = json.loads(status.stdout)
    assert info["currentProfile"] == "checkpoint-throughput"
    assert info["limits"]["inForce"][device]["write_bps"] == 250 * MIB
    assert info["limits"]["cgroup"] == str(group.path)
    assert "250 MiB/s and 6000 IOPS" in info["limits"]["summary"]
    block = run_hook("status", "--backend", "local", "-n", "sandbox",
                     "--claim", "training-checkpoints").stdout  # fmt: skip
    assert f"  limits         {info['limits']['summary']}  ({group.path})" in block
    assert "emulates checkpoint-throughput" in block


def test_an_emulation_the_kernel_cannot_do_is_refused_and_changes_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    from hooks.storage_profile import local as local_backend

    root = _emulated_root(tmp_path, monkeypatch)

    def cannot(path, name):
        raise ThrottleUnavailable("no block-I/O controller: made up for this test")

    monkeypatch.setattr(local_backend, "probe", cannot)
    result = local(to="checkpoint-baseline")
    assert result.exit_code == 3, result.output
    assert "emulates class checkpoint-baseline (125 MiB/s and 3000 IOPS" in result.stderr
    assert "the kernel cannot throttle here: no block-I/O controller" in result.stderr
    assert "sandbox-profiles-media.yaml" in result.stderr
    assert not (root / ".sandbox" / "claims" / "training-checkpoints").exists()


@pytest.mark.skipif(
    not Path("/dev/shm").is_dir() or os.major(os.stat("/dev/shm").st_dev) != 0,
    reason="no tmpfs at /dev/shm",
)
def test_a_class_on_tmpfs_is_refused_there_is_no_disk_to_throttle(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    root = _emulated_root(tmp_path, monkeypatch)
    shm = Path("/dev/shm") / f"emulated-{os.getpid()}"
    shm.mkdir()
    try:
        spec_file = root / "connections" / "sandbox-profiles.yaml"
        spec = yaml.safe_load(spec_file.read_text())
        spec["profiles"]["checkpoint-baseline"]["path"] = str(shm)
        spec_file.write_text(yaml.safe_dump(spec))
        result = local("--summary-json", str(tmp_path / "s.json"), to="checkpoint-baseline")
    finally:
        shm.rmdir()
    assert result.exit_code == 3, result.output
    assert "the kernel cannot throttle here" in result.stderr
    assert load_summary(tmp_path / "s.json")["outcome"] == "refused"


def test_a_local_restore_only_after_its_own_holders_switch(sandbox: Path):
    state = sandbox / ".sandbox" / "claims" / "training-checkpoints.profile"
    assert local("--holder", "pipeline-old").exit_code == 0
    assert json.loads(state.read_text())["holder"] == "pipeline-old"
    # Another pipeline's restore: the claim stays on the other pipeline's profile.
    result = local("--holder", "pipeline-b", "--only-if-switched", to="checkpoint-baseline")
    assert result.exit_code == 0, result.output
    assert "never switched by pipeline-b" in result.output
    assert json.loads(state.read_text())["profile"] == "checkpoint-throughput"
    # Its own: switched back.
    result = local("--holder", "pipeline-old", "--only-if-switched", to="checkpoint-baseline")
    assert result.exit_code == 0, result.output
    assert json.loads(state.read_text())["profile"] == "checkpoint-baseline"
