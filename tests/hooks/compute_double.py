"""A Compute Engine API test double on loopback: ``disks.get`` and the metadata server.

It serves, over real HTTP on 127.0.0.1, what the GKE provider reads:
``GET /compute/v1/projects/P/zones/Z/disks/D`` (and ``regions/R``) with the REST API's
field spellings (int64 as strings, ``status``) and Google's error bodies; and the GCE
metadata server's token endpoint, so Application Default Credentials (Workload Identity
in a GKE pod) can run unmodified against it. A disk's fields can change over calls: a
modification is applied only after a number of looks, as a Compute Engine operation
finishes some time after the driver returned. Every request is recorded.
"""

from __future__ import annotations

import json
import re
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

DISK_PATH = re.compile(
    r"^/compute/v1/(?P<handle>projects/[^/]+/(?:zones|regions)/[^/]+/disks/[^/?]+)$"
)
METADATA = "/computeMetadata/v1"


@dataclass
class Request:
    method: str
    path: str
    headers: dict[str, str]


@dataclass
class Disk:
    """One disk's state, and changes that land at a given look (GET number)."""

    fields: dict[str, Any]
    scheduled: list[tuple[int, dict[str, Any]]] = field(default_factory=list)
    looks: int = 0


class ComputeDouble:
    """Start with :meth:`start`; ``endpoint`` is the API root the provider is given.

    Attributes:
        token: The access token the metadata server hands out; when ``require_token`` is
            set, disk reads without ``Authorization: Bearer <token>`` get a 401.
        faults: (status, headers, message) answered, in order, before the next disk reads.
    """

    def __init__(self, token: str = "metadata-token", require_token: str | None = None) -> None:
        self.token = token
        self.require_token = require_token
        self.project = "ml-project"
        self.disks: dict[str, Disk] = {}
        self.faults: list[tuple[int, dict[str, str], str]] = []
        self.requests: list[Request] = []
        self.lock = threading.Lock()
        self._server: ThreadingHTTPServer | None = None

    # -- control ----------------------------------------------------------------------------

    def start(self) -> ComputeDouble:
        double = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 - the http.server API
                double._handle(self)

            def log_message(self, *args: Any) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()

    @property
    def host(self) -> str:
        assert self._server is not None
        return f"127.0.0.1:{self._server.server_address[1]}"

    @property
    def endpoint(self) -> str:
        return f"http://{self.host}/compute/v1/"

    def add_disk(
        self,
        handle: str,
        iops: int = 3000,
        throughput: int = 140,
        status: str = "READY",
        disk_type: str = "hyperdisk-balanced",
    ) -> None:
        project, scope, location, _, name = handle.split("/")[1:]
        with self.lock:
            self.disks[handle] = Disk(
                {
                    "kind": "compute#disk",
                    "name": name,
                    scope[
                        :-1
                    ]: f"https://www.googleapis.com/compute/v1/projects/{project}/{scope}/{location}",
                    "type": f"projects/{project}/{scope}/{location}/diskTypes/{disk_type}",
                    "sizeGb": "200",
                    "status": status,
                    "provisionedIops": str(iops),
                    "provisionedThroughput": str(throughput),
                    "selfLink": f"https://www.googleapis.com/compute/v1/{handle}",
                }
            )

    def modify(self, handle: str, after_looks: int = 0, **fields: Any) -> None:
        """Change a disk's fields now, or so that read number ``after_looks`` from now is
        the first to see the change (int64 fields are sent as strings, as Google does)."""
        values = {k: str(v) if isinstance(v, int) else v for k, v in fields.items()}
        with self.lock:
            disk = self.disks[handle]
            if after_looks <= 0:
                disk.fields.update(values)
            else:
                disk.scheduled.append((disk.looks + after_looks, values))

    def fail(self, status: int, times: int = 1, retry_after: str | None = None) -> None:
        headers = {"Retry-After": retry_after} if retry_after is not None else {}
        with self.lock:
            self.faults.extend([(status, headers, f"injected {status}")] * times)

    def disk_reads(self) -> list[Request]:
        return [r for r in self.requests if DISK_PATH.match(r.path)]

    # -- serving ----------------------------------------------------------------------------

    def _handle(self, req: BaseHTTPRequestHandler) -> None:
        path = req.path.split("?", 1)[0]
        with self.lock:
            self.requests.append(
                Request("GET", req.path, {k.lower(): v for k, v in req.headers.items()})
            )
        if path == "/" or path.startswith(METADATA):
            self._metadata(req, path)
            return
        match = DISK_PATH.match(path)
        if match is None:
            self._error(req, 404, f"no such API path {path}", "notFound")
            return
        with self.lock:
            fault = self.faults.pop(0) if self.faults else None
        if fault is not None:
            status, headers, message = fault
            self._error(req, status, message, "injected", headers)
            return
        if (
            self.require_token
            and req.headers.get("Authorization") != f"Bearer {self.require_token}"
        ):
            self._error(req, 401, "Request had invalid authentication credentials.", "authError")
            return
        with self.lock:
            disk = self.disks.get(match["handle"])
            if disk is not None:
                disk.looks += 1
                for at, values in [s for s in disk.scheduled if s[0] <= disk.looks]:
                    disk.fields.update(values)
                    disk.scheduled.remove((at, values))
                body = dict(disk.fields)
        if disk is None:
            self._error(req, 404, f"The resource '{match['handle']}' was not found", "notFound")
            return
        self._send(req, 200, body)

    def _metadata(self, req: BaseHTTPRequestHandler, path: str) -> None:
        # The real server refuses requests without this header (SSRF protection).
        if req.headers.get("Metadata-Flavor") != "Google":
            self._send(req, 403, {"error": "Missing Metadata-Flavor: Google"})
            return
        sa = f"{METADATA}/instance/service-accounts/default"
        if path == "/":
            self._send(req, 200, "", text=True)
        elif path == f"{sa}/token":
            self._send(
                req, 200, {"access_token": self.token, "expires_in": 3599, "token_type": "Bearer"}
            )
        elif path in (f"{sa}/", sa):
            email = f"storage-profile-hook@{self.project}.iam.gserviceaccount.com"
            self._send(req, 200, {"aliases": ["default"], "email": email, "scopes": []})
        elif path == f"{METADATA}/project/project-id":
            self._send(req, 200, self.project, text=True)
        elif path == f"{METADATA}/universe/universe-domain":
            self._send(req, 200, "googleapis.com", text=True)
        else:
            self._send(req, 404, "not found", text=True)

    def _error(
        self,
        req: BaseHTTPRequestHandler,
        status: int,
        message: str,
        reason: str,
        headers: dict[str, str] | None = None,
    ) -> None:
        body = {
            "error": {
                "code": status,
                "message": message,
                "errors": [{"message": message, "domain": "global", "reason": reason}],
            }
        }
        self._send(req, status, body, headers=headers)

    @staticmethod
    def _send(
        req: BaseHTTPRequestHandler,
        status: int,
        body: Any,
        headers: dict[str, str] | None = None,
        text: bool = False,
    ) -> None:
        data = (body if text else json.dumps(body)).encode()
        req.send_response(status)
        req.send_header("Content-Type", "application/text" if text else "application/json")
        req.send_header("Content-Length", str(len(data)))
        req.send_header("Metadata-Flavor", "Google")
        for key, value in (headers or {}).items():
            req.send_header(key, value)
        req.end_headers()
        req.wfile.write(data)
