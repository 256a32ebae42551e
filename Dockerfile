# The one job image of every component: PyTorch, fio, and this package.
#
# For a cluster (a CUDA base with torch; push the tag to your registry):
#   docker build --build-arg CODE_REVISION=$(git rev-parse HEAD) \
#     -t registry.example.com/ml/checkpoint-storage-bench:0.2.0 .
# For the local node (docs/node.md), without a registry: `scripts/image.sh build` builds the same
# file with buildah on a Debian base made by mmdebstrap (python3, pip, fio), with torch from PyPI.
#
# The tag's version is the package version (pyproject.toml); the components' `image` input
# defaults to exactly this tag. CODE_REVISION is the provenance every run records (the image
# has no .git): without it the verdict cannot tell two builds of the trainer apart.
ARG BASE_IMAGE=pytorch/pytorch:2.8.0-cuda12.8-cudnn9-runtime
FROM ${BASE_IMAGE}

# fio for the sweep, where the base lacks it; `python` for the components' commands (Debian's
# base has only python3). Nothing else from apt: the rest is Python.
RUN command -v fio >/dev/null \
    || (apt-get update && apt-get install -y --no-install-recommends fio \
        && rm -rf /var/lib/apt/lists/*); \
    command -v python >/dev/null || ln -s "$(command -v python3)" /usr/local/bin/python

# PIP_BREAK_SYSTEM_PACKAGES: a Debian base's python3 is "externally managed"; the image is this
# one program's, so installing into it is what we want.
ENV PYTHONUNBUFFERED=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_BREAK_SYSTEM_PACKAGES=1 \
    PIP_ROOT_USER_ACTION=ignore

WORKDIR /app

# The dependencies in layers of their own, so that a change of code rebuilds only the layers
# after them. torch: the base's when it has one (pyproject accepts any torch >= 2.4, so pip keeps
# a CUDA base's build); TORCH names the one to install otherwise. The `upload` extra brings the
# fsspec backends of --upload-to s3:// and gs:// (s3fs, gcsfs). pip's cache is a build cache
# mount, outside every layer: a rebuild downloads nothing again (several GB with torch).
# PIP_CONSTRAINTS (optional, a file the builder mounts): the versions to install, e.g. those the
# test suite ran with (scripts/image.sh passes the venv's); without it pip resolves the newest.
ARG TORCH=torch
ARG PIP_CONSTRAINTS=""
# The formats extra (Parquet, MDS and the libraries' loaders of the data workloads), then
# mosaicml-streaming without its declared dependencies (pyproject.toml says why); its pin is
# scripts/pins.env's STREAMING_SPEC.
ARG STREAMING=mosaicml-streaming==0.13.0
RUN --mount=type=cache,target=/root/.cache/pip \
    python -c "import torch" 2>/dev/null \
    || python -m pip install ${PIP_CONSTRAINTS:+--constraint "$PIP_CONSTRAINTS"} "$TORCH"
COPY pyproject.toml /app/
RUN --mount=type=cache,target=/root/.cache/pip \
    python -c "import tomllib; p = tomllib.load(open('pyproject.toml', 'rb'))['project']; \
print('\n'.join(p['dependencies'] + p['optional-dependencies']['upload'] + p['optional-dependencies']['formats']))" >/tmp/requirements.txt \
    && python -m pip install ${PIP_CONSTRAINTS:+--constraint "$PIP_CONSTRAINTS"} \
        -r /tmp/requirements.txt \
    && python -m pip install --no-deps ${PIP_CONSTRAINTS:+--constraint "$PIP_CONSTRAINTS"} "$STREAMING" \
    && rm /tmp/requirements.txt

# The components run `python -m trainer ...` from here and read relative paths such as
# connections/pricing.yaml, so the source tree stays in the image next to the install.
COPY . /app
RUN python -m pip install --no-deps . \
    && python -c "import torch, s3fs, gcsfs, trainer, hooks, fio_sweep, checkpoint_compare, data_workloads, checkpoint_storage_bench; print('torch', torch.__version__, 'cuda', torch.version.cuda)" \
    && python -c "from data_workloads.formats import check_libraries as c; c('parquet', 'arrow'); c('mds', 'streaming'); c('webdataset', 'webdataset')" \
    && fio --version

# Not root: the components set fsGroup 1000, so the claim is writable by this user (the
# kubelet gives the volume that group), and a PodSecurity `restricted` namespace admits it.
RUN (getent passwd 1000 >/dev/null || useradd --uid 1000 --user-group --create-home bench) \
    && chown -R 1000:1000 /app
USER 1000:1000

# Last, so a new revision rebuilds only this layer's metadata.
ARG CODE_REVISION=""
ENV CODE_REVISION=${CODE_REVISION}
RUN test -n "$CODE_REVISION" \
    || echo "warning: no --build-arg CODE_REVISION: runs of this image record no code revision" >&2

LABEL org.opencontainers.image.title="checkpoint-storage-bench" \
      org.opencontainers.image.version="0.2.0" \
      org.opencontainers.image.revision="${CODE_REVISION}" \
      org.opencontainers.image.description="Checkpoint training, storage-profile hook and fio sweep for Polyaxon"
