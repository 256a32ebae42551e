"""The sandbox's profiles file (``connections/sandbox-profiles.yaml``, docs/contracts.md)
and the claim's state file: read by the hook's local backend (switch, status) and by the
sandbox (mounts, media, the agent). One parser, one set of checks; each part turns
:class:`ProfilesFileError` into its own error and exit code.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

from localcluster.emulation.io_limits import IoLimits

_PROFILES_KEYS = {"claim", "namespace", "claimPath", "classesFile", "profiles"}
_PROFILE_KEYS = {"path", "description", "volumeAttributesClass"}


class ProfilesFileError(ValueError):
    """The sandbox profiles file is missing, unreadable or malformed."""


@dataclass(frozen=True)
class SandboxProfile:
    """One profile: a directory the claim points at, and the class it emulates there.

    Attributes:
        name: The profile's name (the ``--to`` of a switch).
        path: The directory.
        description: For people.
        volume_attributes_class: The emulated class's name (None: a plain medium).
        driver: The emulated class's ``driverName`` (None: a plain medium).
        class_parameters: The emulated class's ``parameters``, as the cluster has them.
        limits: The block-I/O limits that emulate the class (None: no limit).
    """

    name: str
    path: Path
    description: str = ""
    volume_attributes_class: str | None = None
    driver: str | None = None
    class_parameters: dict[str, str] = field(default_factory=dict)
    limits: IoLimits | None = None


@dataclass(frozen=True)
class SandboxProfiles:
    """The profiles file, every path absolute.

    Attributes:
        source: The file it was read from.
        root: What relative paths were resolved against (absolute).
        claim: The claim name the pipeline passes.
        namespace: The claim's namespace.
        claim_path: The symlink the sandbox agent mounts at the claim's mount path.
        profiles: Name → profile, in the file's order (the first is where a fresh claim starts).
        classes_file: The (first) VolumeAttributesClass manifests file the emulated profiles
            come from.
    """

    source: Path
    root: Path
    claim: str
    namespace: str
    claim_path: Path
    profiles: dict[str, SandboxProfile]
    classes_file: Path | None = None

    @property
    def emulated(self) -> bool:
        """Whether any profile emulates a class (and so needs the kernel's throttle)."""
        return any(p.limits is not None for p in self.profiles.values())

    @property
    def cgroup_name(self) -> str:
        """The claim's cgroup (one per claim and sandbox root, so that two sandboxes on one
        machine never share limits).

        >>> p = SandboxProfiles(Path("f"), Path("/srv/sb"), "ckpt", "ns", Path("/c"), {})
        >>> p.cgroup_name
        'ckpt-0d6525e4a1'
        """
        digest = hashlib.sha256(str(self.root).encode()).hexdigest()[:10]
        return f"{self.claim}-{digest}"

    @property
    def state_file(self) -> Path:
        """Where the hook records the claim's current profile, next to the claim's link
        (several profiles may share one directory: the link alone cannot tell them apart)."""
        return self.claim_path.with_name(self.claim_path.name + ".profile")

    def recorded(self) -> str | None:
        """The profile the last switch recorded (None: none, or unreadable)."""
        try:
            name = json.loads(self.state_file.read_text()).get("profile")
        except (OSError, ValueError, AttributeError):
            return None
        return name if name in self.profiles else None

    def recorded_holder(self) -> str | None:
        """Who made the switch the state file records (None: unknown, or unreadable)."""
        try:
            holder = json.loads(self.state_file.read_text()).get("holder")
        except (OSError, ValueError, AttributeError):
            return None
        return holder if isinstance(holder, str) else None

    def record(self, name: str, holder: str | None = None) -> None:
        """Record ``name`` as the claim's current profile, switched by ``holder`` when known
        (atomically: write, then rename)."""
        self.state_file.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.state_file.with_name(f".{self.state_file.name}.{os.getpid()}.tmp")
        at = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        state = {"profile": name, "at": at, **({"holder": holder} if holder else {})}
        tmp.write_text(json.dumps(state) + "\n")
        os.replace(tmp, self.state_file)

    def current(self) -> SandboxProfile | None:
        """The profile the claim is on: the recorded one when the link leads to its
        directory, else the only profile whose directory the link leads to (None: missing,
        dangling, elsewhere, or ambiguous)."""
        if not self.claim_path.is_symlink() or not self.claim_path.exists():
            return None
        target = self.claim_path.resolve()
        matching = [p for p in self.profiles.values() if p.path.resolve() == target]
        recorded = self.recorded()
        for profile in matching:
            if profile.name == recorded:
                return profile
        return matching[0] if len(matching) == 1 else None


def _read_classes(path: Path) -> dict[str, dict]:
    import yaml

    try:
        docs = list(yaml.safe_load_all(path.read_text()))
    except OSError as exc:
        raise ProfilesFileError(f"cannot read classes file {path}: {exc}") from exc
    except yaml.YAMLError as exc:
        raise ProfilesFileError(f"classes file {path} is not YAML: {exc}") from exc
    classes = {}
    for doc in docs:
        if isinstance(doc, dict) and doc.get("kind") == "VolumeAttributesClass":
            name = (doc.get("metadata") or {}).get("name")
            if name:
                classes[str(name)] = doc
    return classes


def load_sandbox_profiles(path: Path, root: Path) -> SandboxProfiles:
    """Read and check a sandbox profiles file; relative paths resolve against ``root``,
    except ``classesFile``, which is relative to the profiles file itself.

    ``root`` itself is made absolute first: from a relative root, every path would be
    relative, and a symlink written with such a target resolves against the link's own
    directory, not the working directory (a dangling claim link).

    Raises:
        ProfilesFileError: The file (or its classes file) is unreadable or does not follow
            docs/contracts.md.
    """
    import yaml  # the base's other modules do not need yaml; import it where it is used

    root = Path(root).resolve()
    try:
        data = yaml.safe_load(Path(path).read_text())
    except OSError as exc:
        raise ProfilesFileError(f"cannot read profiles file {path}: {exc}") from exc
    except yaml.YAMLError as exc:
        raise ProfilesFileError(f"profiles file {path} is not YAML: {exc}") from exc

    def bad(why: str) -> ProfilesFileError:
        return ProfilesFileError(f"profiles file {path}: {why}")

    if not isinstance(data, dict):
        raise bad("expected a mapping with claim, namespace, claimPath and profiles")
    unknown = set(data) - _PROFILES_KEYS
    if unknown:
        raise bad(f"unknown keys {sorted(unknown)} (known: {sorted(_PROFILES_KEYS)})")
    for key in ("claim", "namespace", "claimPath"):
        if not isinstance(data.get(key), str) or not data[key].strip():
            raise bad(f"{key} must be a non-empty string")
    if not isinstance(data.get("profiles"), dict) or not data["profiles"]:
        raise bad("profiles must be a non-empty mapping of name -> {path, description}")
    classes_file = None
    classes: dict[str, dict] = {}
    where: dict[str, Path] = {}  # class name -> the file that defines it
    if data.get("classesFile") is not None:
        # One file, or a list: the cluster's manifests plus, e.g., a sandbox-only class.
        names = data["classesFile"]
        names = [names] if isinstance(names, str) else names
        if (
            not isinstance(names, list)
            or not names
            or not all(isinstance(n, str) and n.strip() for n in names)
        ):
            raise bad("classesFile must be a path or a non-empty list of paths")
        for name in names:
            one = (Path(path).resolve().parent / name).resolve()
            for vac, doc in _read_classes(one).items():
                if vac in classes:
                    raise bad(f"VolumeAttributesClass {vac} is in both {where[vac]} and {one}")
                classes[vac], where[vac] = doc, one
        classes_file = (Path(path).resolve().parent / names[0]).resolve()
    profiles = {}
    for name, spec in data["profiles"].items():
        if not isinstance(spec, dict):
            raise bad(f"profile {name} must be a mapping, not {spec!r}")
        unknown = set(spec) - _PROFILE_KEYS
        if unknown:
            raise bad(
                f"profile {name}: unknown keys {sorted(unknown)} (known: {sorted(_PROFILE_KEYS)})"
            )
        if not isinstance(spec.get("path"), str) or not spec["path"].strip():
            raise bad(f"profile {name} needs a path")
        emulated: dict = {}
        vac = spec.get("volumeAttributesClass")
        if vac is not None:
            if classes_file is None:
                raise bad(f"profile {name} emulates class {vac}, but there is no classesFile")
            if vac not in classes:
                raise bad(
                    f"profile {name}: no VolumeAttributesClass {vac} in "
                    f"{', '.join(str(p) for p in dict.fromkeys(where.values())) or classes_file} "
                    f"(it has: {', '.join(sorted(classes)) or 'none'})"
                )
            parameters = {k: str(v) for k, v in (classes[vac].get("parameters") or {}).items()}
            try:
                limits = IoLimits.from_class_parameters(parameters)
            except ValueError as exc:
                raise bad(f"profile {name}: class {vac} in {where[vac]}: {exc}") from exc
            emulated = dict(
                volume_attributes_class=str(vac),
                driver=classes[vac].get("driverName"),
                class_parameters=parameters,
                limits=limits,
            )
        profiles[str(name)] = SandboxProfile(
            name=str(name),
            path=root / spec["path"],
            description=str(spec.get("description", "")),
            **emulated,
        )
    return SandboxProfiles(
        source=Path(path),
        root=root,
        claim=data["claim"],
        namespace=data["namespace"],
        claim_path=root / data["claimPath"],
        profiles=profiles,
        classes_file=classes_file,
    )
