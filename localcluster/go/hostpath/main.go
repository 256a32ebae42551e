// csi-hostpath-lite: a whole CSI driver for one node on one machine, whose volumes are
// file-backed loop devices with ext4 and whose speed is their VolumeAttributesClass's. It
// stands in for kubernetes-csi/csi-driver-host-path's hostpathplugin (and for the
// node-driver-registrar), which the Go module proxy reachable here does not serve, and takes
// the same flags for what they share (-endpoint, -nodeid, -statedir, -drivername,
// -enable-controller-modify-volume, -accepted-mutable-parameter-names, -enable-topology).
//
// Controller service (controller.go), always on, needs no root:
//   - CreateVolume: records the volume in <statedir>/state.json; idempotent by name; mutable
//     parameters (from a VolumeAttributesClass) are checked against the accepted names.
//   - DeleteVolume: forgets it and removes its backing file (unknown ids succeed).
//   - ControllerModifyVolume: NotFound for an unknown volume; InvalidArgument for a
//     parameter that is not accepted ("invalid parameters: [...]"), for no parameters or for
//     an iops/throughput that is not a positive number; otherwise records the parameters and,
//     with the node service on, applies them to every pod that has the volume published
//     before it answers.
//   - ControllerExpandVolume: records the new size (never smaller) and asks for node
//     expansion. A mounted ext4 grows only for a process with CAP_SYS_RESOURCE; without it
//     the driver advertises OFFLINE expansion and refuses a staged volume
//     (FailedPrecondition), and NodeStageVolume grows the unmounted ext4 to the device.
//   - ValidateVolumeCapabilities, ControllerExpandVolume: InvalidArgument without a volume id
//     (or capabilities, or a capacity range); NotFound for an unknown volume.
//
// Node service (node.go), with -node-service, as root, in the kubelet's mount namespace:
//   - NodeStageVolume: the backing file <backing-dir>/<backing-prefix><volume id>.img (sparse,
//     the volume's capacity), a loop device over it (LOOP_CONFIGURE with autoclear: the
//     device goes when its last user does, also after a SIGKILL), ext4 when it has no file
//     system yet, mounted at the staging path. NodeUnstageVolume unmounts it (the file stays:
//     the data outlives the pod).
//   - NodePublishVolume / NodeUnpublishVolume: a bind mount of the staging path into the
//     pod's target path, and its removal.
//   - NodeExpandVolume: grows the backing file to the size asked for (never shrinks), tells
//     the loop device (LOOP_SET_CAPACITY, as `losetup -c`) and grows the mounted ext4 online
//     (resize2fs); InvalidArgument without a volume id or path, NotFound for an unknown
//     volume or a path that is not its mount.
//   - NodeGetInfo (node id, topology with -enable-topology), NodeGetCapabilities
//     (STAGE_UNSTAGE_VOLUME, EXPAND_VOLUME).
//   - Self-registration with the kubelet (registration.go): the pluginregistration/v1
//     Registration service on <kubelet-dir>/plugins_registry/<driver>-reg.sock.
//   - The block throttle (throttle.go): the volume's iops and throughput become the kernel's
//     block-I/O limits on its loop device for the cgroups of every pod that has it published.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log"
	"net"
	"net/url"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"sync"
	"syscall"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"golang.org/x/sys/unix"
	"google.golang.org/grpc"
)

var version = "dev"

type stringList []string

func (s *stringList) String() string { return strings.Join(*s, ",") }

func (s *stringList) Set(v string) error {
	for _, p := range strings.Split(v, ",") {
		if p = strings.TrimSpace(p); p != "" {
			*s = append(*s, p)
		}
	}
	return nil
}

type config struct {
	driverName     string
	endpoint       string
	nodeID         string
	stateDir       string
	enableModify   bool
	acceptedParams stringList
	enableTopology bool

	nodeService   bool
	kubeletDir    string
	backingDir    string
	backingPrefix string
	cgroupRoot    string
	defaultSize   int64
}

type driver struct {
	csi.UnimplementedIdentityServer
	csi.UnimplementedControllerServer
	csi.UnimplementedNodeServer

	cfg     config
	mu      sync.Mutex
	volumes map[string]*volume // by id
	nextID  int

	nodeMu    sync.Mutex // one node operation at a time
	throttler *throttler // nil without the node service
	// ext4 grows while mounted only for a process with CAP_SYS_RESOURCE; without it a
	// volume grows while it is not staged, and NodeStageVolume grows its ext4 unmounted.
	onlineExpansion bool
}

// backingFile is where a volume keeps its blocks; "" when the driver keeps no files.
func (d *driver) backingFile(id string) string {
	if d.cfg.backingDir == "" {
		return ""
	}
	return filepath.Join(d.cfg.backingDir, d.cfg.backingPrefix+id+".img")
}

func listen(path string) (net.Listener, error) {
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, err
	}
	return net.Listen("unix", path)
}

func logErrors(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
	resp, err := h(ctx, req)
	if err != nil {
		log.Printf("%s: %v", info.FullMethod, err)
	}
	return resp, err
}

func main() {
	var cfg config
	var showVersion bool
	flag.StringVar(&cfg.driverName, "drivername", "hostpath.csi.k8s.io", "name of the driver")
	flag.StringVar(&cfg.endpoint, "endpoint", "unix:///csi/csi.sock", "CSI endpoint (unix:///ABS/PATH)")
	flag.StringVar(&cfg.nodeID, "nodeid", "", "node id")
	flag.StringVar(&cfg.stateDir, "statedir", "/csi-data-dir", "directory for the driver's state")
	flag.BoolVar(&cfg.enableModify, "enable-controller-modify-volume", false, "enables ControllerModifyVolume (MODIFY_VOLUME)")
	flag.Var(&cfg.acceptedParams, "accepted-mutable-parameter-names", "comma separated names of the mutable parameters the driver accepts; unset: all")
	flag.BoolVar(&cfg.enableTopology, "enable-topology", true, "reports VOLUME_ACCESSIBILITY_CONSTRAINTS")
	flag.BoolVar(&cfg.nodeService, "node-service", false, "also serve the Node service (loop devices, mounts, block throttle: needs root)")
	flag.StringVar(&cfg.kubeletDir, "kubelet-dir", "/var/lib/kubelet", "the kubelet's root dir (plugins_registry/, pods/)")
	flag.StringVar(&cfg.backingDir, "backing-dir", "", "where volumes keep their backing files (required with -node-service)")
	flag.StringVar(&cfg.backingPrefix, "backing-prefix", "csb-csi-", "every backing file's name starts with this (a sweep finds them by it)")
	flag.StringVar(&cfg.cgroupRoot, "kubelet-cgroup-root", "/", "the kubelet's cgroupRoot (pods are under <it>/kubepods)")
	flag.Int64Var(&cfg.defaultSize, "default-size", 1<<30, "bytes of a volume created without a capacity")
	flag.BoolVar(&showVersion, "version", false, "print the version and exit")
	flag.Parse()
	if showVersion {
		fmt.Println(version)
		return
	}
	if cfg.nodeID == "" {
		log.Fatal("-nodeid is required")
	}
	if cfg.nodeService && cfg.backingDir == "" {
		log.Fatal("-node-service needs -backing-dir")
	}
	if strings.ContainsAny(cfg.backingPrefix, "/") {
		log.Fatalf("-backing-prefix %q must not contain '/'", cfg.backingPrefix)
	}
	u, err := url.Parse(cfg.endpoint)
	if err != nil || u.Scheme != "unix" || u.Path == "" {
		log.Fatalf("-endpoint must be unix:///ABS/PATH, got %q", cfg.endpoint)
	}
	if err := os.MkdirAll(cfg.stateDir, 0o750); err != nil {
		log.Fatal(err)
	}
	d := &driver{cfg: cfg, onlineExpansion: !cfg.nodeService || hasCapability(unix.CAP_SYS_RESOURCE)}
	if err := d.load(); err != nil {
		log.Fatal(err)
	}
	var reg *grpc.Server
	if cfg.nodeService {
		if err := os.MkdirAll(cfg.backingDir, 0o700); err != nil {
			log.Fatal(err)
		}
		t, err := newThrottler(d, cfg.cgroupRoot, filepath.Join(cfg.kubeletDir, "pods"))
		if err != nil {
			log.Fatalf("the node service cannot throttle block I/O here: %v", err)
		}
		d.throttler = t
		go t.run()
	}
	lis, err := listen(u.Path)
	if err != nil {
		log.Fatal(err)
	}
	srv := grpc.NewServer(grpc.UnaryInterceptor(logErrors))
	csi.RegisterIdentityServer(srv, d)
	csi.RegisterControllerServer(srv, d)
	if cfg.nodeService {
		csi.RegisterNodeServer(srv, d)
		// Registered once the CSI socket listens: the kubelet calls NodeGetInfo right away.
		reg, err = register(cfg, u.Path)
		if err != nil {
			log.Fatal(err)
		}
	}
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT)
	go func() {
		<-sigs
		if reg != nil {
			reg.Stop()
			_ = os.Remove(registrationSocket(cfg))
		}
		srv.Stop()
	}()
	log.Printf("%s %s listening on %s (modify=%v accepted=%v topology=%v node=%v online-expansion=%v)",
		cfg.driverName, version, u.Path, cfg.enableModify, cfg.acceptedParams, cfg.enableTopology, cfg.nodeService, d.onlineExpansion)
	if err := srv.Serve(lis); err != nil {
		log.Fatal(err)
	}
	_ = os.Remove(u.Path)
}
