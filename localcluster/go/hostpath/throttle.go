// The block throttle: a volume's iops and throughput (its VolumeAttributesClass's mutable
// parameters) become the kernel's block-I/O limits on its loop device, for the processes of
// every pod that has the volume published — the semantics of the sandbox's emulation
// (localcluster/emulation/io_limits.py): reads and writes are each capped at the figure,
// throughput in MiB/s.
//
// cgroup v1 (blkio.throttle.*) is flat: a limit on the pod's cgroup does not apply to the
// processes of its children, and the kubelet runs each container in a child of it. So the
// limits are written into the pod's cgroup and into each container's, and an inotify watch
// on the pod's cgroup writes them into a container's cgroup as soon as the runtime makes it
// (before the container's process starts: runc creates the cgroup, then waits for `start`).
// cgroup v2 (io.max) is hierarchical: the pod's cgroup is enough.
//
// What is in force is derived from the machine each time (the mounts of our loop devices
// under <kubelet-dir>/pods/<uid>/, the cgroups of those pods), never from a record, so a
// restarted driver finds its pods again.
package main

import (
	"fmt"
	"log"
	"math"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

const mib = 1 << 20

type limits struct {
	bps  int64 // read and write bytes/s; 0 = none
	iops int64 // read and write IOs/s; 0 = none
}

func (l limits) String() string {
	if l == (limits{}) {
		return "no limit"
	}
	return fmt.Sprintf("%g MiB/s, %d IOPS", float64(l.bps)/mib, l.iops)
}

var throughputRE = regexp.MustCompile(`^\s*(\d+(?:\.\d+)?)\s*(Mi)?\s*$`)

// limitsOf reads iops and throughput (MiB/s, bare as on EBS or with GKE's "Mi") like
// IoLimits.from_class_parameters; other parameters are not limits.
func limitsOf(params map[string]string) (limits, error) {
	var l limits
	if t, ok := params["throughput"]; ok {
		m := throughputRE.FindStringSubmatch(t)
		if m == nil {
			return l, fmt.Errorf("throughput %q is not MiB/s", t)
		}
		f, err := strconv.ParseFloat(m[1], 64)
		// Beyond int64 bytes/s the conversion would wrap to a negative limit.
		if err != nil || f <= 0 || math.IsInf(f, 0) || f*mib >= math.MaxInt64 {
			return l, fmt.Errorf("throughput %q is not MiB/s", t)
		}
		l.bps = int64(f * mib)
	}
	if s, ok := params["iops"]; ok {
		n, err := strconv.ParseInt(strings.TrimSpace(s), 10, 64)
		if err != nil || n <= 0 {
			return l, fmt.Errorf("iops %q is not a positive integer", s)
		}
		l.iops = n
	}
	return l, nil
}

type hierarchy struct {
	version int
	mount   string
}

func findHierarchy() (hierarchy, error) {
	data, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return hierarchy{}, err
	}
	var v2 []string
	for _, line := range strings.Split(string(data), "\n") {
		left, right, ok := strings.Cut(line, " - ")
		if !ok {
			continue
		}
		lf, rf := strings.Fields(left), strings.Fields(right)
		if len(lf) < 5 || len(rf) < 3 {
			continue
		}
		point := unescapeMount(lf[4])
		switch rf[0] {
		case "cgroup":
			for _, opt := range strings.Split(rf[2], ",") {
				if opt == "blkio" {
					if _, err := os.Stat(filepath.Join(point, "blkio.throttle.write_bps_device")); err == nil {
						return hierarchy{1, point}, nil
					}
				}
			}
		case "cgroup2":
			v2 = append(v2, point)
		}
	}
	for _, point := range v2 {
		ctl, err := os.ReadFile(filepath.Join(point, "cgroup.controllers"))
		if err == nil && slices.Contains(strings.Fields(string(ctl)), "io") {
			return hierarchy{2, point}, nil
		}
	}
	return hierarchy{}, fmt.Errorf("neither a cgroup v1 blkio hierarchy with the throttle files nor a cgroup v2 tree with the io controller is mounted")
}

type throttler struct {
	d        *driver
	h        hierarchy
	kubepods string // <hierarchy>/<cgroup root>/kubepods
	podsDir  string // <kubelet-dir>/pods

	mu      sync.Mutex
	applied map[string]map[string]limits // cgroup dir -> device -> what was written
	watches map[string]int               // pod cgroup dir -> inotify watch
	inotify int
	kick    chan struct{}
}

func newThrottler(d *driver, cgroupRoot, podsDir string) (*throttler, error) {
	h, err := findHierarchy()
	if err != nil {
		return nil, err
	}
	fd, err := unix.InotifyInit1(unix.IN_CLOEXEC)
	if err != nil {
		return nil, fmt.Errorf("inotify: %w", err)
	}
	t := &throttler{
		d: d, h: h,
		kubepods: filepath.Join(h.mount, cgroupRoot, "kubepods"),
		podsDir:  filepath.Clean(podsDir),
		applied:  map[string]map[string]limits{},
		watches:  map[string]int{},
		inotify:  fd,
		kick:     make(chan struct{}, 1),
	}
	log.Printf("throttle: cgroup v%d at %s, pods' cgroups under %s", h.version, h.mount, t.kubepods)
	return t, nil
}

// run reconciles when a watched pod cgroup gets a child, and every second regardless.
func (t *throttler) run() {
	go func() {
		buf := make([]byte, 64<<10)
		for {
			n, err := unix.Read(t.inotify, buf)
			if err != nil && err != unix.EINTR {
				log.Printf("throttle: inotify read: %v", err)
				return
			}
			if n > 0 {
				select {
				case t.kick <- struct{}{}:
				default:
				}
			}
		}
	}()
	tick := time.NewTicker(time.Second)
	for {
		select {
		case <-t.kick:
		case <-tick.C:
		}
		if err := t.reconcile(); err != nil {
			log.Printf("throttle: %v", err)
		}
	}
}

// desired: pod uid -> device -> limits, from our loop devices' mounts under the pods dir.
func (t *throttler) desired() (map[string]map[string]limits, error) {
	devices := map[string]limits{} // device id -> limits of its volume
	prefix := filepath.Join(t.d.cfg.backingDir, t.d.cfg.backingPrefix)
	t.d.mu.Lock()
	for file, dev := range loopDevices() {
		if !strings.HasPrefix(file, prefix) || !strings.HasSuffix(file, ".img") {
			continue
		}
		id := strings.TrimSuffix(strings.TrimPrefix(file, prefix), ".img")
		if v, ok := t.d.volumes[id]; ok {
			l, err := limitsOf(v.Mutable)
			if err != nil {
				log.Printf("throttle: volume %s: %v", id, err)
			}
			devices[dev.id()] = l
		}
	}
	t.d.mu.Unlock()
	all, err := mounts()
	if err != nil {
		return nil, err
	}
	want := map[string]map[string]limits{}
	for _, m := range all {
		l, ours := devices[m.devID]
		rel, err := filepath.Rel(t.podsDir, m.mountPoint)
		if !ours || err != nil || strings.HasPrefix(rel, "..") {
			continue
		}
		uid := strings.SplitN(rel, string(filepath.Separator), 2)[0]
		if want[uid] == nil {
			want[uid] = map[string]limits{}
		}
		want[uid][m.devID] = l
	}
	return want, nil
}

// podCgroup finds pod<uid> under kubepods (guaranteed pods), kubepods/burstable or
// kubepods/besteffort (the cgroupfs driver's names).
func (t *throttler) podCgroup(uid string) string {
	for _, dir := range []string{t.kubepods, filepath.Join(t.kubepods, "burstable"), filepath.Join(t.kubepods, "besteffort")} {
		p := filepath.Join(dir, "pod"+uid)
		if st, err := os.Stat(p); err == nil && st.IsDir() {
			return p
		}
	}
	return ""
}

func (t *throttler) reconcile() error {
	if t == nil {
		return nil
	}
	// What to write is read under the lock too, so that a reconcile that read the old
	// parameters never writes after one that read the new.
	t.mu.Lock()
	defer t.mu.Unlock()
	want, err := t.desired()
	if err != nil {
		return err
	}
	targets := map[string]map[string]limits{} // cgroup dir -> device -> limits
	pods := map[string]bool{}
	for uid, devs := range want {
		pod := t.podCgroup(uid)
		if pod == "" {
			continue // not made yet, or gone: the next event or tick
		}
		pods[pod] = true
		dirs := []string{pod}
		if t.h.version == 1 {
			if _, ok := t.watches[pod]; !ok {
				wd, err := unix.InotifyAddWatch(t.inotify, pod, unix.IN_CREATE|unix.IN_ONLYDIR)
				if err == nil {
					t.watches[pod] = wd
				}
			}
			entries, _ := os.ReadDir(pod)
			for _, e := range entries {
				if e.IsDir() {
					dirs = append(dirs, filepath.Join(pod, e.Name()))
				}
			}
		}
		for _, dir := range dirs {
			targets[dir] = devs
		}
	}
	var firstErr error
	for dir, devs := range targets {
		for dev, l := range devs {
			if old, ok := t.applied[dir][dev]; ok && old == l {
				continue
			}
			if err := t.write(dir, dev, l); err != nil {
				if os.IsNotExist(err) {
					continue // the container went meanwhile
				}
				if firstErr == nil {
					firstErr = err
				}
				continue
			}
			if t.applied[dir] == nil {
				t.applied[dir] = map[string]limits{}
			}
			t.applied[dir][dev] = l
			log.Printf("throttle: %s on %s: %v", dir, dev, l)
		}
	}
	// Pods that no longer have a volume of ours published get their limits back to none.
	for dir, devs := range t.applied {
		for dev := range devs {
			if _, ok := targets[dir][dev]; ok {
				continue
			}
			if err := t.write(dir, dev, limits{}); err == nil {
				log.Printf("throttle: %s on %s: cleared", dir, dev)
			}
			delete(devs, dev)
		}
		if len(devs) == 0 {
			delete(t.applied, dir)
		}
	}
	for pod, wd := range t.watches {
		if !pods[pod] {
			_, _ = unix.InotifyRmWatch(t.inotify, uint32(wd))
			delete(t.watches, pod)
		}
	}
	return firstErr
}

func (t *throttler) write(dir, dev string, l limits) error {
	if t.h.version == 1 {
		for file, v := range map[string]int64{
			"blkio.throttle.read_bps_device":   l.bps,
			"blkio.throttle.write_bps_device":  l.bps,
			"blkio.throttle.read_iops_device":  l.iops,
			"blkio.throttle.write_iops_device": l.iops,
		} {
			// 0 removes the limit.
			if err := os.WriteFile(filepath.Join(dir, file), []byte(fmt.Sprintf("%s %d\n", dev, v)), 0); err != nil {
				return err
			}
		}
		return nil
	}
	value := func(n int64) string {
		if n == 0 {
			return "max"
		}
		return strconv.FormatInt(n, 10)
	}
	line := fmt.Sprintf("%s rbps=%s wbps=%s riops=%s wiops=%s\n", dev, value(l.bps), value(l.bps), value(l.iops), value(l.iops))
	err := os.WriteFile(filepath.Join(dir, "io.max"), []byte(line), 0)
	if os.IsNotExist(err) {
		// The io controller is not enabled for the pod's cgroup: enable it from the top.
		if enableErr := t.enableIO(dir); enableErr != nil {
			return enableErr
		}
		err = os.WriteFile(filepath.Join(dir, "io.max"), []byte(line), 0)
	}
	return err
}

func (t *throttler) enableIO(dir string) error {
	rel, err := filepath.Rel(t.h.mount, dir)
	if err != nil {
		return err
	}
	parent := t.h.mount
	for _, part := range strings.Split(rel, string(filepath.Separator)) {
		control := filepath.Join(parent, "cgroup.subtree_control")
		cur, _ := os.ReadFile(control)
		if !slices.Contains(strings.Fields(string(cur)), "io") {
			if err := os.WriteFile(control, []byte("+io\n"), 0); err != nil {
				return fmt.Errorf("enabling io in %s: %w", control, err)
			}
		}
		parent = filepath.Join(parent, part)
	}
	return nil
}
