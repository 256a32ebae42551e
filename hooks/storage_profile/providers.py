"""Provider-side settle: Kubernetes says "done" before the cloud delivers the performance.

The EBS CSI driver returns once the EC2 modification reaches ``optimizing``; the volume
performs "between source and target" until it is ``completed`` (GKE's driver does not wait
for the disk update at all: ``gke.py``). A :class:`Provider` knows
how to wait for that and how to check the provider's rate limit before a switch. Add a
driver by writing a class with the same two methods and registering it in ``PROVIDERS``
(one line: driver name -> factory).
"""

from __future__ import annotations

import logging
import math
import os
import re
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any, Protocol

from checkpoint_storage_bench.retry import Backoff, Deadline, TemporaryError, retry, within
from hooks.storage_profile.errors import BudgetExceeded, HookError, Infeasible, PreflightRefused
from hooks.storage_profile.gke import GkeProvider

log = logging.getLogger(__name__)

# A modification that started this long before the switch's request may still be ours:
# the request time is this machine's clock, the start time the provider's.
CLOCK_SKEW = timedelta(seconds=60)


class Provider(Protocol):
    """What the hook needs from a cloud provider.

    Every call to the provider's API must end by ``deadline`` (cap its timeouts to
    ``deadline.remaining()``, no retries of its own beyond the deadline), and every wait
    sleeps through ``deadline.sleep(seconds, what)``: ``what`` says what is waited for.
    """

    name: str

    def check_rate_limit(self, volume_handle: str, force: bool, deadline: Deadline) -> list[str]:
        """Refuse when one more modification would break a limit: ``BudgetExceeded`` (with
        the time the next one fits, if known), or ``PreflightRefused`` when the provider
        cannot be asked. The hook also counts the claim's own ledger; the stricter wins.

        Returns:
            Warnings (for example when ``force`` overrode a refusal).
        """
        ...

    def wait_settled(
        self,
        volume_handle: str,
        deadline: Deadline,
        since: datetime | None,
        target_class: dict | None = None,
    ) -> str:
        """Block until the provider finished the modification this switch started (and,
        where the provider reports them, delivers ``target_class``'s values); return a note.

        Args:
            volume_handle: The PV's ``spec.csi.volumeHandle``.
            deadline: The switch's deadline.
            since: When the switch patched the claim (a modification that started earlier,
                allowing for :data:`CLOCK_SKEW`, is someone else's); None when nothing was
                patched: then only a modification still running is waited for.
            target_class: The VolumeAttributesClass switched to (its ``parameters`` are what
                the volume should deliver); a provider that cannot read them back ignores it.
        """
        ...


class ProviderError(HookError):
    """The provider's API could not be asked (exit 1 once the switch is under way)."""


def utcnow() -> datetime:
    return datetime.now(UTC)


# EC2 error codes worth another try; everything else (permissions, unknown volume) is not.
EC2_TEMPORARY = {
    "RequestLimitExceeded",
    "Throttling",
    "ThrottlingException",
    "InternalError",
    "InternalFailure",
    "ServiceUnavailable",
    "Unavailable",
}
EC2_CONNECT_TIMEOUT = 5.0
EC2_READ_TIMEOUT = 20.0
EC2_BACKOFF = Backoff(delays=(1.0, 2.0, 4.0, 8.0))


class EbsProvider:
    """AWS EBS: wait for ``describe_volumes_modifications`` to say ``completed``.

    Each EC2 call is bounded by the deadline: botocore's own retries are off (its default
    is 60 s read timeouts, several times over) and its timeouts are capped to what is left;
    throttling and connection errors are retried by the shared retry loop, within the
    deadline.

    Args:
        ec2: A boto3 EC2 client (tests); by default one is made per the deadline's needs.
        region: Region for the client (else ``AWS_REGION``/``AWS_DEFAULT_REGION``).
        poll_interval: Seconds between two looks at a running modification (EC2 has no
            watch; optimizing can take hours, so this is deliberately slow).
        max_per_window: Modifications AWS allows per volume in ``window``.
        window: The rolling window of the rate limit.
        now: Wall clock (injectable, the limit is about real time).
        sleep: Injectable sleep.
        backoff: Retry schedule of one EC2 call.
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
        backoff: Backoff = EC2_BACKOFF,
    ) -> None:
        self._ec2 = ec2
        self._client: Any | None = None
        self.region = region
        self.poll_interval = poll_interval
        self.max_per_window = max_per_window
        self.window = window
        self.now = now
        self.sleep = sleep
        self.backoff = backoff

    def client(self, deadline: Deadline | None = None) -> Any:
        """An EC2 client whose one attempt ends by ``deadline``.

        Far from the deadline one client is reused; near it, a client is made with its
        connect and read timeouts cut to what is left.
        """
        if self._ec2 is not None:
            return self._ec2
        left = deadline.remaining() if deadline is not None else math.inf
        if left > EC2_CONNECT_TIMEOUT + EC2_READ_TIMEOUT:
            if self._client is None:
                self._client = self._make_client(EC2_CONNECT_TIMEOUT, EC2_READ_TIMEOUT)
            return self._client
        left = max(0.2, left)
        connect = min(EC2_CONNECT_TIMEOUT, left / 2)
        return self._make_client(connect, left - connect)

    def _make_client(self, connect: float, read: float) -> Any:
        import boto3
        from botocore.config import Config

        region = self.region or os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION")
        config = Config(
            connect_timeout=connect,
            read_timeout=read,
            retries={"mode": "standard", "total_max_attempts": 1},
        )
        return boto3.client("ec2", region_name=region, config=config)

    def modifications(self, volume_id: str, deadline: Deadline | None = None) -> list[dict]:
        """The volume's modifications known to EC2, oldest first (empty when none).

        Raises:
            ProviderError: EC2 could not be asked (credentials, permissions, unknown volume),
                or kept failing for every try.
            DeadlineExceeded: The deadline passed while retrying.
        """
        from botocore.exceptions import BotoCoreError, ClientError, HTTPClientError
        from botocore.exceptions import ConnectionError as BotoConnectionError

        what = f"read EC2 modifications of {volume_id}"

        def once() -> dict:
            try:
                # within(): resolving the credentials (IRSA: an STS call with botocore's
                # own 60 s timeouts and retries) is part of the first call.
                return within(
                    lambda: self.client(deadline).describe_volumes_modifications(
                        VolumeIds=[volume_id]
                    ),
                    what=what,
                    deadline=deadline,
                )
            except ClientError as exc:
                code = exc.response["Error"]["Code"]
                status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode") or 0
                if code in EC2_TEMPORARY or status >= 500:
                    raise TemporaryError(f"EC2 answered {code}: {exc}") from exc
                raise
            except (BotoConnectionError, HTTPClientError) as exc:
                raise TemporaryError(f"EC2 could not be reached: {exc}") from exc

        try:
            resp = retry(once, what=what, backoff=self.backoff, deadline=deadline, sleep=self.sleep)
        except ClientError as exc:
            if exc.response["Error"]["Code"] == "InvalidVolumeModification.NotFound":
                return []
            raise ProviderError(f"cannot {what}: {exc}") from exc
        except (BotoCoreError, TemporaryError) as exc:
            raise ProviderError(f"cannot {what}: {exc}") from exc
        mods = [m for m in resp.get("VolumesModifications", []) if m["VolumeId"] == volume_id]
        return sorted(mods, key=lambda m: m["StartTime"])

    def check_rate_limit(
        self, volume_handle: str, force: bool, deadline: Deadline | None = None
    ) -> list[str]:
        """Refuse when a modification is still running or the 24 h budget is used up.

        ``describe_volumes_modifications`` may list only the most recent modification of a
        volume; the count is then a lower bound, and the "previous one must be completed"
        rule still catches the common case of switching twice in a row.
        """
        try:
            mods = self.modifications(volume_handle, deadline)
        except ProviderError as exc:
            raise PreflightRefused(f"{exc} (--settle kubernetes skips the provider)") from exc
        problems = []
        next_at = None
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
            raise BudgetExceeded("; ".join(problems) + " (--force to try anyway)", next_at)
        return [f"--force: {p}" for p in problems]

    def wait_settled(
        self,
        volume_handle: str,
        deadline: Deadline,
        since: datetime | None = None,
        target_class: dict | None = None,
    ) -> str:
        # target_class is not needed here: EC2's own record of the modification this switch
        # started (completed or failed) is the judge.
        while True:
            mods = self.modifications(volume_handle, deadline)
            if since is not None:
                ours = [m for m in mods if m["StartTime"] >= since - CLOCK_SKEW]
                if not ours:
                    return (
                        f"EC2 has no modification of {volume_handle} since the switch; "
                        "nothing to wait for"
                    )
                last = ours[-1]
            elif not mods:
                return f"EC2 has no modification of {volume_handle}; nothing to wait for"
            else:
                last = mods[-1]
                if last["ModificationState"] not in ("modifying", "optimizing"):
                    # Not started by this switch (nothing was patched): nothing to wait for,
                    # and an old failure is not this switch's.
                    return (
                        f"EC2's latest modification of {volume_handle} is "
                        f"{last['ModificationState']} (started {last['StartTime'].isoformat()})"
                        "; nothing to wait for"
                    )
            state = last["ModificationState"]
            if state == "completed":
                return f"EC2 modification of {volume_handle} completed"
            if state == "failed":
                raise Infeasible(
                    f"EC2 modification of {volume_handle} failed: "
                    f"{last.get('StatusMessage', 'no message')}"
                )
            progress = last.get("Progress")
            log.info("EBS volume %s is %s (%s%%)", volume_handle, state, progress)
            deadline.sleep(
                self.poll_interval,
                f"waiting for EBS volume {volume_handle} to finish optimizing "
                f"(EC2: {state}, {progress if progress is not None else '?'}%)",
                self.sleep,
            )


# driver name -> factory; a factory gets the PV (for region or project hints).
PROVIDERS: dict[str, Callable[[dict], Provider]] = {
    EbsProvider.driver: lambda pv: EbsProvider(region=region_of(pv)),
    GkeProvider.driver: GkeProvider.for_pv,
}

# An AWS region: "us-east-1", "us-gov-west-1", "ap-southeast-4". Zone names add a letter
# ("us-east-1a"), Local Zones a suffix ("us-west-2-lax-1a"), Wavelength Zones another
# ("us-east-1-wl1-bos-wlz-1"): the region is the leading part up to its number.
AWS_REGION = re.compile(r"^([a-z]{2}(?:-[a-z]+)+-\d+)(?![0-9])")


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
                match = AWS_REGION.match(expr["values"][0])
                return match.group(1) if match else None
    return None
