// csi-hostpath-lite: the controller side of a host-path CSI driver, for a control plane on
// loopback. It stands in for kubernetes-csi/csi-driver-host-path's hostpathplugin, which the
// Go module proxy reachable here does not serve, and takes the same flags for what it does
// (-endpoint, -nodeid, -statedir, -drivername, -enable-controller-modify-volume,
// -accepted-mutable-parameter-names, -enable-topology), so the launcher can run either.
//
// What it does, like hostpathplugin's controller service:
//   - CreateVolume: a directory <statedir>/<volume id>; idempotent by name; mutable
//     parameters (from a VolumeAttributesClass) are checked against the accepted names.
//   - DeleteVolume: removes the directory (unknown ids succeed).
//   - ControllerModifyVolume: NotFound for an unknown volume; InvalidArgument for a
//     parameter that is not accepted ("invalid parameters: [...]") or for no parameters;
//     otherwise records the parameters.
//   - ControllerExpandVolume: records the new size.
//
// No node service: nothing here mounts anything, and it needs no root.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"log"
	"net"
	"net/url"
	"os"
	"os/signal"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"syscall"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
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
}

type volume struct {
	ID         string            `json:"id"`
	Name       string            `json:"name"`
	Capacity   int64             `json:"capacity"`
	Path       string            `json:"path"`
	Parameters map[string]string `json:"parameters,omitempty"`
	Mutable    map[string]string `json:"mutable,omitempty"`
}

type driver struct {
	csi.UnimplementedIdentityServer
	csi.UnimplementedControllerServer

	cfg     config
	mu      sync.Mutex
	volumes map[string]*volume // by id
	nextID  int
}

const topologyKey = "topology.hostpath.csi/node"

func (d *driver) stateFile() string { return filepath.Join(d.cfg.stateDir, "state.json") }

func (d *driver) load() error {
	d.volumes = map[string]*volume{}
	data, err := os.ReadFile(d.stateFile())
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	var vols []*volume
	if err := json.Unmarshal(data, &vols); err != nil {
		return fmt.Errorf("%s: %w", d.stateFile(), err)
	}
	for _, v := range vols {
		d.volumes[v.ID] = v
	}
	d.nextID = len(vols)
	return nil
}

// save writes the state atomically; the caller holds d.mu.
func (d *driver) save() error {
	vols := make([]*volume, 0, len(d.volumes))
	for _, v := range d.volumes {
		vols = append(vols, v)
	}
	sort.Slice(vols, func(i, j int) bool { return vols[i].ID < vols[j].ID })
	data, err := json.MarshalIndent(vols, "", "  ")
	if err != nil {
		return err
	}
	tmp := d.stateFile() + ".tmp"
	if err := os.WriteFile(tmp, data, 0o600); err != nil {
		return err
	}
	return os.Rename(tmp, d.stateFile())
}

func (d *driver) validateMutable(params map[string]string) error {
	if len(d.cfg.acceptedParams) == 0 {
		return nil // like hostpathplugin: no list means every parameter is mutable
	}
	accepted := map[string]bool{}
	for _, n := range d.cfg.acceptedParams {
		accepted[n] = true
	}
	var unsupported []string
	for k := range params {
		if !accepted[k] {
			unsupported = append(unsupported, k)
		}
	}
	sort.Strings(unsupported)
	if len(unsupported) > 0 {
		return status.Errorf(codes.InvalidArgument, "invalid parameters: %v", unsupported)
	}
	return nil
}

// Identity service.

func (d *driver) GetPluginInfo(context.Context, *csi.GetPluginInfoRequest) (*csi.GetPluginInfoResponse, error) {
	return &csi.GetPluginInfoResponse{Name: d.cfg.driverName, VendorVersion: version}, nil
}

func (d *driver) GetPluginCapabilities(context.Context, *csi.GetPluginCapabilitiesRequest) (*csi.GetPluginCapabilitiesResponse, error) {
	caps := []*csi.PluginCapability{{
		Type: &csi.PluginCapability_Service_{Service: &csi.PluginCapability_Service{
			Type: csi.PluginCapability_Service_CONTROLLER_SERVICE,
		}},
	}, {
		Type: &csi.PluginCapability_VolumeExpansion_{VolumeExpansion: &csi.PluginCapability_VolumeExpansion{
			Type: csi.PluginCapability_VolumeExpansion_ONLINE,
		}},
	}}
	if d.cfg.enableTopology {
		caps = append(caps, &csi.PluginCapability{
			Type: &csi.PluginCapability_Service_{Service: &csi.PluginCapability_Service{
				Type: csi.PluginCapability_Service_VOLUME_ACCESSIBILITY_CONSTRAINTS,
			}},
		})
	}
	return &csi.GetPluginCapabilitiesResponse{Capabilities: caps}, nil
}

func (d *driver) Probe(context.Context, *csi.ProbeRequest) (*csi.ProbeResponse, error) {
	return &csi.ProbeResponse{}, nil
}

// Controller service.

func (d *driver) controllerCaps() []csi.ControllerServiceCapability_RPC_Type {
	caps := []csi.ControllerServiceCapability_RPC_Type{
		csi.ControllerServiceCapability_RPC_CREATE_DELETE_VOLUME,
		csi.ControllerServiceCapability_RPC_EXPAND_VOLUME,
	}
	if d.cfg.enableModify {
		caps = append(caps, csi.ControllerServiceCapability_RPC_MODIFY_VOLUME)
	}
	return caps
}

func (d *driver) ControllerGetCapabilities(context.Context, *csi.ControllerGetCapabilitiesRequest) (*csi.ControllerGetCapabilitiesResponse, error) {
	var out []*csi.ControllerServiceCapability
	for _, c := range d.controllerCaps() {
		out = append(out, &csi.ControllerServiceCapability{
			Type: &csi.ControllerServiceCapability_Rpc{Rpc: &csi.ControllerServiceCapability_RPC{Type: c}},
		})
	}
	return &csi.ControllerGetCapabilitiesResponse{Capabilities: out}, nil
}

func (d *driver) csiVolume(v *volume) *csi.Volume {
	out := &csi.Volume{VolumeId: v.ID, CapacityBytes: v.Capacity, VolumeContext: v.Parameters}
	if d.cfg.enableTopology {
		out.AccessibleTopology = []*csi.Topology{{Segments: map[string]string{topologyKey: d.cfg.nodeID}}}
	}
	return out
}

func (d *driver) CreateVolume(_ context.Context, req *csi.CreateVolumeRequest) (*csi.CreateVolumeResponse, error) {
	if req.GetName() == "" {
		return nil, status.Error(codes.InvalidArgument, "Name missing in request")
	}
	if len(req.GetVolumeCapabilities()) == 0 {
		return nil, status.Error(codes.InvalidArgument, "Volume Capabilities missing in request")
	}
	for _, c := range req.GetVolumeCapabilities() {
		if c.GetBlock() != nil {
			return nil, status.Error(codes.InvalidArgument, "block volumes are not supported")
		}
	}
	if len(req.GetMutableParameters()) > 0 {
		if !d.cfg.enableModify {
			return nil, status.Error(codes.InvalidArgument, "mutable parameters given but -enable-controller-modify-volume is off")
		}
		if err := d.validateMutable(req.GetMutableParameters()); err != nil {
			return nil, err
		}
	}
	capacity := req.GetCapacityRange().GetRequiredBytes()

	d.mu.Lock()
	defer d.mu.Unlock()
	for _, v := range d.volumes {
		if v.Name == req.GetName() {
			if v.Capacity < capacity {
				return nil, status.Errorf(codes.AlreadyExists, "Volume with the same name: %s but with different size already exist", v.Name)
			}
			return &csi.CreateVolumeResponse{Volume: d.csiVolume(v)}, nil
		}
	}
	d.nextID++
	id := fmt.Sprintf("vol-%04d-%s", d.nextID, shortName(req.GetName()))
	path := filepath.Join(d.cfg.stateDir, id)
	if err := os.MkdirAll(path, 0o750); err != nil {
		return nil, status.Errorf(codes.Internal, "failed to create volume %s: %v", id, err)
	}
	v := &volume{
		ID: id, Name: req.GetName(), Capacity: capacity, Path: path,
		Parameters: req.GetParameters(), Mutable: req.GetMutableParameters(),
	}
	d.volumes[id] = v
	if err := d.save(); err != nil {
		return nil, status.Errorf(codes.Internal, "failed to save state: %v", err)
	}
	log.Printf("CreateVolume %s: id=%s capacity=%d mutable=%v", req.GetName(), id, capacity, v.Mutable)
	return &csi.CreateVolumeResponse{Volume: d.csiVolume(v)}, nil
}

func shortName(name string) string {
	if len(name) > 12 {
		return name[len(name)-12:]
	}
	return name
}

func (d *driver) DeleteVolume(_ context.Context, req *csi.DeleteVolumeRequest) (*csi.DeleteVolumeResponse, error) {
	if req.GetVolumeId() == "" {
		return nil, status.Error(codes.InvalidArgument, "Volume ID missing in request")
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	v, ok := d.volumes[req.GetVolumeId()]
	if !ok {
		return &csi.DeleteVolumeResponse{}, nil
	}
	if err := os.RemoveAll(v.Path); err != nil {
		return nil, status.Errorf(codes.Internal, "failed to delete volume %s: %v", v.ID, err)
	}
	delete(d.volumes, v.ID)
	if err := d.save(); err != nil {
		return nil, status.Errorf(codes.Internal, "failed to save state: %v", err)
	}
	log.Printf("DeleteVolume %s", v.ID)
	return &csi.DeleteVolumeResponse{}, nil
}

func (d *driver) ValidateVolumeCapabilities(_ context.Context, req *csi.ValidateVolumeCapabilitiesRequest) (*csi.ValidateVolumeCapabilitiesResponse, error) {
	d.mu.Lock()
	_, ok := d.volumes[req.GetVolumeId()]
	d.mu.Unlock()
	if !ok {
		return nil, status.Error(codes.NotFound, req.GetVolumeId())
	}
	return &csi.ValidateVolumeCapabilitiesResponse{Confirmed: &csi.ValidateVolumeCapabilitiesResponse_Confirmed{
		VolumeContext: req.GetVolumeContext(), VolumeCapabilities: req.GetVolumeCapabilities(), Parameters: req.GetParameters(),
	}}, nil
}

func (d *driver) ControllerExpandVolume(_ context.Context, req *csi.ControllerExpandVolumeRequest) (*csi.ControllerExpandVolumeResponse, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	v, ok := d.volumes[req.GetVolumeId()]
	if !ok {
		return nil, status.Errorf(codes.NotFound, "volume %s not found", req.GetVolumeId())
	}
	if n := req.GetCapacityRange().GetRequiredBytes(); n > v.Capacity {
		v.Capacity = n
		if err := d.save(); err != nil {
			return nil, status.Errorf(codes.Internal, "failed to save state: %v", err)
		}
	}
	return &csi.ControllerExpandVolumeResponse{CapacityBytes: v.Capacity, NodeExpansionRequired: false}, nil
}

func (d *driver) ControllerModifyVolume(_ context.Context, req *csi.ControllerModifyVolumeRequest) (*csi.ControllerModifyVolumeResponse, error) {
	if !d.cfg.enableModify {
		return nil, status.Error(codes.Unimplemented, "ControllerModifyVolume is not enabled")
	}
	if req.GetVolumeId() == "" {
		return nil, status.Error(codes.InvalidArgument, "Volume ID missing in request")
	}
	if len(req.GetMutableParameters()) == 0 {
		return nil, status.Error(codes.InvalidArgument, "Mutable parameters missing in request")
	}
	if err := d.validateMutable(req.GetMutableParameters()); err != nil {
		log.Printf("ControllerModifyVolume %s refused: %v", req.GetVolumeId(), err)
		return nil, err
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	v, ok := d.volumes[req.GetVolumeId()]
	if !ok {
		return nil, status.Errorf(codes.NotFound, "volume %s not found", req.GetVolumeId())
	}
	if v.Mutable == nil {
		v.Mutable = map[string]string{}
	}
	for k, val := range req.GetMutableParameters() {
		v.Mutable[k] = val
	}
	if err := d.save(); err != nil {
		return nil, status.Errorf(codes.Internal, "failed to save state: %v", err)
	}
	log.Printf("ControllerModifyVolume %s: mutable=%v", v.ID, v.Mutable)
	return &csi.ControllerModifyVolumeResponse{}, nil
}

func main() {
	var cfg config
	var showVersion bool
	flag.StringVar(&cfg.driverName, "drivername", "hostpath.csi.k8s.io", "name of the driver")
	flag.StringVar(&cfg.endpoint, "endpoint", "unix:///csi/csi.sock", "CSI endpoint (unix:///ABS/PATH)")
	flag.StringVar(&cfg.nodeID, "nodeid", "", "node id")
	flag.StringVar(&cfg.stateDir, "statedir", "/csi-data-dir", "directory for the volumes and the driver's state")
	flag.BoolVar(&cfg.enableModify, "enable-controller-modify-volume", false, "enables ControllerModifyVolume (MODIFY_VOLUME)")
	flag.Var(&cfg.acceptedParams, "accepted-mutable-parameter-names", "comma separated names of the mutable parameters the driver accepts; unset: all")
	flag.BoolVar(&cfg.enableTopology, "enable-topology", true, "reports VOLUME_ACCESSIBILITY_CONSTRAINTS")
	flag.BoolVar(&showVersion, "version", false, "print the version and exit")
	flag.Parse()
	if showVersion {
		fmt.Println(version)
		return
	}
	if cfg.nodeID == "" {
		log.Fatal("-nodeid is required")
	}
	u, err := url.Parse(cfg.endpoint)
	if err != nil || u.Scheme != "unix" || u.Path == "" {
		log.Fatalf("-endpoint must be unix:///ABS/PATH, got %q", cfg.endpoint)
	}
	if err := os.MkdirAll(cfg.stateDir, 0o750); err != nil {
		log.Fatal(err)
	}
	d := &driver{cfg: cfg}
	if err := d.load(); err != nil {
		log.Fatal(err)
	}
	if err := os.Remove(u.Path); err != nil && !errors.Is(err, os.ErrNotExist) {
		log.Fatal(err)
	}
	lis, err := net.Listen("unix", u.Path)
	if err != nil {
		log.Fatal(err)
	}
	srv := grpc.NewServer(grpc.UnaryInterceptor(func(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
		resp, err := h(ctx, req)
		if err != nil {
			log.Printf("%s: %v", info.FullMethod, err)
		}
		return resp, err
	}))
	csi.RegisterIdentityServer(srv, d)
	csi.RegisterControllerServer(srv, d)
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT)
	go func() {
		<-sigs
		srv.Stop()
	}()
	log.Printf("%s %s listening on %s (modify=%v accepted=%v topology=%v)",
		cfg.driverName, version, u.Path, cfg.enableModify, cfg.acceptedParams, cfg.enableTopology)
	if err := srv.Serve(lis); err != nil {
		log.Fatal(err)
	}
	_ = os.Remove(u.Path)
}
