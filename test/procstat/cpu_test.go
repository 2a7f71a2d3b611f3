package procstat

import (
	"os"
	"os/exec"
	"testing"
	"time"
)

// Spent sees the CPU this process burns, and that of a child it reaped, in the
// machine's busy time and in this process's own line.
func TestSpent(t *testing.T) {
	before, err := ReadCPU()
	if err != nil {
		t.Skipf("no /proc to read: %v", err)
	}
	burn := func(d time.Duration) {
		for end := time.Now().Add(d); time.Now().Before(end); {
		}
	}
	burn(300 * time.Millisecond)
	// A child's CPU counts once it is reaped (cutime): sh spins for a while.
	if err := exec.Command("sh", "-c", `i=0; while [ $i -lt 200000 ]; do i=$((i+1)); done`).Run(); err != nil {
		t.Skipf("no sh: %v", err)
	}
	busy, procs, err := Spent(before)
	if err != nil {
		t.Fatal(err)
	}
	var self *Proc
	for i := range procs {
		if procs[i].PID == os.Getpid() {
			self = &procs[i]
		}
		if procs[i].Seconds <= 0 {
			t.Errorf("a process that spent nothing is listed: %+v", procs[i])
		}
	}
	if self == nil {
		t.Fatalf("this process (%d) is not among the %d listed", os.Getpid(), len(procs))
	}
	// Ticks are 10 ms: 0.25 s of the 0.3 s burnt is a safe floor on a busy machine too.
	if self.Seconds < 0.25 {
		t.Errorf("this process spent %.2f s, want ≥ 0.25", self.Seconds)
	}
	if busy < self.Seconds-0.02 {
		t.Errorf("machine busy %.2f s < this process's %.2f s", busy, self.Seconds)
	}
	if self.Kernel || self.NodeInit {
		t.Errorf("this process is not a kernel thread nor a node's init: %+v", self)
	}
}

func TestPodUID(t *testing.T) {
	for _, tc := range []struct{ path, uid string }{
		{"/pav-vm-3/kubepods/burstable/pod94c111aa-53c2-494a-a52b-6bb07688b8d2/84e7b0dcc4dc", "94c111aa-53c2-494a-a52b-6bb07688b8d2"},
		{"/kubepods/besteffort/pod0b1c2d3e-4f50-6172-8394-a5b6c7d8e9f0", "0b1c2d3e-4f50-6172-8394-a5b6c7d8e9f0"},
		{"/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod94c111aa_53c2_494a_a52b_6bb07688b8d2.slice/cri-containerd-84e7.scope", "94c111aa-53c2-494a-a52b-6bb07688b8d2"},
		{"/system.slice/containerd.service", ""},
		{"/pod94c111aa-53c2-494a-a52b-6bb07688b8d2", ""}, // not under kubepods
		{"/", ""},
	} {
		if got := podUID(tc.path); got != tc.uid {
			t.Errorf("%s: pod %q, want %q", tc.path, got, tc.uid)
		}
	}
}

func TestRole(t *testing.T) {
	for _, tc := range []struct {
		p    Proc
		want string
	}{
		{Proc{Comm: "kubelet"}, RoleNode},
		{Proc{Comm: "containerd"}, RoleNode},
		{Proc{Comm: "containerd-shim"}, RoleNode},
		{Proc{Comm: "runc"}, RoleNode},
		{Proc{Comm: "bash", NodeInit: true}, RoleNode},
		{Proc{Comm: "kube-apiserver"}, RoleControl},
		{Proc{Comm: "etcd"}, RoleControl},
		{Proc{Comm: "kube-controller"}, RoleControl},
		{Proc{Comm: "kube-scheduler"}, RoleControl},
		// A pod's process is the pod's, whatever its name: a kubelet in a pod (kind) too.
		{Proc{Comm: "kubelet", PodUID: "94c111aa-53c2-494a-a52b-6bb07688b8d2"}, RolePod},
		{Proc{Comm: "pav-driver", PodUID: "94c111aa-53c2-494a-a52b-6bb07688b8d2"}, RolePod},
		{Proc{Comm: "kworker/u8:2", Kernel: true}, RoleKernel},
		{Proc{Comm: "bash"}, RoleOther},
		{Proc{Comm: "go"}, RoleOther},
	} {
		if got := tc.p.Role(); got != tc.want {
			t.Errorf("%+v: %q, want %q", tc.p, got, tc.want)
		}
	}
}
