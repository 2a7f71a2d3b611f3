//go:build bench

package bench

import (
	"context"
	"fmt"
	"io"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/pods-as-volumes/pav/test/procstat"
)

// What the machine's processors spent during a measure, split by the part each process
// plays: the bench runs on the machine of the local cluster, whose nodes, control plane
// and pods are all processes of this /proc (issue 37: what N at once costs on 2 cores).
// With every core busy, a measure cannot take less wall time than its CPU time divided by
// the cores; the split tells whose work that is.

// cpuGroups are the columns of the split, in order.
var cpuGroups = []string{procstat.RoleNode, procstat.RoleControl, ownGroup, "other pods", procstat.RoleKernel, procstat.RoleOther}

// ownGroup is the pods of the system measured (system.ownPods).
const ownGroup = "the system's own pods"

// cpuRows names peerMeasures' rows that have a CPU split (1 and 2).
var cpuRows = [3]string{1: "at once", 2: "deleted"}

// cpuUse is one window's CPU: the machine's busy core-seconds and the processes' split
// (what the processes that exited left with no live reaper is the difference).
type cpuUse struct {
	wall   time.Duration
	busy   float64
	groups map[string]float64
}

func (u cpuUse) attributed() float64 {
	var s float64
	for _, v := range u.groups {
		s += v
	}
	return s
}

// cpuWindow reads the CPU at a window's start; its end returns what the window cost.
type cpuWindow struct {
	start  time.Time
	before procstat.CPU
	ok     bool
}

func startCPU(t *testing.T) cpuWindow {
	c, err := procstat.ReadCPU()
	if err != nil {
		t.Logf("no CPU accounting: %v", err)
	}
	return cpuWindow{start: time.Now(), before: c, ok: err == nil}
}

// end is what the window cost, each process by its role (procstat.Proc.Role), a pod's as
// the system's own or another's by the namespace and name of the pod whose cgroup it runs
// in (own).
func (w cpuWindow) end(ctx context.Context, own func(namespace, name string) bool) (cpuUse, bool) {
	wall := time.Since(w.start)
	if !w.ok {
		return cpuUse{}, false
	}
	busy, procs, err := procstat.Spent(w.before)
	if err != nil {
		return cpuUse{}, false
	}
	type podRef struct{ ns, name string }
	pods := map[string]podRef{}
	if l, err := client.CoreV1().Pods("").List(ctx, metav1.ListOptions{ResourceVersion: "0"}); err == nil {
		for _, p := range l.Items {
			pods[string(p.UID)] = podRef{p.Namespace, p.Name}
		}
	}
	u := cpuUse{wall: wall, busy: busy, groups: map[string]float64{}}
	for _, p := range procs {
		g := p.Role()
		if g == procstat.RolePod {
			g = "other pods"
			if ref, ok := pods[p.PodUID]; ok && own(ref.ns, ref.name) {
				g = ownGroup
			}
		}
		u.groups[g] += p.Seconds
	}
	return u, true
}

// ownPods says which pods are a system's own: its plugins, and the pods it runs for
// volumes (pav's phase pods, local-path's helpers). pav's namespace also holds the other
// provisioners the cluster has installed, which are not the measured one's.
func (s *system) ownPods(namespace, name string) bool {
	switch s.key {
	case "pav":
		return namespace == pavNS && (strings.HasPrefix(name, "pav-"+peersProvisioner+"-") || strings.HasPrefix(name, "pav-manager-"))
	case "hostpath":
		return namespace == hostpathNS
	case "localpath":
		return namespace == localPathNS
	}
	return false
}

// idleCPU measures the machine with nothing measured running, for d.
func idleCPU(t *testing.T, ctx context.Context, d time.Duration) (cpuUse, bool) {
	w := startCPU(t)
	select {
	case <-ctx.Done():
	case <-time.After(d):
	}
	return w.end(ctx, func(string, string) bool { return false })
}

// printCPU is the split of the median repetition of the N-at-once rows, for each system.
func (run *peerRun) printCPU(w io.Writer) {
	cores := nproc()
	fmt.Fprintln(w)
	fmt.Fprintf(w, "CPU the machine spent (%d cores; core-seconds, from /proc: every node and pod of the local cluster runs on this machine), in the median repetition of each row", cores)
	if run.idle.wall > 0 {
		fmt.Fprintf(w, "; idle, the machine spends %.2f core-s per s (%s)", run.idle.busyRate(), run.idle.rates())
	}
	fmt.Fprintln(w, ":")
	fmt.Fprintln(w)
	// The last column is what no live process accounts for: positive for processes that
	// exited with no live reaper (a node's shims reparented to the machine's PID 1),
	// negative when a process reaped during the window had run before it (its whole
	// life then counts in its reaper's children's time).
	fmt.Fprintf(w, "| row | system | wall s | busy core-s | busy ÷ (cores × wall) | above idle | %s | unattributed (±: exited processes) |\n", strings.Join(cpuGroups, " | "))
	fmt.Fprintf(w, "|---|---|---:|---:|---:|---:|%s---:|\n", strings.Repeat("---:|", len(cpuGroups)))
	for i := 1; i <= 2; i++ {
		for _, s := range run.systems {
			u, ok := s.medianCPU(i)
			if !ok {
				continue
			}
			fmt.Fprintf(w, "| %s | %s | %.2f | %.1f | %.0f%% | %.1f | %s | %.1f |\n", cpuRows[i], s.title,
				u.wall.Seconds(), u.busy, 100*u.busyRate()/float64(max(cores, 1)), run.aboveIdle(u), u.cells(), u.busy-u.attributed())
		}
	}
	hp, pv := run.system("hostpath"), run.system("pav")
	for i := 1; i <= 2; i++ {
		a, okA := pv.medianCPU(i)
		b, okB := hp.medianCPU(i)
		if okA && okB && run.aboveIdle(b) > 0 {
			fmt.Fprintf(w, "\n%s: pav's CPU above idle is %.2f× host-path's (%.1f against %.1f core-s); pav's own pods (plugins, manager, phase pods) spent %.1f core-s of it (%.0f%%), the rest is the nodes' and the control plane's work.",
				cpuRows[i], run.aboveIdle(a)/run.aboveIdle(b), run.aboveIdle(a), run.aboveIdle(b),
				a.groups[ownGroup], 100*a.groups[ownGroup]/max(run.aboveIdle(a), 0.01))
		}
	}
	fmt.Fprintln(w)
}

// busyRate is the machine's busy core-seconds per second of the window.
func (u cpuUse) busyRate() float64 { return u.busy / u.wall.Seconds() }

// cells are the groups' core-seconds, as table cells.
func (u cpuUse) cells() string {
	c := make([]string, len(cpuGroups))
	for i, g := range cpuGroups {
		c[i] = fmt.Sprintf("%.1f", u.groups[g])
	}
	return strings.Join(c, " | ")
}

// rates are the groups' core-seconds per second, those of at least 0.005, as a list.
func (u cpuUse) rates() string {
	var c []string
	for _, g := range cpuGroups {
		if r := u.groups[g] / u.wall.Seconds(); r >= 0.005 {
			c = append(c, fmt.Sprintf("%s %.2f", g, r))
		}
	}
	return strings.Join(c, ", ")
}

// aboveIdle is a window's busy time less what the idle machine would have spent in it.
func (run *peerRun) aboveIdle(u cpuUse) float64 {
	if run.idle.wall <= 0 {
		return u.busy
	}
	return u.busy - run.idle.busyRate()*u.wall.Seconds()
}

// medianCPU is row i's CPU in the repetition whose wall time is the row's median.
func (s *system) medianCPU(i int) (cpuUse, bool) {
	if len(s.cpu[i]) == 0 || len(s.cpu[i]) != len(s.d[i]) {
		return cpuUse{}, false
	}
	return s.cpu[i][medianIndex(s.d[i])], true
}
