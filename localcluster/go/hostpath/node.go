// The Node service: loop devices over sparse backing files, ext4, the staging mount and the
// pods' bind mounts. It runs in the kubelet's mount namespace, so its mounts are the
// kubelet's; loop devices are machine-wide, so each is made with autoclear and goes when its
// last mount does.
package main

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"log"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"golang.org/x/sys/unix"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

type loopDevice struct {
	name  string // loop3
	major uint32
	minor uint32
}

func (l loopDevice) id() string   { return fmt.Sprintf("%d:%d", l.major, l.minor) }
func (l loopDevice) path() string { return "/dev/" + l.name }

// loopDevices maps each attached loop device's backing file to the device, from sysfs.
func loopDevices() map[string]loopDevice {
	found := map[string]loopDevice{}
	entries, _ := filepath.Glob("/sys/block/loop*")
	for _, entry := range entries {
		file, err := os.ReadFile(filepath.Join(entry, "loop", "backing_file"))
		if err != nil {
			continue // not attached
		}
		dev, err := os.ReadFile(filepath.Join(entry, "dev"))
		if err != nil {
			continue
		}
		var major, minor uint32
		if _, err := fmt.Sscanf(strings.TrimSpace(string(dev)), "%d:%d", &major, &minor); err != nil {
			continue
		}
		name := strings.TrimSuffix(strings.TrimSpace(string(file)), " (deleted)")
		found[name] = loopDevice{filepath.Base(entry), major, minor}
	}
	return found
}

type mountEntry struct {
	devID      string // major:minor of the mounted file system
	mountPoint string
	source     string
}

func unescapeMount(s string) string {
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			if n, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(n))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

func mounts() ([]mountEntry, error) {
	data, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return nil, err
	}
	var out []mountEntry
	for _, line := range strings.Split(string(data), "\n") {
		fields := strings.Fields(line)
		sep := -1
		for i, f := range fields {
			if f == "-" {
				sep = i
				break
			}
		}
		if len(fields) < 5 || sep < 0 || sep+2 >= len(fields) {
			continue
		}
		out = append(out, mountEntry{fields[2], unescapeMount(fields[4]), unescapeMount(fields[sep+2])})
	}
	return out, nil
}

// mountedAt is the mount at exactly path (the last one, which is the one visible), if any.
func mountedAt(path string) (mountEntry, bool, error) {
	all, err := mounts()
	if err != nil {
		return mountEntry{}, false, err
	}
	var found mountEntry
	ok := false
	for _, m := range all {
		if m.mountPoint == path {
			found, ok = m, true
		}
	}
	return found, ok, nil
}

// attach returns the loop device over file, making the file (sparse, size bytes) and the
// device where they do not exist. A device made here comes with an open descriptor the
// caller closes once the device is mounted: with autoclear, the kernel detaches the device
// when its last opener goes, so a failure (or a SIGKILL) before the mount leaves no device.
func attach(file string, size int64) (loopDevice, *os.File, error) {
	if dev, ok := loopDevices()[file]; ok {
		return dev, nil, nil
	}
	back, err := os.OpenFile(file, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return loopDevice{}, nil, err
	}
	defer back.Close()
	if st, err := back.Stat(); err == nil && st.Size() < size {
		if err := back.Truncate(size); err != nil {
			return loopDevice{}, nil, fmt.Errorf("sizing %s: %w", file, err)
		}
	}
	ctl, err := os.OpenFile("/dev/loop-control", os.O_RDWR, 0)
	if err != nil {
		return loopDevice{}, nil, err
	}
	defer ctl.Close()
	for attempt := 0; attempt < 20; attempt++ {
		n, err := unix.IoctlRetInt(int(ctl.Fd()), unix.LOOP_CTL_GET_FREE)
		if err != nil {
			return loopDevice{}, nil, fmt.Errorf("LOOP_CTL_GET_FREE: %w", err)
		}
		path := fmt.Sprintf("/dev/loop%d", n)
		devFile, err := os.OpenFile(path, os.O_RDWR, 0)
		if err != nil {
			return loopDevice{}, nil, err
		}
		cfg := unix.LoopConfig{Fd: uint32(back.Fd())}
		copy(cfg.Info.File_name[:], file)
		// Direct I/O from the device to its file where the file system allows it (no
		// second copy in the page cache); tmpfs does not.
		for _, flags := range []uint32{unix.LO_FLAGS_AUTOCLEAR | unix.LO_FLAGS_DIRECT_IO, unix.LO_FLAGS_AUTOCLEAR} {
			cfg.Info.Flags = flags
			err = unix.IoctlLoopConfigure(int(devFile.Fd()), &cfg)
			if err != unix.EINVAL {
				break
			}
		}
		if err == nil {
			var st unix.Stat_t
			if err := unix.Fstat(int(devFile.Fd()), &st); err != nil {
				devFile.Close()
				return loopDevice{}, nil, err
			}
			return loopDevice{fmt.Sprintf("loop%d", n), unix.Major(st.Rdev), unix.Minor(st.Rdev)}, devFile, nil
		}
		devFile.Close()
		if err != unix.EBUSY {
			return loopDevice{}, nil, fmt.Errorf("LOOP_CONFIGURE %s over %s: %w", path, file, err)
		}
		// Another process took that device between GET_FREE and CONFIGURE.
	}
	return loopDevice{}, nil, errors.New("no free loop device after 20 attempts")
}

// detach clears the loop device over file, if one is attached (a device still held is
// detached by the kernel once released).
func detach(file string) error {
	dev, ok := loopDevices()[file]
	if !ok {
		return nil
	}
	f, err := os.OpenFile(dev.path(), os.O_RDWR, 0)
	if err != nil {
		return err
	}
	defer f.Close()
	if err := unix.IoctlSetInt(int(f.Fd()), unix.LOOP_CLR_FD, 0); err != nil && err != unix.ENXIO {
		return fmt.Errorf("LOOP_CLR_FD %s: %w", dev.path(), err)
	}
	return nil
}

// hasExtFS reads the ext2/3/4 superblock magic (0xEF53 at byte 1080).
func hasExtFS(dev string) (bool, error) {
	f, err := os.Open(dev)
	if err != nil {
		return false, err
	}
	defer f.Close()
	buf := make([]byte, 2)
	if _, err := f.ReadAt(buf, 1080); err != nil {
		return false, err
	}
	return binary.LittleEndian.Uint16(buf) == 0xEF53, nil
}

// mkfs makes ext4 with its metadata written now: a volume is a file in RAM, so the lazy
// initialisation thread would write during a pod's measurement. For a large sparse volume the
// inode tables and the journal are kept small (checkpoints are few large files), or mkfs
// would write gigabytes of zeros into memory.
func mkfs(dev string, size int64) error {
	args := []string{"-q", "-F", "-m", "0", "-E", "lazy_itable_init=0,lazy_journal_init=0,nodiscard"}
	if inodes := size / (16 << 10); inodes > 262144 {
		args = append(args, "-N", "262144")
	}
	if size >= 4<<30 {
		args = append(args, "-J", "size=64")
	}
	args = append(args, dev)
	t0 := time.Now()
	out, err := exec.Command("mkfs.ext4", args...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("mkfs.ext4 %s: %v: %s", strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	log.Printf("mkfs.ext4 %s (%d MiB) in %.2f s", dev, size>>20, time.Since(t0).Seconds())
	return nil
}

// extFSBytes is the size of the ext2/3/4 file system on dev, from its superblock.
func extFSBytes(dev string) (int64, error) {
	f, err := os.Open(dev)
	if err != nil {
		return 0, err
	}
	defer f.Close()
	sb := make([]byte, 1024)
	if _, err := f.ReadAt(sb, 1024); err != nil {
		return 0, err
	}
	blocks := uint64(binary.LittleEndian.Uint32(sb[4:]))
	if binary.LittleEndian.Uint32(sb[0x60:])&0x80 != 0 { // INCOMPAT_64BIT
		blocks |= uint64(binary.LittleEndian.Uint32(sb[0x150:])) << 32
	}
	return int64(blocks) << (10 + binary.LittleEndian.Uint32(sb[24:])), nil
}

// growUnmounted grows the unmounted ext4 on dev to the device's size, where the device is
// larger (a volume expanded while it was not staged): resize2fs needs no privilege beyond
// the device then, and wants a freshly checked file system.
func growUnmounted(dev loopDevice) error {
	devSize, err := deviceBytes(dev)
	if err != nil {
		return err
	}
	fsSize, err := extFSBytes(dev.path())
	if err != nil {
		return fmt.Errorf("reading the superblock of %s: %w", dev.path(), err)
	}
	// resize2fs leaves out a last block group too small to be worth its metadata.
	if devSize-fsSize < 1<<20 {
		return nil
	}
	t0 := time.Now()
	// e2fsck -p: 0 clean, 1 errors corrected; anything else needs a person.
	out, err := exec.Command("e2fsck", "-f", "-p", dev.path()).CombinedOutput()
	var exit *exec.ExitError
	if err != nil && !(errors.As(err, &exit) && exit.ExitCode() == 1) {
		return fmt.Errorf("e2fsck -f -p %s: %v: %s", dev.path(), err, strings.TrimSpace(string(out)))
	}
	out, err = exec.Command("resize2fs", dev.path()).CombinedOutput()
	if err != nil {
		return fmt.Errorf("resize2fs %s: %v: %s", dev.path(), err, strings.TrimSpace(string(out)))
	}
	log.Printf("resize2fs %s (unmounted): %d MiB -> %d MiB in %.2f s", dev.path(), fsSize>>20, devSize>>20, time.Since(t0).Seconds())
	return nil
}

func (d *driver) lookup(id string) (volume, bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	v, ok := d.volumes[id]
	if !ok {
		return volume{}, false
	}
	return *v, true
}

func (d *driver) NodeGetCapabilities(context.Context, *csi.NodeGetCapabilitiesRequest) (*csi.NodeGetCapabilitiesResponse, error) {
	var caps []*csi.NodeServiceCapability
	for _, c := range []csi.NodeServiceCapability_RPC_Type{
		csi.NodeServiceCapability_RPC_STAGE_UNSTAGE_VOLUME,
		csi.NodeServiceCapability_RPC_EXPAND_VOLUME,
	} {
		caps = append(caps, &csi.NodeServiceCapability{
			Type: &csi.NodeServiceCapability_Rpc{Rpc: &csi.NodeServiceCapability_RPC{Type: c}},
		})
	}
	return &csi.NodeGetCapabilitiesResponse{Capabilities: caps}, nil
}

func (d *driver) NodeGetInfo(context.Context, *csi.NodeGetInfoRequest) (*csi.NodeGetInfoResponse, error) {
	resp := &csi.NodeGetInfoResponse{NodeId: d.cfg.nodeID}
	if d.cfg.enableTopology {
		resp.AccessibleTopology = &csi.Topology{Segments: map[string]string{topologyKey: d.cfg.nodeID}}
	}
	return resp, nil
}

func checkMountCapability(c *csi.VolumeCapability) error {
	if c == nil {
		return status.Error(codes.InvalidArgument, "Volume Capability missing in request")
	}
	if c.GetBlock() != nil {
		return status.Error(codes.InvalidArgument, "block volumes are not supported")
	}
	if fs := c.GetMount().GetFsType(); fs != "" && fs != "ext4" {
		return status.Errorf(codes.InvalidArgument, "fsType %q: only ext4 is supported", fs)
	}
	return nil
}

func (d *driver) NodeStageVolume(_ context.Context, req *csi.NodeStageVolumeRequest) (*csi.NodeStageVolumeResponse, error) {
	id, staging := req.GetVolumeId(), req.GetStagingTargetPath()
	if id == "" || staging == "" {
		return nil, status.Error(codes.InvalidArgument, "volume id and staging target path are required")
	}
	if err := checkMountCapability(req.GetVolumeCapability()); err != nil {
		return nil, err
	}
	d.nodeMu.Lock()
	defer d.nodeMu.Unlock()
	v, ok := d.lookup(id)
	if !ok {
		return nil, status.Errorf(codes.NotFound, "volume %s not found", id)
	}
	file := d.backingFile(id)
	dev, held, err := attach(file, v.Capacity)
	if err != nil {
		return nil, status.Errorf(codes.Internal, "volume %s: %v", id, err)
	}
	if held != nil {
		defer held.Close() // after the mount: from then on the mount keeps the device
	}
	if m, ok, err := mountedAt(staging); err != nil {
		return nil, status.Error(codes.Internal, err.Error())
	} else if ok {
		if m.devID != dev.id() {
			return nil, status.Errorf(codes.FailedPrecondition, "%s is already mounted from %s, not %s", staging, m.source, dev.path())
		}
		return &csi.NodeStageVolumeResponse{}, nil
	}
	formatted, err := hasExtFS(dev.path())
	if err != nil {
		return nil, status.Errorf(codes.Internal, "reading %s: %v", dev.path(), err)
	}
	if !formatted {
		if err := mkfs(dev.path(), v.Capacity); err != nil {
			return nil, status.Error(codes.Internal, err.Error())
		}
	} else if err := growUnmounted(dev); err != nil {
		return nil, status.Errorf(codes.Internal, "volume %s: %v", id, err)
	}
	if err := os.MkdirAll(staging, 0o750); err != nil {
		return nil, status.Error(codes.Internal, err.Error())
	}
	flags := uintptr(unix.MS_NOATIME)
	opts := strings.Join(req.GetVolumeCapability().GetMount().GetMountFlags(), ",")
	if err := unix.Mount(dev.path(), staging, "ext4", flags, opts); err != nil {
		return nil, status.Errorf(codes.Internal, "mount %s at %s: %v", dev.path(), staging, err)
	}
	log.Printf("NodeStageVolume %s: %s (%s) over %s mounted at %s (formatted now: %v)",
		id, dev.path(), dev.id(), file, staging, !formatted)
	return &csi.NodeStageVolumeResponse{}, nil
}

func (d *driver) NodeUnstageVolume(_ context.Context, req *csi.NodeUnstageVolumeRequest) (*csi.NodeUnstageVolumeResponse, error) {
	id, staging := req.GetVolumeId(), req.GetStagingTargetPath()
	if id == "" || staging == "" {
		return nil, status.Error(codes.InvalidArgument, "volume id and staging target path are required")
	}
	d.nodeMu.Lock()
	defer d.nodeMu.Unlock()
	for {
		_, ok, err := mountedAt(staging)
		if err != nil {
			return nil, status.Error(codes.Internal, err.Error())
		}
		if !ok {
			break
		}
		if err := unix.Unmount(staging, 0); err != nil {
			return nil, status.Errorf(codes.Internal, "unmount %s: %v", staging, err)
		}
	}
	// Autoclear detaches the device with its last mount; one made otherwise is cleared here.
	if err := detach(d.backingFile(id)); err != nil {
		return nil, status.Error(codes.Internal, err.Error())
	}
	log.Printf("NodeUnstageVolume %s: %s unmounted", id, staging)
	return &csi.NodeUnstageVolumeResponse{}, nil
}

func (d *driver) NodePublishVolume(_ context.Context, req *csi.NodePublishVolumeRequest) (*csi.NodePublishVolumeResponse, error) {
	id, staging, target := req.GetVolumeId(), req.GetStagingTargetPath(), req.GetTargetPath()
	if id == "" || staging == "" || target == "" {
		return nil, status.Error(codes.InvalidArgument, "volume id, staging and target paths are required")
	}
	if err := checkMountCapability(req.GetVolumeCapability()); err != nil {
		return nil, err
	}
	d.nodeMu.Lock()
	staged, ok, err := mountedAt(staging)
	if err != nil || !ok {
		d.nodeMu.Unlock()
		return nil, status.Errorf(codes.FailedPrecondition, "volume %s is not staged at %s", id, staging)
	}
	if m, ok, _ := mountedAt(target); ok {
		d.nodeMu.Unlock()
		if m.devID != staged.devID {
			return nil, status.Errorf(codes.FailedPrecondition, "%s is already mounted from %s", target, m.source)
		}
		return &csi.NodePublishVolumeResponse{}, nil
	}
	if err := os.MkdirAll(target, 0o750); err != nil {
		d.nodeMu.Unlock()
		return nil, status.Error(codes.Internal, err.Error())
	}
	if err := unix.Mount(staging, target, "", unix.MS_BIND, ""); err != nil {
		d.nodeMu.Unlock()
		return nil, status.Errorf(codes.Internal, "bind mount %s at %s: %v", staging, target, err)
	}
	if req.GetReadonly() {
		if err := unix.Mount("", target, "", unix.MS_BIND|unix.MS_REMOUNT|unix.MS_RDONLY, ""); err != nil {
			_ = unix.Unmount(target, 0)
			d.nodeMu.Unlock()
			return nil, status.Errorf(codes.Internal, "read-only remount of %s: %v", target, err)
		}
	}
	d.nodeMu.Unlock()
	ctx := req.GetVolumeContext()
	log.Printf("NodePublishVolume %s: %s at %s for pod %s/%s (uid %s)", id, staged.source, target,
		ctx["csi.storage.k8s.io/pod.namespace"], ctx["csi.storage.k8s.io/pod.name"], ctx["csi.storage.k8s.io/pod.uid"])
	// The pod's cgroup exists already (the kubelet makes it before it mounts volumes); its
	// containers' cgroups are limited as soon as they appear.
	if err := d.throttler.reconcile(); err != nil {
		return nil, status.Errorf(codes.Internal, "published, but the limits could not be applied: %v", err)
	}
	return &csi.NodePublishVolumeResponse{}, nil
}

func (d *driver) NodeUnpublishVolume(_ context.Context, req *csi.NodeUnpublishVolumeRequest) (*csi.NodeUnpublishVolumeResponse, error) {
	id, target := req.GetVolumeId(), req.GetTargetPath()
	if id == "" || target == "" {
		return nil, status.Error(codes.InvalidArgument, "volume id and target path are required")
	}
	d.nodeMu.Lock()
	for {
		_, ok, err := mountedAt(target)
		if err != nil {
			d.nodeMu.Unlock()
			return nil, status.Error(codes.Internal, err.Error())
		}
		if !ok {
			break
		}
		if err := unix.Unmount(target, 0); err != nil {
			d.nodeMu.Unlock()
			return nil, status.Errorf(codes.Internal, "unmount %s: %v", target, err)
		}
	}
	if err := os.Remove(target); err != nil && !errors.Is(err, os.ErrNotExist) {
		d.nodeMu.Unlock()
		return nil, status.Error(codes.Internal, err.Error())
	}
	d.nodeMu.Unlock()
	log.Printf("NodeUnpublishVolume %s: %s", id, target)
	if err := d.throttler.reconcile(); err != nil {
		log.Printf("NodeUnpublishVolume %s: clearing limits: %v", id, err)
	}
	return &csi.NodeUnpublishVolumeResponse{}, nil
}

// deviceBytes is the size the kernel gives the loop device now.
func deviceBytes(dev loopDevice) (int64, error) {
	data, err := os.ReadFile(filepath.Join("/sys/block", dev.name, "size"))
	if err != nil {
		return 0, err
	}
	sectors, err := strconv.ParseInt(strings.TrimSpace(string(data)), 10, 64)
	if err != nil {
		return 0, fmt.Errorf("%s size: %w", dev.name, err)
	}
	return sectors * 512, nil
}

// NodeExpandVolume grows a staged volume to the size asked for (at least the one the
// controller recorded): the backing file, then the loop device over it, then the mounted
// ext4, online. Each step only ever grows, so a repeated call finds nothing to do.
func (d *driver) NodeExpandVolume(_ context.Context, req *csi.NodeExpandVolumeRequest) (*csi.NodeExpandVolumeResponse, error) {
	id, path := req.GetVolumeId(), req.GetVolumePath()
	if id == "" {
		return nil, status.Error(codes.InvalidArgument, "Volume ID missing in request")
	}
	if path == "" {
		return nil, status.Error(codes.InvalidArgument, "Volume path missing in request")
	}
	if c := req.GetVolumeCapability(); c != nil {
		if err := checkMountCapability(c); err != nil {
			return nil, err
		}
	}
	v, ok := d.lookup(id)
	if !ok {
		return nil, status.Errorf(codes.NotFound, "volume %s not found", id)
	}
	size := v.Capacity
	if n := req.GetCapacityRange().GetRequiredBytes(); n > size {
		size = n
	}
	if limit := req.GetCapacityRange().GetLimitBytes(); limit > 0 && size > limit {
		return nil, status.Errorf(codes.OutOfRange, "volume %s is %d bytes, above the limit of %d", id, size, limit)
	}
	d.nodeMu.Lock()
	defer d.nodeMu.Unlock()
	file := d.backingFile(id)
	dev, staged := loopDevices()[file]
	if !staged {
		return nil, status.Errorf(codes.NotFound, "volume %s is not staged on this node", id)
	}
	// The kubelet passes the pod's target path (or the staging path): either way a mount of
	// this volume's device; anything else is not this volume.
	m, mounted, err := mountedAt(path)
	if err != nil {
		return nil, status.Error(codes.Internal, err.Error())
	}
	if !mounted || m.devID != dev.id() {
		return nil, status.Errorf(codes.NotFound, "%s is not a mount of volume %s (%s)", path, id, dev.path())
	}
	st, err := os.Stat(file)
	if err != nil {
		return nil, status.Errorf(codes.Internal, "volume %s: %v", id, err)
	}
	if st.Size() < size {
		if err := os.Truncate(file, size); err != nil {
			return nil, status.Errorf(codes.Internal, "growing %s to %d bytes: %v", file, size, err)
		}
	}
	devFile, err := os.OpenFile(dev.path(), os.O_RDWR, 0)
	if err != nil {
		return nil, status.Error(codes.Internal, err.Error())
	}
	err = unix.IoctlSetInt(int(devFile.Fd()), unix.LOOP_SET_CAPACITY, 0)
	devFile.Close()
	if err != nil {
		return nil, status.Errorf(codes.Internal, "LOOP_SET_CAPACITY %s: %v", dev.path(), err)
	}
	devSize, err := deviceBytes(dev)
	if err != nil {
		return nil, status.Error(codes.Internal, err.Error())
	}
	if devSize < size {
		return nil, status.Errorf(codes.Internal, "%s is %d bytes after LOOP_SET_CAPACITY, not %d", dev.path(), devSize, size)
	}
	t0 := time.Now()
	out, err := exec.Command("resize2fs", dev.path()).CombinedOutput()
	if err != nil {
		why := ""
		if !d.onlineExpansion {
			why = " (without CAP_SYS_RESOURCE a mounted ext4 cannot grow: expand the volume while it is not staged)"
		}
		return nil, status.Errorf(codes.Internal, "resize2fs %s: %v: %s%s", dev.path(), err, strings.TrimSpace(string(out)), why)
	}
	log.Printf("NodeExpandVolume %s: %s over %s is %d bytes; resize2fs of the ext4 at %s: %.2f s",
		id, dev.path(), file, devSize, path, time.Since(t0).Seconds())
	return &csi.NodeExpandVolumeResponse{CapacityBytes: devSize}, nil
}

// hasCapability says whether this process has capability c in its effective set.
func hasCapability(c int) bool {
	data, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return false
	}
	for _, line := range strings.Split(string(data), "\n") {
		if hex, ok := strings.CutPrefix(line, "CapEff:"); ok {
			set, err := strconv.ParseUint(strings.TrimSpace(hex), 16, 64)
			return err == nil && set&(1<<uint(c)) != 0
		}
	}
	return false
}
