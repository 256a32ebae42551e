"""Where the hook acts: one interface (:class:`Backend`), two implementations.

``--backend kubernetes`` (:class:`KubernetesBackend`) switches a claim through the API server
(``switch.py``, ``status.py``, ``plan.py``, ``lease.py``); ``--backend local``
(:class:`LocalBackend`) switches the embedded sandbox's claim on this machine (``local.py``).
The command line chooses one, once (:func:`make_backend`); the commands (``commands.py``)
only ever call the interface, so a command reads the same for both.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from typing import Protocol, runtime_checkable

from checkpoint_storage_bench.retry import Deadline
from hooks.storage_profile import plan as planning
from hooks.storage_profile.config import (
    LEASE_DURATION,
    BackendName,
    PlanConfig,
    ReleaseConfig,
    RenewConfig,
    StatusConfig,
    SwitchConfig,
    Target,
)
from hooks.storage_profile.heartbeat import BeatingDeadline
from hooks.storage_profile.kube import Kube, load_api_client
from hooks.storage_profile.lease import ClaimLease, default_holder, refuse_after_failure
from hooks.storage_profile.local import SandboxProfiles, render_local, status_local, switch_local
from hooks.storage_profile.report import Report
from hooks.storage_profile.status import claim_status, render_status
from hooks.storage_profile.switch import ProviderFactory, default_provider, switch_kubernetes

Echo = Callable[[str], None]


@runtime_checkable
class Backend(Protocol):
    """What the commands need from the place a claim lives.

    Every method acts on ``cfg``'s claim by ``cfg.timeout``, raising the hook's errors
    (each carries its exit code).
    """

    def settle(self, cfg: SwitchConfig) -> str:
        """What a switch waits for, as its report names it (``kubernetes``, ``provider``,
        ``local``)."""
        ...

    def switch(self, cfg: SwitchConfig, report: Report, echo: Echo) -> None:
        """Switch the claim to ``cfg.target`` and wait until it settled, filling ``report``;
        ``cfg.holder`` is set to the default holder when it is None."""
        ...

    def release(self, cfg: ReleaseConfig) -> str:
        """Give up the claim's Lease held by ``cfg.holder``; what was done, in one line."""
        ...

    def renew(self, cfg: RenewConfig) -> str:
        """Extend the claim's Lease held by ``cfg.holder``; what was done, in one line."""
        ...

    def status(self, cfg: StatusConfig) -> dict:
        """The claim's class state as data (``status -o json``)."""
        ...

    def render(self, data: dict) -> str:
        """The readable block of :meth:`status`'s data."""
        ...

    def plan(self, cfg: PlanConfig, now: datetime) -> planning.ModificationPlan:
        """The run's modifications over ``cfg.profiles``, judged at ``now``; changes
        nothing."""
        ...


def connect(cfg: Target, deadline: Deadline) -> Kube:
    """Access to the API server, its configuration loaded by ``deadline`` (a kubeconfig's
    ``exec`` credential plugin runs then)."""
    return Kube(load_api_client(cfg.kubeconfig, deadline), cfg.backoff)


class KubernetesBackend:
    """The claim through the Kubernetes API server: its Lease, its ledger, its class."""

    def __init__(self, provider_for: ProviderFactory = default_provider) -> None:
        self.provider_for = provider_for

    def settle(self, cfg: SwitchConfig) -> str:
        return cfg.settle

    def switch(self, cfg: SwitchConfig, report: Report, echo: Echo) -> None:
        # The deadline starts first: finding the holder and loading the configuration (an
        # exec credential plugin) are waits of this switch too.
        assert cfg.timeout is not None
        deadline = BeatingDeadline(cfg.timeout)
        if cfg.holder is None:
            cfg.holder = default_holder(deadline=deadline)
        if cfg.stop_after_failure:
            refuse_after_failure(deadline=deadline)
        kube = connect(cfg, deadline)
        switch_kubernetes(
            cfg, kube, report, provider_for=self.provider_for, echo=echo, deadline=deadline
        )

    def release(self, cfg: ReleaseConfig) -> str:
        return self._on_lease(cfg, ClaimLease.release, LEASE_DURATION)

    def renew(self, cfg: RenewConfig) -> str:
        return self._on_lease(cfg, ClaimLease.renew, cfg.lease_duration)

    @staticmethod
    def _on_lease(
        cfg: ReleaseConfig | RenewConfig,
        act: Callable[[ClaimLease, Deadline], str],
        duration: float,
    ) -> str:
        deadline = Deadline(cfg.timeout)
        holder = cfg.holder or default_holder(deadline=deadline)
        kube = connect(cfg, deadline)
        return act(ClaimLease(kube, cfg.namespace, cfg.claim, holder, duration), deadline)

    def status(self, cfg: StatusConfig) -> dict:
        deadline = Deadline(cfg.timeout)
        return claim_status(connect(cfg, deadline), cfg.namespace, cfg.claim, deadline)

    def render(self, data: dict) -> str:
        return render_status(data)

    def plan(self, cfg: PlanConfig, now: datetime) -> planning.ModificationPlan:
        deadline = Deadline(cfg.timeout)
        kube = connect(cfg, deadline)
        return planning.plan_kubernetes(
            kube, cfg.namespace, cfg.claim, cfg.profiles, cfg.return_to_first, now, deadline,
            cfg.restore_to,
        )  # fmt: skip


class LocalBackend:
    """The embedded sandbox's claim on this machine: profiles are directories, a class is
    emulated with block-I/O limits, and there is no Lease (one sandbox, one holder)."""

    def settle(self, cfg: SwitchConfig) -> str:
        return "local"

    def switch(self, cfg: SwitchConfig, report: Report, echo: Echo) -> None:
        if cfg.only_if_switched and cfg.holder is None:
            cfg.holder = default_holder()
        if cfg.stop_after_failure:
            refuse_after_failure()
        switch_local(cfg, SandboxProfiles.load(cfg.profiles_file), report, echo=echo)

    def release(self, cfg: ReleaseConfig) -> str:
        return "local backend: the sandbox has no Lease; nothing to release"

    def renew(self, cfg: RenewConfig) -> str:
        return "local backend: the sandbox has no Lease; nothing to renew"

    def status(self, cfg: StatusConfig) -> dict:
        sandbox = SandboxProfiles.load(cfg.profiles_file)
        sandbox.check_claim(cfg.namespace, cfg.claim)
        return status_local(sandbox)

    def render(self, data: dict) -> str:
        return render_local(data)

    def plan(self, cfg: PlanConfig, now: datetime) -> planning.ModificationPlan:
        return planning.plan_local(
            SandboxProfiles.load(cfg.profiles_file), cfg.namespace, cfg.claim, cfg.profiles,
            cfg.return_to_first, now, cfg.restore_to,
        )  # fmt: skip


def make_backend(name: BackendName, provider_for: ProviderFactory = default_provider) -> Backend:
    """The backend ``--backend`` names; ``provider_for`` finds a Kubernetes volume's cloud
    provider (the local backend has none)."""
    backends: dict[str, Callable[[], Backend]] = {
        "kubernetes": lambda: KubernetesBackend(provider_for),
        "local": LocalBackend,
    }
    return backends[name]()
