"""Kubeflow's training operator (v1, PyTorchJob only) on the local node.

The binary is the pinned ``training-operator`` of scripts/controlplane.sh (``build --node``);
its CRDs are read from the same Go module (``manifests/base/crds/``), so they match the
binary. The operator runs as a host process next to the API server, not as a pod: the node
has no cluster DNS and the API server is not on the pod network, so its webhook is called
through a ``url:`` client config on loopback (docs/agent-on-node.md says why).

The operator always manages its webhook certificate (open-policy-agent/cert-controller): it
reads the Secret ``training-operator-webhook-cert`` in ``kubeflow``, keeps its certificates
when they are valid for ``training-operator.kubeflow.svc`` (and the CA for
``training-operator-ca``) for at least 90 more days, and otherwise replaces them with ones
valid for that DNS name only, which a loopback URL cannot verify. So :func:`certificates`
makes a CA and a server certificate that the rotator accepts and that also name 127.0.0.1;
the rotator then copies them to its certificate directory and injects the CA into the
ValidatingWebhookConfiguration, which must exist first as well.

The certificate directory is fixed in the binary (``/tmp/k8s-webhook-server/serving-certs``)
and the rotator only waits for the files there (in a pod they are the Secret, mounted), so
:meth:`TrainingOperator.start` writes them, as the kubelet would: one operator per machine
(the node is one per machine already); :meth:`TrainingOperator.stop` removes the directory
when the start created it.
"""

from __future__ import annotations

import base64
import datetime as dt
import json
import os
import shutil
import subprocess
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from checkpoint_storage_bench import kube
from checkpoint_storage_bench.ports import free_port
from checkpoint_storage_bench.retry import Deadline
from localcluster.controlplane import ControlPlaneError

if TYPE_CHECKING:
    from localcluster.controlplane import Proc
    from localcluster.node import Node

MODULE = "github.com/kubeflow/training-operator"
BINARY = "training-operator"
NAMESPACE = "kubeflow"
SERVICE = "training-operator"
SECRET = "training-operator-webhook-cert"
WEBHOOK_CONFIG = "validator.training-operator.kubeflow.org"
CA_NAME = "training-operator-ca"
CERT_DIR = Path("/tmp/k8s-webhook-server")
CRD_FILES = ("kubeflow.org_pytorchjobs.yaml",)
ROOT = Path(__file__).resolve().parent.parent
VERSIONS = ROOT / "localcluster" / "go" / "versions.env"
WRAPPER = ROOT / "localcluster" / "go" / "training-operator"
INIT_IMAGE = "localhost/csb-busybox:init"
# The operator's init container for workers, as its default template but with the node's
# busybox image (nothing is pulled here) and the master's full name (busybox's nslookup does
# not walk the search list; glibc's resolver, torchrun's, does).
INIT_TEMPLATE = """
- name: init-pytorch
  image: {{.InitContainerImage}}
  imagePullPolicy: Never
  resources:
    limits: {cpu: 100m, memory: 20Mi}
    requests: {cpu: 50m, memory: 10Mi}
  command: ['sh', '-c', 'err=1; ns=$(cat /var/run/secrets/kubernetes.io/serviceaccount/namespace);
    for i in $(busybox seq {{.MaxTries}}); do
    if busybox nslookup {{.MasterAddr}}.$ns.svc.cluster.local; then err=0 && break; fi;
    echo waiting for master; sleep 2; done; exit $err']
"""
# The rotator replaces certificates that expire within 90 days.
VALIDITY = dt.timedelta(days=3 * 365)


class TrainingOperatorError(ControlPlaneError):
    pass


def version() -> str:
    for line in VERSIONS.read_text().splitlines():
        if line.startswith("TRAINING_OPERATOR_VERSION="):
            return line.split("=", 1)[1].strip()
    raise TrainingOperatorError(f"no TRAINING_OPERATOR_VERSION in {VERSIONS}")


def module_dir() -> Path:
    """The source of the pinned module (downloaded if the module cache lacks it)."""
    go = os.environ.get("GO") or shutil.which("go") or "/usr/local/go/bin/go"
    done = subprocess.run(
        [go, "mod", "download", "-json", f"{MODULE}@{version()}"],
        cwd=WRAPPER,
        env={**os.environ, "GOTOOLCHAIN": "local", "GOFLAGS": "-mod=readonly"},
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    if done.returncode != 0:
        raise TrainingOperatorError(f"go mod download {MODULE}: {done.stderr.strip()}")
    return Path(json.loads(done.stdout)["Dir"])


def crds(source: Path | None = None) -> list[dict[str, Any]]:
    base = (source or module_dir()) / "manifests" / "base" / "crds"
    return [yaml.safe_load((base / name).read_text()) for name in CRD_FILES]


def certificates(namespace: str = NAMESPACE) -> dict[str, bytes]:
    """The Secret's data: a CA valid for the rotator's CA name and a server certificate valid
    for the Service's DNS name (what the rotator checks) and for 127.0.0.1 (what the API server
    checks, calling the loopback URL)."""
    import ipaddress

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import rsa
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    now = dt.datetime.now(dt.UTC)
    begin, end = now - dt.timedelta(hours=1), now + VALIDITY

    def pem_key(key: Any) -> bytes:
        return key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.TraditionalOpenSSL,
            serialization.NoEncryption(),
        )

    def name(cn: str) -> x509.Name:
        return x509.Name(
            [
                x509.NameAttribute(NameOID.COMMON_NAME, cn),
                x509.NameAttribute(NameOID.ORGANIZATION_NAME, "training-operator"),
            ]
        )

    ca_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    ca = (
        x509.CertificateBuilder()
        .subject_name(name(CA_NAME))
        .issuer_name(name(CA_NAME))
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(begin)
        .not_valid_after(end)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=True,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=False,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )  # fmt: skip
        .add_extension(x509.SubjectAlternativeName([x509.DNSName(CA_NAME)]), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    dns = f"{SERVICE}.{namespace}.svc"
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name(dns))
        .issuer_name(ca.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(begin)
        .not_valid_after(end)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(
            x509.SubjectAlternativeName(
                [x509.DNSName(dns), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
            ),
            critical=False,
        )
        .sign(ca_key, hashes.SHA256())
    )
    return {
        "ca.crt": ca.public_bytes(serialization.Encoding.PEM),
        "ca.key": pem_key(ca_key),
        "tls.crt": cert.public_bytes(serialization.Encoding.PEM),
        "tls.key": pem_key(key),
    }


def webhook_configuration(port: int, ca_pem: bytes) -> dict[str, Any]:
    """The operator's PyTorchJob validator (as in the module's manifests/base/webhook), called
    on loopback instead of through a Service."""
    return {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingWebhookConfiguration",
        "metadata": {"name": WEBHOOK_CONFIG},
        "webhooks": [
            {
                "name": "validator.pytorchjob.training-operator.kubeflow.org",
                "admissionReviewVersions": ["v1"],
                "clientConfig": {
                    "url": f"https://127.0.0.1:{port}/validate-kubeflow-org-v1-pytorchjob",
                    "caBundle": base64.b64encode(ca_pem).decode(),
                },
                "failurePolicy": "Fail",
                "sideEffects": "None",
                "rules": [
                    {
                        "apiGroups": ["kubeflow.org"],
                        "apiVersions": ["v1"],
                        "operations": ["CREATE", "UPDATE"],
                        "resources": ["pytorchjobs"],
                    }
                ],
            }
        ],
    }


PYTORCHJOB = kube.Kind("kubeflow.org/v1", "PyTorchJob", "pytorchjobs")
FIELD_MANAGER = "checkpoint-storage-bench-training-operator"


def webhook_answers(objects: kube.Client) -> bool:
    """Whether the API server gets the validator's answer: a PyTorchJob with two masters
    (which only the webhook refuses) is denied, in a dry run."""
    container = {"name": "pytorch", "image": "none"}
    replica = {"replicas": 2, "template": {"spec": {"containers": [container]}}}
    body = {
        "apiVersion": "kubeflow.org/v1",
        "kind": "PyTorchJob",
        "metadata": {"name": "webhook-probe", "namespace": NAMESPACE},
        "spec": {"pytorchReplicaSpecs": {"Master": replica}},
    }
    try:
        objects.request("POST", PYTORCHJOB.path(NAMESPACE), body, query={"dryRun": "All"})
    except kube.Forbidden as exc:
        return "denied the request" in exc.server_message
    except kube.KubeError:
        return False  # e.g. the webhook not reached yet (a 500)
    return False


@dataclass
class TrainingOperator:
    """The operator, started on a started :class:`~localcluster.node.Node` (its processes are
    the node's: the node's stop ends it too)."""

    node: Node
    webhook_port: int = 0
    probe_port: int = 0
    proc: Proc | None = None
    timings: dict[str, float] = field(default_factory=dict)
    _created_cert_dir: bool = False

    def start(self, timeout: float = 120.0) -> TrainingOperator:
        t0 = time.monotonic()
        binary = self.node.bin_dir / BINARY
        if not os.access(binary, os.X_OK):
            raise TrainingOperatorError(
                f"{binary} is not built (scripts/controlplane.sh build {BINARY})"
            )
        objects = self._objects()
        deadline = Deadline(timeout)
        self._install(objects, deadline)
        self.webhook_port = self.webhook_port or free_port()
        self.probe_port = self.probe_port or free_port()
        data = certificates()
        self._secret_and_webhook(objects, data, deadline)
        self._created_cert_dir = not CERT_DIR.exists()
        # In a pod the Secret is mounted there; the rotator waits for the files, it does not
        # write them.
        serving = CERT_DIR / "serving-certs"
        serving.mkdir(parents=True, exist_ok=True)
        for name in ("tls.crt", "tls.key"):
            tmp = serving / f".{name}.tmp"
            tmp.write_bytes(data[name])
            tmp.chmod(0o600)
            tmp.rename(serving / name)
        flags = []
        if self.node.cluster_dns:
            from localcluster.node import busybox_image

            images = self.node.state_dir / "images"
            self.node.import_image(busybox_image(images, "init", ["/bin/sh"]), INIT_IMAGE[:-5])
            template = self.node.state_dir / "pytorch-init-container.yaml"
            template.write_text(INIT_TEMPLATE)
            flags = [
                f"--pytorch-init-container-image={INIT_IMAGE}",
                f"--pytorch-init-container-template-file={template}",
            ]
        self.proc = self.node._spawn(
            BINARY,
            [
                str(binary),
                *flags,
                "--enable-scheme=pytorchjob",
                "--gang-scheduler-name=",
                "--metrics-bind-address=0",
                f"--health-probe-bind-address=127.0.0.1:{self.probe_port}",
                f"--webhook-server-port={self.webhook_port}",
                f"--kubeconfig={self.node.plane.admin_kubeconfig}",
            ],
            in_namespace=False,
            # The webhook server reads its certificates under $TMPDIR, the rotator under
            # /tmp: one directory only when they agree.
            env={"KUBECONFIG": str(self.node.plane.admin_kubeconfig), "TMPDIR": "/tmp"},
        )
        self.node._wait(BINARY, self._ready, max(1.0, deadline.remaining()))
        self.timings["start"] = round(time.monotonic() - t0, 2)
        return self

    def stop(self) -> None:
        """End the process (the node's stop would too) and remove the certificate directory
        when this start created it."""
        from localcluster.controlplane import _stop_group

        if self.proc is not None:
            _stop_group(self.proc.pid, self.proc.start_time, self.proc.popen)
            self.proc = None
        if self._created_cert_dir:
            shutil.rmtree(CERT_DIR, ignore_errors=True)
            self._created_cert_dir = False

    def _ready(self) -> bool:
        # readyz turns ok once the certificates are in place and the webhook server listens;
        # the API server may still fail to call it for a moment (a 500), so ready means: a
        # job only the webhook refuses is refused (a dry run).
        try:
            url = f"http://127.0.0.1:{self.probe_port}/readyz"
            with urllib.request.urlopen(url, timeout=2) as resp:
                if resp.status != 200:
                    return False
        except OSError:
            return False
        return webhook_answers(self._objects())

    def _objects(self) -> kube.Client:
        """The object layer on the node's admin credentials, as this operator's applier."""
        return kube.Client(self.node.cluster.api, field_manager=FIELD_MANAGER)

    def _install(self, objects: kube.Client, deadline: Deadline) -> None:
        """Apply the module's CRDs and wait until the API server serves them."""
        bodies = crds()
        for body in bodies:
            objects.apply(body, deadline=deadline)
        for body in bodies:
            objects.wait_served(body, deadline)

    def _secret_and_webhook(
        self, objects: kube.Client, data: dict[str, bytes], deadline: Deadline
    ) -> None:
        """The namespace, the Secret with the certificates and the ValidatingWebhookConfiguration
        (server-side apply: created, or brought to these values)."""
        namespace = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}}
        secret = {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": SECRET, "namespace": NAMESPACE},
            "data": {k: base64.b64encode(v).decode() for k, v in data.items()},
        }
        webhook = webhook_configuration(self.webhook_port, data["ca.crt"])
        for doc in (namespace, secret, webhook):
            objects.apply(doc, deadline=deadline)


def start(node: Node, timeout: float = 120.0) -> TrainingOperator:
    """Start the operator on ``node``; on failure nothing of it is left running."""
    operator = TrainingOperator(node)
    try:
        return operator.start(timeout)
    except BaseException:
        operator.stop()
        raise
