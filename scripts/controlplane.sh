#!/usr/bin/env bash
# A real Kubernetes control plane on 127.0.0.1, built from the Go modules in localcluster/go
# (docs/controlplane.md); start and stop are `python -m localcluster start|stop`.
#
#   scripts/controlplane.sh build [NAME...]  build the missing or stale binaries (once; cached)
#   scripts/controlplane.sh build --node     the same, with the node's too (kubelet,
#                                            kube-scheduler, kube-proxy: docs/node.md) and
#                                            the AWS EBS CSI driver (localcluster/ebs.py)
#                                            and Kubeflow's training operator
#                                            (localcluster/training_operator.py)
#                                            and csi-sanity (tests/localcluster/
#                                            test_csi_sanity.py)
#   scripts/controlplane.sh check [--node]   exit 1, naming what is missing, unless all are built
#   scripts/controlplane.sh check NAME...    the same, for the binaries named
#   scripts/controlplane.sh bin-dir          print the binary cache directory
#   scripts/controlplane.sh start            start etcd, kube-apiserver, kube-controller-manager,
#                                            the CSI driver, csi-provisioner and csi-resizer
#   scripts/controlplane.sh stop             stop everything `start` started (a stale pid file too)
#   scripts/controlplane.sh env              print `export KUBECONFIG=...` for a started plane
#
# Environment:
#   CONTROLPLANE_BIN_DIR    binary cache (default: ${XDG_CACHE_HOME:-$HOME/.cache}/
#                           checkpoint-storage-bench/controlplane/<version set>/bin)
#   CONTROLPLANE_STATE_DIR  what `start` writes: certificates, etcd data, logs, pids, kubeconfigs
#                           (default: ${TMPDIR:-/tmp}/csb-controlplane-$UID)
#   GO                      the go command (default: `go` on PATH, else /usr/local/go/bin/go)
#   PYTHON                  for start/stop (default: .venv/bin/python, else python3)
#
# Only the Go module proxy is used to build (GOFLAGS=-mod=mod is not needed: every wrapper
# module has its go.sum committed).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
MODS=$ROOT/localcluster/go

# shellcheck source=../localcluster/go/versions.env
. "$MODS/versions.env"
SET="k8s-$K8S_VERSION-etcd-$ETCD_VERSION-prov-$PROVISIONER_VERSION-rsz-$RESIZER_VERSION-hp-$HOSTPATH_VERSION"
BIN_DIR=${CONTROLPLANE_BIN_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/checkpoint-storage-bench/controlplane/$SET/bin}
STATE_DIR=${CONTROLPLANE_STATE_DIR:-${TMPDIR:-/tmp}/csb-controlplane-$(id -u)}

# The Kubernetes binaries come from one wrapper module and are built by one `go build`, so
# the packages they share (most of them) are compiled once.
K8S_NAMES=(kube-apiserver kube-controller-manager kube-scheduler kubelet kube-proxy)
# The control plane's; the node (localcluster/node.py) needs NODE_NAMES as well.
NAMES=(etcd csi-hostpath-lite csi-resizer csi-provisioner kube-apiserver kube-controller-manager)
NODE_NAMES=(kube-scheduler kubelet kube-proxy)
# Built by `build --node` too, started only by the tests that use them (localcluster/ebs.py).
EXTRA_NAMES=(aws-ebs-csi-driver training-operator csi-sanity)

# name -> "wrapper-dir|main package|version|-ldflags -X ..."
spec() {
  case $1 in
    etcd) echo "etcd|go.etcd.io/etcd/server/v3|$ETCD_VERSION|" ;;
    csi-hostpath-lite) echo "hostpath|.|$HOSTPATH_VERSION|-X main.version=$HOSTPATH_VERSION" ;;
    csi-resizer) echo "resizer|github.com/kubernetes-csi/external-resizer/v2/cmd/csi-resizer|$RESIZER_VERSION|-X main.version=$RESIZER_VERSION" ;;
    csi-provisioner) echo "provisioner|github.com/kubernetes-csi/external-provisioner/v6/cmd/csi-provisioner|$PROVISIONER_VERSION|-X main.version=$PROVISIONER_VERSION" ;;
    aws-ebs-csi-driver)
      local p=github.com/kubernetes-sigs/aws-ebs-csi-driver/pkg
      echo "aws-ebs-csi-driver|github.com/kubernetes-sigs/aws-ebs-csi-driver/cmd|$EBS_CSI_DRIVER_VERSION|-X $p/driver.driverVersion=$EBS_CSI_DRIVER_VERSION -X $p/cloud.driverVersion=$EBS_CSI_DRIVER_VERSION"
      ;;
    csi-sanity)
      echo "csi-sanity|github.com/kubernetes-csi/csi-test/v5/cmd/csi-sanity|$CSI_SANITY_VERSION|"
      ;;
    training-operator)
      echo "training-operator|github.com/kubeflow/training-operator/cmd/training-operator.v1|$TRAINING_OPERATOR_VERSION|"
      ;;
    kube-apiserver | kube-controller-manager | kube-scheduler | kubelet | kube-proxy)
      # Without the stamp /version says v0.0.0 (and clients' version checks see that).
      local x="k8s.io/component-base/version" v=${K8S_VERSION#v}
      local major=${v%%.*} minor=${v#*.}
      minor=${minor%%.*}
      echo "kubernetes|k8s.io/kubernetes/cmd/$1|$K8S_VERSION|-X $x.gitVersion=$K8S_VERSION -X $x.gitMajor=$major -X $x.gitMinor=$minor -X $x.gitTreeState=clean"
      ;;
    *) echo "unknown binary: $1 (one of: ${NAMES[*]} ${NODE_NAMES[*]} ${EXTRA_NAMES[*]})" >&2; return 2 ;;
  esac
}

# What a built binary must match: package, version, flags and the wrapper module's files.
stamp() {
  local dir pkg ver flags sum
  IFS='|' read -r dir pkg ver flags <<<"$(spec "$1")"
  local files=("$MODS/$dir"/go.mod "$MODS/$dir"/go.sum)
  [ "$dir" = hostpath ] && files+=("$MODS/$dir"/*.go)
  sum=$(cat "${files[@]}" | sha256sum | cut -c1-16)
  echo "$pkg@$ver $sum $flags"
}

up_to_date() {
  [ -x "$BIN_DIR/$1" ] && [ -f "$BIN_DIR/$1.stamp" ] && [ "$(cat "$BIN_DIR/$1.stamp")" = "$(stamp "$1")" ]
}

find_go() {
  if [ -n "${GO:-}" ]; then echo "$GO"; elif command -v go >/dev/null; then command -v go
  elif [ -x /usr/local/go/bin/go ]; then echo /usr/local/go/bin/go
  else echo "controlplane: no Go toolchain (set GO=/path/to/go)" >&2; return 1; fi
}

# Build NAMES (all from the same wrapper module) with one `go build`.
build_group() {
  local dir pkg ver flags go t0 n pkgs=() tmp
  for n in "$@"; do
    IFS='|' read -r dir pkg ver flags <<<"$(spec "$n")"
    pkgs+=("$pkg")
  done
  go=$(find_go)
  echo "controlplane: building $* (${pkgs[*]}@$ver) ..." >&2
  t0=$(date +%s)
  if (($# == 1)); then
    (cd "$MODS/$dir" && GOTOOLCHAIN=local GOFLAGS=-mod=readonly "$go" build -trimpath \
      -ldflags "-s -w $flags" -o "$BIN_DIR/.$1.tmp" "${pkgs[0]}")
    mv -f "$BIN_DIR/.$1.tmp" "$BIN_DIR/$1"
  else
    # Several main packages: `-o DIR/` writes each under its own name.
    tmp=$BIN_DIR/.group.tmp
    rm -rf "$tmp" && mkdir -p "$tmp"
    (cd "$MODS/$dir" && GOTOOLCHAIN=local GOFLAGS=-mod=readonly "$go" build -trimpath \
      -ldflags "-s -w $flags" -o "$tmp/" "${pkgs[@]}")
    for n in "$@"; do mv -f "$tmp/$n" "$BIN_DIR/$n"; done
    rmdir "$tmp"
  fi
  for n in "$@"; do stamp "$n" >"$BIN_DIR/$n.stamp"; done
  echo "controlplane: built $* in $(($(date +%s) - t0)) s -> $BIN_DIR" >&2
}

cmd_build() {
  local names=("$@")
  if [ "${1:-}" = --node ]; then
    names=("${NAMES[@]}" "${NODE_NAMES[@]}" "${EXTRA_NAMES[@]}")
  elif ((${#names[@]} == 0)); then
    names=("${NAMES[@]}")
  fi
  mkdir -p "$BIN_DIR"
  # One build at a time per cache (a second caller waits, then finds the binaries built).
  exec 9>"$BIN_DIR/.lock"
  flock 9
  local n k t0 k8s=()
  t0=$(date +%s)
  for n in "${names[@]}"; do
    spec "$n" >/dev/null
    if up_to_date "$n"; then
      echo "controlplane: $n is up to date" >&2
      continue
    fi
    for k in "${K8S_NAMES[@]}"; do [ "$n" = "$k" ] && k8s+=("$n") && continue 2; done
    build_group "$n"
  done
  ((${#k8s[@]} == 0)) || build_group "${k8s[@]}"
  echo "controlplane: binaries in $BIN_DIR (build step took $(($(date +%s) - t0)) s)" >&2
}

cmd_check() {
  local n missing=() names=("${NAMES[@]}")
  if [ "${1:-}" = --node ]; then
    names+=("${NODE_NAMES[@]}")
  elif (($#)); then
    names=("$@")
    for n in "${names[@]}"; do spec "$n" >/dev/null; done
  fi
  for n in "${names[@]}"; do up_to_date "$n" || missing+=("$n"); done
  if ((${#missing[@]})); then
    echo "not built in $BIN_DIR: ${missing[*]} (run scripts/controlplane.sh build${*:+ $*})" >&2
    return 1
  fi
}

python_cmd() {
  if [ -n "${PYTHON:-}" ]; then echo "$PYTHON"
  elif [ -x "$ROOT/.venv/bin/python" ]; then echo "$ROOT/.venv/bin/python"
  else echo python3; fi
}

case ${1:-} in
  build) shift; cmd_build "$@" ;;
  check) shift; cmd_check "$@" ;;
  bin-dir) echo "$BIN_DIR" ;;
  start)
    cmd_check
    exec "$(python_cmd)" -m localcluster start --bin-dir "$BIN_DIR" --state-dir "$STATE_DIR"
    ;;
  stop) exec "$(python_cmd)" -m localcluster stop --state-dir "$STATE_DIR" ;;
  env)
    if [ -f "$STATE_DIR/pids.json" ] && [ -f "$STATE_DIR/admin.kubeconfig" ]; then
      echo "export KUBECONFIG=$STATE_DIR/admin.kubeconfig"
    else
      echo "controlplane: not started (no $STATE_DIR/pids.json)" >&2
      exit 1
    fi
    echo "export CONTROLPLANE_BIN_DIR=$BIN_DIR"
    ;;
  *)
    sed -n '2,/^set -euo/p' "$0" | grep '^#' | sed 's/^# \{0,1\}//'
    exit 2
    ;;
esac
