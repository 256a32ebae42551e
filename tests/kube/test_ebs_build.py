"""The EBS driver's place among the pinned binaries (scripts/controlplane.sh) and the start
code's refusal when it is not built (localcluster/ebs.py)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from localcluster.controlplane import ControlPlane
from localcluster.ebs import DRIVER_BINARY, EbsChain, EbsError
from tests.kube.cluster import REPO

pytestmark = pytest.mark.kube

SCRIPT = REPO / "scripts" / "controlplane.sh"


def script(*args: str, bin_dir: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "CONTROLPLANE_BIN_DIR": str(bin_dir)}
    return subprocess.run(
        ["bash", str(SCRIPT), *args], cwd=REPO, env=env, capture_output=True, text=True, check=False
    )


def test_check_names_the_driver_alone_when_only_it_is_asked_for(tmp_path: Path) -> None:
    done = script("check", DRIVER_BINARY, bin_dir=tmp_path)

    assert done.returncode == 1
    assert done.stderr.strip() == (
        f"not built in {tmp_path}: {DRIVER_BINARY} (run scripts/controlplane.sh build {DRIVER_BINARY})"
    )


def test_check_refuses_a_binary_it_does_not_know(tmp_path: Path) -> None:
    done = script("check", "aws-ebs-csi-drivr", bin_dir=tmp_path)

    assert done.returncode == 2
    assert "unknown binary: aws-ebs-csi-drivr" in done.stderr
    assert DRIVER_BINARY in done.stderr  # the list of known ones


def test_the_drivers_version_is_in_its_stamp_not_in_the_cache_dir() -> None:
    versions = dict(
        line.split("=", 1)
        for line in (REPO / "localcluster/go/versions.env").read_text().splitlines()
        if line and not line.startswith("#")
    )
    bin_dir = subprocess.run(
        ["bash", str(SCRIPT), "bin-dir"],
        cwd=REPO,
        env={k: v for k, v in os.environ.items() if k != "CONTROLPLANE_BIN_DIR"},
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()

    # Changing the driver's version must not move (and so rebuild) every other binary.
    assert versions["EBS_CSI_DRIVER_VERSION"] not in bin_dir
    assert versions["K8S_VERSION"] in bin_dir


def test_the_chain_refuses_to_start_without_the_driver(tmp_path: Path) -> None:
    plane = ControlPlane(tmp_path / "bin", tmp_path / "plane")
    chain = EbsChain(plane, tmp_path / "ebs")

    with pytest.raises(EbsError, match=f"build {DRIVER_BINARY}"):
        chain.start()
    assert chain.procs == []


def test_a_failed_ci_build_of_the_driver_fails_only_what_needs_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from tests import tiers

    builds: list[tuple[str, ...]] = []

    def script(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        if args[0] == "build":
            builds.append(args[1:])
            return subprocess.CompletedProcess(args, 1, "", "go: build failed")
        return subprocess.CompletedProcess(args, 0, "/cache/bin\n", "")

    monkeypatch.setenv("CI", "1")
    monkeypatch.setattr(tiers, "_build_failure", {})
    monkeypatch.setattr(tiers, "script", script)
    monkeypatch.setattr(
        tiers, "missing", lambda *options, **_: "missing" if options == (DRIVER_BINARY,) else None
    )

    for _ in range(2):
        with pytest.raises(pytest.fail.Exception, match="go: build failed"):
            tiers.binaries(DRIVER_BINARY)
    assert tiers.binaries() == Path("/cache/bin")
    assert builds == [(DRIVER_BINARY,)]  # tried once per session
