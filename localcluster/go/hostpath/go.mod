// csi-hostpath-lite (main.go): the controller side of a host-path CSI driver.
module checkpoint-storage-bench/controlplane/hostpath

go 1.26

require (
	github.com/container-storage-interface/spec v1.12.0
	golang.org/x/sys v0.39.0
	google.golang.org/grpc v1.79.3
	k8s.io/kubelet v0.34.4
)

require (
	golang.org/x/net v0.48.0 // indirect
	golang.org/x/text v0.32.0 // indirect
	google.golang.org/genproto/googleapis/rpc v0.0.0-20251202230838-ff82c1b0f217 // indirect
	google.golang.org/protobuf v1.36.10 // indirect
)
