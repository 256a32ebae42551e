"""The block throttle's one specification (localcluster/throttle_vectors.json), checked on the
Python side: the sandbox's emulation reads a class's parameters and writes the cgroup's
limits exactly as the table says. The node's CSI driver checks the same table in Go
(localcluster/go/hostpath/throttle_vectors_test.go)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from localcluster.emulation.io_limits import IoLimits, blkio_lines, io_max_line
from sandbox.config import REPO_ROOT

VECTORS = json.loads((REPO_ROOT / "localcluster" / "throttle_vectors.json").read_text())
# Go's build and module caches are under HOME, which every test gets a fresh one of
# (tests/conftest.py): the user's own, read before that, keeps the driver's packages built.
USER_HOME = os.environ.get("HOME", "")


def _limits(vector: dict) -> IoLimits:
    return IoLimits(
        read_bps=vector["bps"],
        write_bps=vector["bps"],
        read_iops=vector["iops"],
        write_iops=vector["iops"],
    )


@pytest.mark.parametrize(
    "vector", VECTORS["class_parameters"], ids=lambda v: ascii(v["parameters"])
)
def test_a_classs_parameters_become_the_tables_limits(vector):
    params = vector["parameters"]
    if vector.get("error"):
        with pytest.raises(ValueError, match="is not"):
            IoLimits.from_class_parameters(params)
    elif vector.get("no_limit"):
        # No figure, nothing to emulate: the sandbox refuses such a class as a profile.
        with pytest.raises(ValueError, match="neither a throughput nor an iops"):
            IoLimits.from_class_parameters(params)
    else:
        assert IoLimits.from_class_parameters(params) == _limits(vector), vector["why"]


@pytest.mark.parametrize("vector", VECTORS["written"], ids=lambda v: v["why"])
def test_the_limits_are_written_as_the_table_says(vector):
    limits = _limits(vector)
    assert io_max_line(vector["device"], limits) == vector["io.max"]
    assert blkio_lines(vector["device"], limits) == vector["blkio"]


def test_the_table_covers_every_outcome():
    outcomes = {
        "error" if v.get("error") else "none" if v.get("no_limit") else "limits"
        for v in VECTORS["class_parameters"]
    }
    assert outcomes == {"error", "none", "limits"}
    assert any(v["bps"] is None and v["iops"] is None for v in VECTORS["written"])


def _go() -> str | None:
    """The Go toolchain the control plane is built with (``GO``, ``go``, /usr/local/go)."""
    found = os.environ.get("GO") or shutil.which("go")
    return found or ("/usr/local/go/bin/go" if Path("/usr/local/go/bin/go").exists() else None)


def test_the_drivers_go_code_follows_the_same_table():
    go = _go()
    if go is None:
        if os.environ.get("CI"):
            pytest.fail("CI: no Go toolchain (go, GO=) to check the driver against the table")
        pytest.skip("no Go toolchain (go, GO=): the driver's side of the table is not checked")
    # -trimpath as scripts/controlplane.sh builds the driver, so its compiled packages are
    # reused; -vet=off: vet is the driver's own test run's business.
    done = subprocess.run(
        [go, "test", "-count=1", "-trimpath", "-vet=off", "-run", "FollowTheVectors", "."],
        cwd=REPO_ROOT / "localcluster" / "go" / "hostpath",
        env={**os.environ, "HOME": USER_HOME, "GOTOOLCHAIN": "local", "GOFLAGS": "-mod=readonly"},
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    assert done.stdout.startswith("ok"), done.stdout
