"""The local cluster: a real Kubernetes control plane on loopback and, as root, one node.

- :mod:`localcluster.controlplane`: etcd, kube-apiserver, kube-controller-manager, the CSI
  driver's controller side and its sidecars (docs/controlplane.md);
- :mod:`localcluster.node`: containerd, the kubelet, kube-scheduler, kube-proxy and the CSI
  driver's node service beside that plane, the sweep that removes all of it, and the node's
  images: busybox for the pause image, the cached Debian base (docs/node.md);
- :mod:`localcluster.client`: the admin's client of a started plane;
- :mod:`localcluster.state`: the state directory, the binary cache, what is running;
- :mod:`localcluster.ebs`: the real AWS EBS CSI driver in controller mode against moto's
  EC2 (and IAM), beside a control plane (docs/controlplane.md);
- ``localcluster/go/``: the Go sources of the binaries ``scripts/controlplane.sh build``
  compiles (pinned wrapper modules and our CSI driver, ``csi-hostpath-lite``).

``python -m localcluster build | start | stop | status`` (:mod:`localcluster.cli`, its
settings in :mod:`localcluster.config`, its exit codes in :mod:`localcluster.errors`). The
test tiers (tests/kube, tests/node, tests/agent_node) start it from their fixtures, the
sandbox's ``--on-node`` mode runs Polyaxon's agent on the node (docs/agent-on-node.md).
"""
