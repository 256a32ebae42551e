"""The claim's volume and cgroup: where the sandbox emulates the claim's volume class.

A profile that names a VolumeAttributesClass is emulated by block-I/O limits (the class's
throughput and IOPS) on the block device that holds the claim's directory, for the
processes of one cgroup per claim and sandbox (``sandbox_profiles.SandboxProfiles.cgroup_name``).
That device is a loop-device volume of the sandbox's own (``checkpoint_storage_bench.
loop_volume``: a file in RAM with ext4, mounted on the profiles' directory), far faster than
any class, so that the throttle, not the machine's shared disk, is the bottleneck; the
sandbox refuses a volume slower than twice the fastest class. The storage-profile hook
(``switch --backend local``) sets the limits; this module gives the sandbox what it needs
around that: the volume, the cgroup the agent runs claim-mounting ops in, its re-creation
with the current profile's limits, and the removal of both (with whatever a crashed agent
left in the cgroup).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

from localcluster.emulation import loop_volume
from localcluster.emulation.io_limits import (
    MIB,
    Cgroup,
    IoLimits,
    ThrottleUnavailable,
    block_device,
    probe,
)
from localcluster.emulation.sandbox_profiles import SandboxProfile, SandboxProfiles
from sandbox.errors import ConfigError

VOLUME_SIZE = 2048 * MIB
"""The claim's volume (RAM, preallocated): the demo's fio files (205 MiB at its
``size_scale``), two kept checkpoints and one being written per stage, with room to spare."""
SPEED_MARGIN = 2.0
"""The volume must write unthrottled at least this many times the fastest class's
throughput, or the throttle would not be what limits it."""


@dataclass(frozen=True)
class ClaimVolume:
    """The claim's volume and its unthrottled write speed (MB/s), measured at start."""

    volume: loop_volume.LoopVolume
    speed_mbps: float
    created: bool

    def describe(self) -> str:
        return (
            f"claim volume {self.volume.describe()} at {self.volume.mount_point}: "
            f"{self.speed_mbps:.0f} MB/s unthrottled (measured when it was made)"
        )


def volume_name(profiles: SandboxProfiles, path: Path) -> str:
    """The volume on ``path``: named after the claim's cgroup, so that one sweep of the
    cgroup's name removes the sandbox's volumes and cgroup, and nothing else."""
    digest = hashlib.sha256(str(path).encode()).hexdigest()[:6]
    return f"{profiles.cgroup_name}-{digest}"


def _speed_record(profiles: SandboxProfiles, name: str) -> Path:
    return profiles.claim_path.with_name(f".{name}.speed.json")


def _identity(volume: loop_volume.LoopVolume) -> dict[str, object]:
    return {"device": volume.device.id, "inode": volume.backing_file.stat().st_ino}


def _measured(profiles: SandboxProfiles, volume: loop_volume.LoopVolume) -> float | None:
    """The speed measured when this very volume was made (None: another volume, or none)."""
    try:
        record = json.loads(_speed_record(profiles, volume.name).read_text())
        return float(record["speed_mbps"]) if record["of"] == _identity(volume) else None
    except (OSError, ValueError, KeyError, TypeError):
        return None


def prepare_volumes(profiles: SandboxProfiles, size: int = VOLUME_SIZE) -> list[ClaimVolume]:
    """A loop-device volume on every directory an emulated profile uses (the existing one,
    else a new one), with its unthrottled write speed: measured when it is made, while
    nothing else writes to it (a volume in use is never measured again: its runs would slow
    the measurement down, and the measurement its runs).

    Raises:
        ThrottleUnavailable: No volume can be made here, or a new one writes slower than
            :data:`SPEED_MARGIN` times the fastest class (the volumes this call made are
            removed again; one that was there before is left as it is).
    """
    emulated = [p for p in profiles.profiles.values() if p.limits is not None]
    if not emulated:
        return []
    fastest = max(emulated, key=lambda p: p.limits.write_bps or 0)
    needed = SPEED_MARGIN * (fastest.limits.write_bps or 0) / 1e6
    made: list[ClaimVolume] = []
    try:
        for path in dict.fromkeys(p.path for p in emulated):
            name = volume_name(profiles, path)
            existing = loop_volume.find(name, path)
            volume = existing or loop_volume.create(name, path, size)
            speed = _measured(profiles, volume) if existing else None
            if speed is None:
                speed = loop_volume.write_speed(path, attempts=5, enough=needed)
                record = _speed_record(profiles, name)
                record.parent.mkdir(parents=True, exist_ok=True)
                record.write_text(json.dumps({"of": _identity(volume), "speed_mbps": speed}))
            made.append(ClaimVolume(volume, speed, created=existing is None))
            if speed < needed:
                raise ThrottleUnavailable(
                    f"the claim's volume {volume.dev_path} writes {speed:.0f} MB/s unthrottled, "
                    f"less than {SPEED_MARGIN:g}x the fastest class "
                    f"({fastest.volume_attributes_class}, "
                    f"{(fastest.limits.write_bps or 0) / 1e6:.0f} MB/s): the throttle would not "
                    "be what limits it"
                )
    except BaseException:
        remove_created(profiles, made)
        raise
    return made


def remove_created(profiles: SandboxProfiles, volumes: list[ClaimVolume]) -> None:
    """Remove the volumes in ``volumes`` that were made for this start (a refused or failed
    start leaves no RAM behind; a volume that was there before may belong to a running
    sandbox and stays)."""
    for made in volumes:
        if made.created:
            loop_volume.remove(made.volume)
            _speed_record(profiles, made.volume.name).unlink(missing_ok=True)


RELEASE_S = 60.0
"""How long ``stop`` waits for a volume a dying run still holds (a throttled write in
flight ends first) before it says which device is left."""


def remove_volumes(profiles: SandboxProfiles | None) -> list[str]:
    """Remove the sandbox's volumes (unmounted, detached, deleted) and its cgroup, with
    whatever still runs in it; one line per thing removed."""
    if profiles is None:
        return []
    try:
        removed = loop_volume.sweep(profiles.cgroup_name, release_s=RELEASE_S)
    except ThrottleUnavailable as exc:
        raise ConfigError(str(exc)) from exc
    for record in profiles.claim_path.parent.glob(f".{profiles.cgroup_name}-*.speed.json"):
        record.unlink(missing_ok=True)
    return removed


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
