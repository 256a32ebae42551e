"""The local backend for the embedded sandbox: profiles are directories on this machine.

The sandbox mounts ``claimPath`` (a symlink) as the training job's ``/checkpoints``.
Switching a profile repoints that symlink atomically: a new link next to it, then
``rename`` over the old one, so a reader sees the old or the new target, never nothing.
"""

from __future__ import annotations

import os
from dataclasses import fields
from pathlib import Path

from checkpoint_storage_bench import contract
from hooks.storage_profile.config import SwitchConfig
from hooks.storage_profile.errors import PreflightRefused, UnexpectedState
from hooks.storage_profile.report import Report, now_iso

DEFAULT_PROFILES_FILE = contract.SANDBOX_PROFILES_FILE
DRIVER = "local"


def sandbox_root() -> Path:
    """Where relative sandbox paths start: ``$SANDBOX_ROOT``, else the working directory
    (absolute: a relative root would write relative, dangling symlink targets)."""
    return Path(os.environ.get("SANDBOX_ROOT") or os.getcwd()).resolve()


class SandboxProfiles(contract.SandboxProfiles):
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
            parsed = contract.load_sandbox_profiles(path, root)
        except contract.ProfilesFileError as exc:
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


def switch_local(cfg: SwitchConfig, sandbox: SandboxProfiles, report: Report, echo=print) -> Report:
    """Point the sandbox claim at the target profile's directory; report like Kubernetes.

    Raises:
        PreflightRefused: Wrong claim, unknown profile, missing directory, or the claim path
            is a real directory (we never replace data).
    """
    sandbox.check_claim(cfg.namespace, cfg.claim)
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
    previous = sandbox.current()
    report.driver = DRIVER
    report.claim_uid = None
    report.pv = str(link)
    report.volume_handle = str(profile.path)
    report.previous_class = previous.name if previous else None
    report.applied_class = report.previous_class
    report.class_parameters = {"path": str(profile.path), "description": profile.description}
    report.notes.append("local backend: no provider settle")
    if cfg.dry_run:
        report.outcome = "dry-run"
        echo(f"dry run: would point {link} at {profile.path}")
        return report
    report.requested_at = now_iso()
    if previous == profile:
        report.outcome = "already-settled"
        report.notes.append(f"claim path already points at {profile.path}")
    else:
        repoint(link, profile.path)
        report.patched = True
        report.outcome = "settled"
    # Settled means the claim reaches the profile's directory, never a dangling link.
    if os.path.realpath(link) != os.path.realpath(profile.path) or not link.is_dir():
        raise UnexpectedState(f"claim path {link} does not lead to {profile.path} after the switch")
    report.k8s_settled_at = now_iso()
    report.applied_class = profile.name
    echo(f"sandbox claim {link} -> {profile.path} ({profile.name})")
    return report


def status_local(sandbox: SandboxProfiles) -> dict:
    current = sandbox.current()
    link = sandbox.claim_path
    return {
        "backend": "local",
        "namespace": sandbox.namespace,
        "claim": sandbox.claim,
        "claimPath": str(link),
        "pointsAt": os.readlink(link) if link.is_symlink() else None,
        "currentProfile": current.name if current else None,
        "profiles": {
            p.name: {"path": str(p.path), "exists": p.path.is_dir(), "description": p.description}
            for p in sandbox.profiles.values()
        },
    }
