"""Provider settle for GKE's Persistent Disk CSI driver (``pd.csi.storage.gke.io``).

The driver's ControllerModifyVolume starts a Compute Engine ``disks.update`` and returns
without waiting for it, so Kubernetes reports the claim settled before the disk delivers
the class's performance. This provider reads the disk with the Compute Engine REST API
(``disks.get`` / ``regionDisks.get``) until it reports the class's ``provisionedIops`` and
``provisionedThroughput`` and ``status`` is ``READY``.

Credentials are Application Default Credentials (google-auth): in a GKE pod, Workload
Identity through the metadata server; elsewhere ``GOOGLE_APPLICATION_CREDENTIALS`` or
gcloud's. The identity needs only ``compute.disks.get`` (connections/gcp-role-storage-profile-hook.yaml).
``STORAGE_PROFILE_COMPUTE_ENDPOINT`` overrides the API's address (a private endpoint, or a
test double on loopback).
"""

from __future__ import annotations

import logging
import math
import os
import re
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import requests

from checkpoint_storage_bench.retry import Backoff, Deadline, TemporaryError, retry, within
from checkpoint_storage_bench.units import parse_quantity
from hooks.storage_profile.errors import HookError, Infeasible, PreflightRefused

log = logging.getLogger(__name__)

DRIVER = "pd.csi.storage.gke.io"
COMPUTE_ENDPOINT = "https://compute.googleapis.com/compute/v1/"
ENDPOINT_ENV = "STORAGE_PROFILE_COMPUTE_ENDPOINT"
# Read-only is enough for disks.get; the custom role narrows it to compute.disks.get.
SCOPES = ("https://www.googleapis.com/auth/compute.readonly",)
# The driver's volume handle: a zonal or a regional (replicated) disk.
_HANDLE = re.compile(
    r"projects/(?P<project>[^/\s]+)/(?P<scope>zones|regions)/(?P<location>[^/\s]+)"
    r"/disks/(?P<disk>[^/\s]+)"
)
MIB = 2**20
CONNECT_TIMEOUT = 10.0
# Compute Engine's disk statuses; FAILED and DELETING never become READY again.
DISK_FAILED = ("FAILED", "DELETING")

Progress = Callable[[str, float | None], None]
"""Called at each look while waiting: the provider's state in words, and a percentage
when the provider reports one (Compute Engine does not: always None here)."""


class ComputeApiError(HookError):
    """The Compute Engine API could not be asked, or refused (exit 1 once the switch is
    under way; preflight turns it into a refusal)."""


def disk_path(volume_handle: str) -> str:
    """The REST path of the driver's volume handle (``projects/P/zones/Z/disks/D`` or
    ``projects/P/regions/R/disks/D``), checked.

    >>> disk_path("projects/ml/zones/us-central1-a/disks/pvc-1")
    'projects/ml/zones/us-central1-a/disks/pvc-1'

    Raises:
        ComputeApiError: Not a handle of this driver.
    """
    if not _HANDLE.fullmatch(volume_handle or ""):
        raise ComputeApiError(
            f"volume handle {volume_handle!r} is not a Compute Engine disk "
            "(expected projects/P/zones/Z/disks/D or projects/P/regions/R/disks/D)"
        )
    return volume_handle


@dataclass(frozen=True)
class DiskTarget:
    """What a VolumeAttributesClass asks of the disk, converted as the driver converts it.

    The GKE driver reads ``iops`` as a quantity rounded up to a whole number and
    ``throughput`` as a quantity rounded up to whole MiB/s (so ``"290Mi"`` is 290 MiB/s,
    and a bare ``"290"`` would be 290 bytes/s, i.e. 1 MiB/s). Keys are case-insensitive.

    Attributes:
        iops: Provisioned IOPS, or None when the class does not set it.
        throughput_mibps: Provisioned throughput in MiB/s, or None.
    """

    iops: int | None = None
    throughput_mibps: int | None = None

    @classmethod
    def from_parameters(cls, parameters: Mapping[str, str] | None) -> DiskTarget:
        """The target of a class's ``parameters``.

        Raises:
            ValueError: A value is not a Kubernetes quantity (the driver refuses it too).
        """
        params = {str(k).lower(): v for k, v in (parameters or {}).items()}
        iops = throughput = None
        if "iops" in params:
            iops = math.ceil(parse_quantity(params["iops"]))
        if "throughput" in params:
            throughput = math.ceil(parse_quantity(params["throughput"]) / MIB)
        return cls(iops, throughput)

    def reached_by(self, disk: Mapping[str, Any]) -> bool:
        """Whether the disk reports what the class asks for."""
        return (self.iops is None or _int(disk.get("provisionedIops")) == self.iops) and (
            self.throughput_mibps is None
            or _int(disk.get("provisionedThroughput")) == self.throughput_mibps
        )

    def describe(self) -> str:
        parts = []
        if self.iops is not None:
            parts.append(f"{self.iops} IOPS")
        if self.throughput_mibps is not None:
            parts.append(f"{self.throughput_mibps} MiB/s")
        return " and ".join(parts) or "no performance parameters"


def describe_disk(disk: Mapping[str, Any]) -> str:
    """The fields the wait looks at, as a person reads them."""
    return (
        f"{disk.get('status', 'no status')}, {_int(disk.get('provisionedIops'))} IOPS, "
        f"{_int(disk.get('provisionedThroughput'))} MiB/s"
    )


def _int(value: Any) -> int | None:
    # The REST API sends int64 fields as JSON strings ("3000").
    try:
        return int(value) if value is not None else None
    except (TypeError, ValueError):
        return None


def _retry_after(response: requests.Response) -> float | None:
    try:
        return float(response.headers["Retry-After"])
    except (KeyError, ValueError):
        return None


def _api_message(response: requests.Response) -> str:
    """The ``error.message`` of a Google API error body, else the HTTP reason."""
    try:
        return str(response.json()["error"]["message"])
    except (ValueError, KeyError, TypeError):
        return f"{response.status_code} {response.reason}"


class GkeProvider:
    """GKE Persistent Disk / Hyperdisk: wait until the disk reports the class's values.

    Args:
        credentials: google-auth credentials; None: Application Default Credentials,
            resolved at the first call.
        endpoint: The Compute Engine API root; else ``$STORAGE_PROFILE_COMPUTE_ENDPOINT``,
            else ``https://compute.googleapis.com/compute/v1/``.
        poll_interval: Seconds between two looks at the disk (the API has no watch).
        backoff: Retry schedule of one ``disks.get`` (429, 5xx, dropped connections).
        request_timeout: Longest single request, in seconds (also bounded by the deadline).
        sleep: Injectable sleep.
    """

    name = "gcp-pd"
    driver = DRIVER

    def __init__(
        self,
        credentials: Any | None = None,
        endpoint: str | None = None,
        poll_interval: float = 10.0,
        backoff: Backoff | None = None,
        request_timeout: float = 30.0,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self._credentials = credentials
        root = endpoint or os.environ.get(ENDPOINT_ENV) or COMPUTE_ENDPOINT
        self.endpoint = root if root.endswith("/") else root + "/"
        self.poll_interval = poll_interval
        self.backoff = backoff or Backoff()
        self.request_timeout = request_timeout
        self.sleep = sleep
        self._session: requests.Session | None = None

    @classmethod
    def for_pv(cls, pv: dict) -> GkeProvider:
        """The factory ``PROVIDERS`` calls: the handle names project and zone, so the PV
        needs no reading here."""
        return cls()

    # -- the API --------------------------------------------------------------------------

    @property
    def session(self) -> requests.Session:
        return self.session_within(None)

    def session_within(self, deadline: Deadline | None) -> requests.Session:
        """The authorized session; finding the credentials ends by ``deadline`` (outside a
        GKE pod, google-auth probes the metadata server with its own timeouts and retries)."""
        if self._session is None:
            import google.auth
            from google.auth.exceptions import DefaultCredentialsError
            from google.auth.transport.requests import AuthorizedSession

            credentials = self._credentials
            if credentials is None:
                try:
                    credentials, _ = within(
                        lambda: google.auth.default(scopes=list(SCOPES)),
                        what="finding Google credentials",
                        deadline=deadline,
                    )
                except DefaultCredentialsError as exc:
                    raise ComputeApiError(
                        f"no Google credentials (Application Default Credentials): {exc}; "
                        "in a GKE pod, bind the hook's service account with Workload "
                        "Identity (docs/bundle.md)"
                    ) from exc
            self._session = AuthorizedSession(credentials)
        return self._session

    def disk(self, volume_handle: str, deadline: Deadline | None = None) -> dict:
        """``disks.get`` (or ``regionDisks.get``) of the volume, retrying what is temporary.

        With a ``deadline`` every try ends by it: the request's connect and read timeouts
        and google-auth's ``max_allowed_time`` (which also bounds a token refresh and the
        retry after a 401) are cut to what is left, and the retry loop stops there.

        Raises:
            ComputeApiError: Not found, forbidden, another refusal, or still failing after
                every try.
            DeadlineExceeded: The deadline passed while retrying.
        """
        url = self.endpoint + disk_path(volume_handle)
        what = f"read Compute Engine disk {volume_handle}"

        def once() -> dict:
            from google.auth.exceptions import RefreshError, TransportError

            timeout = self.request_timeout
            if deadline is not None:
                # retry() checked the deadline just before; the floor only keeps the value
                # a valid timeout.
                timeout = max(0.05, min(timeout, deadline.remaining()))
            try:
                response = self.session_within(deadline).get(
                    url,
                    timeout=(min(CONNECT_TIMEOUT, timeout), timeout),
                    max_allowed_time=timeout,
                )
            except (requests.ConnectionError, requests.Timeout, TransportError) as exc:
                raise TemporaryError(f"connection to {self.endpoint} failed: {exc}") from exc
            except RefreshError as exc:
                # e.g. the metadata server (Workload Identity) briefly unreachable
                if getattr(exc, "retryable", False):
                    raise TemporaryError(f"refreshing the credentials failed: {exc}") from exc
                raise ComputeApiError(
                    f"{what}: the credentials could not be refreshed: {exc}"
                ) from exc
            if response.status_code == 429 or response.status_code >= 500:
                raise TemporaryError(
                    f"Compute Engine answered {response.status_code}: {_api_message(response)}",
                    _retry_after(response),
                )
            if response.status_code in (401, 403):
                raise ComputeApiError(
                    f"forbidden to {what}: {_api_message(response)} (the hook's identity "
                    "needs compute.disks.get: connections/gcp-role-storage-profile-hook.yaml)"
                )
            if response.status_code == 404:
                raise ComputeApiError(f"{what}: not found: {_api_message(response)}")
            if response.status_code >= 400:
                raise ComputeApiError(f"{what} failed: {_api_message(response)}")
            try:
                return response.json()
            except ValueError as exc:
                raise ComputeApiError(f"{what}: the answer is not JSON") from exc

        try:
            return retry(once, what=what, backoff=self.backoff, deadline=deadline, sleep=self.sleep)
        except TemporaryError as exc:
            raise ComputeApiError(f"{what} failed after {self.backoff.tries} tries: {exc}") from exc

    # -- the provider interface -----------------------------------------------------------

    def check_rate_limit(
        self, volume_handle: str, force: bool, deadline: Deadline | None = None
    ) -> list[str]:
        """Refuse when the disk cannot take a modification now (not READY).

        ``disks.get`` says nothing about past modifications, so Google's once-per-4-hours
        rule is counted from the claim's own ledger (the switch's budget check), not here:
        this provider never raises ``BudgetExceeded``. A disk that is not READY is a
        ``PreflightRefused`` (exit 3) without a "next allowed" time.
        """
        try:
            disk = self.disk(volume_handle, deadline)
        except ComputeApiError as exc:
            raise PreflightRefused(f"{exc} (--settle kubernetes skips the provider)") from exc
        status = disk.get("status")
        if status == "READY":
            return []
        problem = f"Compute Engine disk {volume_handle} is {status}, not READY"
        if not force:
            raise PreflightRefused(problem + " (--force to try anyway)")
        return [f"--force: {problem}"]

    def wait_settled(
        self,
        volume_handle: str,
        deadline: Deadline,
        since: datetime | None = None,
        target_class: Mapping[str, Any] | None = None,
        progress: Progress | None = None,
    ) -> str:
        """Block until the disk is READY with the class's provisioned IOPS and throughput.

        Each wait between two looks sleeps through ``deadline.sleep`` with the disk's last
        seen state in its ``what`` (the switch's heartbeat shows it as the provider's).

        Args:
            volume_handle: The PV's ``spec.csi.volumeHandle``.
            deadline: The switch's overall deadline.
            since: When the switch patched the claim (None: nothing was patched). Unused:
                ``disks.get`` has no record of modifications to tell ours from another's,
                so the disk's values are the judge either way; a disk that already reports
                the class returns at the first look.
            target_class: The VolumeAttributesClass switched to; without it only READY is
                awaited (and the note says so).
            progress: Called at each look that is not yet the target.

        Raises:
            Infeasible: The disk FAILED or is being deleted.
            DeadlineExceeded: The deadline passed first (names the last state seen).
            ComputeApiError: The API could not be asked.
        """
        try:
            target = DiskTarget.from_parameters((target_class or {}).get("parameters"))
        except ValueError as exc:
            raise Infeasible(f"the class's parameters cannot be read: {exc}") from exc
        goal = f"READY with {target.describe()}" if target_class else "READY"
        while True:
            disk = self.disk(volume_handle, deadline)
            status = disk.get("status")
            if status in DISK_FAILED:
                raise Infeasible(f"Compute Engine disk {volume_handle} is {status}")
            if status == "READY" and target.reached_by(disk):
                note = f"Compute Engine disk {volume_handle} is {goal}"
                if target_class is None:
                    note += " (the class's values were not checked)"
                return note
            state = describe_disk(disk)
            log.info("Compute Engine disk %s: %s; waiting for %s", volume_handle, state, goal)
            if progress is not None:
                progress(state, None)
            deadline.sleep(
                self.poll_interval,
                f"waiting for Compute Engine disk {volume_handle} to be {goal} "
                f"(last seen: {state})",
                self.sleep,
            )
