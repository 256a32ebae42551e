"""Images for Polyaxon's own init and sidecar containers on the local node, without a registry.

Polyaxon's agent puts two containers of its own into every run's pod: an init container
(``polyaxon-init``: makes the run's context dirs, copies what a resumed run had in the
artifacts store, runs ``polyaxon initializer ...`` for ``init:`` connections) and a sidecar
(``polyaxon sidecar``: follows the main container's logs and syncs its outputs into the
artifacts store). On a cluster their images are ``polyaxon/polyaxon-init`` and
``polyaxon/polyaxon-sidecar`` from Docker Hub, which cannot be pulled here. What they are
is the ``polyaxon`` package with ``POLYAXON_SERVICE`` set (the CLI registers the
``initializer`` / ``sidecar`` commands only for that service): so these images are the node's
Debian base (``localcluster/node.py``) plus one layer with the pinned ``polyaxon`` and the
extras those commands import (``k8s-async``: the sidecar reads its pod through the API;
``sidecar``: pandas, anyio; ``fsspec``: its sync to the store), tagged once per service with
its ``POLYAXON_SERVICE``.

Built with pip (``--target``) and umoci, cached under a key of the pins and the base archive.
"""

from __future__ import annotations

import hashlib
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

POLYAXON_VERSION = "2.18.0"
PACKAGES = (f"polyaxon[k8s-async,sidecar,fsspec]=={POLYAXON_VERSION}",)
IMAGE = "localhost/csb-polyaxon-aux"  # one name, a tag per service: ctr imports NAME:TAG
SERVICES = ("init", "sidecar")
SITE = "/opt/polyaxon"  # where the layer puts the packages (on PYTHONPATH)
# The console script pip writes names the build machine's interpreter; the image's is Debian's.
WRAPPER = (
    '#!/bin/sh\nexec python3 -c "import sys; from polyaxon.cli import cli; sys.exit(cli())" "$@"\n'
)


class ImageBuildError(RuntimeError):
    pass


def _run(*argv: str, timeout: float = 900) -> None:
    done = subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout, check=False)
    if done.returncode != 0:
        raise ImageBuildError(f"{' '.join(argv[:3])} ...: {done.stderr.strip()[-2000:]}")


def archive_path(base_archive: Path, cache: Path) -> Path:
    key = hashlib.sha256(
        f"{PACKAGES} {SITE} {WRAPPER} {base_archive.name} {base_archive.stat().st_size}".encode()
    ).hexdigest()[:12]
    return cache / f"polyaxon-aux-{POLYAXON_VERSION}-{key}.tar"


def build(base_archive: Path, cache: Path) -> Path:
    """The OCI archive with a tag per service (``init-2.18.0``, ``sidecar-2.18.0``), to be
    imported with the base name :data:`IMAGE`; built when not cached.

    ``base_archive``: the Debian base's OCI archive (``localcluster.node.debian_base_image``),
    its one tag ``bookworm``. Needs network for pip (the build machine's, not the node's).
    """
    archive = archive_path(base_archive, cache)
    if archive.exists():
        return archive
    cache.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(dir=cache, prefix="aux-build-"))
    try:
        oci = work / "oci"
        oci.mkdir()
        _run("tar", "-C", str(oci), "-xf", str(base_archive))
        layer = work / "layer"
        site = layer / SITE.lstrip("/")
        # The build machine's interpreter is CPython 3.11 like Debian bookworm's, so the
        # binary wheels pip picks for it fit the image.
        _run(
            sys.executable,
            "-m",
            "pip",
            "install",
            "--quiet",
            "--no-compile",
            "--target",
            str(site),
            *PACKAGES,
        )
        shutil.rmtree(site / "bin", ignore_errors=True)
        bindir = layer / "usr" / "local" / "bin"
        bindir.mkdir(parents=True)
        wrapper = bindir / "polyaxon"
        wrapper.write_text(WRAPPER)
        wrapper.chmod(0o755)
        layer_tar = work / "layer.tar"
        _run("tar", "-C", str(layer), "-cf", str(layer_tar), ".")
        for service in SERVICES:
            tag = tag_for(service)
            _run("umoci", "tag", "--image", f"{oci}:bookworm", tag)
            _run("umoci", "raw", "add-layer", "--image", f"{oci}:{tag}", str(layer_tar))
            _run(
                "umoci",
                "config",
                "--image",
                f"{oci}:{tag}",
                f"--config.env=POLYAXON_SERVICE={service}",
                f"--config.env=PYTHONPATH={SITE}",
                "--config.env=PYTHONUNBUFFERED=1",
            )
        _run("umoci", "rm", "--image", f"{oci}:bookworm")
        partial = work / "image.tar"
        _run("tar", "-C", str(oci), "-cf", str(partial), ".")
        partial.rename(archive)  # complete or absent
        return archive
    finally:
        shutil.rmtree(work, ignore_errors=True)


def tag_for(service: str) -> str:
    return f"{service}-{POLYAXON_VERSION}"
