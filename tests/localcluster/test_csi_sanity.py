"""The CSI community's conformance suite, csi-sanity, against our CSI driver
(localcluster/go/hostpath): its controller and node services in one process, as root, on
loop devices and ext4 as on the node, with ControllerModifyVolume's mutable parameters.
Every spec passes or is skipped because the driver does not advertise the capability it
needs (docs/controlplane.md lists which); a failing spec is named in the failure. Afterwards
nothing of the run is left: no mount, no loop device, no backing file, no process.

The binaries come from scripts/controlplane.sh's cache: when they are not built the test skips
with one line, unless ``CI`` is set: then it builds them or fails."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from tests.tiers import binaries

BINARIES = ("csi-hostpath-lite", "csi-sanity")
MUTABLE_PARAMETERS = ("iops", "throughput")
# What csi-sanity says when it skips a spec for a capability the driver does not advertise;
# any other skip is a spec the run did not exercise for a reason of its own, and fails.
CAPABILITY_SKIPS = (" not supported", "Service does not have ")
# Specs that must have run (not been skipped): the ones this driver is for.
MUST_PASS = (
    "Node Service should work",
    "Node Service should be idempotent",
    "ModifyVolume [Controller Server] should modify a volume created with a volume attribute class",
    "CreateVolume should not create volume with an invalid volume attribute class",
    "ExpandVolume [Controller Server] should work",
    "NodeExpandVolume should work if node-expand is called after node-publish",
    "NodeExpandVolume should fail when volume is not found",
)
BACKING_PREFIX = "csb-sanity-"


def _machine_missing() -> str | None:
    if os.geteuid() != 0:
        return "csi-sanity: the driver's node service needs root (loop devices, mounts)"
    if not Path("/dev/loop-control").exists():
        return "csi-sanity: no /dev/loop-control"
    if not shutil.which("mkfs.ext4"):
        return "csi-sanity: no mkfs.ext4"
    return None


def _mounts_under(root: Path) -> list[str]:
    found = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        point = line.split()[4].encode().decode("unicode_escape")
        if point == str(root) or point.startswith(f"{root}/"):
            found.append(point)
    return found


def _loops_over(root: Path) -> list[str]:
    found = []
    for backing in Path("/sys/block").glob("loop*/loop/backing_file"):
        if backing.read_text().strip().startswith(f"{root}/"):
            found.append(backing.parent.parent.name)
    return found


def _specs(report: Path) -> list[tuple[str, str, str]]:
    """(name, status, message) of every spec in csi-sanity's JUnit report."""
    out = []
    for case in ET.parse(report).getroot().iter("testcase"):
        name = case.get("name", "").removeprefix("[It] ")
        status = case.get("status", "")
        message = ""
        for tag in ("failure", "error", "skipped"):
            node = case.find(tag)
            if node is not None:
                message = " ".join(((node.get("message") or "") + " " + (node.text or "")).split())
                status = status or tag
        out.append((name, status, message))
    return out


def test_our_csi_driver_passes_csi_sanity_and_leaves_nothing_behind():
    bin_dir = binaries(*BINARIES, tier="csi-sanity")
    reason = _machine_missing()
    if reason is not None:
        if os.environ.get("CI"):
            pytest.fail(reason, pytrace=False)
        pytest.skip(reason)
    # Short, under /tmp: the sockets' paths must fit a sun_path.
    root = Path(tempfile.mkdtemp(prefix="csb-sanity-", dir="/tmp"))
    backing = root / "backing"
    for d in ("state", "kubelet", "backing"):
        (root / d).mkdir()
    (root / "mutable.yaml").write_text("".join(f'{k}: "100"\n' for k in MUTABLE_PARAMETERS))
    endpoint = f"unix://{root}/csi.sock"
    log = (root / "driver.log").open("w")
    driver = subprocess.Popen(
        [
            str(bin_dir / "csi-hostpath-lite"),
            "-nodeid=csi-sanity",
            f"-endpoint={endpoint}",
            f"-statedir={root}/state",
            "-node-service",
            f"-backing-dir={backing}",
            f"-backing-prefix={BACKING_PREFIX}",
            f"-kubelet-dir={root}/kubelet",
            "-enable-controller-modify-volume",
            "-accepted-mutable-parameter-names=" + ",".join(MUTABLE_PARAMETERS),
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:
        run = subprocess.run(
            [
                str(bin_dir / "csi-sanity"),
                f"-csi.endpoint={endpoint}",
                f"-csi.mountdir={root}/mnt",
                f"-csi.stagingdir={root}/stage",
                f"-csi.testvolumemutableparameters={root}/mutable.yaml",
                f"--ginkgo.junit-report={root}/junit.xml",
                "--ginkgo.no-color",
            ],
            cwd=root,
            capture_output=True,
            text=True,
            timeout=600,
            check=False,
        )
        assert driver.poll() is None, "the driver exited during the run:\n" + _tail(root)
        report = root / "junit.xml"
        assert report.exists(), (
            f"csi-sanity wrote no report (rc {run.returncode}):\n{run.stdout[-3000:]}"
        )
        specs = _specs(report)
        failed = [
            f"{n}: {m[:300]}" for n, s, m in specs if s not in ("passed", "skipped", "pending")
        ]
        assert not failed, "csi-sanity specs failed:\n" + "\n".join(failed) + "\n" + _tail(root)
        odd_skips = [
            f"{n}: {m}"
            for n, s, m in specs
            if s == "skipped" and not any(c in m for c in CAPABILITY_SKIPS)
        ]
        assert not odd_skips, "specs skipped for no missing capability:\n" + "\n".join(odd_skips)
        passed = {n for n, s, _ in specs if s == "passed"}
        for spec in MUST_PASS:
            assert any(spec in n for n in passed), f"{spec!r} did not pass"
        assert run.returncode == 0, run.stdout[-3000:]
        # The node specs ran on the node's kind of volume, not on a directory, and node
        # expansion went through to resize2fs on the published ext4 (not only answered).
        driver_log = (root / "driver.log").read_text()
        assert "mkfs.ext4 /dev/loop" in driver_log, _tail(root)
        assert "; resize2fs of the ext4 at " in driver_log, _tail(root)
    finally:
        driver.send_signal(signal.SIGTERM)
        try:
            driver.wait(timeout=30)
        except subprocess.TimeoutExpired:
            driver.kill()
            driver.wait()
        log.close()
        left = {
            "mounts": _mounts_under(root),
            "loop devices": _loops_over(root),
            "backing files": sorted(p.name for p in backing.iterdir()),
        }
        clean = not any(left.values())
        if clean:
            shutil.rmtree(root)
    assert driver.returncode is not None
    assert clean, f"csi-sanity's run left {left} under {root}"


def _tail(root: Path) -> str:
    return "driver log:\n" + "\n".join((root / "driver.log").read_text().splitlines()[-30:])
