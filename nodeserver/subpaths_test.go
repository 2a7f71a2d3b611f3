package nodeserver

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/pods-as-volumes/pav/api/v1alpha1"
	"github.com/pods-as-volumes/pav/internal/fakekubelet"
	"github.com/pods-as-volumes/pav/internal/hostmount"
)

func TestFindStaleSubPaths(t *testing.T) {
	const root = "/var/lib/kubelet/pods/"
	st := &staged{Handle: "h", PV: "pv-1"}
	byPV := map[string]*staged{"pv-1": st}
	target := hostmount.Mount{Path: root + "uid-1/volumes/kubernetes.io~csi/pv-1/mount", Dev: "0:77"}
	sub := func(uid, dev string) hostmount.Mount {
		return hostmount.Mount{Path: root + uid + "/volume-subpaths/vol/ctr/0", Dev: dev}
	}
	gone := func(string) error { return os.ErrNotExist }
	for _, tc := range []struct {
		name   string
		mounts []hostmount.Mount
		stat   func(string) error
		want   []string
	}{
		{"subPath of the pav volume, its directory deleted", []hostmount.Mount{target, sub("uid-1", "0:77")}, gone,
			[]string{root + "uid-1/volume-subpaths/vol/ctr/0"}},
		{"its directory still there", []hostmount.Mount{target, sub("uid-1", "0:77")}, func(string) error { return nil }, nil},
		{"stat fails otherwise (the kubelet unmounts on ESTALE itself)", []hostmount.Mount{target, sub("uid-1", "0:77")},
			func(string) error { return syscall.ESTALE }, nil},
		{"subPath of another file system of the pod", []hostmount.Mount{target, sub("uid-1", "0:78")}, gone, nil},
		{"the same file system, another pod (not published for it)", []hostmount.Mount{target, sub("uid-2", "0:77")}, gone, nil},
		{"a PV this plugin did not stage", []hostmount.Mount{{Path: root + "uid-1/volumes/kubernetes.io~csi/pv-9/mount", Dev: "0:77"}, sub("uid-1", "0:77")}, gone, nil},
		{"not a subPath mount", []hostmount.Mount{target, {Path: root + "uid-1/volumes/kubernetes.io~empty-dir/x", Dev: "0:77"}}, gone, nil},
		{"another kubelet root", []hostmount.Mount{
			{Path: "/srv/kubelet/pods/uid-1/volumes/kubernetes.io~csi/pv-1/mount", Dev: "0:77"},
			{Path: "/srv/kubelet/pods/uid-1/volume-subpaths/v/c/3", Dev: "0:77"}}, gone,
			[]string{"/srv/kubelet/pods/uid-1/volume-subpaths/v/c/3"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var got []string
			for _, sp := range findStaleSubPaths(tc.mounts, byPV, tc.stat) {
				if sp.st != st {
					t.Fatalf("%s attributed to %+v", sp.path, sp.st)
				}
				got = append(got, sp.path)
			}
			if !slices.Equal(got, tc.want) {
				t.Fatalf("got %q, want %q", got, tc.want)
			}
		})
	}
}

// TestReleaseStaleSubPaths: a subPath mount of a staged pav volume whose
// directory is gone (stat: ENOENT) is unmounted for the kubelet once its pod
// is being torn down, and only then.
func TestReleaseStaleSubPaths(t *testing.T) {
	deleting := func(p *corev1.Pod) { p.DeletionTimestamp = &metav1.Time{}; p.Finalizers = []string{"keep"} }
	terminated := corev1.ContainerStatus{State: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{}}}
	running := corev1.ContainerStatus{State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{}}}
	for _, tc := range []struct {
		name    string
		pod     func(p *corev1.Pod) // nil: no pod in the API
		keepDir bool                // the subPath's directory exists
		want    bool                // unmounted
	}{
		{"pod being deleted, containers stopped", func(p *corev1.Pod) {
			deleting(p)
			p.Status.ContainerStatuses = []corev1.ContainerStatus{terminated, terminated}
		}, false, true},
		{"pod gone from the API (force-deleted)", nil, false, true},
		{"pod being deleted, a container still runs", func(p *corev1.Pod) {
			deleting(p)
			p.Status.ContainerStatuses = []corev1.ContainerStatus{terminated, running}
		}, false, false},
		{"pod running, not deleted", func(p *corev1.Pod) {
			p.Status.ContainerStatuses = []corev1.ContainerStatus{terminated}
		}, false, false},
		{"the directory is there (the kubelet copes)", func(p *corev1.Pod) { deleting(p) }, true, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t, stagingSpec+unstagingSpec, map[v1alpha1.Phase]podAction{
				v1alpha1.PhaseStaging: {outcome: fakekubelet.Outcome{Kind: fakekubelet.Run, Ready: true}, onStart: makeVolumeDir("x")},
			})
			req := e.stageReq("vol-s", false)
			req.VolumeContext = e.dynamicVolume("vol-s", corev1.PersistentVolumeFilesystem)
			if _, err := e.srv.NodeStageVolume(e.ctx, req); err != nil {
				t.Fatal(err)
			}
			const uid = "pod-uid"
			if tc.pod != nil {
				p := userPod("user", node, "claim-vol-s")
				p.UID = uid
				tc.pod(p)
				e.add(p)
			}
			pods := filepath.Join(e.dir, "kubelet", "pods", uid)
			subPath := filepath.Join(pods, "volume-subpaths", "claim-vol-s", "ctr", "0")
			if tc.keepDir {
				if err := os.MkdirAll(subPath, 0o755); err != nil {
					t.Fatal(err)
				}
			}
			e.srv.Mounts = func() ([]hostmount.Mount, error) {
				return []hostmount.Mount{
					{Path: filepath.Join(pods, "volumes", "kubernetes.io~csi", "pv-vol-s", "mount"), Dev: "0:50"},
					{Path: subPath, Dev: "0:50"},
				}, nil
			}
			var unmounted []string
			e.srv.Unmount = func(p string) error { unmounted = append(unmounted, p); return nil }

			e.srv.ReleaseStaleSubPaths(e.ctx)

			events := e.drainEvents()
			if !tc.want {
				if len(unmounted) != 0 {
					t.Fatalf("unmounted %q", unmounted)
				}
				mustNotHave(t, events, ReasonStaleSubPathReleased)
				return
			}
			if !slices.Equal(unmounted, []string{subPath}) {
				t.Fatalf("unmounted %q, want %s", unmounted, subPath)
			}
			found := false
			for _, ev := range events {
				found = found || (strings.Contains(ev, ReasonStaleSubPathReleased) && strings.Contains(ev, subPath) && strings.Contains(ev, "kubernetes/kubernetes#139535"))
			}
			if !found {
				t.Fatalf("no %s event naming the mount: %q", ReasonStaleSubPathReleased, events)
			}
		})
	}
}

// TestBoundedStat: a stat that hangs (a FUSE server that does not answer) holds
// the check for the timeout at most, and is not started again while it hangs.
func TestBoundedStat(t *testing.T) {
	s := &Server{}
	release := make(chan struct{})
	var calls atomic.Int32
	hang := func(string) error { calls.Add(1); <-release; return os.ErrNotExist }
	if err := s.boundedStat("/p", hang, 10*time.Millisecond); err != nil {
		t.Fatalf("hung stat: %v, want no answer (nil)", err)
	}
	if err := s.boundedStat("/p", hang, 10*time.Millisecond); err != nil || calls.Load() != 1 {
		t.Fatalf("while the first hangs: %v, %d stats; want nil and no second stat", err, calls.Load())
	}
	close(release)
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(time.Millisecond) {
		if _, busy := s.statting.Load("/p"); !busy {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the hung stat's return was not noticed")
		}
	}
	if err := s.boundedStat("/p", hang, time.Second); !errors.Is(err, os.ErrNotExist) || calls.Load() != 2 {
		t.Fatalf("once it returned: %v, %d stats; want ENOENT from a new stat", err, calls.Load())
	}
}
