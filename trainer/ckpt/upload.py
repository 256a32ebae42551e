"""Upload of a committed checkpoint to the artifact store through fsspec, with retries.

Retries go through the bundle's one retry loop (:mod:`checkpoint_storage_bench.retry`):
the delays are data (:data:`DEFAULT_BACKOFF`), and only what another try may cure is
retried. A missing bucket or a refused credential fails at once.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from pathlib import Path

import fsspec

from checkpoint_storage_bench.retry import Backoff, TemporaryError, retry
from trainer.errors import ConfigError, UploadError
from trainer.progress import PROGRESS_EVERY_S, UploadProgress

log = logging.getLogger(__name__)

DEFAULT_BACKOFF = Backoff(delays=(0.5, 1.0, 2.0))
"""Four tries in all, about 3.5 s of waiting: a checkpoint upload that fails for longer
fails the run (exit 5), with the local checkpoint kept."""

# Another try cannot cure these: the bucket or path does not exist, or we may not write it.
_PERMANENT = (FileNotFoundError, PermissionError, NotADirectoryError, IsADirectoryError)
# Object stores have no directories to make, and their makedirs creates a missing bucket
# (s3fs, gcsfs): an upload to a mistyped bucket must fail, not create one.
_OBJECT_STORES = {"s3", "s3a", "gs", "gcs", "abfs", "abfss", "az", "adl"}
# This machine's own files: a target there can be the checkpoint directory itself.
_LOCAL = {"file", "local"}


class Uploader:
    """Copies checkpoint directories to ``<url>/<checkpoint name>/`` on any fsspec store."""

    def __init__(
        self,
        url: str,
        backoff: Backoff = DEFAULT_BACKOFF,
        sleep: Callable[[float], None] = time.sleep,
        say: Callable[[str], None] = lambda line: None,
        progress_every_s: float = PROGRESS_EVERY_S,
        checkpoint_dir: Path | None = None,
    ) -> None:
        """
        Raises:
            ConfigError: ``url`` is no fsspec URL, or it is ``checkpoint_dir`` (the
                directory whose checkpoints are uploaded) or inside it.
        """
        try:
            self.fs, self.root = fsspec.core.url_to_fs(url)
        except (ImportError, ValueError) as exc:
            raise ConfigError(f"--upload-to {url!r}: {exc}") from None
        self.url = url
        protocols = self.fs.protocol if isinstance(self.fs.protocol, tuple) else (self.fs.protocol,)
        self.has_directories = not _OBJECT_STORES.intersection(protocols)
        if checkpoint_dir is not None and _LOCAL.intersection(protocols):
            # Resolved, so no spelling (a symlink, "..", a relative path) slips through.
            target, source = Path(self.root).resolve(), Path(checkpoint_dir).resolve()
            if target.is_relative_to(source):
                raise ConfigError(
                    f"--upload-to {url!r} is inside the checkpoint dir {checkpoint_dir} "
                    f"({target}): an upload there would replace the checkpoint it copies; "
                    "choose a target outside it"
                )
        self.backoff = backoff
        self.sleep = sleep
        self.say = say
        self.progress_every_s = progress_every_s

    def upload(self, checkpoint: Path, names: list[str]) -> None:
        """Upload ``names`` (the manifest last, so a remote copy is complete once it has one).

        Raises:
            UploadError: Every try failed, or one failed for good; the local checkpoint is
                untouched.
        """
        dest = f"{self.root.rstrip('/')}/{checkpoint.name}"
        manifest = f"{dest}/{names[-1]}"

        def attempt() -> None:
            try:
                if self.has_directories:
                    self.fs.makedirs(dest, exist_ok=True)
                # A step uploaded before (a resumed run saving it again): drop its manifest
                # first, or a failed upload would leave the old manifest beside new bytes, a
                # remote copy that looks complete and is not.
                if self.fs.exists(manifest):
                    self.fs.rm_file(manifest)
                sizes = {name: (checkpoint / name).stat().st_size for name in names}
                progress = UploadProgress(
                    checkpoint.name, sum(sizes.values()), self.say, self.progress_every_s
                )
                for name in names:
                    self.fs.put_file(str(checkpoint / name), f"{dest}/{name}", callback=progress)
                    progress.file_done(sizes[name])
                progress.done()
            except _PERMANENT:
                raise
            except Exception as exc:  # noqa: BLE001 - stores raise anything; the rest is retried
                raise TemporaryError(f"{type(exc).__name__}: {exc}") from exc

        try:
            retry(attempt, what=f"upload {checkpoint.name}", backoff=self.backoff, sleep=self.sleep)
        except TemporaryError as exc:
            raise UploadError(
                f"upload of {checkpoint.name} to {self.url} failed after "
                f"{self.backoff.tries} attempts: {exc}"
            ) from exc
        except _PERMANENT as exc:
            raise UploadError(f"upload of {checkpoint.name} to {self.url} failed: {exc}") from exc
