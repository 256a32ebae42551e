"""Provider-side settle: Kubernetes says "done" before the cloud delivers the performance.

The EBS CSI driver returns once the EC2 modification reaches ``optimizing``; the volume
performs "between source and target" until it is ``completed``. A :class:`Provider` knows
how to wait for that and how to check the provider's rate limit before a switch. Add a
driver by writing a class with the same two methods and registering it in ``PROVIDERS``.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any, Protocol

from hooks.storage_profile.config import Deadline
from hooks.storage_profile.errors import HookError, Infeasible, PreflightRefused
from hooks.storage_profile.gke import GkeProvider

log = logging.getLogger(__name__)


class Provider(Protocol):
    """What the hook needs from a cloud provider."""

    name: str

    def check_rate_limit(self, volume_handle: str, force: bool) -> list[str]:
        """Refuse (``PreflightRefused``) when one more modification would break a limit.

        Returns:
            Warnings (for example when ``force`` overrode a refusal).
        """
        ...

    def wait_settled(
        self, volume_handle: str, deadline: Deadline, target_class: dict | None = None
    ) -> str:
        """Block until the provider finished the latest modification (and, where the
        provider reports them, delivers ``target_class``'s values); return a note."""
        ...


class ProviderError(HookError):
    """The provider's API could not be asked (exit 1 once the switch is under way)."""


def utcnow() -> datetime:
    return datetime.now(UTC)


class EbsProvider:
    """AWS EBS: wait for ``describe_volumes_modifications`` to say ``completed``.

    Args:
        ec2: A boto3 EC2 client (made lazily from the environment when None).
        region: Region for the lazy client (else ``AWS_REGION``/``AWS_DEFAULT_REGION``).
        poll_interval: Seconds between two looks at a running modification (EC2 has no
            watch; optimizing can take hours, so this is deliberately slow).
        max_per_window: Modifications AWS allows per volume in ``window``.
        window: The rolling window of the rate limit.
        now: Wall clock (injectable, the limit is about real time).
        sleep: Injectable sleep.
    """

    name = "aws-ebs"
    driver = "ebs.csi.aws.com"

    def __init__(
        self,
        ec2: Any | None = None,
        region: str | None = None,
        poll_interval: float = 15.0,
        max_per_window: int = 4,
        window: timedelta = timedelta(hours=24),
        now: Callable[[], datetime] = utcnow,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self._ec2 = ec2
        self.region = region
        self.poll_interval = poll_interval
        self.max_per_window = max_per_window
        self.window = window
        self.now = now
        self.sleep = sleep

    @property
    def ec2(self) -> Any:
        if self._ec2 is None:
            import boto3

            region = (
                self.region or os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION")
            )
            self._ec2 = boto3.client("ec2", region_name=region)
        return self._ec2

    def modifications(self, volume_id: str) -> list[dict]:
        """The volume's modifications known to EC2, oldest first (empty when none).

        Raises:
            ProviderError: EC2 could not be asked (credentials, permissions, unknown volume).
        """
        from botocore.exceptions import BotoCoreError, ClientError

        try:
            resp = self.ec2.describe_volumes_modifications(VolumeIds=[volume_id])
        except ClientError as exc:
            if exc.response["Error"]["Code"] == "InvalidVolumeModification.NotFound":
                return []
            raise ProviderError(f"cannot read EC2 modifications of {volume_id}: {exc}") from exc
        except BotoCoreError as exc:
            raise ProviderError(f"cannot read EC2 modifications of {volume_id}: {exc}") from exc
        mods = [m for m in resp.get("VolumesModifications", []) if m["VolumeId"] == volume_id]
        return sorted(mods, key=lambda m: m["StartTime"])

    def check_rate_limit(self, volume_handle: str, force: bool) -> list[str]:
        """Refuse when a modification is still running or the 24 h budget is used up.

        ``describe_volumes_modifications`` may list only the most recent modification of a
        volume; the count is then a lower bound, and the "previous one must be completed"
        rule still catches the common case of switching twice in a row.
        """
        try:
            mods = self.modifications(volume_handle)
        except ProviderError as exc:
            raise PreflightRefused(f"{exc} (--settle kubernetes skips the provider)") from exc
        problems = []
        if mods and mods[-1]["ModificationState"] in ("modifying", "optimizing"):
            last = mods[-1]
            problems.append(
                f"the previous modification of {volume_handle} is still "
                f"{last['ModificationState']} ({last.get('Progress', 0)}%); AWS accepts the "
                "next one only after it completed"
            )
        since = self.now() - self.window
        recent = [m for m in mods if m["StartTime"] >= since]
        if len(recent) >= self.max_per_window:
            next_at = recent[-self.max_per_window]["StartTime"] + self.window
            problems.append(
                f"{volume_handle} was modified {len(recent)} times in the last "
                f"{self.window.total_seconds() / 3600:g} h; AWS allows {self.max_per_window} "
                f"per rolling window, the next from {next_at.isoformat()}"
            )
        if problems and not force:
            raise PreflightRefused("; ".join(problems) + " (--force to try anyway)")
        return [f"--force: {p}" for p in problems]

    def wait_settled(
        self, volume_handle: str, deadline: Deadline, target_class: dict | None = None
    ) -> str:
        what = f"waiting for EBS volume {volume_handle} to finish optimizing"
        while True:
            mods = self.modifications(volume_handle)
            if not mods:
                return f"EC2 has no modification of {volume_handle}; nothing to wait for"
            last = mods[-1]
            state = last["ModificationState"]
            if state == "completed":
                return f"EC2 modification of {volume_handle} completed"
            if state == "failed":
                raise Infeasible(
                    f"EC2 modification of {volume_handle} failed: "
                    f"{last.get('StatusMessage', 'no message')}"
                )
            log.info("EBS volume %s is %s (%s%%)", volume_handle, state, last.get("Progress"))
            deadline.sleep(self.poll_interval, what, self.sleep)


# driver name -> factory; a factory gets the PV (for region or project hints).
PROVIDERS: dict[str, Callable[[dict], Provider]] = {
    EbsProvider.driver: lambda pv: EbsProvider(region=region_of(pv)),
    GkeProvider.driver: GkeProvider.for_pv,
}


def region_of(pv: dict) -> str | None:
    """The AWS region from the PV's zone affinity (``us-east-1a`` -> ``us-east-1``), if any."""
    terms = ((pv["spec"].get("nodeAffinity") or {}).get("required") or {}).get(
        "nodeSelectorTerms"
    ) or []
    for term in terms:
        for expr in term.get("matchExpressions") or []:
            if expr.get("key") in (
                "topology.ebs.csi.aws.com/zone",
                "topology.kubernetes.io/zone",
            ) and expr.get("values"):
                zone = expr["values"][0]
                return zone[:-1] if zone[-1:].isalpha() else zone
    return None
