"""Upload of a committed checkpoint to the artifact store through fsspec, with retries."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import fsspec

from trainer.errors import ConfigError, UploadError

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Backoff:
    """Retry schedule: ``attempts`` tries, sleeping initial·factor^k (capped) between them."""

    attempts: int = 4
    initial_s: float = 0.5
    factor: float = 2.0
    cap_s: float = 8.0

    def delays(self) -> list[float]:
        return [min(self.cap_s, self.initial_s * self.factor**k) for k in range(self.attempts - 1)]


DEFAULT_BACKOFF = Backoff()


class Uploader:
    """Copies checkpoint directories to ``<url>/<checkpoint name>/`` on any fsspec store."""

    def __init__(
        self,
        url: str,
        backoff: Backoff = DEFAULT_BACKOFF,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        try:
            self.fs, self.root = fsspec.core.url_to_fs(url)
        except (ImportError, ValueError) as exc:
            raise ConfigError(f"--upload-to {url!r}: {exc}") from None
        self.url = url
        self.backoff = backoff
        self.sleep = sleep

    def upload(self, checkpoint: Path, names: list[str]) -> None:
        """Upload ``names`` (the manifest last, so a remote copy is complete once it has one).

        Raises:
            UploadError: Every attempt failed; the local checkpoint is untouched.
        """
        dest = f"{self.root.rstrip('/')}/{checkpoint.name}"
        delays = self.backoff.delays()
        for attempt in range(self.backoff.attempts):
            try:
                self.fs.makedirs(dest, exist_ok=True)
                for name in names:
                    self.fs.put_file(str(checkpoint / name), f"{dest}/{name}")
                return
            except Exception as exc:  # noqa: BLE001 - stores raise anything; all are retried
                if attempt == len(delays):
                    raise UploadError(
                        f"upload of {checkpoint.name} to {self.url} failed after "
                        f"{self.backoff.attempts} attempts: {exc}"
                    ) from exc
                log.warning(
                    "upload attempt %d failed (%s); retrying in %.1fs",
                    attempt + 1,
                    exc,
                    delays[attempt],
                )
                self.sleep(delays[attempt])
