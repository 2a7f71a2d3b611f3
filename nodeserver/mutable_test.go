package nodeserver

import (
	"strings"
	"sync"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	k8stesting "k8s.io/client-go/testing"

	"github.com/container-storage-interface/spec/lib/go/csi"

	"github.com/pods-as-volumes/pav/api/v1alpha1"
	"github.com/pods-as-volumes/pav/internal/fakekubelet"
	"github.com/pods-as-volumes/pav/podrunner"
)

// mutableSpec's staging, unstaging and node expansion pods show their
// mutableParams in their command.
const mutableSpec = "  provisioningModes: [Dynamic]\n  volumeCreation: {capacity: 1Mi}\n" +
	"  volumeStaging: {podTemplate: {spec: {containers: [{name: s, image: b, command: [stage, \"{{ mutableParams | tojson }}\"]}]}}}\n" +
	"  volumeUnstaging: {podTemplate: {spec: {containers: [{name: u, image: b, command: [unstage, \"{{ mutableParams | tojson }}\"]}]}}}\n" +
	"  volumeExpansion: {}\n" +
	"  volumeNodeExpansion: {podTemplate: {spec: {containers: [{name: g, image: b, command: [grow, \"{{ mutableParams | tojson }}\"]}]}}}\n"

// commands records the command of every pod created, by phase.
type commands struct {
	mu sync.Mutex
	by map[string][]string
}

func (e *env) recordCommands() *commands {
	c := &commands{by: map[string][]string{}}
	e.client.PrependReactor("create", "pods", func(a k8stesting.Action) (bool, runtime.Object, error) {
		pod := a.(k8stesting.CreateAction).GetObject().(*corev1.Pod)
		c.mu.Lock()
		defer c.mu.Unlock()
		ph := pod.Labels[podrunner.LabelPhase]
		cmd := strings.Join(pod.Spec.Containers[0].Command, " ")
		// A staging pod's command is wrapped by pav-report: its own follows "--".
		if _, own, wrapped := strings.Cut(cmd, " -- "); wrapped {
			cmd = own
		}
		c.by[ph] = append(c.by[ph], cmd)
		return false, nil, nil
	})
	return c
}

// last is the command of the last pod of a phase, "" if none was created.
func (c *commands) last(ph v1alpha1.Phase) string {
	c.mu.Lock()
	defer c.mu.Unlock()
	l := c.by[string(ph)]
	if len(l) == 0 {
		return ""
	}
	return l[len(l)-1]
}

func vac(name, driver string, params map[string]string) *storagev1.VolumeAttributesClass {
	return &storagev1.VolumeAttributesClass{ObjectMeta: metav1.ObjectMeta{Name: name}, DriverName: driver, Parameters: params}
}

// setClass names a VolumeAttributesClass on a PV, as external-provisioner
// (at creation) and external-resizer (once a modification succeeded) do.
func (e *env) setClass(pvName, class string) {
	e.t.Helper()
	pv, err := e.client.CoreV1().PersistentVolumes().Get(e.ctx, pvName, metav1.GetOptions{})
	if err != nil {
		e.t.Fatal(err)
	}
	pv.Spec.VolumeAttributesClassName = &class
	if _, err := e.client.CoreV1().PersistentVolumes().Update(e.ctx, pv, metav1.UpdateOptions{}); err != nil {
		e.t.Fatal(err)
	}
}

// TestMutableParamsOnTheNode: staging sees the parameters of the class its PV
// names, read at each staging; unstaging sees what staging saw; node
// expansion sees the class the PV names now (it may have been modified
// since); a PV without a class gives {}.
func TestMutableParamsOnTheNode(t *testing.T) {
	e := newEnv(t, mutableSpec, map[v1alpha1.Phase]podAction{
		v1alpha1.PhaseStaging: {outcome: fakekubelet.Outcome{Kind: fakekubelet.Run, Ready: true}, onStart: makeVolumeDir("x")},
	})
	cmds := e.recordCommands()
	e.add(vac("fast", "test", map[string]string{"readAheadKiB": "256"}), vac("faster", "test", map[string]string{"readAheadKiB": "1024"}))
	vc := e.dynamicVolume("vol-1", corev1.PersistentVolumeFilesystem)
	e.setClass("pv-vol-1", "fast")
	req := e.stageReq("vol-1", false)
	req.VolumeContext = vc
	unstage := &csi.NodeUnstageVolumeRequest{VolumeId: "vol-1", StagingTargetPath: req.StagingTargetPath}

	if _, err := e.srv.NodeStageVolume(e.ctx, req); err != nil {
		t.Fatal(err)
	}
	if got, want := cmds.last(v1alpha1.PhaseStaging), `stage {"readAheadKiB": "256"}`; got != want {
		t.Fatalf("staging %q, want %q", got, want)
	}
	// The volume is modified to "faster" while staged.
	e.setClass("pv-vol-1", "faster")
	if _, err := e.srv.NodeExpandVolume(e.ctx, expandNodeReq("vol-1", 3<<20, 0)); err != nil {
		t.Fatal(err)
	}
	if got, want := cmds.last(v1alpha1.PhaseNodeExpansion), `grow {"readAheadKiB": "1024"}`; got != want {
		t.Fatalf("node expansion %q, want %q", got, want)
	}
	if _, err := e.srv.NodeUnstageVolume(e.ctx, unstage); err != nil {
		t.Fatal(err)
	}
	if got, want := cmds.last(v1alpha1.PhaseUnstaging), `unstage {"readAheadKiB": "256"}`; got != want {
		t.Fatalf("unstaging %q, want %q (what staging saw)", got, want)
	}
	// Staged again: the class it has now.
	if _, err := e.srv.NodeStageVolume(e.ctx, req); err != nil {
		t.Fatal(err)
	}
	if got, want := cmds.last(v1alpha1.PhaseStaging), `stage {"readAheadKiB": "1024"}`; got != want {
		t.Fatalf("restaged %q, want %q", got, want)
	}
	if _, err := e.srv.NodeUnstageVolume(e.ctx, unstage); err != nil {
		t.Fatal(err)
	}

	// A PV without a class.
	vc = e.dynamicVolume("vol-2", corev1.PersistentVolumeFilesystem)
	req = e.stageReq("vol-2", false)
	req.VolumeContext = vc
	if _, err := e.srv.NodeStageVolume(e.ctx, req); err != nil {
		t.Fatal(err)
	}
	if got, want := cmds.last(v1alpha1.PhaseStaging), `stage {}`; got != want {
		t.Fatalf("staging without a class %q, want %q", got, want)
	}
}

// TestMutableParamsClassRefused: a class that is gone, or of another driver,
// fails the staging before any pod, naming the class, the PV and the fix.
func TestMutableParamsClassRefused(t *testing.T) {
	for _, tc := range []struct {
		name    string
		classes []runtime.Object
		want    []string
	}{
		{"gone", nil, []string{"VolumeAttributesClass fast, named by PersistentVolume pv-vol-1 (spec.volumeAttributesClassName), does not exist", "create it again (driverName test"}},
		{"another driver's", []runtime.Object{vac("fast", "ebs.csi.aws.com", map[string]string{"iops": "3000"})},
			[]string{"VolumeAttributesClass fast, named by PersistentVolume pv-vol-1 (spec.volumeAttributesClassName), is for driver ebs.csi.aws.com, not test"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t, mutableSpec, map[v1alpha1.Phase]podAction{
				v1alpha1.PhaseStaging: {outcome: fakekubelet.Outcome{Kind: fakekubelet.Run, Ready: true}, onStart: makeVolumeDir("x")},
			})
			e.add(tc.classes...)
			vc := e.dynamicVolume("vol-1", corev1.PersistentVolumeFilesystem)
			e.setClass("pv-vol-1", "fast")
			req := e.stageReq("vol-1", false)
			req.VolumeContext = vc
			_, err := e.srv.NodeStageVolume(e.ctx, req)
			if status.Code(err) != codes.FailedPrecondition {
				t.Fatalf("error %v, want FailedPrecondition", err)
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not say %q", err, w)
				}
			}
			if n := e.count(v1alpha1.PhaseStaging); n != 0 {
				t.Fatalf("%d staging pods, want none", n)
			}
		})
	}
}
