"""The AWS EBS CSI driver between a local control plane and moto's EC2 (docs/controlplane.md).

What :class:`EbsChain` starts beside a started :class:`~localcluster.controlplane.ControlPlane`,
each in its own process group, its log and pid in its own state directory:

1. ``moto`` (``python -m moto.server`` on a free port of 127.0.0.1, a process of its own so
   that its global state, IAM enforcement included, is not the test process's), with an
   administrator, the driver's IAM user, and one EC2 instance in :data:`ZONE` (the node);
2. ``aws-ebs-csi-driver`` in controller mode (the upstream binary, scripts/controlplane.sh),
   its EC2 calls sent to moto as the driver's user;
3. ``csi-provisioner`` and ``csi-resizer`` on the driver's socket, with the flags the
   driver's own manifests give them (``--extra-create-metadata`` and
   ``--extra-modify-metadata``: the driver sees the claim's name, for the volume's tags), as
   the admin or, with ``controller_rbac``, as the driver's controller ServiceAccount.

It registers the instance as a node the way the kubelet and the driver's node plugin would:
a ``Node`` labelled with the instance's zone (providerID ``aws:///ZONE/i-…``) and a
``CSINode`` carrying the topology keys the driver's ``NodeGetInfo`` reports
(:data:`TOPOLOGY_KEYS`). No kubelet and no node plugin run: a ``WaitForFirstConsumer``
claim binds when ``volume.kubernetes.io/selected-node`` names that node, as the scheduler
does for the claim's first pod, and the provisioner then asks the driver for a volume in the
node's zone.

With :meth:`Moto.enforce_iam` on, moto checks every call against the caller's IAM policies
(actions, and ``StringEquals`` conditions; moto ignores a statement's ``Resource`` ARNs and
every other condition operator).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from checkpoint_storage_bench.ports import free_port
from localcluster.client import AdminClient
from localcluster.controlplane import (
    PIDS_FILE,
    ControlPlane,
    ControlPlaneError,
    Lifecycle,
    Proc,
    _die_with_parent,
    _http_ok,
    _proc_start_time,
    _stop_group,
    tail,
    write_kubeconfig,
)

EBS_DRIVER = "ebs.csi.aws.com"
DRIVER_BINARY = "aws-ebs-csi-driver"
REGION = "us-east-1"
ZONE = "us-east-1a"
# What the driver's NodeGetInfo reports (pkg/driver/node.go, v1.44): the node's CSINode
# carries these keys and its Node the same labels, which the provisioner turns into the
# CreateVolume's topology requirement.
TOPOLOGY_KEYS = ("kubernetes.io/os", "topology.ebs.csi.aws.com/zone", "topology.kubernetes.io/zone")
# The sidecars' ServiceAccount in kube-system (the driver's manifests' name).
CONTROLLER_SERVICE_ACCOUNT = "ebs-csi-controller-sa"
# Order of start; stop goes the other way.
PROCESSES = ("moto", DRIVER_BINARY, "csi-provisioner", "csi-resizer")
ADMIN_USER = "admin"
DRIVER_USER = "ebs-csi-driver"
# The driver's user may call any EC2 action. AWS's managed AmazonEBSCSIDriverPolicy scopes
# its statements by resource ARN and request tags, which moto's authorizer does not match
# (it compares every statement's Resource with "*"), so that policy would refuse everything.
DRIVER_POLICY = {
    "Version": "2012-10-17",
    "Statement": [{"Effect": "Allow", "Action": "ec2:*", "Resource": "*"}],
}
ADMIN_POLICY = {
    "Version": "2012-10-17",
    "Statement": [{"Effect": "Allow", "Action": "*", "Resource": "*"}],
}


class EbsError(ControlPlaneError):
    """moto or the driver's chain did not start; the message ends with a log's tail."""


@dataclass(frozen=True)
class Credentials:
    """An IAM user's access key in moto."""

    user: str
    access_key_id: str
    secret_access_key: str

    def env(self) -> dict[str, str]:
        return {
            "AWS_ACCESS_KEY_ID": self.access_key_id,
            "AWS_SECRET_ACCESS_KEY": self.secret_access_key,
        }


@dataclass
class Moto:
    """moto's server, already started (:meth:`EbsChain.start`), at ``url``."""

    url: str
    admin: Credentials | None = None

    def client(self, service: str, credentials: Credentials | None = None) -> Any:
        """A boto3 client of ``service`` against moto, as ``credentials`` (the admin's by
        default), without retries (a refused call is an answer, not a hiccup)."""
        import boto3
        from botocore.config import Config

        who = credentials or self.admin
        keys = (
            {"aws_access_key_id": who.access_key_id, "aws_secret_access_key": who.secret_access_key}
            if who
            else {"aws_access_key_id": "testing", "aws_secret_access_key": "testing"}
        )
        return boto3.client(
            service,
            region_name=REGION,
            endpoint_url=self.url,
            config=Config(retries={"mode": "standard", "total_max_attempts": 1}),
            **keys,
        )

    def create_user(self, name: str, policy: dict) -> Credentials:
        """An IAM user holding only ``policy`` (inline), and an access key of it."""
        iam = self.client("iam")
        iam.create_user(UserName=name)
        iam.put_user_policy(UserName=name, PolicyName=name, PolicyDocument=json.dumps(policy))
        key = iam.create_access_key(UserName=name)["AccessKey"]
        return Credentials(name, key["AccessKeyId"], key["SecretAccessKey"])

    def enforce_iam(self, on: bool = True) -> None:
        """From the next call on, moto authenticates and authorizes every call (or none)."""
        body = b"0" if on else b"inf"
        # Not form-encoded (urllib's default type): flask would then hide the body from moto.
        request = urllib.request.Request(
            f"{self.url}/moto-api/reset-auth",
            body,
            headers={"Content-Type": "text/plain"},
            method="POST",
        )
        with urllib.request.urlopen(request, timeout=10) as resp:  # noqa: S310 (loopback)
            if resp.status != 200:
                raise EbsError(f"moto refused to switch IAM enforcement: HTTP {resp.status}")

    def env(self, credentials: Credentials) -> dict[str, str]:
        """What an AWS SDK needs to call moto's EC2 as ``credentials`` (boto3 and the Go SDK
        read ``AWS_ENDPOINT_URL_EC2``; the driver reads ``AWS_EC2_ENDPOINT``)."""
        return {
            **credentials.env(),
            "AWS_REGION": REGION,
            "AWS_ENDPOINT_URL_EC2": self.url,
            "AWS_EC2_ENDPOINT": self.url,
            "AWS_EC2_METADATA_DISABLED": "true",
        }


@dataclass
class EbsChain(Lifecycle):
    """Start with :meth:`start`, stop with :meth:`stop` (also a context manager).

    Attributes:
        plane: A started control plane: the sidecars use its admin kubeconfig, its binaries.
        state_dir: Logs, the driver's socket, the pid file (short: the socket is in it).
        enforce_iam: Turn moto's IAM enforcement on before the driver starts, so that every
            EC2 call from then on, the driver's too, is checked against its caller's policy.
        controller_rbac: A manifest with the sidecars' ServiceAccount ``kube-system/``
            :data:`CONTROLLER_SERVICE_ACCOUNT` and its RBAC (e.g.
            connections/rbac-ebs-csi-controller.yaml): applied, and the sidecars run with a
            token of that account. None: they run as the admin.
        die_with_parent: As for the control plane (PR_SET_PDEATHSIG).
        moto: Set by :meth:`start`.
        node_name: The registered node (the instance's private DNS name), set by :meth:`start`.
        instance_id: The node's EC2 instance.
    """

    plane: ControlPlane
    state_dir: Path
    enforce_iam: bool = True
    controller_rbac: Path | None = None
    die_with_parent: bool = False
    moto: Moto = field(init=False)
    driver_credentials: Credentials = field(init=False)
    node_name: str = ""
    instance_id: str = ""
    procs: list[Proc] = field(default_factory=list)
    timings: dict[str, float] = field(default_factory=dict)

    @property
    def socket(self) -> Path:
        return self.state_dir / "ebs.sock"

    def _start(self) -> None:
        if len(str(self.socket)) > 100:
            raise EbsError(f"state dir too long for a unix socket: {self.socket}")
        self.state_dir.mkdir(parents=True, exist_ok=True)
        self.logs = self.state_dir / "logs"
        self.logs.mkdir(exist_ok=True)
        binary = self.plane.bin_dir / DRIVER_BINARY
        if not os.access(binary, os.X_OK):
            raise EbsError(f"{binary} is not built (scripts/controlplane.sh build {DRIVER_BINARY})")

        port = free_port()
        url = f"http://127.0.0.1:{port}"
        self._spawn(
            "moto", [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)]
        )
        self._wait("moto", lambda: _http_ok(f"{url}/moto-api/data.json"), 60)
        self.moto = Moto(url)
        self.moto.admin = self.moto.create_user(ADMIN_USER, ADMIN_POLICY)
        self.driver_credentials = self.moto.create_user(DRIVER_USER, DRIVER_POLICY)
        if self.enforce_iam:
            self.moto.enforce_iam()
        instance = self.moto.client("ec2").run_instances(
            ImageId="ami-12c6146b",  # one of moto's bundled images
            MinCount=1,
            MaxCount=1,
            InstanceType="p5.48xlarge",
            Placement={"AvailabilityZone": ZONE},
        )["Instances"][0]
        self.instance_id = instance["InstanceId"]
        self.node_name = instance["PrivateDnsName"]

        self._spawn(
            DRIVER_BINARY,
            [str(binary), "controller", f"--endpoint=unix://{self.socket}", "--v=4"],
            env=self.moto.env(self.driver_credentials),
        )
        self._wait(DRIVER_BINARY, self.socket.exists, 60)
        admin = AdminClient(self.plane)
        kubeconfig = f"--kubeconfig={self._sidecar_kubeconfig(admin)}"
        csi = f"--csi-address=unix://{self.socket}"
        self._spawn(
            "csi-provisioner",
            [
                str(self.plane.bin_dir / "csi-provisioner"),
                csi,
                kubeconfig,
                "--leader-election=false",
                "--extra-create-metadata",
                "--default-fstype=ext4",
                "--retry-interval-start=1s",
                "--retry-interval-max=5s",
                # EBS's CreateVolume waits until EC2 says the volume is available.
                "--timeout=60s",
                "--v=4",
            ],
        )
        self._spawn(
            "csi-resizer",
            [
                str(self.plane.bin_dir / "csi-resizer"),
                csi,
                kubeconfig,
                "--leader-election=false",
                "--handle-volume-inuse-error=false",
                "--extra-modify-metadata",
                "--retry-interval-start=1s",
                "--retry-interval-max=30s",
                "--timeout=60s",
                "--v=4",
            ],
        )
        self.register_node(admin)
        time.sleep(0.5)  # the sidecars exit early when they cannot talk to the driver
        for proc in self.procs:
            self._check_running(proc)

    def _sidecar_kubeconfig(self, admin: AdminClient) -> Path:
        """The admin's kubeconfig, or one with a token of the controller's ServiceAccount
        once ``controller_rbac`` is applied."""
        if self.controller_rbac is None:
            return self.plane.admin_kubeconfig
        admin.apply_file(self.controller_rbac)
        token = admin.service_account_token(
            CONTROLLER_SERVICE_ACCOUNT, "kube-system", expiration_s=24 * 3600
        )
        return write_kubeconfig(
            self.state_dir / "controller.kubeconfig",
            self.plane.server,
            self.plane.pki.ca_crt,
            user={"token": token},
            user_name=f"system:serviceaccount:kube-system:{CONTROLLER_SERVICE_ACCOUNT}",
        )

    def register_node(self, admin: AdminClient) -> None:
        """The Node and CSINode the kubelet and the driver's node plugin would write."""
        labels = {
            "kubernetes.io/hostname": self.node_name,
            "kubernetes.io/os": "linux",
            "topology.kubernetes.io/region": REGION,
            "topology.kubernetes.io/zone": ZONE,
            "topology.ebs.csi.aws.com/zone": ZONE,
        }
        admin.apply(
            {
                "apiVersion": "v1",
                "kind": "Node",
                "metadata": {"name": self.node_name, "labels": labels},
                "spec": {"providerID": f"aws:///{ZONE}/{self.instance_id}"},
            }
        )
        admin.apply(
            {
                "apiVersion": "storage.k8s.io/v1",
                "kind": "CSINode",
                "metadata": {"name": self.node_name},
                "spec": {
                    "drivers": [
                        {
                            "name": EBS_DRIVER,
                            "nodeID": self.instance_id,
                            "topologyKeys": list(TOPOLOGY_KEYS),
                        }
                    ]
                },
            }
        )

    def stop(self) -> None:
        """Stop every process this object started (whole process groups), last first."""
        for proc in reversed(self.procs):
            _stop_group(proc.pid, proc.start_time, proc.popen)
        self.procs.clear()
        (self.state_dir / PIDS_FILE).unlink(missing_ok=True)

    def log(self, name: str) -> Path:
        return self.logs / f"{name}.log"

    # -- helpers -----------------------------------------------------------------------------

    def _spawn(self, name: str, argv: list[str], env: dict[str, str] | None = None) -> Proc:
        log = self.log(name)
        full_env = {"PATH": "/usr/bin:/bin", "HOME": str(self.state_dir)}
        full_env["TMPDIR"] = str(self.state_dir)
        full_env.update(env or {})
        with log.open("ab") as out:
            popen = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                cwd=self.state_dir,
                env=full_env,
                start_new_session=True,
                preexec_fn=_die_with_parent if self.die_with_parent else None,  # noqa: PLW1509
            )
        proc = Proc(name, popen, popen.pid, _proc_start_time(popen.pid), log, argv)
        self.procs.append(proc)
        data = {"procs": [p.record() for p in self.procs]}
        (self.state_dir / PIDS_FILE).write_text(json.dumps(data, indent=2))
        return proc

    def _proc(self, name: str) -> Proc:
        (proc,) = [p for p in self.procs if p.name == name]
        return proc

    def _check_running(self, proc: Proc) -> None:
        if proc.popen is not None and proc.popen.poll() is not None:
            raise EbsError(f"{proc.name} exited with {proc.popen.returncode}:\n{tail(proc.log)}")

    def _wait(self, name: str, ready: Callable[[], Any], timeout: float) -> None:
        proc = self._proc(name)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self._check_running(proc)
            if ready():
                self.timings[name] = round(time.monotonic() - proc.t0, 2)
                return
            time.sleep(0.1)
        raise EbsError(f"{name} not ready after {timeout}s:\n{tail(proc.log)}")
