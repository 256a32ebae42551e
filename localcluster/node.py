"""One real Kubernetes node beside the loopback control plane (docs/node.md).

What runs, and what each touches on the machine (everything named with our own prefixes):

- a bridge ``csb0`` with ``10.244.0.1/24`` (created before the control plane, whose API
  server listens on that address: pods cannot reach the host's loopback);
- a *holder* process owning a private mount namespace (``unshare -m``, ``/`` made rshared
  inside it only), in which containerd, the kubelet and the CSI node plugin run. Every mount
  they make (container root filesystems, projected volumes, network-namespace files, staged
  volumes) exists only there and goes away with the namespace's last process; the host paths
  that containerd and the kubelet write regardless of their flags (``/run/containerd``,
  ``/var/lib/cni``, ``/var/lib/kubelet``, ``/var/log/containers``) are bind-mounted from the
  state directory inside it;
- containerd (Debian's 1.6) with its own root, state, socket and config; runc from Debian;
  the CNI bridge plugin (``isGateway: false``, ``ipMasq: false``, a route to the service
  range only: no route off the machine, and ``net.ipv4.ip_forward`` is never switched on);
- kubelet v1.34 (cgroupfs driver, ``failCgroupV1: false``, ``protectKernelDefaults: true``,
  its own root dir, ``cgroupRoot: /csb-node``), kube-scheduler, kube-proxy (iptables mode,
  so that pods reach the API server through the ``kubernetes`` Service);
- the CSI driver ``csi-hostpath-lite`` with its node service, in the holder's mount namespace
  too: each volume a loop device over a sparse file ``/dev/shm/csb-csi-<volume id>.img`` with
  ext4, staged and bind-mounted into its pods, registered with the kubelet through its plugin
  registration socket, its class's iops and throughput the block throttle on that device for
  the pods that have it published; the ``CSIDriver`` object (no attach, pod info on mount,
  ``fsGroupPolicy: File``);
- every node process is started in the cgroup ``/csb-node/daemons`` of each hierarchy, so
  containerd's shims and the containers (``/csb-node/kubepods``) are all under ``/csb-node``.

:func:`sweep` removes all of it, from a clean stop or after a killed run alike: it kills every
process under ``/csb-node``, removes those cgroups, the volumes' loop devices and backing files (by their prefix), the
iptables chains (``kube-proxy --cleanup`` and the kubelet's own chains), the bridge, the
directories it created, and restores ``ip_forward`` if it changed.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from checkpoint_storage_bench.ports import free_port
from localcluster.client import AdminClient
from localcluster.controlplane import (
    DRIVER_NAME,
    KUBELET_CLIENT,
    NODE_NAME,
    ControlPlane,
    ControlPlaneError,
    Lifecycle,
    Proc,
    _alive,
    _b64,
    _die_with_parent,
    _http_ok,
    _proc_start_time,
    _stop_group,
    stop_recorded,
    tail,
    write_kubeconfig,
)
from localcluster.emulation import loop_volume

BRIDGE = "csb0"
BRIDGE_IP = "10.244.0.1"
POD_SUBNET = "10.244.0.0/24"
SERVICE_SUBNET = "10.0.0.0/24"
# Under every cgroup hierarchy: daemons/ holds the node's processes, kubepods/ the kubelet's.
CGROUP_ROOT = "csb-node"
PAUSE_IMAGE = "registry.k8s.io/pause:3.10"
NODE_PROCESSES = (
    "holder",
    "csi-hostpath-lite",
    "containerd",
    "kubelet",
    "kube-scheduler",
    "kube-proxy",
)
# The CSI volumes' backing files: loop_volume's naming (csb-<name>.img in /dev/shm), so one
# sweep by this name prefix finds every loop device and file the driver made.
VOLUME_PREFIX = "csi-"
VOLUME_BACKING_DIR = loop_volume.BACKING_DIR
NODE_PIDS_FILE = "node-pids.json"
HOST_FILE = "node-host.json"  # what start changed on the host, for the sweep
# Host paths containerd 1.6 and kubelet 1.34 use whatever their flags say; inside the node's
# mount namespace a directory of the state dir is bind-mounted over each.
MASKED_PATHS = ("/run/containerd", "/var/lib/cni", "/var/lib/kubelet", "/var/log/containers")
# kubelet with protectKernelDefaults refuses to start when these differ from its defaults
# (it would otherwise write them). They are not namespaced, so inside the node's mount
# namespace only, a read-only file with the expected value covers each /proc/sys entry.
KUBELET_SYSCTLS = {
    "vm/overcommit_memory": "1",
    "vm/panic_on_oom": "0",
    "kernel/panic": "10",
    "kernel/panic_on_oops": "1",
    "kernel/keys/root_maxkeys": "1000000",
    "kernel/keys/root_maxbytes": "25000000",
}
# Chains kubelet 1.34 creates itself (kube-proxy --cleanup removes kube-proxy's).
KUBELET_CHAINS = {
    "mangle": ("KUBE-IPTABLES-HINT", "KUBE-KUBELET-CANARY"),
    "nat": ("KUBE-KUBELET-CANARY",),
    "filter": ("KUBE-KUBELET-CANARY", "KUBE-FIREWALL"),
}
PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
# The bridge, /csb-node and the KUBE-* chains are machine-wide: one node at a time. The
# starter and the holder keep this lock (an inherited descriptor), so it is free again once
# both are gone, whether stopped or killed.
LOCK_FILE = Path("/run/csb-node.lock")


class NodeError(ControlPlaneError):
    """The node did not start; the message says what and ends with a log's tail."""


def _run(*argv: str, check: bool = True, timeout: float = 60) -> subprocess.CompletedProcess:
    done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)
    if check and done.returncode != 0:
        raise NodeError(f"{' '.join(argv)} exited {done.returncode}: {done.stderr.strip()}")
    return done


# -- cgroups ---------------------------------------------------------------------------------


def cgroup_mounts() -> list[Path]:
    """Every cgroup (v1) and cgroup2 mount point of this mount namespace."""
    mounts = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        left, _, right = line.partition(" - ")
        if right.split()[0] in ("cgroup", "cgroup2"):
            mounts.append(Path(left.split()[4]))
    return mounts


def node_cgroups() -> list[Path]:
    """Every existing cgroup at or under /csb-node, deepest first."""
    found = []
    for mount in cgroup_mounts():
        top = mount / CGROUP_ROOT
        if top.is_dir():
            found += [Path(d) for d, _, _ in os.walk(top)]
    return sorted(found, key=lambda p: len(p.parts), reverse=True)


def node_cgroup_pids() -> set[int]:
    pids: set[int] = set()
    for group in node_cgroups():
        try:
            pids.update(int(p) for p in (group / "cgroup.procs").read_text().split())
        except OSError:
            pass
    return pids


def make_daemon_cgroups() -> list[Path]:
    """/csb-node/daemons in every hierarchy (cpuset ones get their parent's cpus and mems)."""
    made = []
    for mount in cgroup_mounts():
        parent = mount
        for part in (CGROUP_ROOT, "daemons"):
            group = parent / part
            group.mkdir(exist_ok=True)
            for knob in ("cpuset.cpus", "cpuset.mems"):
                if (parent / knob).exists() and not (group / knob).read_text().strip():
                    (group / knob).write_text((parent / knob).read_text())
            parent = group
        made.append(parent)
    return made


def _join_daemon_cgroups() -> None:
    """In the child before exec: move into /csb-node/daemons of every hierarchy."""
    for mount in cgroup_mounts():
        procs = mount / CGROUP_ROOT / "daemons" / "cgroup.procs"
        try:
            procs.write_text(str(os.getpid()))
        except OSError:
            pass


def kill_node_cgroups(timeout: float = 15.0) -> int:
    """SIGKILL every process under /csb-node until none is left; returns how many were seen."""
    seen: set[int] = set()
    deadline = time.monotonic() + timeout
    while True:
        pids = node_cgroup_pids() - {os.getpid()}
        if not pids:
            return len(seen)
        if time.monotonic() > deadline:
            raise NodeError(f"processes under /{CGROUP_ROOT} survive SIGKILL: {sorted(pids)}")
        seen |= pids
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        time.sleep(0.1)


def remove_node_cgroups(timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while groups := node_cgroups():
        for group in groups:
            try:
                group.rmdir()
            except OSError:
                pass
        if time.monotonic() > deadline:
            raise NodeError(f"cgroups left: {[str(g) for g in node_cgroups()]}")
        time.sleep(0.1)


# -- iptables --------------------------------------------------------------------------------


def kube_chains() -> list[str]:
    """``family table chain`` for each KUBE-* chain in iptables and ip6tables."""
    chains = []
    for family, save in (("ipv4", "iptables-save"), ("ipv6", "ip6tables-save")):
        if not shutil.which(save, path=PATH):
            continue
        table = ""
        for line in _run(save, check=False).stdout.splitlines():
            if line.startswith("*"):
                table = line[1:]
            elif line.startswith(":KUBE-"):
                chains.append(f"{family} {table} {line[1:].split()[0]}")
    return chains


IPTABLES_TABLES = ("filter", "nat", "mangle", "raw", "security")


def nft_tables() -> list[str]:
    """``family name`` of every nftables table (iptables-nft keeps its tables there)."""
    done = _run("nft", "list", "tables", check=False)
    return sorted(line.removeprefix("table ").strip() for line in done.stdout.splitlines() if line)


def remove_new_iptables_tables(before: list[str]) -> None:
    """Delete the iptables tables (ip/ip6 filter, nat, ...) that did not exist before the node
    started, once they hold no rule: the kubelet and kube-proxy create them."""
    for table in set(nft_tables()) - set(before):
        family, _, name = table.partition(" ")
        if family not in ("ip", "ip6") or name not in IPTABLES_TABLES:
            continue
        save = "iptables-save" if family == "ip" else "ip6tables-save"
        rules = _run(save, "-t", name, check=False).stdout.splitlines()
        if not any(line.startswith(("-A", ":KUBE")) for line in rules):
            _run("nft", "delete", "table", family, name, check=False)


def remove_kubelet_chains() -> None:
    for tool in ("iptables", "ip6tables"):
        if not shutil.which(tool, path=PATH):
            continue
        for table, chains in KUBELET_CHAINS.items():
            for chain in chains:
                for builtin in ("INPUT", "OUTPUT", "FORWARD", "PREROUTING", "POSTROUTING"):
                    while (
                        _run(tool, "-t", table, "-D", builtin, "-j", chain, check=False).returncode
                        == 0
                    ):
                        pass
                _run(tool, "-t", table, "-F", chain, check=False)
                _run(tool, "-t", table, "-X", chain, check=False)


def take_lock() -> Any:
    """The machine's node lock (an open file), or NodeError when a live node holds it."""
    lock = LOCK_FILE.open("a+")
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        lock.seek(0)
        owner = lock.read().strip()
        lock.close()
        raise NodeError(
            f"another node is running on this machine ({owner}); stop it first"
        ) from None
    lock.truncate(0)
    lock.write(f"pid {os.getpid()}\n")
    lock.flush()
    return lock


# -- the sweep -------------------------------------------------------------------------------


def sweep(state_dir: Path, bin_dir: Path | None = None, *, lock: Any = None) -> dict[str, Any]:
    """Remove what a node left, whether it stopped cleanly or was killed. Idempotent.

    Touches only what carries our names: processes under /csb-node (and the pids recorded in
    the state dir, checked against their start time), /csb-node cgroups, the bridge csb0,
    the KUBE-* chains (kube-proxy's own cleanup, then the kubelet's named chains), the
    directories ``start`` created, and ip_forward if it was changed. Refuses (NodeError) while
    another live node holds the machine's lock; ``lock``: the caller's, already held.
    """
    own = lock is None
    stopped: list[str] = []
    if own:
        try:
            lock = take_lock()
        except NodeError:
            # Held by this state dir's own detached node (`start` from the command line, or
            # a killed starter whose holder lives on): stop those processes, then it is free.
            stopped = _stop_recorded_node(state_dir)
            if not stopped:
                raise
            lock = _retry(take_lock, 5.0)
    try:
        report = _sweep(state_dir, bin_dir)
        report["recorded"] = stopped + report["recorded"]
        return report
    finally:
        if own:
            lock.close()


def _sweep(state_dir: Path, bin_dir: Path | None) -> dict[str, Any]:
    report: dict[str, Any] = {}
    report["recorded"] = _stop_recorded_node(state_dir)
    report["killed"] = kill_node_cgroups()
    remove_node_cgroups()
    report["volumes"] = sweep_volumes()
    host = _read_json(state_dir / HOST_FILE)
    proxy = (bin_dir or Path(host.get("bin_dir", "/nonexistent"))) / "kube-proxy"
    if kube_chains() and os.access(proxy, os.X_OK):
        _run(str(proxy), "--cleanup", "--v=0", check=False, timeout=60)
    remove_kubelet_chains()
    if "nft_tables" in host:
        remove_new_iptables_tables(host["nft_tables"])
    # A pod's veth goes when its network namespace does, which the kernel frees shortly after
    # the namespace's last process and mount are gone.
    deadline = time.monotonic() + 10
    while _bridge_ports() and time.monotonic() < deadline:
        time.sleep(0.1)
    if Path(f"/sys/class/net/{BRIDGE}").exists():
        _run("ip", "link", "delete", BRIDGE, check=False)
    for made in reversed(host.get("created_dirs", [])):
        try:
            Path(made).rmdir()
        except OSError:
            pass
    forward = host.get("ip_forward")
    if forward is not None and _ip_forward() != forward:
        Path("/proc/sys/net/ipv4/ip_forward").write_text(forward)
        report["ip_forward_restored"] = forward
    (state_dir / HOST_FILE).unlink(missing_ok=True)
    report["left"] = leftovers()
    return report


def volume_devices() -> dict[str, list[str]]:
    """The CSI volumes' loop devices and backing files on this machine now."""
    ours = f"{loop_volume.PREFIX}{VOLUME_PREFIX}"
    devices = [
        f"/dev/{dev.name} ({file})"
        for file, dev in loop_volume.loop_devices().items()
        if file.parent == VOLUME_BACKING_DIR and file.name.startswith(ours)
    ]
    files = sorted(str(f) for f in VOLUME_BACKING_DIR.glob(f"{ours}*.img"))
    return {"loop_devices": sorted(devices), "backing_files": files}


def sweep_volumes(timeout: float = 15.0) -> list[str]:
    """Detach the volumes' loop devices and delete their backing files. Run once the node's
    processes are gone: a device whose file system is still mounted in the dying mount
    namespace is detached by the kernel when that mount goes, which this waits for."""
    try:
        return loop_volume.sweep(
            VOLUME_PREFIX, VOLUME_BACKING_DIR, cgroups=False, release_s=timeout
        )
    except loop_volume.VolumeUnavailable as exc:
        raise NodeError(f"loop devices of the node's volumes left: {exc}") from exc


def leftovers() -> dict[str, list[str]]:
    """What of a node is on this machine now (empty lists when nothing)."""
    mounts = [
        line.split()[4]
        for line in Path("/proc/self/mountinfo").read_text().splitlines()
        if "csb-kube" in line or "csb-node" in line
    ]
    return {
        "processes": sorted(str(p) for p in node_cgroup_pids()),
        "cgroups": [str(g) for g in node_cgroups()],
        "chains": kube_chains(),
        "bridge": [BRIDGE] if Path(f"/sys/class/net/{BRIDGE}").exists() else [],
        "veths": _bridge_ports(),
        "mounts": mounts,
        **volume_devices(),
    }


def _retry(fn: Any, timeout: float) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        try:
            return fn()
        except NodeError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)


def _bridge_ports() -> list[str]:
    ports = Path(f"/sys/class/net/{BRIDGE}/brif")
    return sorted(p.name for p in ports.iterdir()) if ports.is_dir() else []


def _ip_forward() -> str:
    return Path("/proc/sys/net/ipv4/ip_forward").read_text().strip()


def _read_json(path: Path) -> dict[str, Any]:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


def _stop_recorded_node(state_dir: Path) -> list[str]:
    data = _read_json(state_dir / NODE_PIDS_FILE)
    stopped = []
    for rec in reversed(data.get("procs", [])):
        if _alive(rec["pid"], rec.get("start_time")):
            stopped.append(rec["name"])
            _stop_group(rec["pid"], rec.get("start_time"), None)
    (state_dir / NODE_PIDS_FILE).unlink(missing_ok=True)
    return stopped


# -- the node --------------------------------------------------------------------------------


@dataclass
class Node(Lifecycle):
    """The control plane (bound to the bridge's address) and a node registered with it.

    ``start()`` / ``stop()``, or a context manager. ``stop`` is :func:`sweep`.
    ``cluster`` is the admin's client once started: a ``client_class`` instance
    (:class:`localcluster.client.AdminClient` unless a subclass with more helpers is given).
    """

    bin_dir: Path
    state_dir: Path
    die_with_parent: bool = False
    plane: ControlPlane | None = None
    procs: list[Proc] = field(default_factory=list)
    timings: dict[str, float] = field(default_factory=dict)
    lock: Any = None
    client_class: type[AdminClient] | None = None
    # A cluster DNS for the pods (localcluster/cluster_dns.py), for pods that find each other
    # by a Service's name (a PyTorchJob's workers); off, the pods use the host's resolv.conf.
    cluster_dns: bool = False

    @property
    def containerd_socket(self) -> Path:
        return self.state_dir / "containerd.sock"

    def stop(self) -> dict[str, Any]:
        if self.lock is None:  # start failed before it had the machine: nothing of ours
            return {"left": leftovers()}
        for proc in reversed(self.procs):
            if proc.name in ("kubelet", "kube-scheduler", "kube-proxy"):
                _stop_group(proc.pid, proc.start_time, proc.popen)
        try:
            report = sweep(self.state_dir, self.bin_dir, lock=self.lock)
        finally:
            for proc in self.procs:
                if proc.popen is not None:
                    proc.popen.poll()  # reap
            self.procs.clear()
            if self.plane is not None:
                self.plane.stop()
            self.lock.close()
            self.lock = None
        return report

    # -- start -------------------------------------------------------------------------------

    def _start(self) -> None:
        self.state_dir.mkdir(parents=True, exist_ok=True)
        self.lock = take_lock()
        stop_recorded(self.state_dir)
        sweep(self.state_dir, self.bin_dir, lock=self.lock)
        shutil.rmtree(self.state_dir)  # a fresh cluster: no etcd data of an earlier start
        self.state_dir.mkdir(parents=True)
        self.logs = self.state_dir / "logs"
        self.logs.mkdir(exist_ok=True)
        self._prepare_host()
        # Before the control plane: the CSI driver it starts first runs in this namespace.
        self._start_holder()
        self.plane = ControlPlane(
            self.bin_dir,
            self.state_dir,
            die_with_parent=self.die_with_parent,
            bind_address=BRIDGE_IP,
            node=True,
            driver_spawner=self._spawn_driver,
        )
        self.plane.start()
        self.cluster = (self.client_class or AdminClient)(self.plane)
        self.cluster.apply(csi_driver_object())
        self._start_containerd()
        self._start_kubelet()
        self._start_scheduler()
        self._start_proxy()
        self._wait_node_ready()
        self._write_pids()

    def _prepare_host(self) -> None:
        host: dict[str, Any] = {
            "ip_forward": _ip_forward(),
            "nft_tables": nft_tables(),
            "bin_dir": str(self.bin_dir),
            "created_dirs": [],
        }
        for path in MASKED_PATHS:
            missing = []
            p = Path(path)
            while not p.exists():
                missing.append(str(p))
                p = p.parent
            Path(path).mkdir(parents=True, exist_ok=True)
            host["created_dirs"] += reversed(missing)
        # Written before anything else changes, so that a killed start is swept too.
        (self.state_dir / HOST_FILE).write_text(json.dumps(host, indent=2))
        make_daemon_cgroups()
        _run("ip", "link", "add", BRIDGE, "type", "bridge")
        _run("ip", "addr", "add", f"{BRIDGE_IP}/24", "dev", BRIDGE)
        _run("ip", "link", "set", BRIDGE, "up")

    def _spawn(
        self, name: str, argv: list[str], *, in_namespace: bool = True, env: dict | None = None
    ) -> Proc:
        log = self.logs / f"{name}.log"
        if in_namespace and name != "holder":
            argv = ["nsenter", f"--mount=/proc/{self._proc('holder').pid}/ns/mnt", "--", *argv]
        full_env = {"PATH": PATH, "HOME": str(self.state_dir), "TMPDIR": str(self.state_dir)}
        full_env.update(env or {})
        die = self.die_with_parent

        def preexec() -> None:
            _join_daemon_cgroups()
            if die:
                _die_with_parent()

        with log.open("ab") as out:
            popen = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                cwd=self.state_dir,
                env=full_env,
                start_new_session=True,
                preexec_fn=preexec,  # noqa: PLW1509
                pass_fds=(self.lock.fileno(),) if name == "holder" else (),
            )
        proc = Proc(name, popen, popen.pid, _proc_start_time(popen.pid), log, argv)
        self.procs.append(proc)
        self._write_pids()
        return proc

    def _proc(self, name: str) -> Proc:
        (proc,) = [p for p in self.procs if p.name == name]
        return proc

    def _write_pids(self) -> None:
        data = {"procs": [p.record() for p in self.procs]}
        (self.state_dir / NODE_PIDS_FILE).write_text(json.dumps(data, indent=2))

    def _wait(self, name: str, ready: Any, timeout: float) -> None:
        proc = self._proc(name)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if proc.popen is not None and proc.popen.poll() is not None:
                raise NodeError(f"{name} exited with {proc.popen.returncode}:\n{tail(proc.log)}")
            if ready():
                self.timings[name] = round(time.monotonic() - proc.t0, 2)
                return
            time.sleep(0.1)
        raise NodeError(f"{name} not ready after {timeout}s:\n{tail(proc.log)}")

    def _start_holder(self) -> None:
        masks = self.state_dir / "masked"
        sysctls = self.state_dir / "sysctls"
        lines = ["set -e", "mount --make-rshared /"]
        for path in MASKED_PATHS:
            src = masks / path.strip("/").replace("/", "-")
            src.mkdir(parents=True, exist_ok=True)
            lines.append(f"mount --bind {src} {path}")
        for key, value in KUBELET_SYSCTLS.items():
            f = sysctls / key.replace("/", ".")
            f.parent.mkdir(parents=True, exist_ok=True)
            f.write_text(value + "\n")
            lines.append(f"mount --bind -o ro {f} /proc/sys/{key}")
        ready = self.state_dir / "holder.ready"
        ready.unlink(missing_ok=True)
        lines += [f"touch {ready}", "exec sleep infinity"]
        self._spawn("holder", ["unshare", "--mount", "--", "sh", "-c", "\n".join(lines)])
        self._wait("holder", ready.exists, 10)

    def _spawn_driver(self, args: list[str]) -> Proc:
        """The control plane's CSI driver, here with its node service (as root, in the
        holder's mount namespace, so that its mounts are the kubelet's)."""
        binary = self.bin_dir / "csi-hostpath-lite"
        if not os.access(binary, os.X_OK):
            raise NodeError(f"{binary} is not built (scripts/controlplane.sh build)")
        return self._spawn(
            "csi-hostpath-lite",
            [
                str(binary),
                *args,
                "-node-service",
                f"-kubelet-dir={self.state_dir / 'kubelet'}",
                f"-backing-dir={VOLUME_BACKING_DIR}",
                f"-backing-prefix={loop_volume.PREFIX}{VOLUME_PREFIX}",
                f"-kubelet-cgroup-root=/{CGROUP_ROOT}",
            ],
        )

    def _start_containerd(self) -> None:
        root = self.state_dir / "containerd"
        cni = self.state_dir / "cni"
        (cni / "net.d").mkdir(parents=True, exist_ok=True)
        (cni / "net.d" / "10-csb.conflist").write_text(json.dumps(cni_config(cni / "ipam")))
        config = root / "config.toml"
        root.mkdir(parents=True, exist_ok=True)
        config.write_text(containerd_config(self.state_dir, cni / "net.d"))
        self._spawn("containerd", ["containerd", f"--config={config}", "--log-level=info"])
        self._wait("containerd", self.containerd_socket.exists, 30)
        self.import_image(build_pause_image(self.state_dir / "images"), "registry.k8s.io/pause")

    def ctr(self, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
        holder = self._proc("holder").pid
        return _run(
            "nsenter",
            f"--mount=/proc/{holder}/ns/mnt",
            "--",
            "ctr",
            f"--address={self.containerd_socket}",
            "--namespace=k8s.io",
            *args,
            timeout=timeout,
        )

    def import_image(self, archive: Path, base_name: str) -> None:
        """Import an OCI archive whose index names its tag (``NAME:TAG`` = base_name:tag)."""
        # The job image is several GB (torch with its CUDA libraries): minutes on a busy disk.
        self.ctr("images", "import", f"--base-name={base_name}", str(archive), timeout=900)

    def _start_kubelet(self) -> None:
        assert self.plane is not None
        pki = self.plane.pki
        kubelet_dir = self.state_dir / "kubelet"
        kubelet_dir.mkdir(exist_ok=True)
        kubeconfig = write_kubeconfig(
            self.state_dir / "kubelet.kubeconfig",
            self.plane.server,
            pki.ca_crt,
            user={
                "client-certificate-data": _b64(pki.client_crt(KUBELET_CLIENT)),
                "client-key-data": _b64(pki.client_key(KUBELET_CLIENT)),
            },
            user_name=f"system:node:{NODE_NAME}",
        )
        self.kubelet_healthz = free_port()
        config = self.state_dir / "kubelet.yaml"
        settings = kubelet_config(
            self.state_dir, ca=pki.ca_crt, port=free_port(BRIDGE_IP), healthz=self.kubelet_healthz
        )
        if self.cluster_dns:
            self._start_cluster_dns()
            settings["clusterDNS"] = [BRIDGE_IP]
        config.write_text(json.dumps(settings, indent=2))
        self._spawn(
            "kubelet",
            [
                str(self.bin_dir / "kubelet"),
                f"--config={config}",
                f"--kubeconfig={kubeconfig}",
                f"--root-dir={kubelet_dir}",
                f"--hostname-override={NODE_NAME}",
                f"--node-ip={BRIDGE_IP}",
                "--v=2",
            ],
        )
        self._wait(
            "kubelet", lambda: _http_ok(f"http://127.0.0.1:{self.kubelet_healthz}/healthz"), 90
        )

    def _start_cluster_dns(self) -> None:
        import sys

        from localcluster import cluster_dns

        assert self.plane is not None
        self._spawn(
            "cluster-dns",
            [
                sys.executable, "-m", "localcluster.cluster_dns",
                f"--kubeconfig={self.plane.admin_kubeconfig}", f"--listen={BRIDGE_IP}:53",
            ],
            in_namespace=False,
            env={"PYTHONPATH": str(Path(cluster_dns.__file__).resolve().parent.parent)},
        )  # fmt: skip
        self._wait("cluster-dns", lambda: cluster_dns.answers(BRIDGE_IP), 30)

    def _start_scheduler(self) -> None:
        assert self.plane is not None
        self._spawn(
            "kube-scheduler",
            [
                str(self.bin_dir / "kube-scheduler"),
                f"--kubeconfig={self.plane.admin_kubeconfig}",
                "--leader-elect=false",
                "--bind-address=127.0.0.1",
                f"--secure-port={free_port()}",
                "--v=1",
            ],
            in_namespace=False,
        )

    def _start_proxy(self) -> None:
        assert self.plane is not None
        config = self.state_dir / "kube-proxy.yaml"
        config.write_text(json.dumps(proxy_config(self.plane.admin_kubeconfig), indent=2))
        self._spawn(
            "kube-proxy",
            [str(self.bin_dir / "kube-proxy"), f"--config={config}", "--v=1"],
            in_namespace=False,
        )

    def _wait_node_ready(self, timeout: float = 90) -> None:
        proc = self._proc("kubelet")

        def ready() -> bool:
            if proc.popen is not None and proc.popen.poll() is not None:
                raise NodeError(f"kubelet exited with {proc.popen.returncode}:\n{tail(proc.log)}")
            try:
                node = self.cluster.request("GET", f"/api/v1/nodes/{NODE_NAME}")
            except Exception:  # noqa: BLE001 - not registered yet
                return False
            conditions = (node.get("status") or {}).get("conditions") or []
            return any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)

        deadline = time.monotonic() + timeout
        while not ready():
            if time.monotonic() > deadline:
                raise NodeError(f"node {NODE_NAME} not Ready after {timeout}s:\n{tail(proc.log)}")
            time.sleep(0.5)
        self.timings["node-ready"] = round(time.monotonic() - proc.t0, 2)

    # -- pods ----------------------------------------------------------------------------------

    def run_pod(self, doc: dict, timeout: float = 120) -> tuple[dict, str]:
        """Create the pod, wait until it Succeeded or Failed; returns it and its log."""
        ns, name = doc["metadata"]["namespace"], doc["metadata"]["name"]
        path = f"/api/v1/namespaces/{ns}/pods/{name}"
        self.cluster.request("POST", f"/api/v1/namespaces/{ns}/pods", doc)
        deadline = time.monotonic() + timeout
        while True:
            pod = self.cluster.request("GET", path)
            if pod["status"].get("phase") in ("Succeeded", "Failed"):
                break
            if time.monotonic() > deadline:
                raise AssertionError(
                    f"pod {ns}/{name} not finished after {timeout}s: {pod['status']}"
                )
            time.sleep(0.5)
        log = self.cluster.api.call_api(
            f"{path}/log",
            "GET",
            auth_settings=["BearerToken"],
            _preload_content=False,
            _return_http_data_only=True,
        ).data.decode(errors="replace")
        return pod, log


# -- configuration ---------------------------------------------------------------------------


def csi_driver_object() -> dict[str, Any]:
    """The driver as the kubelet must know it: no attach step (there is no attacher: the node
    service stages the volume itself), the pod's name and uid in NodePublishVolume's context
    (the driver finds the pod's cgroups by the uid), and ``fsGroupPolicy: File`` so that the
    kubelet hands the root-owned ext4 to a pod's ``fsGroup`` whatever the volume's fsType."""
    return {
        "apiVersion": "storage.k8s.io/v1",
        "kind": "CSIDriver",
        "metadata": {"name": DRIVER_NAME},
        "spec": {
            "attachRequired": False,
            "podInfoOnMount": True,
            "fsGroupPolicy": "File",
            "volumeLifecycleModes": ["Persistent"],
        },
    }


def cni_config(ipam_dir: Path) -> dict[str, Any]:
    """The bridge plugin on csb0: no gateway on the bridge (we gave it its address), so the
    plugin never turns ip_forward on; no masquerade; routes to the pod and service ranges
    only, so nothing a pod sends can leave the machine."""
    return {
        "cniVersion": "0.4.0",
        "name": "csb-pods",
        "plugins": [
            {
                "type": "bridge",
                "bridge": BRIDGE,
                "isGateway": False,
                "ipMasq": False,
                "ipam": {
                    "type": "host-local",
                    "dataDir": str(ipam_dir),
                    "ranges": [[{"subnet": POD_SUBNET, "gateway": BRIDGE_IP}]],
                    "routes": [{"dst": SERVICE_SUBNET, "gw": BRIDGE_IP}],
                },
            }
        ],
    }


def containerd_config(state: Path, cni_conf_dir: Path) -> str:
    root = state / "containerd"
    cri = 'plugins."io.containerd.grpc.v1.cri"'
    return f"""version = 2
root = "{root / "root"}"
state = "{root / "state"}"
disabled_plugins = [
  "io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.btrfs",
  "io.containerd.snapshotter.v1.devmapper", "io.containerd.snapshotter.v1.zfs",
  "io.containerd.tracing.processor.v1.otlp",
]

[grpc]
  address = "{state / "containerd.sock"}"

[plugins."io.containerd.internal.v1.opt"]
  path = "{root / "opt"}"

[{cri}]
  sandbox_image = "{PAUSE_IMAGE}"
  netns_mounts_under_state_dir = true
  stream_server_address = "127.0.0.1"
  disable_apparmor = true
  enable_selinux = false
  # Lowering a process's oom_score_adj needs CAP_SYS_RESOURCE, which root lacks on some
  # machines (this one): runc then fails with "failed to update /proc/self/oom_score_adj".
  # Restricted, no container gets a score below containerd's own.
  restrict_oom_score_adj = true

[{cri}.cni]
  bin_dir = "/usr/lib/cni"
  conf_dir = "{cni_conf_dir}"

[{cri}.containerd]
  snapshotter = "overlayfs"
  default_runtime_name = "runc"

[{cri}.containerd.runtimes.runc]
  runtime_type = "io.containerd.runc.v2"

[{cri}.containerd.runtimes.runc.options]
  SystemdCgroup = false
  BinaryName = "/usr/sbin/runc"
  Root = "{root / "runc"}"
"""


def kubelet_config(state: Path, *, ca: Path, port: int, healthz: int) -> dict[str, Any]:
    return {
        "apiVersion": "kubelet.config.k8s.io/v1beta1",
        "kind": "KubeletConfiguration",
        "containerRuntimeEndpoint": f"unix://{state / 'containerd.sock'}",
        # No systemd here; cgroup v1 (kubelet 1.35 would refuse it).
        "cgroupDriver": "cgroupfs",
        "failCgroupV1": False,
        "cgroupRoot": f"/{CGROUP_ROOT}",
        # Never write the machine's sysctls (the holder shows kubelet the values it wants).
        "protectKernelDefaults": True,
        "address": BRIDGE_IP,
        "port": port,
        "readOnlyPort": 0,
        "healthzBindAddress": "127.0.0.1",
        "healthzPort": healthz,
        "authentication": {
            "anonymous": {"enabled": False},
            "webhook": {"enabled": True},
            "x509": {"clientCAFile": str(ca)},
        },
        "authorization": {"mode": "Webhook"},
        "podLogsDir": str(state / "pod-logs"),
        "volumePluginDir": str(state / "kubelet-volume-plugins"),
        # Nothing can be pulled here: imported images must never be collected.
        "imageGCHighThresholdPercent": 100,
        "imageGCLowThresholdPercent": 99,
        "evictionHard": {
            "memory.available": "100Mi",
            "nodefs.available": "2%",
            "imagefs.available": "2%",
            "nodefs.inodesFree": "2%",
        },
        "failSwapOn": False,
        "maxPods": 16,
        "shutdownGracePeriod": "0s",
        "clusterDomain": "cluster.local",
        "resolvConf": "/etc/resolv.conf",
        "serializeImagePulls": True,
    }


def proxy_config(kubeconfig: Path) -> dict[str, Any]:
    return {
        "apiVersion": "kubeproxy.config.k8s.io/v1alpha1",
        "kind": "KubeProxyConfiguration",
        "mode": "iptables",
        "clientConnection": {"kubeconfig": str(kubeconfig)},
        "hostnameOverride": NODE_NAME,
        "bindAddress": BRIDGE_IP,
        "healthzBindAddress": f"127.0.0.1:{free_port()}",
        "metricsBindAddress": f"127.0.0.1:{free_port()}",
        "clusterCIDR": POD_SUBNET,
        "nodePortAddresses": [f"{BRIDGE_IP}/32"],
        # 0 = leave the machine's conntrack settings alone; no route_localnet sysctl.
        "conntrack": {
            "maxPerCore": 0,
            "min": 0,
            "tcpEstablishedTimeout": "0s",
            "tcpCloseWaitTimeout": "0s",
        },
        "iptables": {"localhostNodePorts": False, "masqueradeAll": False},
        "oomScoreAdj": 0,
    }


# -- images ----------------------------------------------------------------------------------


def busybox_image(out_dir: Path, tag: str, entrypoint: list[str]) -> Path:
    """An OCI archive of one layer, Debian's static busybox (/bin/busybox, /bin/sh), built
    with umoci; its index names ``tag``. Returns the archive."""
    out_dir.mkdir(parents=True, exist_ok=True)
    layout = Path(tempfile.mkdtemp(dir=out_dir, prefix="layout-"))
    try:
        oci, bundle = layout / "oci", layout / "bundle"
        _run("umoci", "init", "--layout", str(oci))
        _run("umoci", "new", "--image", f"{oci}:{tag}")
        _run("umoci", "unpack", "--image", f"{oci}:{tag}", str(bundle))
        bindir = bundle / "rootfs" / "bin"
        bindir.mkdir(parents=True, exist_ok=True)
        shutil.copy2("/bin/busybox", bindir / "busybox")
        for applet in ("sh", "sleep", "cat", "echo", "id", "ls", "touch", "df", "mount"):
            (bindir / applet).symlink_to("busybox")
        _run("umoci", "repack", "--image", f"{oci}:{tag}", str(bundle))
        config = ["umoci", "config", "--image", f"{oci}:{tag}"]
        config += [f"--config.entrypoint={e}" for e in entrypoint]
        _run(*config)
        archive = out_dir / f"{tag}.tar"
        _run("tar", "-C", str(oci), "-cf", str(archive), ".")
        return archive
    finally:
        shutil.rmtree(layout, ignore_errors=True)


# The base of the node's images, from Debian's archive (no registry is reachable here).
DEBIAN_SUITE = "bookworm"
DEBIAN_PACKAGES = ("python3", "python3-venv", "python3-pip", "fio")
BASE_IMAGE = f"localhost/csb-debian-base:{DEBIAN_SUITE}"


def image_cache() -> Path:
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return cache / "checkpoint-storage-bench" / "images"


def debian_base_image(cache: Path | None = None) -> Path:
    """An OCI archive of a minbase Debian root with Python and fio (mmdebstrap, one layer
    added with umoci), tagged ``DEBIAN_SUITE``. Cached under a key of the suite and the
    package list: built once (minutes: it downloads ~100 MB of packages), then reused."""
    import hashlib

    cache = cache or image_cache()
    key = hashlib.sha256(f"{DEBIAN_SUITE} minbase {sorted(DEBIAN_PACKAGES)}".encode()).hexdigest()
    archive = cache / f"debian-base-{key[:12]}.tar"
    if archive.exists():
        return archive
    cache.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(dir=cache, prefix="build-"))
    try:
        rootfs = work / "rootfs.tar"
        _run(
            "mmdebstrap",
            "--variant=minbase",
            f"--include={','.join(DEBIAN_PACKAGES)}",
            "--quiet",
            DEBIAN_SUITE,
            str(rootfs),
            timeout=3600,
        )
        oci = work / "oci"
        image = f"{oci}:{DEBIAN_SUITE}"
        _run("umoci", "init", "--layout", str(oci))
        _run("umoci", "new", "--image", image)
        _run("umoci", "raw", "add-layer", "--image", image, str(rootfs), timeout=600)
        _run(
            "umoci",
            "config",
            "--image",
            image,
            "--config.env=PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
            "--config.cmd=python3",
        )
        rootfs.unlink()
        partial = work / "image.tar"
        _run("tar", "-C", str(oci), "-cf", str(partial), ".", timeout=600)
        partial.rename(archive)  # complete or absent: a killed build leaves no half archive
        return archive
    finally:
        shutil.rmtree(work, ignore_errors=True)


def build_pause_image(out_dir: Path) -> Path:
    """The sandbox image: busybox sleeping (killed with SIGKILL when the pod stops)."""
    return busybox_image(out_dir, PAUSE_IMAGE.rsplit(":", 1)[1], ["/bin/sleep", "infinity"])
