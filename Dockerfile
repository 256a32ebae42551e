# The one job image of every component: PyTorch with CUDA, fio, and this package.
#   docker build --build-arg CODE_REVISION=$(git rev-parse HEAD) \
#     -t registry.example.com/ml/checkpoint-storage-bench:0.2.0 .
# The tag's version is the package version (pyproject.toml); the components' `image` input
# defaults to exactly this tag. CODE_REVISION is the provenance every run records (the image
# has no .git): without it the verdict cannot tell two builds of the trainer apart.
ARG BASE_IMAGE=pytorch/pytorch:2.8.0-cuda12.8-cudnn9-runtime
FROM ${BASE_IMAGE}

# fio for the sweep. Nothing else from apt: the rest is Python.
RUN apt-get update \
    && apt-get install -y --no-install-recommends fio \
    && rm -rf /var/lib/apt/lists/*

ENV PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

# The components run `python -m trainer ...` from here and read relative paths such as
# connections/pricing.yaml, so the source tree stays in the image next to the install.
WORKDIR /app
COPY . /app

# torch comes from the base image (pyproject accepts any torch >= 2.4, so pip keeps the
# CUDA build); everything else comes from pyproject.toml. The `upload` extra brings the
# fsspec backends of --upload-to s3:// and gs:// (s3fs, gcsfs).
RUN python -m pip install ".[upload]" \
    && python -c "import torch, s3fs, gcsfs, trainer, hooks, fio_sweep, checkpoint_compare, checkpoint_storage_bench; print('torch', torch.__version__, 'cuda', torch.version.cuda)" \
    && fio --version

# Last, so a new revision rebuilds only this layer's metadata.
ARG CODE_REVISION=""
ENV CODE_REVISION=${CODE_REVISION}
RUN test -n "$CODE_REVISION" \
    || echo "warning: no --build-arg CODE_REVISION: runs of this image record no code revision" >&2

LABEL org.opencontainers.image.title="checkpoint-storage-bench" \
      org.opencontainers.image.version="0.2.0" \
      org.opencontainers.image.revision="${CODE_REVISION}" \
      org.opencontainers.image.description="Checkpoint training, storage-profile hook and fio sweep for Polyaxon"
