"""The claim's cgroup: where the sandbox emulates the claim's volume class.

A profile that names a VolumeAttributesClass is emulated by block-I/O limits (the class's
throughput and IOPS) on the disk that holds the claim's directory, for the processes of one
cgroup per claim and sandbox (``sandbox_profiles.SandboxProfiles.cgroup_name``). The storage-profile
hook (``switch --backend local``) sets the limits; this module gives the sandbox what it
needs around that: the cgroup the agent runs claim-mounting ops in, its re-creation with the
current profile's limits, and its removal (with whatever a crashed agent left in it).
"""

from __future__ import annotations

from dataclasses import dataclass

from checkpoint_storage_bench.io_limits import (
    Cgroup,
    IoLimits,
    ThrottleUnavailable,
    block_device,
    probe,
)
from checkpoint_storage_bench.sandbox_profiles import SandboxProfile, SandboxProfiles
from sandbox.errors import ConfigError


@dataclass(frozen=True)
class ClaimLimits:
    """The claim's profile and the limits the kernel holds for it."""

    profile: SandboxProfile
    cgroup: Cgroup
    in_force: dict[str, IoLimits]


def claim_cgroup(profiles: SandboxProfiles | None) -> Cgroup | None:
    """The claim's cgroup; None when no profile emulates a class (plain media need none).

    Raises:
        ConfigError: The profiles emulate volume classes, and the kernel cannot throttle.
    """
    if profiles is None or not profiles.emulated:
        return None
    try:
        for profile in profiles.profiles.values():
            if profile.limits is not None:
                cgroup, _ = probe(profile.path, profiles.cgroup_name)
        return cgroup
    except ThrottleUnavailable as exc:
        raise ConfigError(cannot_emulate(profiles, str(exc))) from exc


def existing_cgroup(profiles: SandboxProfiles | None) -> Cgroup | None:
    """The claim's cgroup if it exists now (for ``stop`` and ``status``; never raises)."""
    if profiles is None:
        return None
    try:
        cgroup = Cgroup.find(profiles.cgroup_name)
    except ThrottleUnavailable:
        return None
    return cgroup if cgroup.exists() else None


def cannot_emulate(profiles: SandboxProfiles, why: str) -> str:
    """The one line that says an emulation is not possible here, and what to do instead."""
    classes = ", ".join(p.name for p in profiles.profiles.values() if p.limits)
    return (
        f"{profiles.source} emulates volume classes ({classes}) with block-I/O limits, but "
        f"the kernel cannot throttle here: {why}. Use a profiles file of plain media instead "
        "(connections/sandbox-profiles-media.yaml: the local disk and memory, which is not an "
        "emulation of the classes)"
    )


def restore(profiles: SandboxProfiles, cgroup: Cgroup) -> ClaimLimits:
    """(Re-)create the claim's cgroup with the limits of the claim's current profile.

    The current profile is the one the hook recorded last (a fresh claim: the first
    profile, which is then recorded, as a fresh claim starts on its default class).

    Raises:
        ConfigError: The kernel refused the limits or the device cannot be throttled.
    """
    profile = profiles.current() or next(iter(profiles.profiles.values()))
    if profiles.recorded() is None:
        profiles.record(profile.name)
    try:
        if profile.limits is None:
            cgroup.create()
            cgroup.clear()
        else:
            cgroup.set_limits(block_device(profile.path), profile.limits)
    except ThrottleUnavailable as exc:
        raise ConfigError(cannot_emulate(profiles, str(exc))) from exc
    return ClaimLimits(profile, cgroup, cgroup.limits())


def reset(profiles: SandboxProfiles | None) -> tuple[ClaimLimits | None, list[int]]:
    """At agent start: end whatever an earlier agent left in the claim's cgroup, remove it,
    and (when a profile emulates a class) create it afresh with the current profile's limits.

    Returns:
        The claim's limits (None without a cgroup) and the pids that had to be killed.

    Raises:
        ConfigError: The profiles emulate classes and the kernel cannot throttle, or the
            old cgroup could not be emptied.
    """
    cgroup = claim_cgroup(profiles)  # first: refuse before anything is touched
    killed: list[int] = []
    old = existing_cgroup(profiles)
    if old is not None:
        try:
            killed = old.remove()
        except ThrottleUnavailable as exc:
            raise ConfigError(str(exc)) from exc
    if cgroup is None or profiles is None:
        return None, killed
    return restore(profiles, cgroup), killed


def describe(profiles: SandboxProfiles | None) -> dict[str, object]:
    """The claim's profile and the limits in force, read back from the kernel (``status``)."""
    if profiles is None:
        return {}
    current = profiles.current()
    cgroup = existing_cgroup(profiles)
    in_force = cgroup.limits() if cgroup else {}
    return {
        "claim_profile": current.name if current else None,
        "claim_cgroup": str(cgroup.path) if cgroup else None,
        "claim_limits": "; ".join(f"{dev}: {lim.describe()}" for dev, lim in in_force.items())
        or "no limit",
    }


def summary(limits: ClaimLimits) -> str:
    """One line: the claim's profile and the limits in force."""
    in_force = "; ".join(f"{d}: {lim.describe()}" for d, lim in limits.in_force.items())
    what = (
        f"emulates {limits.profile.volume_attributes_class}"
        if limits.profile.limits
        else "a plain medium"
    )
    return (
        f"claim on {limits.profile.name} ({what}); limits in force: {in_force or 'none'} "
        f"({limits.cgroup.path})"
    )
