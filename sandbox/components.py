"""Versioned components in a Polyaxon server's component hub, and the hubRef twin of a pipeline.

``components/<name>/<version>.yaml`` is registered as ``OWNER/<name>:<version>`` (Polyaxon
keeps component versions in a project called ``<name>``). The pipeline in git references
components by ``pathRef`` so CI can check it offline; :func:`pipeline_twin` rewrites those refs to
``hubRef`` for a server, so there is one source of truth and no hand-kept copy.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import yaml

from sandbox.config import is_loopback_http
from sandbox.errors import ConfigError, RegisterError, ServerUnavailableError

T = TypeVar("T")


@dataclass(frozen=True)
class ComponentFile:
    """One ``components/<name>/<version>.yaml``."""

    path: Path
    name: str
    version: str

    def hub_ref(self, owner: str) -> str:
        return f"{owner}/{self.name}:{self.version}"


def find_components(components_dir: Path) -> list[ComponentFile]:
    """Every ``<name>/<version>.yaml`` under ``components_dir`` (``latest.yaml`` included)."""
    if not components_dir.is_dir():
        raise ConfigError(f"no components directory at {components_dir}")
    found = [
        ComponentFile(path=p, name=p.parent.name, version=p.stem)
        for p in sorted(components_dir.glob("*/*.yaml"))
    ]
    if not found:
        raise ConfigError(f"no components/<name>/<version>.yaml files under {components_dir}")
    return found


def api_client(host: str | None) -> Any:
    """A Polyaxon SDK client for ``host``; ``None`` means the user's configured server.

    A plain-http loopback host (the sandbox) gets no token, so the user's own is never sent
    to it. Any other host keeps TLS verification on and uses the token of the user's
    polyaxon config when there is one (a cluster).
    """
    from polyaxon._constants.globals import NO_AUTH
    from polyaxon._schemas.client import ClientConfig
    from polyaxon.client import PolyaxonClient

    if host is None:
        return PolyaxonClient()
    if is_loopback_http(host):
        return PolyaxonClient(config=ClientConfig(host=host, verify_ssl=False), token=NO_AUTH)
    return PolyaxonClient(config=ClientConfig(host=host, verify_ssl=True))


@contextmanager
def quiet_sdk_errors() -> Iterator[None]:
    """Silence the error block Polyaxon's client logs for every failed call.

    "No such project/version yet" (404) is the normal first-registration path here, and
    every other failure is raised to the caller, which reports it in one line.
    """
    logger = logging.getLogger("polyaxon.cli")
    level = logger.level
    logger.setLevel(logging.CRITICAL)
    try:
        yield
    finally:
        logger.setLevel(level)


def sdk_call(what: str, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """Call a Polyaxon SDK method; a failure becomes one clear sandbox error.

    Raises:
        ServerUnavailableError: The server did not answer, or answered with an error.
    """
    from polyaxon.exceptions import ApiException, PolyaxonClientException
    from urllib3.exceptions import HTTPError

    with quiet_sdk_errors():
        try:
            return fn(*args, **kwargs)
        except ApiException as exc:
            raise ServerUnavailableError(f"{what}: HTTP {exc.status} {exc.reason}") from exc
        except (HTTPError, PolyaxonClientException, OSError) as exc:
            raise ServerUnavailableError(f"{what}: {exc}") from exc


def ensure_project(owner: str, name: str, client: Any) -> None:
    """Create ``owner/name`` unless it exists."""
    with quiet_sdk_errors():
        _ensure_project(owner, name, client)


def _ensure_project(owner: str, name: str, client: Any) -> None:
    from polyaxon.client import ProjectClient
    from polyaxon.exceptions import ApiException

    project = ProjectClient(
        owner=owner, project=name, client=client, manual_exceptions_handling=True
    )
    try:
        project.refresh_data()
        return
    except ApiException as exc:
        if exc.status != 404:
            raise RegisterError(f"cannot read project {owner}/{name}: {exc}") from exc
    try:
        project.create({"name": name})
    except ApiException as exc:
        raise RegisterError(f"cannot create project {owner}/{name}: {exc}") from exc


def register(components: list[ComponentFile], owner: str, host: str | None = None) -> list[str]:
    """Register each component file as ``owner/<name>:<version>``; returns the refs.

    Does what ``polyaxon components register -f FILE -p OWNER/<name> -ver <version>
    --force`` does (validate, inline pathRefs, register), in one process. An existing
    version is overwritten: the file in git is the source of truth for that version, so
    re-running is safe.
    """
    client = api_client(host)
    with quiet_sdk_errors():
        return [_register_one(comp, owner, client) for comp in components]


def _register_one(comp: ComponentFile, owner: str, client: Any) -> str:
    from polyaxon.client import ProjectClient
    from polyaxon.exceptions import ApiException, PolyaxonClientException
    from polyaxon.polyaxonfile import check_polyaxonfile

    try:
        spec = check_polyaxonfile(
            polyaxonfile=str(comp.path), is_cli=False, to_op=False, verbose=False
        )
    except Exception as exc:  # noqa: BLE001 - polyaxon raises several schema errors
        raise ConfigError(f"{comp.path} is not a valid component: {exc}") from exc
    _ensure_project(owner, comp.name, client)
    project = ProjectClient(
        owner=owner, project=comp.name, client=client, manual_exceptions_handling=True
    )
    try:
        project.register_component_version(
            version=comp.version, content=spec.to_source_json(), force=True
        )
    except (ApiException, PolyaxonClientException) as exc:
        raise RegisterError(f"cannot register {comp.hub_ref(owner)}: {exc}") from exc
    return comp.hub_ref(owner)


def _rewrite_refs(node: Any, owner: str | None, source: Path) -> Any:
    if isinstance(node, dict):
        node = {k: _rewrite_refs(v, owner, source) for k, v in node.items()}
        if "pathRef" in node:
            ref = Path(str(node["pathRef"]))
            if owner is None:
                # The twin lives elsewhere: keep the same file, by absolute path.
                node["pathRef"] = str((source.parent / ref).resolve())
                return node
            if ref.suffix not in (".yaml", ".yml") or not ref.parent.name:
                raise ConfigError(f"{source}: pathRef {ref} is not <name>/<version>.yaml")
            del node["pathRef"]
            node["hubRef"] = f"{owner}/{ref.parent.name}:{ref.stem}"
        return node
    if isinstance(node, list):
        return [_rewrite_refs(v, owner, source) for v in node]
    return node


def pipeline_twin(pipeline: Path, out: Path, hub_owner: str | None) -> Path:
    """Write the submitted twin of ``pipeline``: the same spec, generated, never hand-kept.

    With ``hub_owner`` every ``pathRef: .../<name>/<version>.yaml`` becomes
    ``hubRef: <hub_owner>/<name>:<version>``; without, pathRefs become absolute. The file
    and every DAG op get ``cache: {disable: true}``: an identical re-run would otherwise be a
    cache hit that leaves the pipeline running forever.

    Raises:
        ConfigError: The file is unreadable, or a pathRef is not ``<name>/<version>.yaml``.
    """
    try:
        spec = yaml.safe_load(pipeline.read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise ConfigError(f"cannot read pipeline {pipeline}: {exc}") from exc
    if not isinstance(spec, dict):
        raise ConfigError(f"{pipeline} is not a polyaxonfile")
    spec = _rewrite_refs(spec, hub_owner, pipeline.resolve())
    spec["cache"] = {**(spec.get("cache") or {}), "disable": True}
    for op in (spec.get("run") or {}).get("operations") or []:
        op["cache"] = {**(op.get("cache") or {}), "disable": True}
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(
        f"# Generated from {pipeline} by python -m sandbox: do not edit.\n"
        + yaml.safe_dump(spec, sort_keys=False)
    )
    return out
