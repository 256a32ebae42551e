"""A real Kubernetes control plane on 127.0.0.1, from binaries built by scripts/controlplane.sh.

Starts, in this order, each in its own process group with its log in the state directory:

1. ``csi-hostpath-lite`` (the CSI driver, on a unix socket; first, because the sidecars exit
   when the socket goes away): its controller side here; with a node (localcluster/node.py)
   the node starts it, in its mount namespace and with the node service on,
2. ``etcd`` (``--unsafe-no-fsync``),
3. ``kube-apiserver`` (generated certificates, RBAC, a service-account issuer and key),
4. ``kube-controller-manager`` (the PV binder, the PVC/PV protection and service-account
   controllers),
5. ``csi-provisioner`` and 6. ``csi-resizer`` (leader election off, fast retries).

``python -m localcluster start|stop`` is what ``scripts/controlplane.sh start|stop`` runs;
the pytest tier uses :class:`ControlPlane` directly (tests/kube/conftest.py). Every port is a
free port on 127.0.0.1; nothing listens elsewhere.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import signal
import ssl
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Self

from checkpoint_storage_bench.ports import free_port

NODE_NAME = "node-1"
DRIVER_NAME = "hostpath.csi.k8s.io"
# The parameters the driver lets a VolumeAttributesClass change (connections/vac-hostpath.yaml).
ACCEPTED_MUTABLE_PARAMETERS = ("iops", "throughput")
SERVICE_CIDR = "10.0.0.0/24"
# Order of start; stop goes the other way.
PROCESSES = (
    "csi-hostpath-lite",
    "etcd",
    "kube-apiserver",
    "kube-controller-manager",
    "csi-provisioner",
    "csi-resizer",
)
PIDS_FILE = "pids.json"
ADMIN_KUBECONFIG = "admin.kubeconfig"
CONTROLLERS = (
    "persistentvolume-binder-controller",
    "persistentvolumeclaim-protection-controller",
    "persistentvolume-protection-controller",
    "serviceaccount-controller",
)
# What pods of a Job need beyond that: the Job controller creates them, the garbage collector
# removes them with their Job, ttl-after-finished deletes finished Jobs, the root-CA publisher
# writes the kube-root-ca.crt ConfigMap every projected service-account volume mounts, and the
# pod GC removes pods of a deleted node, and the node lifecycle controller lifts the
# not-ready taint the kubelet registers its node with.
NODE_CONTROLLERS = (
    "node-lifecycle-controller",
    "job-controller",
    "garbage-collector-controller",
    "ttl-after-finished-controller",
    "root-ca-certificate-publisher-controller",
    "pod-garbage-collector-controller",
)
# Client certificates a node needs (localcluster/node.py): file names in the PKI directory.
KUBELET_CLIENT = "kubelet"
APISERVER_KUBELET_CLIENT = "apiserver-kubelet-client"


class ControlPlaneError(RuntimeError):
    """A process did not start or become ready; the message ends with its log's tail."""


def _proc_start_time(pid: int) -> str | None:
    """Field 22 of /proc/PID/stat: tells a process from a later one that reuses its pid."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rsplit(")", 1)[1].split()[19]


def _alive(pid: int, start_time: str | None) -> bool:
    """That very process is running (a zombie whose parent is gone and that the machine's
    init has not reaped yet counts as gone: it holds nothing and signals do nothing to it)."""
    if start_time is None or _proc_start_time(pid) != start_time:
        return False
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


# -- certificates ---------------------------------------------------------------------------


@dataclass
class Pki:
    """A CA, the API server's serving certificate, an admin client and the SA signing key."""

    dir: Path

    @property
    def ca_crt(self) -> Path:
        return self.dir / "ca.crt"

    @property
    def server_crt(self) -> Path:
        return self.dir / "apiserver.crt"

    @property
    def server_key(self) -> Path:
        return self.dir / "apiserver.key"

    @property
    def admin_crt(self) -> Path:
        return self.dir / "admin.crt"

    @property
    def admin_key(self) -> Path:
        return self.dir / "admin.key"

    @property
    def sa_key(self) -> Path:
        return self.dir / "sa.key"

    def client_crt(self, name: str) -> Path:
        return self.dir / f"{name}.crt"

    def client_key(self, name: str) -> Path:
        return self.dir / f"{name}.key"

    def generate(
        self, sans: tuple[str, ...] = (), clients: dict[str, tuple[str, str]] | None = None
    ) -> Pki:
        """``sans``: more IP addresses the API server serves on; ``clients``: more client
        certificates, file name -> (CN, O), e.g. a kubelet's ``system:node:NAME``."""
        import ipaddress

        from cryptography import x509
        from cryptography.hazmat.primitives import hashes, serialization
        from cryptography.hazmat.primitives.asymmetric import ec, rsa
        from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

        self.dir.mkdir(parents=True, exist_ok=True)
        now = dt.datetime.now(dt.UTC) - dt.timedelta(minutes=5)
        later = now + dt.timedelta(days=2)

        def name(cn: str, org: str | None = None) -> x509.Name:
            attrs = [x509.NameAttribute(NameOID.COMMON_NAME, cn)]
            if org:
                attrs.append(x509.NameAttribute(NameOID.ORGANIZATION_NAME, org))
            return x509.Name(attrs)

        def write_key(path: Path, key: Any) -> None:
            path.write_bytes(
                key.private_bytes(
                    serialization.Encoding.PEM,
                    serialization.PrivateFormat.TraditionalOpenSSL,
                    serialization.NoEncryption(),
                )
            )
            path.chmod(0o600)

        ca_key = ec.generate_private_key(ec.SECP256R1())
        ca = (
            x509.CertificateBuilder()
            .subject_name(name("checkpoint-storage-bench-ca"))
            .issuer_name(name("checkpoint-storage-bench-ca"))
            .public_key(ca_key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now)
            .not_valid_after(later)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .add_extension(
                x509.KeyUsage(
                    digital_signature=True,
                    key_cert_sign=True,
                    crl_sign=True,
                    content_commitment=False,
                    key_encipherment=False,
                    data_encipherment=False,
                    key_agreement=False,
                    encipher_only=False,
                    decipher_only=False,
                ),
                critical=True,
            )
            .sign(ca_key, hashes.SHA256())
        )
        self.ca_crt.write_bytes(ca.public_bytes(serialization.Encoding.PEM))

        def leaf(subject: x509.Name, usage: Any, sans: list | None) -> tuple[Any, Any]:
            key = ec.generate_private_key(ec.SECP256R1())
            builder = (
                x509.CertificateBuilder()
                .subject_name(subject)
                .issuer_name(ca.subject)
                .public_key(key.public_key())
                .serial_number(x509.random_serial_number())
                .not_valid_before(now)
                .not_valid_after(later)
                .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
                .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
            )
            if sans:
                builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
            return key, builder.sign(ca_key, hashes.SHA256())

        key, cert = leaf(
            name("kube-apiserver"),
            ExtendedKeyUsageOID.SERVER_AUTH,
            [
                x509.IPAddress(ipaddress.ip_address("127.0.0.1")),
                # The first address of the service range: the `kubernetes` service's IP.
                x509.IPAddress(ipaddress.ip_address("10.0.0.1")),
                *(x509.IPAddress(ipaddress.ip_address(a)) for a in sans),
                x509.DNSName("localhost"),
                x509.DNSName("kubernetes"),
                x509.DNSName("kubernetes.default"),
                x509.DNSName("kubernetes.default.svc"),
            ],
        )
        write_key(self.server_key, key)
        self.server_crt.write_bytes(cert.public_bytes(serialization.Encoding.PEM))

        key, cert = leaf(name("admin", "system:masters"), ExtendedKeyUsageOID.CLIENT_AUTH, None)
        write_key(self.admin_key, key)
        self.admin_crt.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        for file_name, (cn, org) in (clients or {}).items():
            key, cert = leaf(name(cn, org), ExtendedKeyUsageOID.CLIENT_AUTH, None)
            write_key(self.client_key(file_name), key)
            self.client_crt(file_name).write_bytes(cert.public_bytes(serialization.Encoding.PEM))

        # Service-account tokens (TokenRequest) are signed with this key; the API server also
        # verifies with it (a private key file is accepted as --service-account-key-file).
        write_key(self.sa_key, rsa.generate_private_key(public_exponent=65537, key_size=2048))
        return self


def write_kubeconfig(
    path: Path,
    server: str,
    ca_crt: Path,
    *,
    user: dict[str, str],
    user_name: str = "admin",
    namespace: str | None = None,
) -> Path:
    """A kubeconfig with the CA and the user's credentials inline (no file references)."""
    import base64

    context: dict[str, str] = {"cluster": "loopback", "user": user_name}
    if namespace:
        context["namespace"] = namespace
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {
                "name": "loopback",
                "cluster": {
                    "server": server,
                    "certificate-authority-data": base64.b64encode(ca_crt.read_bytes()).decode(),
                },
            }
        ],
        "users": [{"name": user_name, "user": user}],
        "contexts": [{"name": user_name, "context": context}],
        "current-context": user_name,
    }
    path.write_text(json.dumps(config, indent=2))  # JSON is YAML
    path.chmod(0o600)
    return path


# -- the control plane ----------------------------------------------------------------------


@dataclass
class Proc:
    name: str
    popen: subprocess.Popen | None
    pid: int
    start_time: str | None
    log: Path
    argv: list[str] = field(default_factory=list)
    t0: float = field(default_factory=time.monotonic)

    def record(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "pid": self.pid,
            "start_time": self.start_time,
            "log": str(self.log),
            "argv": self.argv,
        }


class Lifecycle:
    """What the local cluster's parts share: ``start`` runs ``_start`` timed into
    ``timings["total"]`` and, on any failure, stops what was started before raising; a
    context manager that stops on leaving."""

    timings: dict[str, float]

    def _start(self) -> None:
        raise NotImplementedError

    def stop(self) -> Any:
        raise NotImplementedError

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> Self:
        """Start every process; on any failure stop what was started and raise."""
        t0 = time.monotonic()
        try:
            self._start()
        except BaseException:
            self.stop()
            raise
        self.timings["total"] = round(time.monotonic() - t0, 2)
        return self


@dataclass
class ControlPlane(Lifecycle):
    """Start with :meth:`start`, stop with :meth:`stop` (also a context manager).

    Attributes:
        bin_dir: Where the binaries are (``scripts/controlplane.sh bin-dir``).
        state_dir: Certificates, etcd data, logs, the CSI socket, kubeconfigs, the pid file.
            Keep it short: the CSI socket lives in it (unix sockets take < 108 bytes).
        server: ``https://127.0.0.1:PORT`` once started.
        admin_kubeconfig: A system:masters client certificate.
        timings: Seconds each process took to be ready.
        die_with_parent: Linux: each process gets SIGKILL when the thread that started it
            exits (PR_SET_PDEATHSIG), so a killed test session leaves nothing running.
        bind_address: Where the API server listens and what it advertises. A node
            (localcluster/node.py) passes its bridge's address: pods cannot reach the host's
            loopback, and the `kubernetes` Service's endpoint must be an address they reach.
        node: Also the controllers a Job's pods need, and the API server's kubelet client
            certificate (logs, exec).
        driver_spawner: Starts the CSI driver instead of this object (called with the
            driver's arguments, returns its process): a node runs it in its own mount
            namespace with the node service on.
    """

    bin_dir: Path
    state_dir: Path
    server: str = ""
    admin_kubeconfig: Path = Path()
    procs: list[Proc] = field(default_factory=list)
    timings: dict[str, float] = field(default_factory=dict)
    resizer_args: list[str] = field(default_factory=list)
    die_with_parent: bool = False
    bind_address: str = "127.0.0.1"
    node: bool = False
    driver_spawner: Callable[[list[str]], Proc] | None = None

    # -- lifecycle ---------------------------------------------------------------------------

    def _start(self) -> None:
        stale = self.state_dir / PIDS_FILE
        if stale.exists():
            stop_recorded(self.state_dir)
        self.state_dir.mkdir(parents=True, exist_ok=True)
        self.logs = self.state_dir / "logs"
        self.logs.mkdir(exist_ok=True)
        sans = () if self.bind_address == "127.0.0.1" else (self.bind_address,)
        clients = {KUBELET_CLIENT: (f"system:node:{NODE_NAME}", "system:nodes")}
        clients[APISERVER_KUBELET_CLIENT] = ("kube-apiserver-kubelet-client", "system:masters")
        pki = Pki(self.state_dir / "pki").generate(sans, clients if self.node else None)
        self.pki = pki
        socket_path = self.state_dir / "csi.sock"
        if len(str(socket_path)) > 100:
            raise ControlPlaneError(f"state dir too long for a unix socket: {socket_path}")
        csi_address = f"unix://{socket_path}"

        driver_args = [
            f"-endpoint={csi_address}",
            f"-nodeid={NODE_NAME}",
            f"-statedir={self.state_dir / 'volumes'}",
            f"-drivername={DRIVER_NAME}",
            "-enable-controller-modify-volume",
            f"-accepted-mutable-parameter-names={','.join(ACCEPTED_MUTABLE_PARAMETERS)}",
            "-enable-topology=false",
        ]
        if self.driver_spawner is None:
            self._spawn("csi-hostpath-lite", driver_args)
        else:
            self.procs.append(self.driver_spawner(driver_args))
            self._write_pids()

        client_port, peer_port = free_port(), free_port()
        etcd_url = f"http://127.0.0.1:{client_port}"
        peer_url = f"http://127.0.0.1:{peer_port}"
        self._spawn(
            "etcd",
            [
                "--name=default",
                f"--data-dir={self.state_dir / 'etcd'}",
                f"--listen-client-urls={etcd_url}",
                f"--advertise-client-urls={etcd_url}",
                f"--listen-peer-urls={peer_url}",
                f"--initial-advertise-peer-urls={peer_url}",
                f"--initial-cluster=default={peer_url}",
                "--unsafe-no-fsync=true",
                "--log-level=warn",
            ],
        )
        self._wait("etcd", lambda: _http_ok(f"{etcd_url}/health"), 20)

        port = free_port(self.bind_address)
        self.server = f"https://{self.bind_address}:{port}"
        if self.node:
            node_flags = [
                f"--kubelet-client-certificate={pki.client_crt(APISERVER_KUBELET_CLIENT)}",
                f"--kubelet-client-key={pki.client_key(APISERVER_KUBELET_CLIENT)}",
                "--kubelet-preferred-address-types=InternalIP",
            ]
        else:
            # The `kubernetes` Endpoints would name 127.0.0.1, which validation refuses.
            node_flags = ["--endpoint-reconciler-type=none"]
        self._spawn(
            "kube-apiserver",
            [
                f"--etcd-servers={etcd_url}",
                f"--bind-address={self.bind_address}",
                f"--advertise-address={self.bind_address}",
                f"--secure-port={port}",
                f"--tls-cert-file={pki.server_crt}",
                f"--tls-private-key-file={pki.server_key}",
                f"--client-ca-file={pki.ca_crt}",
                f"--service-cluster-ip-range={SERVICE_CIDR}",
                "--authorization-mode=Node,RBAC",
                f"--service-account-issuer={self.server}",
                f"--service-account-key-file={pki.sa_key}",
                f"--service-account-signing-key-file={pki.sa_key}",
                "--allow-privileged=true",
                *node_flags,
                "--profiling=false",
                "--v=1",
            ],
        )
        self.admin_kubeconfig = write_kubeconfig(
            self.state_dir / ADMIN_KUBECONFIG,
            self.server,
            pki.ca_crt,
            user={
                "client-certificate-data": _b64(pki.admin_crt),
                "client-key-data": _b64(pki.admin_key),
            },
        )
        self._wait("kube-apiserver", self._apiserver_ready, 60)

        kubeconfig = f"--kubeconfig={self.admin_kubeconfig}"
        self._spawn(
            "kube-controller-manager",
            [
                kubeconfig,
                "--controllers=" + ",".join(CONTROLLERS + (NODE_CONTROLLERS if self.node else ())),
                *([f"--root-ca-file={pki.ca_crt}"] if self.node else []),
                "--leader-elect=false",
                "--use-service-account-credentials=false",
                "--bind-address=127.0.0.1",
                f"--secure-port={free_port()}",
                # The binder re-syncs every claim and volume this often (default 15s).
                "--pvclaimbinder-sync-period=2s",
                "--v=1",
            ],
        )
        self._wait("csi-hostpath-lite", socket_path.exists, 20)
        self._spawn(
            "csi-provisioner",
            [
                f"--csi-address={csi_address}",
                kubeconfig,
                "--leader-election=false",
                "--retry-interval-start=1s",
                "--retry-interval-max=5s",
                "--timeout=15s",
                "--v=4",
            ],
        )
        self._spawn(
            "csi-resizer",
            [
                f"--csi-address={csi_address}",
                kubeconfig,
                "--leader-election=false",
                "--handle-volume-inuse-error=false",
                "--retry-interval-start=1s",
                "--retry-interval-max=30s",
                "--timeout=15s",
                "--v=4",
                *self.resizer_args,
            ],
        )
        # The sidecars exit early when they cannot talk to the driver or the API server.
        time.sleep(0.5)
        for proc in self.procs:
            self._check_running(proc)
        self._write_pids()

    def stop(self) -> None:
        """Stop every process this object started (whole process groups), last first."""
        for proc in reversed(self.procs):
            _stop_group(proc.pid, proc.start_time, proc.popen)
        self.procs.clear()
        (self.state_dir / PIDS_FILE).unlink(missing_ok=True)

    # -- helpers -----------------------------------------------------------------------------

    def _spawn(self, name: str, args: list[str]) -> Proc:
        binary = self.bin_dir / name
        if not os.access(binary, os.X_OK):
            raise ControlPlaneError(f"{binary} is not built (scripts/controlplane.sh build)")
        log = self.logs / f"{name}.log"
        argv = [str(binary), *args]
        env = {
            "PATH": "/usr/bin:/bin",
            "HOME": str(self.state_dir),
            "TMPDIR": str(self.state_dir),
        }
        with log.open("ab") as out:
            popen = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                cwd=self.state_dir,
                env=env,
                start_new_session=True,  # its own process group: stop() kills the group
                preexec_fn=_die_with_parent if self.die_with_parent else None,  # noqa: PLW1509
            )
        proc = Proc(name, popen, popen.pid, _proc_start_time(popen.pid), log, argv)
        self.procs.append(proc)
        self._write_pids()
        return proc

    def _write_pids(self) -> None:
        data = {"server": self.server, "procs": [p.record() for p in self.procs]}
        (self.state_dir / PIDS_FILE).write_text(json.dumps(data, indent=2))

    def _proc(self, name: str) -> Proc:
        (proc,) = [p for p in self.procs if p.name == name]
        return proc

    def _check_running(self, proc: Proc) -> None:
        if proc.popen is not None and proc.popen.poll() is not None:
            raise ControlPlaneError(
                f"{proc.name} exited with {proc.popen.returncode}:\n{tail(proc.log)}"
            )

    def _wait(self, name: str, ready: Any, timeout: float) -> None:
        proc = self._proc(name)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self._check_running(proc)
            if ready():
                self.timings[name] = round(time.monotonic() - proc.t0, 2)
                return
            time.sleep(0.1)
        raise ControlPlaneError(f"{name} not ready after {timeout}s:\n{tail(proc.log)}")

    def _ssl_context(self) -> ssl.SSLContext:
        ctx = ssl.create_default_context(cafile=str(self.pki.ca_crt))
        ctx.load_cert_chain(str(self.pki.admin_crt), str(self.pki.admin_key))
        return ctx

    def _apiserver_ready(self) -> bool:
        return _http_ok(f"{self.server}/readyz", self._ssl_context())

    def log(self, name: str) -> Path:
        return self.logs / f"{name}.log"

    def running(self) -> dict[str, bool]:
        return {p.name: p.popen is None or p.popen.poll() is None for p in self.procs}

    def restart(self, name: str) -> None:
        """Stop one process and start it again with the same arguments (e.g. the resizer)."""
        proc = self._proc(name)
        _stop_group(proc.pid, proc.start_time, proc.popen)
        self.procs.remove(proc)
        self._spawn(name, proc.argv[1:])


def _die_with_parent() -> None:
    """In the child before exec: SIGKILL when the parent goes (Linux prctl PR_SET_PDEATHSIG)."""
    import ctypes

    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):
        pass


def _b64(path: Path) -> str:
    import base64

    return base64.b64encode(path.read_bytes()).decode()


def _http_ok(url: str, context: ssl.SSLContext | None = None) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2, context=context) as resp:  # noqa: S310
            return resp.status == 200
    except (urllib.error.URLError, OSError, ValueError):
        return False


def tail(path: Path, lines: int = 25) -> str:
    try:
        text = path.read_text(errors="replace").splitlines()
    except OSError:
        return f"(no log at {path})"
    return "\n".join(f"  | {line}" for line in text[-lines:])


def _stop_group(
    pid: int, start_time: str | None, popen: subprocess.Popen | None, grace: float = 5.0
) -> None:
    """SIGTERM the process group of ``pid`` (if it is still that process), then SIGKILL."""
    if popen is not None:
        if popen.poll() is None:
            _signal_group(pid, signal.SIGTERM)
            try:
                popen.wait(grace)
            except subprocess.TimeoutExpired:
                _signal_group(pid, signal.SIGKILL)
                popen.wait(grace)
        _signal_group(pid, signal.SIGKILL)  # children left in the group, if any
        return
    if not _alive(pid, start_time):
        return
    _signal_group(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline and _alive(pid, start_time):
        time.sleep(0.1)
    if _alive(pid, start_time):
        _signal_group(pid, signal.SIGKILL)


def _signal_group(pid: int, sig: signal.Signals) -> None:
    try:
        os.killpg(pid, sig)  # the group id is the leader's pid (start_new_session)
    except (ProcessLookupError, PermissionError):
        pass


def stop_recorded(state_dir: Path) -> list[str]:
    """Stop what a pid file lists (a crashed session's leftovers); returns what was alive."""
    pids = state_dir / PIDS_FILE
    try:
        data = json.loads(pids.read_text())
    except (OSError, ValueError):
        pids.unlink(missing_ok=True)
        return []
    stopped = []
    for rec in reversed(data.get("procs", [])):
        if _alive(rec["pid"], rec.get("start_time")):
            stopped.append(rec["name"])
            _stop_group(rec["pid"], rec.get("start_time"), None)
    pids.unlink(missing_ok=True)
    return stopped
