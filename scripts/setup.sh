#!/usr/bin/env bash
# Idempotent set-up: system tools (fio, chromium, losetup, mkfs.ext4, the node tier's) when missing
# and we may install them,
# then a project venv in .venv with torch first.
set -euo pipefail
cd "$(dirname "$0")/.."

missing=()
command -v fio >/dev/null || missing+=(fio)
command -v chromium >/dev/null || missing+=(chromium)
# The node tier (tests/node, docs/node.md): a container runtime, CNI plugins, OCI image tools.
command -v containerd >/dev/null || missing+=(containerd)
command -v runc >/dev/null || missing+=(runc)
[ -x /usr/lib/cni/bridge ] || missing+=(containernetworking-plugins)
command -v umoci >/dev/null || missing+=(umoci)
[ -x /bin/busybox ] || missing+=(busybox-static)
command -v mmdebstrap >/dev/null || missing+=(mmdebstrap)
command -v buildah >/dev/null || missing+=(buildah)
command -v nft >/dev/null || missing+=(nftables)
# The sandbox's emulated claim is a loop-device volume with ext4 (losetup, mkfs.ext4).
command -v losetup >/dev/null || missing+=(mount)
command -v mkfs.ext4 >/dev/null || missing+=(e2fsprogs)
if ((${#missing[@]})); then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    echo "setup: installing ${missing[*]} with apt-get" >&2
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq "${missing[@]}" >/dev/null
  else
    echo "setup: warning: ${missing[*]} not installed (install with your package manager)" >&2
  fi
fi

stamp=.venv/.installed
if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ]; then
  python3 -m venv .venv
  .venv/bin/python -m pip install -q --upgrade pip
  # torch first, pinned (scripts/pins.env): a later unpinned resolve would take the newest.
  # shellcheck source=pins.env
  . scripts/pins.env
  .venv/bin/python -m pip install -q "$TORCH_SPEC"
  .venv/bin/python -m pip install -q -e ".[sandbox,report,test,agent,formats]"
  .venv/bin/python -m pip install -q --no-deps "$STREAMING_SPEC"
  touch "$stamp"
fi
