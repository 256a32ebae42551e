"""The formats extra is what the suite runs with and what the job image installs: the same
pins in pyproject, the set-up, the image and the venv."""

from __future__ import annotations

import re
import tomllib
from importlib import metadata
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def _pins_env() -> dict[str, str]:
    text = (REPO / "scripts" / "pins.env").read_text()
    return dict(re.findall(r"^([A-Z_]+)=(\S+)$", text, re.MULTILINE))


def test_the_image_and_the_setup_install_the_formats_extra_and_the_pinned_streaming() -> None:
    streaming = _pins_env()["STREAMING_SPEC"]
    dockerfile = (REPO / "Dockerfile").read_text()
    assert "['optional-dependencies']['formats']" in dockerfile
    assert f"ARG STREAMING={streaming}\n" in dockerfile
    assert re.search(r'pip install --no-deps [^\n]*"\$STREAMING"', dockerfile)
    setup = (REPO / "scripts" / "setup.sh").read_text()
    assert re.search(r'pip install -q -e "\.\[[a-z,]*\bformats\b[a-z,]*\]"', setup)
    assert 'pip install -q --no-deps "$STREAMING_SPEC"' in setup


def test_the_venv_runs_the_pinned_libraries() -> None:
    extra = tomllib.loads((REPO / "pyproject.toml").read_text())["project"][
        "optional-dependencies"
    ]["formats"]
    pinned = dict(spec.split("==") for spec in extra if "==" in spec)
    pinned.update([_pins_env()["STREAMING_SPEC"].split("==")])
    assert {"pyarrow", "webdataset", "mosaicml-streaming"} <= set(pinned)
    for name, version in pinned.items():
        assert metadata.version(name) == version, name
