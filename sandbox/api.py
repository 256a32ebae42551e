"""A few calls to the sandbox server's REST API (plain HTTP on loopback): reads, and stop."""

from __future__ import annotations

import gzip
import json
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from typing import Any

from sandbox.errors import ServerUnavailableError

DONE_STATUSES = {"succeeded", "failed", "stopped", "upstream_failed", "skipped", "done"}


@dataclass
class Api:
    """The REST API of one server.

    Attributes:
        host: Base URL, e.g. ``http://127.0.0.1:8000``.
        timeout: Seconds per request.
    """

    host: str
    timeout: float = 10.0

    def get(self, path: str, **params: Any) -> Any:
        """GET ``path`` (relative to the host) and decode its JSON."""
        url = f"{self.host.rstrip('/')}/{path.lstrip('/')}"
        if params:
            url += "?" + urllib.parse.urlencode(params)
        try:
            with urllib.request.urlopen(url, timeout=self.timeout) as resp:
                body = resp.read()
                # The server gzips JSON even when the client did not ask for it.
                if resp.headers.get("Content-Encoding") == "gzip" or body[:2] == b"\x1f\x8b":
                    body = gzip.decompress(body)
                return json.loads(body)
        except urllib.error.HTTPError as exc:
            raise ServerUnavailableError(f"GET {url}: HTTP {exc.code}") from exc
        except (urllib.error.URLError, OSError) as exc:
            raise ServerUnavailableError(f"GET {url}: {exc}") from exc

    def post(self, path: str, body: dict[str, Any] | None = None) -> None:
        """POST ``body`` as JSON to ``path`` (relative to the host)."""
        url = f"{self.host.rstrip('/')}/{path.lstrip('/')}"
        request = urllib.request.Request(
            url,
            data=json.dumps(body or {}).encode(),
            headers={"Content-Type": "application/json"},
            method="POST",
        )
        try:
            with urllib.request.urlopen(request, timeout=self.timeout):
                pass
        except urllib.error.HTTPError as exc:
            raise ServerUnavailableError(f"POST {url}: HTTP {exc.code}") from exc
        except (urllib.error.URLError, OSError) as exc:
            raise ServerUnavailableError(f"POST {url}: {exc}") from exc

    def stop(self, owner: str, project: str, uuid: str) -> None:
        """Ask the server to stop a run (a pipeline stops its ops too)."""
        self.post(f"api/v1/{owner}/{project}/runs/{uuid}/stop")

    def healthy(self) -> bool:
        """Whether the server answers ``/healthz`` (never the agents' state: reading that
        schedules the queued runs)."""
        try:
            with urllib.request.urlopen(f"{self.host}/healthz", timeout=2) as resp:
                return resp.status == 200
        except (urllib.error.URLError, OSError):
            return False

    def run(self, owner: str, project: str, uuid: str) -> dict[str, Any]:
        return self.get(f"api/v1/{owner}/{project}/runs/{uuid}")

    def runs(
        self, owner: str, project: str, query: str | None = None, limit: int = 100
    ) -> list[dict[str, Any]]:
        """Runs of a project, newest first, optionally filtered (e.g. ``pipeline.uuid:U``)."""
        params: dict[str, Any] = {"limit": limit}
        if query:
            params["query"] = query
        return self.get(f"api/v1/{owner}/{project}/runs", **params).get("results") or []

    def pipeline_runs(self, owner: str, project: str, pipeline: str) -> list[dict[str, Any]]:
        """The ops of a pipeline, in the order they were created."""
        runs = self.runs(owner, project, query=f"pipeline.uuid:{pipeline}", limit=200)
        return sorted(runs, key=lambda r: r.get("created_at") or "")

    def statuses(self, owner: str, project: str, uuid: str) -> list[dict[str, Any]]:
        data = self.get(f"api/v1/{owner}/{project}/runs/{uuid}/statuses")
        return data.get("status_conditions") or []

    def logs(self, owner: str, project: str, uuid: str) -> list[str]:
        """The run's captured log lines, as the UI shows them."""
        data = self.get(f"streams/v1/sandbox/{owner}/{project}/runs/{uuid}/logs", force="true")
        return [entry.get("value") or "" for entry in data.get("logs") or []]
