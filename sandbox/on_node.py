"""The node runtime (:class:`NodeRuntime`): the sandbox on the local node, with Polyaxon's
own agent and the operator stand-in instead of the process agent (docs/agent-on-node.md).

What runs, beside the node (``python -m localcluster start --node``, which owns the bridge
``10.244.0.1`` and the API server on it):

- the sandbox's haupt server, listening on the bridge's address (the one address of this
  machine the pods reach: Polyaxon's init and sidecar containers and the runs' tracking
  call it);
- Polyaxon's agent from the pinned package, ``polyaxon agent start`` (``POLYAXON_SERVICE=
  agent``, the ``agent`` extra's ``kubernetes_asyncio``), with ``connections/node-agent.yaml``
  as its config: it polls the server's agent state and turns each queued run into a
  ``polyaxon.com/v1`` object with Polyaxon's own converter;
- the operator stand-in (``python -m operator_standin``), which runs those objects as batch
  Jobs and reports their phases to the server.

Before those start, the cluster gets what the runs need: the CRDs, the objects of
``localcluster/manifests/sandbox-runs.yaml`` (the namespace, the artifacts store's volume and
claim, the runs' service account and the Role Polyaxon's sidecar needs: it reads its pod and
the main container's log through the API), applied through the shared object layer
(``checkpoint_storage_bench/kube.py``), and the images of Polyaxon's init and sidecar containers
imported into the node's containerd (``sandbox/node_images.py``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from string import Template
from typing import Any, ClassVar

import yaml

from sandbox.components import ensure_project
from sandbox.config import (
    DEFAULT_HOST,
    NODE_BRIDGE_ADDRESS,
    REPO_ROOT,
    AgentSettings,
    SandboxPaths,
)
from sandbox.errors import ConfigError, ServerStartError
from sandbox.processes import read_pid, spawn, tail
from sandbox.runtime import Echo, Runtime
from sandbox.server import Sandbox

NODE_AGENT_FILE = REPO_ROOT / "connections" / "node-agent.yaml"
RUNS_ROLE = "polyaxon-runs-sidecar"
READY_TIMEOUT = 60.0


def node_state_dir() -> Path:
    """Where ``python -m localcluster start --node`` keeps its state by default."""
    from localcluster.state import default_state_dir

    return default_state_dir(node=True)


def node_kubeconfig(state_dir: Path) -> Path:
    """The node's admin kubeconfig; a ConfigError when the node is not running."""
    kubeconfig = state_dir / "admin.kubeconfig"
    pids = state_dir / "node-pids.json"
    if not kubeconfig.exists() or not pids.exists():
        raise ConfigError(
            f"no node runs with state in {state_dir}: start it first with "
            "`python -m localcluster start --node`"
        )
    return kubeconfig


def agent_config(agent_file: Path) -> dict[str, Any]:
    """The node agent config (Polyaxon's AgentConfig keys); its artifacts store must be a
    ``volume_claim``: the on-node mode backs that claim with the server's data dir."""
    try:
        config = yaml.safe_load(agent_file.read_text()) or {}
    except (OSError, yaml.YAMLError) as exc:
        raise ConfigError(f"cannot read agent config {agent_file}: {exc}") from exc
    store = config.get("artifactsStore") or {}
    if store.get("kind") != "volume_claim" or not (store.get("schema") or {}).get("volumeClaim"):
        raise ConfigError(
            f"{agent_file}: the artifacts store must be a volume_claim (the on-node mode binds "
            "it to the server's data dir)"
        )
    if not config.get("namespace"):
        raise ConfigError(f"{agent_file}: namespace is required")
    return config


def server_settings(root: Path, agent_file: Path = NODE_AGENT_FILE) -> AgentSettings:
    """The server's view of the node agent config: the same connections, and the artifacts
    store as the host directory the store's claim is bound to (the server reads it there)."""
    config = agent_config(agent_file)
    data = str(SandboxPaths(root).server_data)
    store = dict(config["artifactsStore"])
    store.update(kind="host_path", schema={"hostPath": data, "mountPath": data})
    return AgentSettings(
        artifacts_store=store, connections=config.get("connections") or [], agent_file=agent_file
    )


# The agent config's keys and the environment variables Polyaxon's AgentConfig reads them from.
AGENT_ENV_KEYS = {
    "namespace": "POLYAXON_K8S_NAMESPACE",
    "artifactsStore": "POLYAXON_AGENT_ARTIFACTS_STORE",
    "connections": "POLYAXON_AGENT_CONNECTIONS",
    "init": "POLYAXON_AGENT_INIT",
    "sidecar": "POLYAXON_AGENT_SIDECAR",
    "runsSa": "POLYAXON_AGENT_RUNS_SA",
}


def agent_env(config: dict[str, Any], url: str, kubeconfig: Path, home: Path) -> dict[str, str]:
    """The environment of ``polyaxon agent start`` for this config and server."""
    unknown = set(config) - set(AGENT_ENV_KEYS)
    if unknown:
        raise ConfigError(f"node agent config: keys not handled here: {sorted(unknown)}")
    env = {k: v for k, v in os.environ.items() if not k.startswith("POLYAXON_")}
    env.update(
        HOME=str(home),
        KUBECONFIG=str(kubeconfig),
        # The CLI registers `agent` only for this service; it also makes settings read the
        # agent config from the POLYAXON_AGENT_* variables below.
        POLYAXON_SERVICE="agent",
        POLYAXON_HOST=url,
        POLYAXON_NO_API="false",
        PYTHONUNBUFFERED="1",
    )
    for key, var in AGENT_ENV_KEYS.items():
        if key in config:
            value = config[key]
            env[var] = value if isinstance(value, str) else json.dumps(value)
    return env


RUNS_FILE = REPO_ROOT / "localcluster" / "manifests" / "sandbox-runs.yaml"


def runs_manifests(config: dict[str, Any], store_dir: Path) -> list[dict[str, Any]]:
    """The objects of :data:`RUNS_FILE` for this agent config: the namespace, the artifacts
    store's volume on ``store_dir`` and its claim, the runs' service account (when the
    config names one) and the sidecar's Role and RoleBinding."""
    namespace = config["namespace"]
    claim = config["artifactsStore"]["schema"]["volumeClaim"]
    values = {
        "namespace": namespace,
        "claim": claim,
        "volume": store_volume_name(namespace, claim),
        "store_dir": str(store_dir),
        "runs_sa": config.get("runsSa") or "",
        "role": RUNS_ROLE,
    }
    from checkpoint_storage_bench.kube import load_manifests

    try:
        docs = [_fill(doc, values) for doc in load_manifests(RUNS_FILE)]
    except (KeyError, ValueError) as exc:
        raise ConfigError(f"{RUNS_FILE}: a placeholder this mode does not fill: {exc}") from exc
    return [d for d in docs if d["kind"] != "ServiceAccount" or values["runs_sa"]]


def _fill(node: Any, values: dict[str, str]) -> Any:
    """``node`` with every ``$name`` of its strings replaced (after parsing: a value never
    changes the YAML's structure)."""
    if isinstance(node, dict):
        return {k: _fill(v, values) for k, v in node.items()}
    if isinstance(node, list):
        return [_fill(v, values) for v in node]
    if isinstance(node, str):
        return Template(node).substitute(values)
    return node


def prepare_cluster(api: Any, config: dict[str, Any], store_dir: Path) -> list[str]:
    """The CRDs and :func:`runs_manifests` applied (``store_dir``, the server's data dir,
    made first); returns what did not exist before."""
    from checkpoint_storage_bench.kube import Client
    from operator_standin import crd

    kube = Client(api, field_manager=FIELD_MANAGER)
    docs = runs_manifests(config, store_dir)
    namespace, rest = docs[0], docs[1:]
    made = [_named(namespace)] if kube.apply(namespace).created else []
    made += crd.install(api)
    store_dir.mkdir(parents=True, exist_ok=True)
    made += [_named(doc) for doc in rest if kube.apply(doc).created]
    return made


def _named(doc: dict[str, Any]) -> str:
    return f"{doc['kind']} {doc['metadata']['name']}"


def store_volume_name(namespace: str, claim: str) -> str:
    return f"{namespace}-{claim}"


def import_image(state_dir: Path, archive: Path, base_name: str) -> None:
    """Import an OCI archive into the running node's containerd (in the node's mount
    namespace, as ``localcluster.node.Node.import_image`` does)."""
    pids = json.loads((state_dir / "node-pids.json").read_text())
    (holder,) = [p["pid"] for p in pids["procs"] if p["name"] == "holder"]
    done = subprocess.run(
        [
            "nsenter",
            f"--mount=/proc/{holder}/ns/mnt",
            "--",
            "ctr",
            f"--address={state_dir / 'containerd.sock'}",
            "--namespace=k8s.io",
            "images",
            "import",
            f"--base-name={base_name}",
            str(archive),
        ],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    if done.returncode != 0:
        raise ConfigError(f"importing {archive} into the node failed: {done.stderr.strip()}")


def import_images(state_dir: Path) -> list[str]:
    """The Debian base and Polyaxon's init/sidecar images, built (cached) and imported."""
    from localcluster.node import BASE_IMAGE, debian_base_image, image_cache
    from sandbox import node_images

    base = debian_base_image()
    aux = node_images.build(base, image_cache())
    import_image(state_dir, base, BASE_IMAGE.rsplit(":", 1)[0])
    import_image(state_dir, aux, node_images.IMAGE)
    return [
        BASE_IMAGE,
        *(f"{node_images.IMAGE}:{node_images.tag_for(s)}" for s in node_images.SERVICES),
    ]


# The bundle's objects on the node: the node's CSI driver's StorageClass and classes, the
# hook's RBAC, and the shipped claim on that StorageClass (WaitForFirstConsumer: bound when
# the first op that mounts it is scheduled).
STORAGE_CLASS_FILE = REPO_ROOT / "connections" / "storageclass-hostpath.yaml"
CLASSES_FILE = REPO_ROOT / "connections" / "vac-hostpath.yaml"
RBAC_FILE = REPO_ROOT / "connections" / "rbac-storage-profile.yaml"
CLAIM_FILE = REPO_ROOT / "connections" / "claim-training-checkpoints.yaml"
FIELD_MANAGER = "checkpoint-storage-bench-sandbox"


def apply_bundle(api: Any, namespace: str) -> tuple[list[str], list[str]]:
    """Server-side apply the StorageClass, the classes, the hook's RBAC and the claim;
    returns (applied objects, the classes in the file's order)."""
    from checkpoint_storage_bench.kube import Client, load_manifests

    kube = Client(api, field_manager=FIELD_MANAGER)
    (storage_class,) = load_manifests(STORAGE_CLASS_FILE)
    classes = load_manifests(CLASSES_FILE)
    (claim_doc,) = load_manifests(CLAIM_FILE)
    claim_doc["metadata"]["namespace"] = namespace
    claim_doc["spec"]["storageClassName"] = storage_class["metadata"]["name"]
    docs = [storage_class, *classes, *load_manifests(RBAC_FILE), claim_doc]
    for doc in docs:
        kube.apply(doc)
    return [_named(doc) for doc in docs], [c["metadata"]["name"] for c in classes]


def project_image(echo: Any = print) -> tuple[str, Path]:
    """Build (cached) the project's image from its Dockerfile (``scripts/image.sh``) and
    return its name and archive."""
    script = REPO_ROOT / "scripts" / "image.sh"
    if not script.exists():
        raise ConfigError(f"{script} is missing: the project's image cannot be built here")
    name = subprocess.run(
        ["bash", str(script), "name"], capture_output=True, text=True, check=False, timeout=60
    )
    t0 = time.monotonic()
    built = subprocess.run(
        ["bash", str(script), "build"], capture_output=True, text=True, check=False, timeout=3600
    )
    if name.returncode != 0 or built.returncode != 0:
        raise ConfigError(f"scripts/image.sh failed: {(built.stderr or name.stderr)[-2000:]}")
    archive = built.stdout.strip().splitlines()[-1]
    echo(f"sandbox: image {name.stdout.strip()} ({archive}, {time.monotonic() - t0:.0f} s)")
    return name.stdout.strip(), Path(archive)


# What the measuring pods (fio, training, data workload) ask of the local node, through the
# pipeline's `resources` input: the components' defaults fit a GPU training node (4-8 CPUs and
# a GPU), this node is the 2-core machine, and the trainer runs on its CPU.
NODE_RESOURCES = {"requests": {"cpu": "500m", "memory": "1Gi"}, "limits": {"memory": "6Gi"}}

# The demo's sizes (sandbox.commands.DEMO_PARAMS) with what differs on the node: the hook
# talks to the API server from its pod, the node's driver has no provider to wait for, and
# the pods are sized for the node.
NODE_DEMO_OVERRIDES = {
    "backend": "kubernetes",
    "settle": "kubernetes",
    "resources": json.dumps(NODE_RESOURCES),
}


@dataclass
class NodeRuntime(Runtime):
    """Polyaxon's agent and the operator stand-in against the node whose state is in
    ``state_dir`` (``python -m localcluster start --node``); the server on the node's bridge.
    """

    state_dir: Path

    name: ClassVar[str] = "node"
    processes: ClassVar[tuple[str, ...]] = ("plx-agent", "operator")
    hub: ClassVar[bool] = False

    def sandbox(
        self,
        paths: SandboxPaths,
        host: str,
        port: int,
        agent_file: Path | None,
        profiles_file: Path | None,
    ) -> Sandbox:
        """The server with the node agent config's connections (the profiles are the node's
        classes, not a profiles file), on the bridge unless another host was named."""
        return Sandbox(
            paths=paths,
            agent=server_settings(paths.root, agent_file or NODE_AGENT_FILE),
            host=NODE_BRIDGE_ADDRESS if host == DEFAULT_HOST else host,
            port=port,
        )

    def config(self, sb: Sandbox) -> dict[str, Any]:
        return agent_config(sb.agent.agent_file or NODE_AGENT_FILE)

    def start(self, sb: Sandbox, owner: str, project: str, echo: Echo = print) -> Sandbox:
        """Cluster objects, images, the server on the bridge, the project, Polyaxon's agent
        and the operator stand-in; each step is skipped when already done."""
        from kubernetes import config as k8s_config

        kubeconfig = node_kubeconfig(self.state_dir)
        config = self.config(sb)
        api = k8s_config.new_client_from_config(str(kubeconfig))
        made = prepare_cluster(api, config, sb.paths.server_data)
        echo(f"sandbox: node {kubeconfig}: {', '.join(made) if made else 'objects already there'}")
        t0 = time.monotonic()
        images = import_images(self.state_dir)
        echo(f"sandbox: images in the node: {', '.join(images)} ({time.monotonic() - t0:.0f} s)")
        sb.paths.state.mkdir(parents=True, exist_ok=True)
        echo(f"sandbox: server on {sb.url} (log {sb.paths.server_log})")
        sb.start_server()
        ensure_project(owner, project, sb.client)
        self._start_processes(sb, kubeconfig, config)
        echo(
            f"sandbox: Polyaxon's agent (log {self.log_file(sb.paths, 'plx-agent')}) and the "
            f"operator stand-in (log {self.log_file(sb.paths, 'operator')}) running against "
            "the node"
        )
        return sb

    def _start_processes(self, sb: Sandbox, kubeconfig: Path, config: dict[str, Any]) -> None:
        if sb.host != NODE_BRIDGE_ADDRESS:
            raise ConfigError(
                f"on the node the server must listen on {NODE_BRIDGE_ADDRESS} (--host), "
                "where the pods reach it"
            )
        home = sb.paths.state / "plx-agent-home"
        home.mkdir(parents=True, exist_ok=True)
        env = agent_env(config, sb.url, kubeconfig, home)
        polyaxon = Path(sys.executable).with_name("polyaxon")
        self._start(sb.paths, "plx-agent", [str(polyaxon), "agent", "start"], env)
        op_env = {k: v for k, v in os.environ.items() if not k.startswith("POLYAXON_")}
        op_env.update(PYTHONPATH=str(REPO_ROOT), PYTHONUNBUFFERED="1")
        self._start(
            sb.paths,
            "operator",
            [
                sys.executable,
                "-m",
                "operator_standin",
                "--namespace",
                config["namespace"],
                "--kubeconfig",
                str(kubeconfig),
                "--api-host",
                sb.url,
            ],
            op_env,
        )
        self._wait_ready(sb.paths)

    def _start(self, paths: SandboxPaths, name: str, argv: list[str], env: dict[str, str]) -> None:
        if read_pid(self.pid_file(paths, name)):
            return
        self.log_file(paths, name).write_text("")
        pid = spawn(argv, env, self.log_file(paths, name), REPO_ROOT)
        self.pid_file(paths, name).write_text(str(pid))

    def _wait_ready(self, paths: SandboxPaths, timeout: float = READY_TIMEOUT) -> None:
        marks = {"plx-agent": "Checking agent state", "operator": "watching polyaxon.com/v1"}
        deadline = time.monotonic() + timeout
        pending = dict(marks)
        while pending and time.monotonic() < deadline:
            for name, mark in list(pending.items()):
                log = self.log_file(paths, name)
                if not read_pid(self.pid_file(paths, name)):
                    raise ServerStartError(
                        f"{name} exited while starting; last lines of {log}:\n{tail(log)}"
                    )
                if mark in log.read_text(errors="replace"):
                    del pending[name]
            time.sleep(0.5)
        if pending:
            raise ServerStartError(f"not ready after {timeout:.0f} s: {', '.join(pending)}")

    def place(self, sb: Sandbox, echo: Echo = print) -> dict[str, str]:
        """The pipeline as the README's cluster command submits it: the bundle's objects
        applied, the project's image built and imported into the node, the pods sized for
        the node (:data:`NODE_DEMO_OVERRIDES`)."""
        from kubernetes import config as k8s_config

        from checkpoint_storage_bench.kube import load_manifests

        config = self.config(sb)
        api = k8s_config.new_client_from_config(str(node_kubeconfig(self.state_dir)))
        applied, classes = apply_bundle(api, config["namespace"])
        echo(f"sandbox: applied {', '.join(applied)}")
        name, archive = project_image(echo)
        import_image(self.state_dir, archive, name.rsplit(":", 1)[0])
        return dict(
            NODE_DEMO_OVERRIDES,
            image=name,
            namespace=config["namespace"],
            claim=load_manifests(CLAIM_FILE)[0]["metadata"]["name"],
            profiles=json.dumps(classes),
        )
