package nodeserver

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/pods-as-volumes/pav/api/v1alpha1"
	"github.com/pods-as-volumes/pav/internal/fakekubelet"
	"github.com/pods-as-volumes/pav/internal/hostmount"
	"github.com/pods-as-volumes/pav/internal/provisioner"
	"github.com/pods-as-volumes/pav/internal/volume"
)

const (
	inlineID = "csi-9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08"
	// inlineSpec makes an inline volume with every phase: the creation pod
	// reports the capacity, the staging pod's command shows its context.
	inlineSpec = `  provisioningModes: [Dynamic, Ephemeral]
  volumeValidation: {podTemplate: {spec: {containers: [{name: v, image: b}]}}}
  volumeCreation: {podTemplate: {spec: {containers: [{name: c, image: b}]}}}
  volumeDeletion: {podTemplate: {spec: {containers: [{name: d, image: b, command: [rm, "{{ handle }}", "{{ capacity }}", "{{ pod.name }}"]}]}}}
  volumeStaging: {podTemplate: {spec: {containers: [{name: s, image: b, command: [stage, "{{ handle }}", "{{ capacity }}", "{{ params.color | default('none') }}", "{{ pod.namespace }}/{{ pod.name }}", "{{ ephemeral }}", "{{ node.metadata.name }}"]}]}}}
  volumeUnstaging: {podTemplate: {spec: {containers: [{name: u, image: b}]}}}
`
)

// inlineActions: creation reports 2Ki, staging makes /pav/volume and keeps
// running (ready).
func inlineActions() map[v1alpha1.Phase]podAction {
	return map[v1alpha1.Phase]podAction{
		v1alpha1.PhaseCreation: {outcome: fakekubelet.Outcome{Files: map[string]string{"capacity": "2Ki"}}},
		v1alpha1.PhaseStaging:  {outcome: fakekubelet.Outcome{Kind: fakekubelet.Run, Ready: true}, onStart: makeVolumeDir("inline")},
	}
}

// inlineReq is the kubelet's NodePublishVolume of a pod's csi volume.
func (e *env) inlineReq(target string, attrs map[string]string) *csi.NodePublishVolumeRequest {
	vc := map[string]string{volume.KeyEphemeral: "true", volume.KeyPodName: "web", volume.KeyPodNamespace: "team-a",
		volume.KeyPodUID: "pod-uid", volume.KeyServiceAccountName: "default"}
	for k, v := range attrs {
		vc[k] = v
	}
	return &csi.NodePublishVolumeRequest{VolumeId: inlineID, TargetPath: target, VolumeContext: vc,
		VolumeCapability: &csi.VolumeCapability{AccessType: &csi.VolumeCapability_Mount{Mount: &csi.VolumeCapability_MountVolume{}},
			AccessMode: &csi.VolumeCapability_AccessMode{Mode: csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER}}}
}

// inlineRecord is the volume's PavVolume, or nil.
func (e *env) inlineRecord() *v1alpha1.PavVolume {
	e.t.Helper()
	u, err := e.records.Resource(v1alpha1.VolumeGroupVersionResource).Get(context.Background(), inlineID, metav1.GetOptions{})
	if err != nil {
		return nil
	}
	v := &v1alpha1.PavVolume{}
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, v); err != nil {
		e.t.Fatal(err)
	}
	return v
}

// nothingLeft checks that nothing of the inline volume is left: no record,
// marker, state, pod or mount.
func (e *env) nothingLeft(target string) {
	e.t.Helper()
	if v := e.inlineRecord(); v != nil {
		e.t.Errorf("PavVolume left: %+v", v.Status)
	}
	for _, path := range []string{e.srv.markerPath(inlineID), e.srv.volumeDir(inlineID), target} {
		if _, err := os.Stat(path); !os.IsNotExist(err) {
			e.t.Errorf("%s left: %v", path, err)
		}
	}
	pods, err := e.client.CoreV1().Pods("").List(context.Background(), metav1.ListOptions{})
	if err != nil {
		e.t.Fatal(err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for len(pods.Items) > 0 && time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond)
		pods, _ = e.client.CoreV1().Pods("").List(context.Background(), metav1.ListOptions{})
	}
	for _, p := range pods.Items {
		e.t.Errorf("pod left: %s (%s)", p.Name, p.Labels["pav.albertofaria.github.io/phase"])
	}
}

func TestInlineVolume(t *testing.T) {
	e := newEnv(t, inlineSpec, inlineActions())
	target := filepath.Join(e.dir, "pods", "web", "volumes", "vol")
	req := e.inlineReq(target, map[string]string{"color": "blue"})
	if _, err := e.srv.NodePublishVolume(e.ctx, req); err != nil {
		t.Fatal(err)
	}
	if b, err := os.ReadFile(filepath.Join(target, "data")); err != nil || string(b) != "inline" {
		t.Fatalf("published volume reads %q, %v", b, err)
	}
	v := e.inlineRecord()
	if v == nil || v.Status.Phase != v1alpha1.VolumeCreated || v.Status.Handle != inlineID || v.Status.Capacity != 2048 ||
		v.Spec.Ephemeral == nil || v.Spec.Ephemeral.Node != node || v.Spec.Ephemeral.Pod.UID != "pod-uid" || v.Spec.Params["color"] != "blue" {
		t.Fatalf("record %+v", v)
	}
	st, err := readState(e.srv.volumeDir(inlineID))
	if err != nil || st == nil || !st.Staged || st.Pod == nil || st.Pod.Name != "web" || st.StagedAt != "" || st.Capacity != 2048 {
		t.Fatalf("state %+v, %v", st, err)
	}
	stage := e.podCommand(v1alpha1.PhaseStaging)
	if want := "stage " + inlineID + " 2048 blue team-a/web True " + node; stage != want {
		t.Fatalf("staging command %q, want %q", stage, want)
	}
	// Again (a retry, a restarted kubelet): OK, no pod.
	for range 2 {
		if _, err := e.srv.NodePublishVolume(e.ctx, req); err != nil {
			t.Fatal(err)
		}
		e.srv = e.newServer(e.srv.Source.(provisioner.Static).P)
	}
	for ph, want := range map[v1alpha1.Phase]int{v1alpha1.PhaseValidation: 1, v1alpha1.PhaseCreation: 1, v1alpha1.PhaseStaging: 1, v1alpha1.PhaseDeletion: 0} {
		if n := e.count(ph); n != want {
			t.Errorf("%d %s pods, want %d", n, ph, want)
		}
	}
	// The pod goes: everything goes.
	if _, err := e.srv.NodeUnpublishVolume(e.ctx, &csi.NodeUnpublishVolumeRequest{VolumeId: inlineID, TargetPath: target}); err != nil {
		t.Fatal(err)
	}
	for ph, want := range map[v1alpha1.Phase]int{v1alpha1.PhaseUnstaging: 1, v1alpha1.PhaseDeletion: 1} {
		if n := e.count(ph); n != want {
			t.Errorf("%d %s pods, want %d", n, ph, want)
		}
	}
	if got := e.podCommand(v1alpha1.PhaseDeletion); got != "rm "+inlineID+" 2048 web" {
		t.Errorf("deletion command %q", got)
	}
	e.nothingLeft(target)
	// Unpublished again, or an id it never knew: OK.
	for _, id := range []string{inlineID, "csi-unknown"} {
		if _, err := e.srv.NodeUnpublishVolume(e.ctx, &csi.NodeUnpublishVolumeRequest{VolumeId: id, TargetPath: target}); err != nil {
			t.Fatal(err)
		}
	}
}

// podCommand is the command of the last pod of a phase, without pav-report's
// wrapper.
func (e *env) podCommand(ph v1alpha1.Phase) string {
	e.mu.Lock()
	defer e.mu.Unlock()
	c := e.commands[string(ph)]
	if _, after, ok := strings.Cut(c, " -- "); ok {
		return after
	}
	return c
}

// TestInlineVolumeRefused: what is refused before anything is made gets a
// final error that names the problem and its fix, and leaves nothing.
func TestInlineVolumeRefused(t *testing.T) {
	failing := inlineActions()
	failing[v1alpha1.PhaseValidation] = podAction{outcome: fakekubelet.Outcome{Kind: fakekubelet.Fail,
		Files: map[string]string{"error": "volumeAttributes key size must be a quantity such as 1Gi, not \"big\""}}}
	for _, tc := range []struct {
		name    string
		spec    string
		actions map[v1alpha1.Phase]podAction
		edit    func(*csi.NodePublishVolumeRequest)
		code    codes.Code
		msg     string
	}{
		{name: "a reserved attribute", spec: inlineSpec, actions: inlineActions(),
			edit: func(r *csi.NodePublishVolumeRequest) { r.VolumeContext[volume.KeyCapacity] = "1" },
			code: codes.InvalidArgument, msg: `volumeAttributes key "pav.albertofaria.github.io/capacity" is reserved`},
		{name: "the validation pod refuses an attribute", spec: inlineSpec, actions: failing,
			code: codes.InvalidArgument, msg: `volumeAttributes key size must be a quantity such as 1Gi, not "big"`},
		{name: "a provisioner without Ephemeral", spec: strings.Replace(inlineSpec, "[Dynamic, Ephemeral]", "[Dynamic]", 1), actions: inlineActions(),
			code: codes.InvalidArgument, msg: `PavProvisioner "test" does not allow inline ephemeral volumes (a pod's csi volume): add Ephemeral to its spec.provisioningModes`},
		{name: "no pod information (a CSIDriver without podInfoOnMount)", spec: inlineSpec, actions: inlineActions(),
			edit: func(r *csi.NodePublishVolumeRequest) { delete(r.VolumeContext, volume.KeyPodUID) },
			code: codes.InvalidArgument, msg: "the volume context lacks the pod"},
		{name: "a staging target path", spec: inlineSpec, actions: inlineActions(),
			edit: func(r *csi.NodePublishVolumeRequest) { r.StagingTargetPath = "/somewhere" },
			code: codes.InvalidArgument, msg: "never staged by the caller"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t, tc.spec, tc.actions)
			target := filepath.Join(e.dir, "pods", "web", "volumes", "vol")
			req := e.inlineReq(target, map[string]string{"size": "big"})
			if tc.edit != nil {
				tc.edit(req)
			}
			_, err := e.srv.NodePublishVolume(e.ctx, req)
			if status.Code(err) != tc.code || !strings.Contains(status.Convert(err).Message(), tc.msg) {
				t.Fatalf("error %v, want %v %q", err, tc.code, tc.msg)
			}
			e.nothingLeft(target)
			if n := e.count(v1alpha1.PhaseCreation) + e.count(v1alpha1.PhaseStaging); n != 0 {
				t.Fatalf("%d creation or staging pods", n)
			}
		})
	}
}

// TestInlineVolumeStagingFails: a staging that fails after the volume was
// created answers ABORTED (the kubelet then unpublishes when the pod goes),
// and keeps the volume for the retry; the pod's deletion removes it all.
func TestInlineVolumeStagingFails(t *testing.T) {
	actions := inlineActions()
	actions[v1alpha1.PhaseStaging] = podAction{outcome: fakekubelet.Outcome{Kind: fakekubelet.Fail, Files: map[string]string{"error": "cannot reach the backend"}}}
	e := newEnv(t, inlineSpec, actions)
	target := filepath.Join(e.dir, "pods", "web", "volumes", "vol")
	req := e.inlineReq(target, nil)
	_, err := e.srv.NodePublishVolume(e.ctx, req)
	if status.Code(err) != codes.Aborted || !strings.Contains(err.Error(), "cannot reach the backend") || !strings.Contains(err.Error(), "pav keeps its PavVolume") {
		t.Fatalf("error %v", err)
	}
	if v := e.inlineRecord(); v == nil || v.Status.Phase != v1alpha1.VolumeCreated {
		t.Fatalf("record %+v", v)
	}
	// The retry stages again (and the volume is not created again).
	e.setAction(v1alpha1.PhaseStaging, inlineActions()[v1alpha1.PhaseStaging])
	if _, err := e.srv.NodePublishVolume(e.ctx, req); err != nil {
		t.Fatal(err)
	}
	if c, s := e.count(v1alpha1.PhaseCreation), e.count(v1alpha1.PhaseStaging); c != 1 || s != 2 {
		t.Fatalf("%d creation, %d staging pods", c, s)
	}
	if _, err := e.srv.NodeUnpublishVolume(e.ctx, &csi.NodeUnpublishVolumeRequest{VolumeId: inlineID, TargetPath: target}); err != nil {
		t.Fatal(err)
	}
	e.nothingLeft(target)
}

// TestInlineVolumeRestarts: a node plugin that restarts while it creates or
// stages an inline volume loses nothing: the next NodePublishVolume adopts
// the recorded pods (no phase runs twice), or NodeUnpublishVolume (the pod
// went meanwhile) removes what was made.
func TestInlineVolumeRestarts(t *testing.T) {
	slow := map[v1alpha1.Phase]podAction{
		v1alpha1.PhaseCreation: {outcome: fakekubelet.Outcome{Files: map[string]string{"capacity": "2Ki"}, RunFor: 1500 * time.Millisecond}},
		v1alpha1.PhaseStaging: {outcome: fakekubelet.Outcome{Kind: fakekubelet.Run}, onStart: func(dir string) error {
			time.Sleep(1500 * time.Millisecond)
			if err := makeVolumeDir("inline")(dir); err != nil {
				return err
			}
			return os.WriteFile(filepath.Join(dir, "ready"), nil, 0o644)
		}},
	}
	for _, tc := range []struct {
		name    string
		slow    v1alpha1.Phase // whose pod is still running when the plugin restarts
		thenPod bool           // the pod goes (unpublish) rather than the publish being retried
	}{
		{"during creation, then published", v1alpha1.PhaseCreation, false},
		{"during staging, then published", v1alpha1.PhaseStaging, false},
		{"during creation, then the pod goes", v1alpha1.PhaseCreation, true},
		{"during staging, then the pod goes", v1alpha1.PhaseStaging, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			actions := inlineActions()
			actions[tc.slow] = slow[tc.slow]
			e := newEnv(t, inlineSpec, actions)
			target := filepath.Join(e.dir, "pods", "web", "volumes", "vol")
			req := e.inlineReq(target, nil)
			ctx, cancel := context.WithTimeout(e.ctx, 700*time.Millisecond)
			_, err := e.srv.NodePublishVolume(ctx, req)
			cancel()
			if st := status.Code(err); st != codes.DeadlineExceeded && st != codes.Canceled {
				t.Fatalf("error %v", err)
			}
			if _, err := os.Stat(e.srv.markerPath(inlineID)); err != nil {
				t.Fatalf("no marker: %v", err)
			}
			if n := e.count(tc.slow); n != 1 {
				t.Fatalf("%d %s pods", n, tc.slow)
			}
			// The plugin restarts; the pod it waited for goes on.
			e.srv = e.newServer(e.srv.Source.(provisioner.Static).P)
			if tc.thenPod {
				if _, err := e.srv.NodeUnpublishVolume(e.ctx, &csi.NodeUnpublishVolumeRequest{VolumeId: inlineID, TargetPath: target}); err != nil {
					t.Fatal(err)
				}
				e.nothingLeft(target)
				return
			}
			if _, err := e.srv.NodePublishVolume(e.ctx, req); err != nil {
				t.Fatal(err)
			}
			if mounted, err := hostmount.IsMountPoint(target); err != nil || !mounted {
				t.Fatalf("not published: %v", err)
			}
			for _, ph := range []v1alpha1.Phase{v1alpha1.PhaseValidation, v1alpha1.PhaseCreation, v1alpha1.PhaseStaging} {
				if n := e.count(ph); n != 1 {
					t.Errorf("%d %s pods, want 1", n, ph)
				}
			}
			if _, err := e.srv.NodeUnpublishVolume(e.ctx, &csi.NodeUnpublishVolumeRequest{VolumeId: inlineID, TargetPath: target}); err != nil {
				t.Fatal(err)
			}
			e.nothingLeft(target)
		})
	}
}

// TestInlineHandleNotStaged: a persistent volume with an inline volume's
// handle is neither staged nor takes the inline volume with it.
func TestInlineHandleNotStaged(t *testing.T) {
	e := newEnv(t, inlineSpec, inlineActions())
	target := filepath.Join(e.dir, "pods", "web", "volumes", "vol")
	if _, err := e.srv.NodePublishVolume(e.ctx, e.inlineReq(target, nil)); err != nil {
		t.Fatal(err)
	}
	req := e.stageReq(inlineID, false)
	if _, err := e.srv.NodeStageVolume(e.ctx, req); status.Code(err) != codes.FailedPrecondition || !strings.Contains(err.Error(), "is an inline ephemeral volume of pod team-a/web") {
		t.Fatalf("stage: %v", err)
	}
	other := filepath.Join(e.dir, "elsewhere")
	if _, err := e.srv.NodeUnpublishVolume(e.ctx, &csi.NodeUnpublishVolumeRequest{VolumeId: inlineID, TargetPath: other}); err != nil {
		t.Fatal(err)
	}
	if mounted, err := hostmount.IsMountPoint(target); err != nil || !mounted || e.inlineRecord() == nil {
		t.Fatalf("the inline volume went with another target: %v", err)
	}
	if _, err := e.srv.NodeUnpublishVolume(e.ctx, &csi.NodeUnpublishVolumeRequest{VolumeId: inlineID, TargetPath: target}); err != nil {
		t.Fatal(err)
	}
	e.nothingLeft(target)
}
