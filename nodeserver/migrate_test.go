package nodeserver

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/pods-as-volumes/pav/api/v1alpha1"
	"github.com/pods-as-volumes/pav/internal/compat"
	"github.com/pods-as-volumes/pav/internal/fakekubelet"
	"github.com/pods-as-volumes/pav/internal/grpcerr"
	"github.com/pods-as-volumes/pav/internal/hostmount"
	"github.com/pods-as-volumes/pav/internal/provisioner"
	"github.com/pods-as-volumes/pav/podrunner"
)

// v020State is a state.json as v0.2.0 wrote it (its nodeserver's staged
// struct): the staging pod's namespace, no pod identity, no boot ID.
const v020State = `{"handle":"h-1","volumeMode":"Filesystem","accessModes":["ReadWriteOnce"],"capacity":1048576,` +
	`"params":{"color":"blue"},"readOnly":false,"pv":"pvc-1","stagingTargetPath":"/var/lib/kubelet/plugins/kubernetes.io/csi/test/x/globalmount",` +
	`"podNamespace":"default","staged":true}`

// devState is one a development build after v0.2.0 wrote: format 1's fields,
// without the version.
const devState = `{"handle":"h-1","volumeMode":"Filesystem","accessModes":["ReadWriteOnce"],"capacity":1048576,"params":{"color":"blue"},` +
	`"readOnly":false,"stagingTargetPath":"/s","bootID":"boot-0","stagingPod":{"namespace":"pav","name":"pav-test-staging-0","token":"t","uid":"u-dev"},` +
	`"began":true,"staged":true,"keepRunning":true,"volume":{"dev":1,"ino":2}}`

// legacyPod is v0.2.0's staging pod of volume h-1 on node: its labels and
// volume key annotation, no token.
func legacyPod(provisioner, volumeKey string, phase corev1.PodPhase) *corev1.Pod {
	return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: podrunner.PodName("test", v1alpha1.PhaseStaging, "h-1@"+node), UID: "u-legacy",
		Labels:      map[string]string{podrunner.LabelProvisioner: provisioner, podrunner.LabelPhase: string(v1alpha1.PhaseStaging), podrunner.LabelNode: podrunner.NodeLabel(node)},
		Annotations: map[string]string{podrunner.AnnotationVolumeKey: volumeKey}},
		Status: corev1.PodStatus{Phase: phase}}
}

// TestMigrateState migrates every older format with the facts of each case,
// and checks the state that results.
func TestMigrateState(t *testing.T) {
	boot := time.Date(2026, 11, 20, 8, 0, 0, 0, time.UTC)
	after, before := boot.Add(time.Hour), boot.Add(-time.Hour)
	id := &hostmount.Identity{Dev: 42, Ino: 7}
	for _, tc := range []struct {
		name    string
		state   string
		written time.Time
		pod     *corev1.Pod
		// what the state must say once migrated
		bootID         string
		stagingPod     *podID
		keepRunning    bool
		volume         *hostmount.Identity
		identifyCalled bool
	}{
		{name: "v0.2.0, staging pod completed (v0.2.0 deleted it)", state: v020State, written: after,
			bootID: "boot-now", volume: id, identifyCalled: true},
		{name: "v0.2.0, live mount: the running staging pod is recorded by UID and watched", state: v020State, written: after,
			pod:    legacyPod("test", "h-1@"+node, corev1.PodRunning),
			bootID: "boot-now", stagingPod: &podID{Namespace: "default", Name: podrunner.PodName("test", v1alpha1.PhaseStaging, "h-1@"+node), UID: "u-legacy"},
			keepRunning: true, volume: id, identifyCalled: true},
		{name: "v0.2.0, staging pod ended but not yet removed: recorded, for unstaging to remove", state: v020State, written: after,
			pod:    legacyPod("test", "h-1@"+node, corev1.PodSucceeded),
			bootID: "boot-now", stagingPod: &podID{Namespace: "default", Name: podrunner.PodName("test", v1alpha1.PhaseStaging, "h-1@"+node), UID: "u-legacy"},
			volume: id, identifyCalled: true},
		{name: "v0.2.0, a pod of that name for another volume: not ours", state: v020State, written: after,
			pod:    legacyPod("test", "h-2@"+node, corev1.PodRunning),
			bootID: "boot-now", volume: id, identifyCalled: true},
		{name: "v0.2.0, a pod of that name of another provisioner: not ours", state: v020State, written: after,
			pod:    legacyPod("other", "h-1@"+node, corev1.PodRunning),
			bootID: "boot-now", volume: id, identifyCalled: true},
		{name: "v0.2.0, staged before the node rebooted: stale, nothing of it trusted", state: v020State, written: before,
			bootID: "(a boot before 2026-11-20T08:00:00Z, when v0.2.0 staged the volume)"},
		{name: "v0.2.0, staging unfinished: no identity", state: strings.Replace(v020State, `"staged":true`, `"staged":false`, 1), written: after,
			bootID: "boot-now"},
		{name: "a development build after v0.2.0: what it recorded is kept", state: devState, written: after,
			bootID: "boot-0", stagingPod: &podID{Namespace: "pav", Name: "pav-test-staging-0", Token: "t", UID: "u-dev"}, keepRunning: true,
			volume: &hostmount.Identity{Dev: 1, Ino: 2}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			if err := os.WriteFile(filepath.Join(dir, "state.json"), []byte(tc.state), 0o600); err != nil {
				t.Fatal(err)
			}
			st, err := readStateFile(dir)
			if err != nil || st.FormatVersion != 0 {
				t.Fatalf("read %+v, %v", st, err)
			}
			identified := false
			f := nodeFacts{provisioner: "test", nodeID: node, bootID: "boot-now", bootTime: boot, written: tc.written,
				pod: func(ns, name string) (*corev1.Pod, error) {
					if tc.pod != nil && ns == tc.pod.Namespace && name == tc.pod.Name {
						return tc.pod, nil
					}
					return nil, nil
				},
				identify: func(string, *staged) (*hostmount.Identity, error) { identified = true; return id, nil }}
			if err := migrateState(dir, st, f); err != nil {
				t.Fatal(err)
			}
			if st.FormatVersion != stateFormat.Current || st.PodNamespace != "" {
				t.Errorf("format %d, podNamespace %q", st.FormatVersion, st.PodNamespace)
			}
			if st.BootID != tc.bootID || st.KeepRunning != tc.keepRunning || identified != tc.identifyCalled {
				t.Errorf("bootID %q keepRunning %v identified %v, want %q %v %v", st.BootID, st.KeepRunning, identified, tc.bootID, tc.keepRunning, tc.identifyCalled)
			}
			if got, want := jsonOf(st.StagingPod), jsonOf(tc.stagingPod); got != want {
				t.Errorf("staging pod %s, want %s", got, want)
			}
			if got, want := jsonOf(st.Volume), jsonOf(tc.volume); got != want {
				t.Errorf("volume %s, want %s", got, want)
			}
			// What v0.2.0 recorded of the request is kept.
			if st.Handle != "h-1" || st.Capacity != 1<<20 || st.Params["color"] != "blue" || st.VolumeMode != corev1.PersistentVolumeFilesystem {
				t.Errorf("migrated %+v", st)
			}
			// Written and read back: the current format, read as it is.
			if err := writeState(dir, st); err != nil {
				t.Fatal(err)
			}
			back, err := readState(dir)
			if err != nil || jsonOf(back) != jsonOf(st) {
				t.Errorf("read back %s (%v), wrote %s", jsonOf(back), err, jsonOf(st))
			}
		})
	}
}

func jsonOf(v any) string {
	b, _ := json.Marshal(v)
	return string(b)
}

// TestReadStateFormats: readState reads the current format only; an older one
// (not migrated) is retried, a newer one refused, naming both versions.
func TestReadStateFormats(t *testing.T) {
	old := compat.Release
	compat.Release = "v9.9.9-test"
	defer func() { compat.Release = old }()
	for _, tc := range []struct {
		name, state string
		code        codes.Code // OK: read
		msg         string
	}{
		{name: "current", state: `{"formatVersion":1,"handle":"h","staged":true}`},
		{name: "v0.2.0's, not migrated", state: v020State, code: codes.Unavailable, msg: "has format version 0 (v0.2.0, or a development build after it (no format version)), which the node plugin migrates when it starts"},
		{name: "a newer pav's", state: `{"formatVersion":2,"handle":"h","staged":true,"replicas":3}`, code: codes.FailedPrecondition,
			msg: `state.json of volume "h" has format version 2 (written by a pav newer than v9.9.9-test), newer than version 1, the newest this pav (v9.9.9-test) reads: pav was downgraded`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			if err := os.WriteFile(filepath.Join(dir, "state.json"), []byte(tc.state), 0o600); err != nil {
				t.Fatal(err)
			}
			st, err := readState(dir)
			if tc.code == codes.OK {
				if err != nil || st.Handle != "h" {
					t.Fatalf("%+v, %v", st, err)
				}
				return
			}
			if got := status.Convert(grpcerr.Status(err)); st != nil || got.Code() != tc.code || !strings.Contains(got.Message(), tc.msg) {
				t.Fatalf("%+v, %v; want %v %q", st, err, tc.code, tc.msg)
			}
		})
	}
}

// TestUpgradeFromV020 is an upgrade on one node: v0.2.0 staged a live volume
// (its staging pod keeps running) and a client uses it; the new node plugin
// starts, migrates the state, publishes the volume again without staging it
// again, watches the old staging pod, and unstaging removes that pod (by the
// UID the migration recorded) and runs the unstaging pod; a state of a newer
// pav is left alone and refused.
func TestUpgradeFromV020(t *testing.T) {
	e := newEnv(t, stagingSpec+unstagingSpec, map[v1alpha1.Phase]podAction{
		v1alpha1.PhaseStaging: {outcome: fakekubelet.Outcome{Kind: fakekubelet.Run, Ready: true}, onStart: makeVolumeDir("from v0.2.0")},
	})
	req := e.stageReq("h-1", false)
	dir := e.srv.volumeDir("h-1")
	// v0.2.0's staging: its pod (no token), running on the volume's /pav, and
	// its state.json.
	op := e.srv.podOperation("test", v1alpha1.PhaseStaging, "h-1", corev1.PodTemplateSpec{Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "s", Image: "b"}}}})
	op.Template.Namespace = "default"
	pod, err := podrunner.BuildPod(op, podrunner.PodConfig{ReportImage: "pav:v0.2.0"})
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := pod.Annotations[podrunner.AnnotationToken]; ok {
		t.Fatal("a pod without a token was expected")
	}
	if _, err := e.client.CoreV1().Pods("default").Create(e.ctx, pod, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the v0.2.0 staging pod running and ready", func() bool {
		p, err := e.client.CoreV1().Pods("default").Get(e.ctx, pod.Name, metav1.GetOptions{})
		return err == nil && p.Status.Phase == corev1.PodRunning && fileExists(filepath.Join(dir, "pav", "volume", "data"))
	})
	state := strings.Replace(v020State, `"stagingTargetPath":"/var/lib/kubelet/plugins/kubernetes.io/csi/test/x/globalmount"`,
		`"stagingTargetPath":"`+req.StagingTargetPath+`"`, 1)
	if err := os.WriteFile(filepath.Join(dir, "state.json"), []byte(state), 0o600); err != nil {
		t.Fatal(err)
	}
	// A volume a newer pav staged.
	newer := e.srv.volumeDir("h-newer")
	if err := os.MkdirAll(newer, 0o750); err != nil {
		t.Fatal(err)
	}
	newerState := `{"formatVersion":2,"handle":"h-newer","staged":true}`
	if err := os.WriteFile(filepath.Join(newer, "state.json"), []byte(newerState), 0o600); err != nil {
		t.Fatal(err)
	}

	// The upgraded node plugin starts.
	srv := e.newServer(e.srv.Source.(provisioner.Static).P)
	waitFor(t, "the runner's cache to hold the v0.2.0 staging pod", func() bool {
		p, _ := srv.Pods.Cached("default", pod.Name)
		return p != nil
	})
	if err := srv.MigrateStates(e.ctx, "test"); err != nil {
		t.Fatal(err)
	}
	st, err := readState(dir)
	if err != nil {
		t.Fatal(err)
	}
	live, _ := srv.Pods.Cached("default", pod.Name)
	if st.StagingPod == nil || st.StagingPod.UID != live.UID || !st.KeepRunning || st.Volume == nil || st.BootID == "" {
		t.Fatalf("migrated state %s", jsonOf(st))
	}
	if b, _ := os.ReadFile(filepath.Join(newer, "state.json")); string(b) != newerState {
		t.Errorf("a newer pav's state was rewritten: %s", b)
	}

	// The client's volume is published again (a new pod of the claim)
	// without a second staging pod, and reads what v0.2.0's staging made.
	target := filepath.Join(e.dir, "pods-target", "a")
	pub := &csi.NodePublishVolumeRequest{VolumeId: "h-1", StagingTargetPath: req.StagingTargetPath, TargetPath: target, VolumeCapability: req.VolumeCapability}
	if _, err := srv.NodePublishVolume(e.ctx, pub); err != nil {
		t.Fatal(err)
	}
	if b, err := os.ReadFile(filepath.Join(target, "data")); err != nil || string(b) != "from v0.2.0" {
		t.Fatalf("published volume reads %q, %v", b, err)
	}
	if n := e.count(v1alpha1.PhaseStaging); n != 1 {
		t.Fatalf("%d staging pods, want v0.2.0's only", n)
	}
	if why, err := srv.healthOf(e.ctx, "h-1"); why != "" || err != nil {
		t.Fatalf("health: %q %v", why, err)
	}
	if _, err := srv.NodeUnpublishVolume(e.ctx, &csi.NodeUnpublishVolumeRequest{VolumeId: "h-1", TargetPath: target}); err != nil {
		t.Fatal(err)
	}

	// The newer state is refused, naming the versions, and left as it is.
	_, err = srv.NodeUnstageVolume(e.ctx, &csi.NodeUnstageVolumeRequest{VolumeId: "h-newer", StagingTargetPath: "/s"})
	if status.Code(err) != codes.FailedPrecondition || !strings.Contains(err.Error(), "has format version 2") {
		t.Fatalf("unstaging a newer pav's volume: %v", err)
	}
	if b, _ := os.ReadFile(filepath.Join(newer, "state.json")); string(b) != newerState {
		t.Errorf("a newer pav's state was rewritten: %s", b)
	}

	// Unstaging removes v0.2.0's staging pod and runs the unstaging pod.
	if _, err := srv.NodeUnstageVolume(e.ctx, &csi.NodeUnstageVolumeRequest{VolumeId: "h-1", StagingTargetPath: req.StagingTargetPath}); err != nil {
		t.Fatal(err)
	}
	if n := e.count(v1alpha1.PhaseUnstaging); n != 1 {
		t.Errorf("%d unstaging pods, want 1", n)
	}
	if _, err := e.client.CoreV1().Pods("default").Get(e.ctx, pod.Name, metav1.GetOptions{}); err == nil {
		t.Error("v0.2.0's staging pod is left")
	}
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Errorf("volume directory left: %v", err)
	}
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func fileExists(path string) bool {
	_, err := os.Stat(path)
	return err == nil
}
