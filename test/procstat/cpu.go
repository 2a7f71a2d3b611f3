package procstat

import (
	"regexp"
	"slices"
	"strings"

	"github.com/prometheus/procfs"
)

// userHZ is the unit of /proc's CPU times: the kernel's USER_HZ, 100 on every Linux
// architecture pav's nodes run (procfs assumes the same).
const userHZ = 100

// CPU is what the machine's processors, and each of its processes, had spent at one
// moment: read it before something and pass it to Spent after, to tell what that cost.
// The benchmarks run on the machine of the local cluster, whose nodes (kubelets,
// containerd, the control plane and every pod) are processes of this /proc.
type CPU struct {
	busy  float64          // seconds, all processors
	procs map[int]procTime // by PID
}

type procTime struct {
	start uint64 // in clock ticks since boot: a PID reused in between is another process
	ticks int    // utime+stime+cutime+cstime
}

// ReadCPU reads the machine's busy time and every process's CPU time.
func ReadCPU() (CPU, error) {
	busy, all, err := machine()
	if err != nil {
		return CPU{}, err
	}
	c := CPU{busy: busy, procs: make(map[int]procTime, len(all))}
	for _, p := range all {
		if s, err := p.Stat(); err == nil {
			c.procs[p.PID] = procTime{start: s.Starttime, ticks: ticks(s)}
		}
	}
	return c, nil
}

// machine reads the time all processors spent on anything but idling or waiting
// for I/O, in seconds, and lists the processes.
func machine() (busy float64, all procfs.Procs, err error) {
	fs, err := procfs.NewDefaultFS()
	if err != nil {
		return 0, nil, err
	}
	st, err := fs.Stat()
	if err != nil {
		return 0, nil, err
	}
	t := st.CPUTotal
	all, err = fs.AllProcs()
	return t.User + t.Nice + t.System + t.IRQ + t.SoftIRQ + t.Steal, all, err
}

// ticks is a process's CPU time and that of the children it reaped: a short-lived
// helper (runc, a CNI plugin, a mount) counts for the process that started it.
func ticks(s procfs.ProcStat) int { return int(s.UTime) + int(s.STime) + s.CUTime + s.CSTime }

// Proc is a process's CPU time between two readings, with what tells its part in the
// cluster.
type Proc struct {
	PID     int
	Comm    string
	Seconds float64
	// PodUID is the pod whose cgroup the process runs in ("" outside pods).
	PodUID string
	// NodeInit: the first process of a PID namespace other than the machine's, such as
	// a local cluster node's init. It reaps its node's orphans (container shims, which
	// detach from containerd), whose CPU time it then carries.
	NodeInit bool
	// Kernel: a kernel thread (kworkers tearing down cgroups and network namespaces,
	// writeback).
	Kernel bool
}

// podUID is the UID of the pod whose cgroup path is path, or "".
func podUID(path string) string {
	if m := podCgroup.FindStringSubmatch(path); m != nil {
		return strings.ReplaceAll(m[1], "_", "-")
	}
	return ""
}

// podCgroup finds a kubepods cgroup's pod UID, with the cgroupfs driver's dashes or
// the systemd driver's underscores ("pod94c1…" or "kubepods-burstable-pod94c1_….slice").
var podCgroup = regexp.MustCompile(`kubepods.*pod([0-9a-f]{8}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{12})`)

// Spent returns the seconds the machine's processors were busy since before, and the
// CPU time of each process alive now that spent any since (all of it for a process
// started since). A process that exited in between counts only through the one that
// reaped it, if that one is still alive: the machine's busy time has everything. The
// machine's own PID 1 is left out: it reaps every orphan of the machine (from long
// before), which cannot be told apart.
func Spent(before CPU) (busy float64, procs []Proc, err error) {
	now, all, err := machine()
	if err != nil {
		return 0, nil, err
	}
	for _, p := range all {
		if p.PID == 1 {
			continue
		}
		s, err := p.Stat()
		if err != nil {
			continue // exited meanwhile
		}
		d := ticks(s)
		if b, ok := before.procs[p.PID]; ok && b.start == s.Starttime {
			d -= b.ticks
		}
		if d <= 0 {
			continue
		}
		pr := Proc{PID: p.PID, Comm: s.Comm, Seconds: float64(d) / userHZ, Kernel: s.PPID == 2 || p.PID == 2}
		if cgs, err := p.Cgroups(); err == nil {
			for _, cg := range cgs {
				if pr.PodUID = podUID(cg.Path); pr.PodUID != "" {
					break
				}
			}
		}
		if st, err := p.NewStatus(); err == nil && len(st.NSpids) > 1 && st.NSpids[len(st.NSpids)-1] == 1 {
			pr.NodeInit = true
		}
		procs = append(procs, pr)
	}
	return now - before.busy, procs, nil
}

// The parts a process plays on the local cluster's machine (Role).
const (
	RoleNode    = "kubelet & container runtime"
	RoleControl = "control plane"
	RolePod     = "pod"
	RoleKernel  = "kernel threads"
	RoleOther   = "other processes"
)

// Role is the part the process plays: a pod's (whatever its command), a node's
// (the kubelet, containerd and its shims, runc, and a node's init, which reaps the
// shims), the control plane's (by command name: comm is the name's first 15 bytes,
// kube-controller-manager is "kube-controller"), the kernel's, or another.
func (p Proc) Role() string {
	switch {
	case p.PodUID != "":
		return RolePod
	case p.Kernel:
		return RoleKernel
	case p.NodeInit, p.Comm == "kubelet", p.Comm == "runc", strings.HasPrefix(p.Comm, "containerd"):
		return RoleNode
	case slices.Contains([]string{"kube-apiserver", "etcd", "kube-controller", "kube-scheduler"}, p.Comm):
		return RoleControl
	}
	return RoleOther
}
