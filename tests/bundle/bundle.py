"""Helpers for the bundle tests: find the polyaxonfiles and compile them with Polyaxon's own code.

Everything here goes through Polyaxon's real validation (``check_polyaxonfile``) and its real
Kubernetes converter (``polyaxon.k8s.Executor.make_and_convert``), offline, against the agent
configuration shipped in ``connections/``.
"""

from __future__ import annotations

import copy
import functools
import json
import re
import tomllib
import uuid
import warnings
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]
COMPONENTS = ROOT / "components"
POLYAXONFILES = ROOT / "polyaxonfiles"
CONNECTIONS = ROOT / "connections"
PIPELINE = POLYAXONFILES / "checkpoint-storage-pipeline.yaml"
"""The two-profile pipeline (a wrapper over the general one), as released before."""
PROFILES_PIPELINE = POLYAXONFILES / "checkpoint-storage-profiles.yaml"
"""The general pipeline: any number of profiles, in order."""
AGENT_CONFIGS = sorted(CONNECTIONS.glob("agent-config*.yaml"))
AGENT_CONFIG = CONNECTIONS / "agent-config.yaml"

OWNER, PROJECT = "acme", "checkpoint-storage"
# A stand-in for the pipeline run's uuid, which only the server knows.
PIPELINE_UUID = uuid.uuid5(uuid.NAMESPACE_URL, "pipeline").hex

VERSION_FILE = re.compile(r"^v(\d+)\.(\d+)(?:\.(\d+))?\.yaml$")


def version_key(path: Path) -> tuple[int, ...]:
    """Sort key of a ``v<major>.<minor>[.<patch>].yaml`` component file."""
    match = VERSION_FILE.match(path.name)
    assert match, f"{path} is not named v<major>.<minor>[.<patch>].yaml"
    return tuple(int(part or 0) for part in match.groups())


def component_versions(name: str) -> list[Path]:
    """The numbered version files of one component, oldest first."""
    return sorted(
        (p for p in (COMPONENTS / name).glob("v*.yaml") if VERSION_FILE.match(p.name)),
        key=version_key,
    )


def package_version() -> str:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]


def current_versions() -> list[Path]:
    """The newest numbered version of every component: what this source tree implements.

    Older numbered versions are released history: they stay as released (their commands
    name the modules of their own image) and are only compiled, never run against this tree.
    """
    return [component_versions(name)[-1] for name in component_names()]


def current(name: str) -> Path:
    """The newest numbered version of one component (what this source tree implements)."""
    return component_versions(name)[-1]


def component_names() -> list[str]:
    """Every component folder under ``components/``."""
    return sorted(p.name for p in COMPONENTS.iterdir() if p.is_dir())


def is_dag(path: Path) -> bool:
    """Whether a component file runs a DAG (it has no Kubernetes resource of its own)."""
    (doc,) = load_yaml_documents(path)
    return doc["run"]["kind"] == "dag"


def job_component_names() -> list[str]:
    """The components that run one job (a pod, or replicas of one), not a DAG."""
    return [name for name in component_names() if not is_dag(current(name))]


def all_polyaxonfiles() -> list[Path]:
    """Every component version, ``latest.yaml``, operation and pipeline file."""
    return sorted(COMPONENTS.glob("*/*.yaml")) + sorted(POLYAXONFILES.glob("*.yaml"))


def load_yaml_documents(path: Path) -> list[Any]:
    """All YAML documents of a file, empty ones dropped."""
    with path.open() as f:
        return [doc for doc in yaml.safe_load_all(f) if doc is not None]


@contextmanager
def quiet_polyaxon() -> Iterator[None]:
    """Silence pydantic's serializer warnings that Polyaxon 2.18 raises for every `validation`."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Pydantic serializer warnings")
        yield


def check(path: Path, params: Mapping[str, Any] | None = None) -> Any:
    """Validate a polyaxonfile with params the way ``polyaxon check``/``run`` do; returns the op."""
    from polyaxon.polyaxonfile import check_polyaxonfile

    with quiet_polyaxon():
        return check_polyaxonfile(
            polyaxonfile=str(path), params=dict(params or {}), is_cli=False, verbose=False
        )


def use_agent_config(path: Path) -> None:
    """Make Polyaxon's converter use an agent configuration file (connections, artifacts store)."""
    from polyaxon import settings
    from polyaxon._schemas.agent import AgentConfig

    settings.AGENT_CONFIG = AgentConfig.read(yaml.safe_load(path.read_text()))


def to_kubernetes(
    operation: Any, run_name: str, run_uuid: str | None = None, agent_config: Path = AGENT_CONFIG
) -> dict[str, Any]:
    """Compile an operation to the Kubernetes resource the agent would create (as a dict)."""
    from kubernetes.client import ApiClient
    from polyaxon.k8s import Executor

    use_agent_config(agent_config)
    with quiet_polyaxon():
        crd = Executor.make_and_convert(
            owner_name=OWNER,
            project_name=PROJECT,
            run_uuid=run_uuid or uuid.uuid4().hex,
            run_name=run_name,
            content=operation.to_json(),
            default_auth=False,
        )
    return ApiClient().sanitize_for_serialization(crd)


# A Kubeflow replica's restartPolicy becomes its pods' restartPolicy; ExitCode (restart on a
# signal, fail on the program's own exit codes) is the operator's own and runs as Never.
KUBEFLOW_POD_RESTART = {"ExitCode": "Never"}
DROP_TO_IMAGE_USER = 'exec setpriv --reuid=1000 --regid=1000 --clear-groups -- "$@"'
"""How a container that starts as root ends its script: its argv, as the image's user."""


@dataclass(frozen=True)
class Pod:
    """The parts of a compiled Polyaxon job that the tests look at.

    ``replica`` picks one replica type (``Master``, ``Worker``) of a Kubeflow job.
    """

    manifest: dict[str, Any]
    replica: str | None = None

    @property
    def template(self) -> dict[str, Any]:
        if self.replica is None:
            return self.manifest["batchJobSpec"]["template"]
        return self.manifest["pytorchJobSpec"]["replicaSpecs"][self.replica]["template"]

    @property
    def spec(self) -> dict[str, Any]:
        return self.template["spec"]

    def replicas(self) -> dict[str, Pod]:
        """The replica types of a Kubeflow PyTorchJob, each as the pods it makes."""
        specs = self.manifest["pytorchJobSpec"]["replicaSpecs"]
        return {name: Pod(self.manifest, name) for name in specs}

    @property
    def replica_count(self) -> int:
        return self.manifest["pytorchJobSpec"]["replicaSpecs"][self.replica]["replicas"]

    @property
    def main(self) -> dict[str, Any]:
        """The container that runs the component's command (Polyaxon names it polyaxon-main;
        in a PyTorchJob replica it is `pytorch`, the name Kubeflow's operator looks for)."""
        name = "polyaxon-main" if self.replica is None else "pytorch"
        (main,) = [c for c in self.spec["containers"] if c["name"] == name]
        return main

    @property
    def run_uuid(self) -> str:
        return self.manifest["metadata"]["labels"]["operation.polyaxon.com/uuid"]

    @property
    def run_name(self) -> str:
        """The run's name: for a pipeline op, the op's name (mapping runs share it)."""
        return self.manifest["metadata"]["annotations"]["operation.polyaxon.com/name"]

    @property
    def command_line(self) -> list[str]:
        """The main container's command and args as the pod spec has them."""
        return list(self.main.get("command") or []) + list(self.main.get("args") or [])

    @property
    def argv(self) -> list[str]:
        """The command line the image's user runs. A container that starts as root for the
        claim's permissions (``sh -c SCRIPT NAME ARGV...``, SCRIPT ending in
        :data:`DROP_TO_IMAGE_USER`) runs ARGV after it."""
        line = self.command_line
        if line[:2] == ["sh", "-c"] and line[2].endswith(DROP_TO_IMAGE_USER):
            return line[4:]
        return line

    @property
    def env(self) -> dict[str, Any]:
        return {e["name"]: e.get("value") for e in self.main.get("env") or []}

    def field_ref(self, name: str) -> str | None:
        """The pod field an env variable of the main container comes from (downward API)."""
        (var,) = [e for e in self.main.get("env") or [] if e["name"] == name]
        return ((var.get("valueFrom") or {}).get("fieldRef") or {}).get("fieldPath")

    @property
    def termination(self) -> dict[str, Any]:
        """What Polyaxon's operator puts on the Kubernetes Job: backoffLimit, deadline, policy."""
        return self.manifest.get("termination") or {}

    def as_job(self) -> dict[str, Any]:
        """The batch/v1 Job the operator makes of it, for kubernetes-validate.

        Polyaxon's CRD carries the pod template and the termination separately; the operator
        sets ``backoffLimit``, ``activeDeadlineSeconds`` and ``podFailurePolicy`` on the Job.
        """
        spec = {"template": copy.deepcopy(self.template)}
        for key in ("backoffLimit", "activeDeadlineSeconds", "podFailurePolicy"):
            if key in self.termination:
                spec[key] = copy.deepcopy(self.termination[key])
        return {
            "apiVersion": "batch/v1",
            "kind": "Job",
            "metadata": {"name": "job", "namespace": self.manifest["metadata"]["namespace"]},
            "spec": spec,
        }

    def mounts(self) -> dict[str, str]:
        """Mount path -> claim name of every persistentVolumeClaim mounted in the main container."""
        claims = {
            v["name"]: v["persistentVolumeClaim"]["claimName"]
            for v in self.spec.get("volumes") or []
            if v.get("persistentVolumeClaim")
        }
        return {
            m["mountPath"]: claims[m["name"]]
            for m in self.main.get("volumeMounts") or []
            if m["name"] in claims
        }

    def as_pod(self) -> dict[str, Any]:
        """The job's pod template as a plain v1 Pod, for kubernetes-validate."""
        template = self.template
        spec = dict(template["spec"])
        if self.replica is not None and "restartPolicy" in spec:
            policy = spec["restartPolicy"]
            spec["restartPolicy"] = KUBEFLOW_POD_RESTART.get(policy, policy)
        return {"apiVersion": "v1", "kind": "Pod", "metadata": template["metadata"], "spec": spec}


def compile_component(
    path: Path,
    params: Mapping[str, Any] | None = None,
    agent_config: Path = AGENT_CONFIG,
    run_uuid: str | None = None,
) -> Pod:
    """Validate a component or operation file with params and compile it to a pod."""
    operation = check(path, params)
    return Pod(
        to_kubernetes(
            operation, run_name=path.parent.name, run_uuid=run_uuid, agent_config=agent_config
        )
    )


# ---- DAG ops --------------------------------------------------------------------------------
#
# A DAG has no Kubernetes resource of its own: each op is compiled on its own, with its params
# resolved the way the server resolves them (DAG inputs, upstream outputs, globals). Matrix
# (mapping) values and join queries are rendered with Polyaxon's own parser and the op's
# params, as the server's scheduler does before it creates the runs; a mapping's runs are made
# with Polyaxon's own ``get_ops_from_suggestions``, and a nested DAG becomes a Dag of its own.


def op_uuid(op_name: str) -> str:
    """A stand-in run uuid for a DAG op (the server assigns the real one)."""
    return uuid.uuid5(uuid.NAMESPACE_URL, op_name).hex


@dataclass
class Dag:
    """A pipeline (or a nested DAG run) as Polyaxon reads it, its inputs resolved to values.

    Attributes:
        operation: The operation whose component runs the DAG.
        inputs: The DAG's input values (defaults, then params).
        uuid: This DAG run's uuid (``globals.uuid`` in its ops' params).
        path: Where this run sits in the tree of runs (stand-in uuids derive from it).
    """

    operation: Any
    inputs: dict[str, Any]
    uuid: str = PIPELINE_UUID
    path: str = "pipeline"

    @property
    def run(self) -> Any:
        return self.operation.component.run

    @property
    def ops(self) -> dict[str, Any]:
        return {op.name: op for op in self.run.operations}

    def op_uuid(self, op_name: str) -> str:
        return op_uuid(op_name if self.path == "pipeline" else f"{self.path}/{op_name}")

    def order(self) -> list[str]:
        """Polyaxon's own topological order of the ops, one per stage."""
        self.run.process_dag()
        self.run.validate_dag()
        return [name for stage in self.run.sort_topologically() for name in stage]

    def upstream(self) -> dict[str, set[str]]:
        """Direct upstream ops of every op, as Polyaxon's DAG sees them."""
        self.run.process_dag()
        return {name: set(node.upstream) for name, node in self.run.dag.items()}

    def stand_in_output(self, op_name: str, output: str) -> Any:
        """What an upstream op's output would be after it succeeded, typed as declared."""
        if output == "applied_class":  # a successful switch applies the class it was given
            return self.resolve_params(op_name)["target_class"]
        (io,) = [o for o in self.ops[op_name].component.outputs if o.name == output]
        return {"float": 1.5, "int": 3, "bool": True}.get(io.type, f"{op_name}.{output}")

    def resolve_param(self, param: Any) -> Any:
        """A param's value as the server would pass it to the op."""
        ref, value = param.ref, param.value
        if ref is None:
            return value
        kind, _, name = value.partition(".")
        if ref == "dag":
            return self.uuid if value == "globals.uuid" else self.inputs[name]
        assert ref.startswith("ops."), f"unexpected ref {ref}"
        upstream = ref.removeprefix("ops.")
        if value == "globals.uuid":
            return self.op_uuid(upstream)
        assert kind == "outputs", f"unexpected ref value {value}"
        return self.stand_in_output(upstream, name)

    def resolve_params(self, op_name: str, context: bool = False) -> dict[str, Any]:
        """An op's params as plain values; context-only params (not component inputs) only
        with ``context``."""
        params = self.ops[op_name].params or {}
        return {
            k: self.resolve_param(p) for k, p in params.items() if context or not p.context_only
        }

    def standalone(
        self, op_name: str, extra: Mapping[str, Any] | None = None, sections: bool = False
    ) -> Any:
        """The op as one operation with its params resolved (context-only ones kept as such).

        With ``sections`` the op keeps its matrix and joins; otherwise it is one run of it
        (``extra`` being, e.g., one mapping's values).
        """
        from polyaxon._polyaxonfile import OperationSpecification

        op = self.ops[op_name]
        params = {
            k: {"value": self.resolve_param(p), **({"contextOnly": True} if p.context_only else {})}
            for k, p in (op.params or {}).items()
        }
        params.update({k: {"value": v} for k, v in (extra or {}).items()})
        content = {
            "kind": "operation",
            "name": op_name,
            "component": op.component.to_dict(),
            "params": params,
        }
        if sections:
            content |= {
                k: v
                for k, v in {
                    "matrix": op.matrix.to_dict() if op.matrix else None,
                    "joins": [j.to_dict() for j in op.joins] if op.joins else None,
                }.items()
                if v
            }
        with quiet_polyaxon():
            return OperationSpecification.read(content)

    def _compiled(self, op_name: str) -> tuple[Any, dict[str, Any]]:
        """The op compiled with its matrix/joins, and its param spec (the template context)."""
        from polyaxon._polyaxonfile import CompiledOperationSpecification, OperationSpecification

        operation = self.standalone(op_name, sections=True)
        with quiet_polyaxon():
            compiled = OperationSpecification.compile_operation(operation)
            # As the scheduler does: the run's params (context-only ones too) onto the spec.
            compiled = CompiledOperationSpecification.apply_params(
                config=compiled, params={k: p.to_dict() for k, p in operation.params.items()}
            )
            spec = CompiledOperationSpecification.calculate_context_spec(
                config=compiled, contexts={"globals": {"uuid": self.op_uuid(op_name)}}
            )
        return compiled, spec

    def mapping(self, op_name: str) -> list[dict[str, Any]]:
        """The values of an op's mapping matrix, rendered as the scheduler renders them."""
        from polyaxon._polyaxonfile import CompiledOperationSpecification
        from polyaxon.tuners.mapping import MappingManager

        compiled, spec = self._compiled(op_name)
        with quiet_polyaxon():
            matrix = compiled.matrix.__class__.read(
                CompiledOperationSpecification.apply_section_contexts(
                    config=compiled, section=compiled.matrix.to_dict(), param_spec=spec
                )
            )
        assert matrix.kind == "mapping", matrix
        return list(MappingManager(matrix).get_suggestions())

    def matrix(self, op_name: str) -> Any:
        """The op's matrix as written (kind, concurrency)."""
        return self.ops[op_name].matrix

    def joins(self, op_name: str) -> list[Any]:
        """An op's joins with their queries rendered, as the scheduler renders them."""
        from polyaxon._polyaxonfile import CompiledOperationSpecification
        from polyaxon.schemas import V1Join

        compiled, spec = self._compiled(op_name)
        with quiet_polyaxon():
            return [
                V1Join.read(
                    CompiledOperationSpecification.apply_section_contexts(
                        config=compiled, section=join.to_dict(), param_spec=spec
                    )
                )
                for join in compiled.joins or []
            ]

    def children(self, op_name: str) -> list[Dag]:
        """The nested DAG runs a mapping op makes, one per value, built the server's way."""
        from polyaxon._polyaxonfile.manager import get_ops_from_suggestions

        values = self.mapping(op_name)
        compiled, _ = self._compiled(op_name)
        content = self.standalone(op_name, sections=True).to_json()
        with quiet_polyaxon():
            runs = list(get_ops_from_suggestions(content, compiled, values))
        dags = []
        for i, run in enumerate(runs):
            component = run.component
            assert component.run.kind == "dag", f"{op_name} does not run a DAG"
            inputs = {io.name: io.value for io in component.inputs or []}
            inputs.update({k: p.value for k, p in (run.params or {}).items()})
            path = f"{self.path}/{op_name}[{i}]"
            dags.append(Dag(operation=run, inputs=inputs, uuid=op_uuid(path), path=path))
        return dags

    def compile_op(
        self,
        op_name: str,
        agent_config: Path = AGENT_CONFIG,
        extra: Mapping[str, Any] | None = None,
        index: int | None = None,
    ) -> Pod:
        """Compile one op of the DAG to its pod; for a mapping op, its ``index``-th run, whose
        values are ``extra``."""
        standalone = self.standalone(op_name, extra)
        name = op_name if index is None else f"{op_name}[{index}]"
        return Pod(
            to_kubernetes(
                standalone, op_name, run_uuid=self.op_uuid(name), agent_config=agent_config
            )
        )

    def runs(self, op_name: str) -> bool:
        """Whether the op runs: its ``conditions`` rendered with its params, as the scheduler
        does (a false condition skips the op)."""
        from polyaxon._polyaxonfile.specs.libs.parser import PolyaxonfileParser

        conditions = self.ops[op_name].conditions
        if not conditions:
            return True
        params = {**self.inputs, **self.resolve_params(op_name, context=True)}
        rendered = PolyaxonfileParser.parse_expression(conditions, params)
        return str(rendered).strip().lower() not in ("", "false", "none", "0")

    def jobs(self, agent_config: Path = AGENT_CONFIG) -> dict[str, Pod]:
        """Every job this DAG runs, nested DAGs and mapping runs included, compiled, by path,
        in the order the tree runs them. An op whose condition is about the workload runs only
        for its workload; other conditional ops (the optional restore) are compiled too, so
        that their command lines are checked whether or not a run asks for them."""
        pods: dict[str, Pod] = {}
        for name in self.order():
            op = self.ops[name]
            if op.conditions and "workload" in op.conditions and not self.runs(name):
                continue
            if op.component.run.kind == "dag":
                for child in self.children(name):
                    pods.update(child.jobs(agent_config))
            elif op.matrix is not None:
                for i, values in enumerate(self.mapping(name)):
                    pods[f"{self.path}/{name}[{i}]"] = self.compile_op(
                        name, agent_config, extra=values, index=i
                    )
            else:
                pods[f"{self.path}/{name}"] = self.compile_op(name, agent_config)
        return pods


def load_dag(path: Path = PIPELINE, params: Mapping[str, Any] | None = None) -> Dag:
    """Validate the pipeline with params and resolve its inputs (defaults, then params)."""
    operation = check(path, params)
    inputs = {io.name: io.value for io in operation.component.inputs or []}
    inputs.update({k: p.value for k, p in (operation.params or {}).items()})
    return Dag(operation=operation, inputs=inputs)


def joined(pods: Mapping[str, Pod], names: set[str]) -> list[str]:
    """The uuids a join on ``name: a|b|c`` of a comparison's jobs returns, in creation order
    (the server creates the ops in the order the tree runs them)."""
    return [pod.run_uuid for pod in pods.values() if pod.run_name in names]


@functools.lru_cache(maxsize=8)
def _pipeline_jobs(path: Path, params_json: str, agent_config: Path) -> dict[str, Pod]:
    return load_dag(path, json.loads(params_json)).jobs(agent_config)


def pipeline_jobs(
    path: Path = PIPELINE,
    params: Mapping[str, Any] | None = None,
    agent_config: Path = AGENT_CONFIG,
) -> dict[str, Pod]:
    """Every job of a pipeline with params, compiled (once per session: several test files
    look at the same pipelines, and compiling every job of a tree takes a while)."""
    return _pipeline_jobs(path, json.dumps(dict(params or {}), sort_keys=True), agent_config)


JOB_FILES = [p for p in sorted(COMPONENTS.glob("*/*.yaml")) if not is_dag(p)]
"""Every version of every component that runs one job (not a pipeline)."""
YAML_FILES = sorted([*CONNECTIONS.rglob("*.yaml"), *CONNECTIONS.rglob("*.yml")])
"""Every YAML file in ``connections/``: manifests and config files."""


def is_manifest(doc: Any) -> bool:
    """A Kubernetes object, as opposed to a config file (agent config, sandbox profiles...)."""
    return isinstance(doc, dict) and "apiVersion" in doc and "kind" in doc


def manifests(kind: str | None = None) -> list[dict]:
    """The Kubernetes objects in ``connections/``, of one kind or all."""
    docs = [doc for path in YAML_FILES for doc in load_yaml_documents(path) if is_manifest(doc)]
    return [doc for doc in docs if kind is None or doc["kind"] == kind]
