# The one job image of every component: PyTorch with CUDA, fio, and this package.
#   docker build -t registry.example.com/ml/checkpoint-storage-bench:0.2.0 .
# The tag's version is the package version (pyproject.toml); the components' `image` input
# defaults to exactly this tag.
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
# CUDA build); everything else comes from pyproject.toml.
RUN python -m pip install . \
    && python -c "import torch, trainer, hooks, fio_sweep, checkpoint_compare, checkpoint_storage_bench; print('torch', torch.__version__, 'cuda', torch.version.cuda)" \
    && fio --version

LABEL org.opencontainers.image.title="checkpoint-storage-bench" \
      org.opencontainers.image.version="0.2.0" \
      org.opencontainers.image.description="Checkpoint training, storage-profile hook and fio sweep for Polyaxon"
