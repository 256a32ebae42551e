#!/usr/bin/env bash
# The project's job image for the local node (docs/node.md), built from ./Dockerfile without a
# registry: buildah on a Debian base made by mmdebstrap, saved as an OCI archive that the node's
# containerd imports under the exact name the components use.
#
#   scripts/image.sh build   build what is missing or stale (cached); prints the archive's path
#   scripts/image.sh name    the image name the components use
#
# Cached in ~/.cache/checkpoint-storage-bench/images, keyed by the build context's files, the
# Dockerfile, the base and the torch pin: building twice builds nothing. buildah's own layer
# cache (/var/lib/containers) keeps the dependency layer, so a change of code rebuilds only the
# layers after it. Needs root, buildah, mmdebstrap and umoci (scripts/setup.sh installs them).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD

# shellcheck source=pins.env
. scripts/pins.env
CACHE=${XDG_CACHE_HOME:-$HOME/.cache}/checkpoint-storage-bench/images
VERSION=$(sed -n 's/^version = "\(.*\)"$/\1/p' pyproject.toml | head -1)
REPO=registry.example.com/ml/checkpoint-storage-bench
NAME=$REPO:$VERSION
PY=${PYTHON:-$ROOT/.venv/bin/python}

# What the image is made of: the files COPY sees (the tree minus .dockerignore's entries, as
# committed plus any uncommitted change), the Dockerfile, the base, the torch pin and the
# venv's versions (the constraints of the build).
context_key() {
  local ignored=() line
  while IFS= read -r line; do
    line=${line%%#*}
    line=${line//[[:space:]]/}
    [ -n "$line" ] && ignored+=(":(exclude,glob)${line#\*\*/}" ":(exclude,glob)**/${line#\*\*/}")
  done <.dockerignore
  {
    echo "$TORCH_SPEC $(basename "$1")"
    sha256sum Dockerfile .dockerignore
    "$PY" -m pip freeze --exclude-editable --disable-pip-version-check
    git ls-files -s -- . "${ignored[@]}"
    git diff HEAD --binary -- . "${ignored[@]}"
    git ls-files --others --exclude-standard -- . "${ignored[@]}" | xargs -r sha256sum
  } | sha256sum | cut -c1-16
}

revision() {
  local rev
  rev=$(git rev-parse HEAD)
  git diff --quiet HEAD -- . && echo "$rev" || echo "$rev-dirty"
}

base_archive() {
  "$PY" -c 'from localcluster.node import debian_base_image; print(debian_base_image())'
}

archive_for() { echo "$CACHE/project-$VERSION-$(context_key "$1").tar"; }

cmd_build() {
  local t0 base archive tmp base_name
  t0=$(date +%s)
  base=$(base_archive)
  archive=$(archive_for "$base")
  if [ -f "$archive" ]; then
    echo "image: $NAME is up to date ($archive)" >&2
    echo "$archive"
    return
  fi
  mkdir -p "$CACHE"
  exec 9>"$CACHE/.project.lock"
  flock 9
  [ -f "$archive" ] && { echo "$archive"; return; }
  # The base under the name the build names; buildah reads the OCI archive directly.
  base_name=$("$PY" -c 'from localcluster.node import BASE_IMAGE; print(BASE_IMAGE)')
  if ! buildah inspect --type image "$base_name" >/dev/null 2>&1; then
    buildah tag "$(buildah pull --quiet "oci-archive:$base")" "$base_name"
  fi
  echo "image: building $NAME from Dockerfile on $base_name (torch $TORCH_SPEC) ..." >&2
  # --network host: the RUN steps reach Debian's archive and PyPI like the host does (the build
  # only downloads; nothing listens). --layers: the dependency layer is reused when only code
  # changed.
  # This host's pip settings and CA bundle, mounted for the build only (never in a layer): where
  # PyPI is reached through a TLS-inspecting proxy, its CA is in the host's bundle.
  local mounts=()
  [ -f /etc/pip.conf ] && mounts+=(--volume /etc/pip.conf:/etc/pip.conf:ro)
  [ -f /etc/ssl/certs/ca-certificates.crt ] &&
    mounts+=(--volume /etc/ssl/certs/ca-certificates.crt:/etc/ssl/certs/ca-certificates.crt:ro)
  # The versions the venv (and so the test suite) runs with, so that pip in the image installs
  # those instead of resolving anew (s3fs/boto3's pins can keep pip backtracking for many
  # minutes).
  local constraints=$CACHE/.constraints.txt
  "$PY" -m pip freeze --exclude-editable --disable-pip-version-check >"$constraints"
  mounts+=(--volume "$constraints:/run/csb-constraints.txt:ro")
  buildah bud --quiet --layers --network host "${mounts[@]}" \
    --build-arg PIP_CONSTRAINTS=/run/csb-constraints.txt \
    --build-arg "BASE_IMAGE=$base_name" \
    --build-arg "TORCH=$TORCH_SPEC" \
    --build-arg "CODE_REVISION=$(revision)" \
    --tag "$NAME" . >&2
  tmp=$archive.partial
  rm -f "$tmp"
  # The archive names only the tag; the node imports it with the repository as base name.
  buildah push --quiet "$NAME" "oci-archive:$tmp:$VERSION" >&2
  mv -f "$tmp" "$archive" # complete or absent: a killed build leaves no half archive
  # Older archives of this image are stale: keep the disk to one copy.
  find "$CACHE" -maxdepth 1 -name "project-*.tar" ! -path "$archive" -delete
  echo "image: built $NAME in $(($(date +%s) - t0)) s, $(du -h "$archive" | cut -f1) -> $archive" >&2
  echo "$archive"
}

case ${1:-} in
  build) cmd_build ;;
  name) echo "$NAME" ;;
  *)
    sed -n '2,/^set -euo/p' "$0" | grep '^#' | sed 's/^# \{0,1\}//'
    exit 2
    ;;
esac
