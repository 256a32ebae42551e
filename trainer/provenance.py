"""What ran, where: the build, the image, the node and its hardware, and the run's identity.

Recorded on every run (Polyaxon meta and input ``image``, the summary's ``provenance``) so
the verdict can refuse to compare runs of different builds, images or GPU models. On a
cluster the values come from the environment the component sets: ``CODE_REVISION`` (baked
into the image at build time: ``docker build --build-arg CODE_REVISION=$(git rev-parse
HEAD)``), ``IMAGE_REF`` (the component's ``image`` input), ``NODE_NAME`` (the downward API's
``spec.nodeName``), and optionally ``IMAGE_DIGEST``.
"""

from __future__ import annotations

import math
import os
import re
import socket
import subprocess
from pathlib import Path
from typing import Any

import torch

from checkpoint_storage_bench.contract import PROVENANCE_KEYS

_DIGEST = re.compile(r"@(sha256:[0-9a-f]{64})$")


def code_revision() -> str | None:
    """``CODE_REVISION`` from the image build, else the git commit of this checkout."""
    if rev := os.environ.get("CODE_REVISION"):
        return rev
    try:
        out = subprocess.run(
            ["git", "rev-parse", "HEAD"],
            cwd=Path(__file__).resolve().parent,
            capture_output=True,
            text=True,
            timeout=5,
            check=True,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None


def image_ref() -> str | None:
    """The image reference the run was started with (``IMAGE_REF``, set by the component)."""
    return os.environ.get("IMAGE_REF") or None


def image_digest(ref: str | None = None) -> str | None:
    """``IMAGE_DIGEST``, else the digest the image reference pins (``repo@sha256:…``).

    >>> image_digest("registry.example.com/ml/bench@sha256:" + "ab" * 32)[:13]
    'sha256:ababab'
    >>> image_digest("registry.example.com/ml/bench:0.2.0") is None
    True
    """
    if digest := os.environ.get("IMAGE_DIGEST"):
        return digest
    match = _DIGEST.search(ref if ref is not None else image_ref() or "")
    return match.group(1) if match else None


def node_name() -> str | None:
    """The Kubernetes node (``NODE_NAME`` from the downward API), else this host's name."""
    return os.environ.get("NODE_NAME") or socket.gethostname() or None


def cpu_count() -> int:
    """CPUs this process may use: its affinity, capped by a cgroup v2 CPU limit (a pod's
    ``limits.cpu``), rounded up."""
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    try:
        quota, period = Path("/sys/fs/cgroup/cpu.max").read_text().split()
        if quota != "max":
            cpus = min(cpus or 1, math.ceil(int(quota) / int(period)))
    except (OSError, ValueError):
        pass
    return cpus or 1


def hardware(device: torch.device) -> dict[str, Any]:
    """GPU model and count, CUDA and torch versions, CPU count."""
    gpu = device.type == "cuda"
    return {
        "gpu_model": torch.cuda.get_device_name(device) if gpu else None,
        "gpu_count": torch.cuda.device_count() if torch.cuda.is_available() else 0,
        "cuda_version": torch.version.cuda,
        "torch_version": torch.__version__,
        "cpu_count": cpu_count(),
    }


def collect(device: torch.device) -> dict[str, Any]:
    """Every provenance key (:data:`PROVENANCE_KEYS`) for a run on ``device``."""
    ref = image_ref()
    values = {
        "image": ref,
        "code_revision": code_revision(),
        "image_digest": image_digest(ref),
        "node_name": node_name(),
        **hardware(device),
    }
    return {key: values[key] for key in PROVENANCE_KEYS}


def run_uuid() -> str | None:
    """The uuid of the Polyaxon run this process belongs to (None outside Polyaxon).

    A retried or resumed Polyaxon run keeps its uuid: it is how a run knows its own
    checkpoints (``--resume auto``) and its own leftovers.
    """
    parts = os.environ.get("POLYAXON_RUN_INSTANCE", "").split(".")
    return parts[-1] if len(parts) == 4 and re.fullmatch(r"[0-9a-f]{32}", parts[-1]) else None


def host_name() -> str:
    """This pod's (or host's) name, safe inside a file name."""
    host = os.environ.get("HOSTNAME") or socket.gethostname() or "host"
    return re.sub(r"[^A-Za-z0-9-]", "-", host)[:63]
