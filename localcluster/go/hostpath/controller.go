// The Identity and Controller services: volumes are records in <statedir>/state.json; their
// blocks exist once the node service stages them (node.go).
package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log"
	"os"
	"path/filepath"
	"sort"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

type volume struct {
	ID         string            `json:"id"`
	Name       string            `json:"name"`
	Capacity   int64             `json:"capacity"`
	Path       string            `json:"path,omitempty"` // the backing file, where there is one
	Parameters map[string]string `json:"parameters,omitempty"`
	Mutable    map[string]string `json:"mutable,omitempty"`
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
			Type: d.expansionType(),
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

func (d *driver) expansionType() csi.PluginCapability_VolumeExpansion_Type {
	if d.onlineExpansion {
		return csi.PluginCapability_VolumeExpansion_ONLINE
	}
	return csi.PluginCapability_VolumeExpansion_OFFLINE
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
		if _, err := limitsOf(req.GetMutableParameters()); err != nil {
			return nil, status.Errorf(codes.InvalidArgument, "invalid parameters: %v", err)
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
	if capacity <= 0 {
		capacity = d.cfg.defaultSize
	}
	v := &volume{
		ID: id, Name: req.GetName(), Capacity: capacity, Path: d.backingFile(id),
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
	if v.Path != "" {
		if dev, ok := loopDevices()[v.Path]; ok {
			return nil, status.Errorf(codes.FailedPrecondition, "volume %s is still staged on /dev/%s", v.ID, dev.name)
		}
		if err := os.Remove(v.Path); err != nil && !errors.Is(err, os.ErrNotExist) {
			return nil, status.Errorf(codes.Internal, "failed to delete volume %s: %v", v.ID, err)
		}
	}
	delete(d.volumes, v.ID)
	if err := d.save(); err != nil {
		return nil, status.Errorf(codes.Internal, "failed to save state: %v", err)
	}
	log.Printf("DeleteVolume %s", v.ID)
	return &csi.DeleteVolumeResponse{}, nil
}

func (d *driver) ValidateVolumeCapabilities(_ context.Context, req *csi.ValidateVolumeCapabilitiesRequest) (*csi.ValidateVolumeCapabilitiesResponse, error) {
	if req.GetVolumeId() == "" {
		return nil, status.Error(codes.InvalidArgument, "Volume ID missing in request")
	}
	if len(req.GetVolumeCapabilities()) == 0 {
		return nil, status.Error(codes.InvalidArgument, "Volume Capabilities missing in request")
	}
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
	if req.GetVolumeId() == "" {
		return nil, status.Error(codes.InvalidArgument, "Volume ID missing in request")
	}
	if req.GetCapacityRange() == nil {
		return nil, status.Error(codes.InvalidArgument, "Capacity range missing in request")
	}
	if !d.onlineExpansion {
		// No NodeStageVolume between the in-use check and the new size (node lock first).
		d.nodeMu.Lock()
		defer d.nodeMu.Unlock()
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	v, ok := d.volumes[req.GetVolumeId()]
	if !ok {
		return nil, status.Errorf(codes.NotFound, "volume %s not found", req.GetVolumeId())
	}
	n := req.GetCapacityRange().GetRequiredBytes()
	if n > v.Capacity && !d.onlineExpansion && v.Path != "" {
		// Offline expansion (the CSI spec's answer for a volume in use): the resizer retries,
		// and once no pod has the volume staged the size is recorded; the next
		// NodeStageVolume grows the file system before it mounts it.
		if dev, ok := loopDevices()[v.Path]; ok {
			return nil, status.Errorf(codes.FailedPrecondition,
				"volume %s is in use (staged on /dev/%s): without CAP_SYS_RESOURCE ext4 grows only while unmounted", v.ID, dev.name)
		}
	}
	if n > v.Capacity {
		v.Capacity = n
		if err := d.save(); err != nil {
			return nil, status.Errorf(codes.Internal, "failed to save state: %v", err)
		}
	}
	log.Printf("ControllerExpandVolume %s: capacity=%d", v.ID, v.Capacity)
	// The backing file, the loop device and ext4 grow on the node (NodeExpandVolume), where
	// the device and its mount are.
	return &csi.ControllerExpandVolumeResponse{CapacityBytes: v.Capacity, NodeExpansionRequired: true}, nil
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
	v, ok := d.volumes[req.GetVolumeId()]
	if !ok {
		d.mu.Unlock()
		return nil, status.Errorf(codes.NotFound, "volume %s not found", req.GetVolumeId())
	}
	merged := map[string]string{}
	for k, val := range v.Mutable {
		merged[k] = val
	}
	for k, val := range req.GetMutableParameters() {
		merged[k] = val
	}
	if _, err := limitsOf(merged); err != nil {
		d.mu.Unlock()
		return nil, status.Errorf(codes.InvalidArgument, "invalid parameters: %v", err)
	}
	v.Mutable = merged
	if err := d.save(); err != nil {
		d.mu.Unlock()
		return nil, status.Errorf(codes.Internal, "failed to save state: %v", err)
	}
	log.Printf("ControllerModifyVolume %s: mutable=%v", v.ID, v.Mutable)
	d.mu.Unlock()
	// Done when the pods that have the volume published see the new limits.
	if d.throttler != nil {
		if err := d.throttler.reconcile(); err != nil {
			return nil, status.Errorf(codes.Internal, "parameters recorded, limits not applied: %v", err)
		}
	}
	return &csi.ControllerModifyVolumeResponse{}, nil
}
