"""The local backend for the embedded sandbox: profiles are directories on this machine,
and a profile that names a VolumeAttributesClass emulates it with block-I/O limits.

The sandbox mounts ``claimPath`` (a symlink) as the training job's ``/checkpoints``.
Switching a profile repoints that symlink atomically (a new link next to it, then
``rename`` over the old one, so a reader sees the old or the new target, never nothing)
and sets the class's throughput and IOPS as the limits of the claim's cgroup on the disk
that holds the profile's directory (``localcluster.emulation.io_limits``); the sandbox
agent runs every op that mounts the claim in that cgroup. Where the kernel cannot throttle,
switching to an emulated profile is refused (exit 3), never reported as settled.
"""

from __future__ import annotations

import os
from dataclasses import fields
from pathlib import Path

from checkpoint_storage_bench import contract
from hooks.storage_profile.config import SwitchConfig
from hooks.storage_profile.errors import PreflightRefused, UnexpectedState
from hooks.storage_profile.report import Report, not_switched, now_iso
from localcluster.emulation import sandbox_profiles
from localcluster.emulation.io_limits import (
    BlockDevice,
    Cgroup,
    IoLimits,
    ThrottleUnavailable,
    probe,
)
from localcluster.emulation.sandbox_profiles import SandboxProfile

DEFAULT_PROFILES_FILE = contract.SANDBOX_PROFILES_FILE
DRIVER = contract.SANDBOX_DRIVER


def sandbox_root() -> Path:
    """Where relative sandbox paths start: ``$SANDBOX_ROOT``, else the working directory
    (absolute: a relative root would write relative, dangling symlink targets)."""
    return Path(os.environ.get("SANDBOX_ROOT") or os.getcwd()).resolve()


class SandboxProfiles(sandbox_profiles.SandboxProfiles):
    """The profiles file (parsed by :mod:`checkpoint_storage_bench.contract`), with the
    hook's checks: a refused file or claim is a preflight refusal (exit 3)."""

    @classmethod
    def load(cls, path: Path | None = None, root: Path | None = None) -> SandboxProfiles:
        """Read and validate the profiles file.

        Raises:
            PreflightRefused: The file is missing or malformed.
        """
        root = root or sandbox_root()
        path = path or root / DEFAULT_PROFILES_FILE
        if not path.is_absolute() and not path.exists():
            path = root / path
        try:
            parsed = sandbox_profiles.load_sandbox_profiles(path, root)
        except sandbox_profiles.ProfilesFileError as exc:
            raise PreflightRefused(str(exc)) from exc
        return cls(**{f.name: getattr(parsed, f.name) for f in fields(parsed)})

    def check_claim(self, namespace: str, claim: str) -> None:
        """Refuse a claim the sandbox does not have."""
        if (namespace, claim) != (self.namespace, self.claim):
            raise PreflightRefused(
                f"the sandbox has claim {self.namespace}/{self.claim}, not {namespace}/{claim}"
            )


def repoint(link: Path, target: Path) -> None:
    """Make ``link`` a symlink to ``target`` atomically (new link, then rename over)."""
    link.parent.mkdir(parents=True, exist_ok=True)
    tmp = link.with_name(f".{link.name}.{os.getpid()}.tmp")
    if tmp.is_symlink() or tmp.exists():
        tmp.unlink()
    os.symlink(target, tmp)
    os.replace(tmp, link)


def _throttle(
    sandbox: SandboxProfiles, profile: SandboxProfile
) -> tuple[Cgroup | None, BlockDevice | None]:
    """The claim's cgroup and the device the profile's limits apply to.

    An emulated profile needs both, or the switch is refused (never a silent "settled" on an
    unthrottled disk). A plain medium needs neither; its cgroup, where one can exist, only
    gets its limits cleared.

    Raises:
        PreflightRefused: The profile emulates a class and the kernel cannot throttle here.
    """
    if profile.limits is None:
        try:
            return Cgroup.find(sandbox.cgroup_name), None
        except ThrottleUnavailable:
            return None, None
    try:
        return probe(profile.path, sandbox.cgroup_name)
    except ThrottleUnavailable as exc:
        raise PreflightRefused(
            f"profile {profile.name} emulates class {profile.volume_attributes_class} "
            f"({profile.limits.describe()}), but the kernel cannot throttle here: {exc}; "
            f"nothing was changed (plain media without emulation: "
            f"{contract.SANDBOX_MEDIA_PROFILES_FILE})"
        ) from exc


def switch_local(cfg: SwitchConfig, sandbox: SandboxProfiles, report: Report, echo=print) -> Report:
    """Point the sandbox claim at the target profile's directory and, for a profile that
    emulates a class, set the class's block-I/O limits in the claim's cgroup; report like
    Kubernetes (settled once the kernel reports the limits in force).

    Raises:
        PreflightRefused: Wrong claim, unknown profile, missing directory, the claim path
            is a real directory (we never replace data), or the kernel cannot throttle.
        UnexpectedState: The link or the limits read back are not what was set.
    """
    sandbox.check_claim(cfg.namespace, cfg.claim)
    if cfg.only_if_switched and (cfg.holder is None or sandbox.recorded_holder() != cfg.holder):
        # The state file names who made the last switch: anyone else's (or none) means this
        # holder's pipeline never moved the claim, so there is nothing to switch back.
        return not_switched(report, cfg.holder, echo)
    profile = sandbox.profiles.get(cfg.target)
    if profile is None:
        raise PreflightRefused(
            f"unknown sandbox profile {cfg.target} (known: {', '.join(sorted(sandbox.profiles))})"
        )
    if not profile.path.is_dir():
        raise PreflightRefused(f"directory {profile.path} of profile {cfg.target} does not exist")
    link = sandbox.claim_path
    if link.exists() and not link.is_symlink():
        raise PreflightRefused(f"claim path {link} is not a symlink; refusing to replace it")
    cgroup, device = _throttle(sandbox, profile)
    wanted = {device.id: profile.limits} if device and profile.limits else {}
    previous = sandbox.current()
    report.driver = contract.SANDBOX_EMULATED_DRIVER if profile.limits else DRIVER
    report.claim_uid = None
    report.pv = str(link)
    report.volume_handle = str(profile.path)
    report.previous_class = previous.name if previous else None
    report.applied_class = report.previous_class
    if profile.limits and device and cgroup:
        # The class's own parameters: the verdict prices the profile from them (vac_*).
        report.class_parameters = dict(profile.class_parameters)
        report.notes.append(
            f"local backend: emulates {profile.volume_attributes_class} "
            f"({profile.driver or 'no driver'}) as block-I/O limits of "
            f"{profile.limits.describe()} on {device.name} ({device.id}) for the processes "
            f"of {cgroup.path} (cgroup v{cgroup.hierarchy.version}): a token bucket, not the "
            "provider's burst or latency model; only I/O the kernel attributes to the cgroup "
            "(O_DIRECT on cgroup v1) is limited"
        )
    else:
        report.class_parameters = {"path": str(profile.path), "description": profile.description}
        report.notes.append(f"local backend: {profile.path} as it is, no emulated class")
    report.notes.append("local backend: no provider settle")
    if cfg.dry_run:
        report.outcome = "dry-run"
        limits = f", limits {profile.limits.describe()}" if profile.limits else ""
        echo(f"dry run: would point {link} at {profile.path}{limits}")
        return report
    report.requested_at = now_iso()
    in_force = cgroup.limits() if cgroup else {}
    if previous == profile and in_force == wanted:
        report.outcome = "already-settled"
        report.notes.append(f"claim path already points at {profile.path}, limits in force")
    else:
        try:
            if cgroup and device and profile.limits:
                cgroup.set_limits(device, profile.limits)
            elif cgroup and cgroup.exists():
                cgroup.clear()
        except ThrottleUnavailable as exc:
            raise PreflightRefused(str(exc)) from exc
        if os.path.realpath(link) != os.path.realpath(profile.path) or not link.is_symlink():
            repoint(link, profile.path)
        sandbox.record(profile.name, cfg.holder)
        report.patched = True
        report.outcome = "settled"
    # Settled means the claim reaches the profile's directory, never a dangling link...
    if os.path.realpath(link) != os.path.realpath(profile.path) or not link.is_dir():
        raise UnexpectedState(f"claim path {link} does not lead to {profile.path} after the switch")
    # ...and the limits the kernel reports are the class's.
    in_force = cgroup.limits() if cgroup else {}
    if in_force != wanted:
        raise UnexpectedState(
            f"the kernel reports {_describe(in_force)} for {cgroup.path if cgroup else '-'}, "
            f"not {_describe(wanted)}"
        )
    report.k8s_settled_at = now_iso()
    report.applied_class = profile.name
    echo(f"sandbox claim {link} -> {profile.path} ({profile.name}; {_describe(in_force)})")
    return report


def _describe(limits: dict[str, IoLimits]) -> str:
    return "; ".join(f"{dev}: {lim.describe()}" for dev, lim in limits.items()) or "no limit"


def status_local(sandbox: SandboxProfiles) -> dict:
    """The claim's link, its profile and the block-I/O limits in force, read back from the
    kernel (``limits`` is None where the kernel cannot throttle)."""
    current = sandbox.current()
    link = sandbox.claim_path
    try:
        cgroup = Cgroup.find(sandbox.cgroup_name)
        limits = {
            "cgroup": str(cgroup.path) if cgroup.exists() else None,
            "controller": f"cgroup v{cgroup.hierarchy.version}",
            "inForce": {dev: lim.as_dict() for dev, lim in cgroup.limits().items()},
            "summary": _describe(cgroup.limits()),
        }
    except ThrottleUnavailable as exc:
        limits = {"cgroup": None, "unavailable": str(exc), "inForce": {}, "summary": "no limit"}
    return {
        "backend": "local",
        "namespace": sandbox.namespace,
        "claim": sandbox.claim,
        "claimPath": str(link),
        "pointsAt": os.readlink(link) if link.is_symlink() else None,
        "currentProfile": current.name if current else None,
        "limits": limits,
        "profiles": {
            p.name: {
                "path": str(p.path),
                "exists": p.path.is_dir(),
                "description": p.description,
                "volumeAttributesClass": p.volume_attributes_class,
                "limits": p.limits.describe() if p.limits else None,
            }
            for p in sandbox.profiles.values()
        },
    }


def render_local(data: dict) -> str:
    """The readable block of :func:`status_local` (``status`` without ``--json``)."""
    lines = [
        f"sandbox claim {data['namespace']}/{data['claim']}",
        f"  claim path     {data['claimPath']} -> {data['pointsAt'] or '-'}",
        f"  current        {data['currentProfile'] or '-'}",
        f"  limits         {data['limits']['summary']}"
        + (f"  ({data['limits']['cgroup']})" if data["limits"].get("cgroup") else ""),
    ]
    for name, prof in sorted(data["profiles"].items()):
        missing = "" if prof["exists"] else "  (missing)"
        emulates = f"  emulates {prof['volumeAttributesClass']}: {prof['limits']}"
        lines.append(
            f"  profile        {name}: {prof['path']}{missing}"
            + (emulates if prof.get("volumeAttributesClass") else "")
        )
    return "\n".join(lines)
