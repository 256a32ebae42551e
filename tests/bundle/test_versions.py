"""Component versions, ``latest.yaml`` and the one job image all components run."""

from __future__ import annotations

import re

import pytest

from tests.bundle.bundle import (
    COMPONENTS,
    ROOT,
    component_names,
    component_versions,
    load_yaml_documents,
    package_version,
)

DOCKERFILE = ROOT / "Dockerfile"


# Released in 1.0 and kept as released history; components added later start at their
# release's version.
RELEASED_IN_1_0 = {"checkpoint-training", "storage-profile", "fio-sweep", "checkpoint-compare"}


@pytest.mark.parametrize("name", component_names())
def test_latest_is_the_newest_version(name: str) -> None:
    versions = component_versions(name)
    assert versions, f"components/{name} has no v<major>.<minor>.yaml"
    assert versions[0].name == ("v1.0.yaml" if name in RELEASED_IN_1_0 else "v1.1.yaml")
    latest = COMPONENTS / name / "latest.yaml"
    # A full copy, not a link: the hub layout serves the file itself.
    assert latest.is_file() and not latest.is_symlink()
    assert latest.read_bytes() == versions[-1].read_bytes(), (
        f"components/{name}/latest.yaml differs from {versions[-1].name}"
    )


@pytest.mark.parametrize("name", component_names())
def test_component_folder_holds_only_versions_and_latest(name: str) -> None:
    assert re.fullmatch(r"[-a-zA-Z0-9_]+", name)
    files = {p.name for p in (COMPONENTS / name).iterdir()}
    assert files == {"latest.yaml", *(p.name for p in component_versions(name))}
    for path in component_versions(name):
        (doc,) = load_yaml_documents(path)
        assert doc["kind"] == "component" and doc["name"] == name, path


def default_images() -> dict[str, str]:
    images = {}
    for name in component_names():
        (doc,) = load_yaml_documents(COMPONENTS / name / "latest.yaml")
        (image,) = [io for io in doc["inputs"] if io["name"] == "image"]
        if doc["run"]["kind"] == "dag":  # passed down to every op
            assert all(
                op["params"]["image"] == {"ref": "dag", "value": "inputs.image"}
                for op in doc["run"]["operations"]
            ), name
        else:
            replicas = [doc["run"][r] for r in ("master", "worker") if r in doc["run"]]
            for replica in replicas or [doc["run"]]:
                assert replica["container"]["image"] == "{{ image }}", name
        images[name] = image["value"]
    return images


def test_all_components_run_the_same_image_tagged_with_the_package_version() -> None:
    images = default_images()
    assert len(set(images.values())) == 1, images
    (image,) = set(images.values())
    assert image.rsplit(":", 1)[1] == package_version()
    (pipeline_image,) = [
        io["value"]
        for io in load_yaml_documents(ROOT / "polyaxonfiles" / "checkpoint-storage-pipeline.yaml")[
            0
        ]["inputs"]
        if io["name"] == "image"
    ]
    assert pipeline_image == image


def test_the_dockerfile_builds_the_job_image() -> None:
    text = DOCKERFILE.read_text()
    base = re.search(r"^ARG BASE_IMAGE=(\S+)$", text, re.M)
    assert base and re.fullmatch(r"pytorch/pytorch:[\d.]+-cuda[\d.]+-cudnn\d+-runtime", base[1])
    assert re.search(r"^FROM \$\{BASE_IMAGE\}$", text, re.M)
    assert re.search(r"apt-get install -y --no-install-recommends fio\b", text)
    # The package's dependencies with its fsspec upload backends (s3fs, gcsfs), then the package.
    assert "['optional-dependencies']['upload']" in text
    assert re.search(r"python -m pip install --no-deps \.(\s|$)", text)
    # Not root: the components' fsGroup makes the claim writable for this user.
    assert re.search(r"^USER 1000:1000$", text, re.M)
    # Provenance: the revision is a build argument that every run reads from the env.
    assert re.search(r"^ARG CODE_REVISION=", text, re.M)
    assert re.search(r"^ENV CODE_REVISION=\$\{CODE_REVISION\}$", text, re.M)
    assert f'org.opencontainers.image.version="{package_version()}"' in text
    assert re.search(r"^WORKDIR /app$", text, re.M)


def test_the_build_context_keeps_what_the_jobs_need() -> None:
    ignored = {
        line.strip().rstrip("/")
        for line in (ROOT / ".dockerignore").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    }
    for needed in (
        "checkpoint_storage_bench",
        "trainer",
        "hooks",
        "fio_sweep",
        "checkpoint_compare",
        "connections",
        "pyproject.toml",
        "README.md",
    ):
        assert needed not in ignored
        assert (ROOT / needed).exists(), needed
