package controllerserver

import (
	"context"
	"maps"
	"strings"
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime"
	k8stesting "k8s.io/client-go/testing"

	"github.com/pods-as-volumes/pav/api/v1alpha1"
	"github.com/pods-as-volumes/pav/internal/records/recordstest"
	"github.com/pods-as-volumes/pav/podrunner"
)

// modifyBase makes 1 GiB volumes without a pod; each test adds its
// volumeModification.
const modifyBase = expandBase

// modifyPod is a modification pod whose command shows its context.
const modifyPod = `{mutableParameters: [readAheadKiB, tier], podTemplate: {spec: {containers: [{name: c, image: busybox, command: [modify, "{{ handle }}", "{{ capacity }}", "{{ params.color }}", "{{ mutableParams | tojson }}", "{{ previousMutableParams | tojson }}"]}]}}}`

func modifyReq(handle string, params map[string]string) *csi.ControllerModifyVolumeRequest {
	return &csi.ControllerModifyVolumeRequest{VolumeId: handle, MutableParameters: params}
}

// modificationEntries are the record's modification pod entries.
func modificationEntries(v *v1alpha1.PavVolume) []v1alpha1.VolumePod {
	var out []v1alpha1.VolumePod
	for _, e := range v.Status.Pods {
		if e.Phase == v1alpha1.PhaseModification {
			out = append(out, e)
		}
	}
	return out
}

func TestControllerModifyVolume(t *testing.T) {
	ra := func(kib string) map[string]string { return map[string]string{"readAheadKiB": kib} }
	for _, tc := range []struct {
		name     string
		spec     string            // volumeModification and the like, added to modifyBase
		created  map[string]string // CreateVolume's mutable_parameters
		req      *csi.ControllerModifyVolumeRequest
		answer   func(podrunner.Operation) (*podrunner.Result, error)
		wantCode codes.Code
		wantMsgs []string
		wantCur  map[string]string // the record's current mutable parameters after the call
		wantPods int               // modification pods created
		wantCmd  string            // the modification pod's command
	}{
		{name: "without a podTemplate the new parameters are only recorded", spec: "  volumeModification: {mutableParameters: [readAheadKiB]}\n",
			req: modifyReq("v1", ra("512")), wantCur: ra("512")},
		{name: "the pod sees the deletion context, the new and the previous parameters", spec: "  volumeModification: " + modifyPod + "\n",
			created: ra("128"), req: modifyReq("v1", ra("512")), wantCur: ra("512"), wantPods: 1,
			wantCmd: `modify v1 1073741824 blue {"readAheadKiB": "512"} {"readAheadKiB": "128"}`},
		{name: "the whole new set replaces the old one", spec: "  volumeModification: " + modifyPod + "\n",
			created: map[string]string{"readAheadKiB": "128", "tier": "gold"}, req: modifyReq("v1", map[string]string{"tier": "silver"}),
			wantCur: map[string]string{"tier": "silver"}, wantPods: 1,
			wantCmd: `modify v1 1073741824 blue {"tier": "silver"} {"readAheadKiB": "128", "tier": "gold"}`},
		{name: "from none: previousMutableParams is {}", spec: "  volumeModification: " + modifyPod + "\n",
			req: modifyReq("v1", ra("512")), wantCur: ra("512"), wantPods: 1,
			wantCmd: `modify v1 1073741824 blue {"readAheadKiB": "512"} {}`},
		{name: "the parameters it has: nothing to do", spec: "  volumeModification: " + modifyPod + "\n",
			created: ra("128"), req: modifyReq("v1", ra("128")), wantCur: ra("128")},
		{name: "no parameters: nothing to do (CSI: absent keys change nothing)", spec: "  volumeModification: " + modifyPod + "\n",
			created: ra("128"), req: modifyReq("v1", nil), wantCur: ra("128")},
		{name: "the sidecars' own keys are not the provisioner's", spec: "  volumeModification: " + modifyPod + "\n",
			req:     modifyReq("v1", map[string]string{"readAheadKiB": "512", "csi.storage.k8s.io/pvc/name": "data", "csi.storage.k8s.io/pv/name": "pv"}),
			wantCur: ra("512"), wantPods: 1, wantCmd: `modify v1 1073741824 blue {"readAheadKiB": "512"} {}`},
		{name: "an undeclared key: INVALID_ARGUMENT naming it, the declared set and the field; nothing runs", spec: "  volumeModification: " + modifyPod + "\n",
			created: ra("128"), req: modifyReq("v1", map[string]string{"readAheadKiB": "512", "iops": "3000"}),
			wantCode: codes.InvalidArgument, wantCur: ra("128"),
			wantMsgs: []string{`parameter "iops" is not mutable`, `declares ["readAheadKiB", "tier"] in spec.volumeModification.mutableParameters`}},
		{name: "no volumeModification: says so", spec: "",
			req: modifyReq("v1", ra("512")), wantCode: codes.InvalidArgument,
			wantMsgs: []string{`has ["readAheadKiB"], but PavProvisioner "test" has no spec.volumeModification`}},
		{name: "the pod fails: INTERNAL with its failure; the parameters stay", spec: "  volumeModification: " + modifyPod + "\n",
			created: ra("128"), req: modifyReq("v1", ra("999999")), answer: podFails("readAheadKiB 999999 is out of range"),
			wantCode: codes.Internal, wantMsgs: []string{"volume modification failed", "readAheadKiB 999999 is out of range"}, wantCur: ra("128"), wantPods: 1,
			wantCmd: `modify v1 1073741824 blue {"readAheadKiB": "999999"} {"readAheadKiB": "128"}`},
		{name: "a template error names the field", spec: "  volumeModification: {mutableParameters: [readAheadKiB], podTemplate: {spec: {containers: [{name: c, image: \"{{ nope }}\"}]}}}\n",
			req: modifyReq("v1", ra("512")), wantCode: codes.InvalidArgument, wantMsgs: []string{"spec.volumeModification.podTemplate"}},
		{name: "unknown volume", spec: "  volumeModification: " + modifyPod + "\n",
			req: modifyReq("nope", ra("512")), wantCode: codes.NotFound, wantMsgs: []string{`volume "nope" does not exist`}},
		{name: "no volume id", spec: "  volumeModification: " + modifyPod + "\n",
			req: modifyReq("", ra("512")), wantCode: codes.InvalidArgument, wantMsgs: []string{"volume id is required"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := prov(t, modifyBase+tc.spec)
			c := newCluster(t)
			runner := &fakeRunner{answers: answers{v1alpha1.PhaseModification: tc.answer}}
			cr := createReq("v1", 1, 0)
			cr.MutableParameters = tc.created
			if _, err := c.server(p, runner).CreateVolume(context.Background(), cr); err != nil {
				t.Fatal(err)
			}
			before := recordstest.Writes(c.records)
			_, err := c.server(p, runner).ControllerModifyVolume(context.Background(), tc.req)
			if status.Code(err) != tc.wantCode {
				t.Fatalf("error = %v, want %v", err, tc.wantCode)
			}
			for _, m := range tc.wantMsgs {
				if !strings.Contains(err.Error(), m) {
					t.Errorf("error %q does not say %q", err, m)
				}
			}
			v := c.volume("v1")
			if got := v.CurrentMutableParams(); !maps.Equal(got, tc.wantCur) {
				t.Errorf("record's mutable parameters %v, want %v", got, tc.wantCur)
			}
			if v.Status.Modification != nil || len(modificationEntries(v)) != 0 {
				t.Errorf("record left modification %+v, pods %+v", v.Status.Modification, v.Status.Pods)
			}
			if tc.wantCode == codes.InvalidArgument && recordstest.Writes(c.records) != before {
				t.Errorf("a refused modification wrote the record")
			}
			if tc.wantCode == codes.Internal && !strings.Contains(v.Status.Message, "volume modification failed") {
				t.Errorf("record message %q does not tell the failure", v.Status.Message)
			}
			if runner.created != tc.wantPods || runner.live() != 0 {
				t.Fatalf("%d modification pods created, %d left; want %d, 0", runner.created, runner.live(), tc.wantPods)
			}
			if got := runner.command(v1alpha1.PhaseModification); got != tc.wantCmd {
				t.Fatalf("command %q, want %q", got, tc.wantCmd)
			}
		})
	}
}

// TestModifyRetries: what a resizer's retries meet. Each step is one
// ControllerModifyVolume on a fresh server (a restarted driver shares nothing
// with the last but the API).
func TestModifyRetries(t *testing.T) {
	p := prov(t, modifyBase+"  volumeModification: "+modifyPod+"\n")
	type step struct {
		ra       string
		answer   func(podrunner.Operation) (*podrunner.Result, error)
		wantCode codes.Code
		wantCur  string // the record's readAheadKiB after the step
	}
	for _, tc := range []struct {
		name        string
		steps       []step
		wantCreated int
		wantTargets []string // readAheadKiB the pods were given, in order
	}{
		{name: "a timed-out call's retry adopts the same pod",
			steps: []step{
				{ra: "512", answer: stillRunning, wantCode: codes.DeadlineExceeded, wantCur: "128"},
				{ra: "512", answer: stillRunning, wantCode: codes.DeadlineExceeded, wantCur: "128"},
				{ra: "512", wantCur: "512"},
			},
			wantCreated: 1, wantTargets: []string{"512"}},
		{name: "a retry of another class finishes the recorded change first, then makes its own in a new pod",
			steps: []step{
				{ra: "512", answer: stillRunning, wantCode: codes.DeadlineExceeded, wantCur: "128"},
				{ra: "1024", wantCur: "1024"},
			},
			wantCreated: 2, wantTargets: []string{"512", "1024"}},
		{name: "back to the class it had: the recorded change finishes, then is undone",
			steps: []step{
				{ra: "512", answer: stillRunning, wantCode: codes.DeadlineExceeded, wantCur: "128"},
				{ra: "128", wantCur: "128"},
			},
			wantCreated: 2, wantTargets: []string{"512", "128"}},
		{name: "a failed pod: recorded, and the retry runs a new pod",
			steps: []step{
				{ra: "512", answer: podFails("device busy"), wantCode: codes.Internal, wantCur: "128"},
				{ra: "512", wantCur: "512"},
			},
			wantCreated: 2, wantTargets: []string{"512", "512"}},
		{name: "each change after a success runs a new pod; repeats run none",
			steps: []step{
				{ra: "512", wantCur: "512"},
				{ra: "512", wantCur: "512"},
				{ra: "256", wantCur: "256"},
				{ra: "256", wantCur: "256"},
			},
			wantCreated: 2, wantTargets: []string{"512", "256"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := newCluster(t)
			runner := &fakeRunner{answers: answers{}}
			cr := createReq("v1", 1, 0)
			cr.MutableParameters = map[string]string{"readAheadKiB": "128"}
			if _, err := c.server(p, runner).CreateVolume(context.Background(), cr); err != nil {
				t.Fatal(err)
			}
			for i, st := range tc.steps {
				runner.mu.Lock()
				runner.answers[v1alpha1.PhaseModification] = st.answer
				runner.mu.Unlock()
				_, err := c.server(p, runner).ControllerModifyVolume(context.Background(), modifyReq("v1", map[string]string{"readAheadKiB": st.ra}))
				if status.Code(err) != st.wantCode {
					t.Fatalf("step %d: %v, want %v", i, err, st.wantCode)
				}
				if got := c.volume("v1").CurrentMutableParams()["readAheadKiB"]; got != st.wantCur {
					t.Fatalf("step %d: recorded readAheadKiB %q, want %q", i, got, st.wantCur)
				}
			}
			var targets []string
			seen := map[string]bool{}
			for _, op := range runner.ops {
				if !seen[op.Token] {
					seen[op.Token] = true
					cmd := op.Template.Spec.Containers[0].Command[4]
					targets = append(targets, strings.TrimSuffix(strings.TrimPrefix(cmd, `{"readAheadKiB": "`), `"}`))
				}
			}
			if runner.created != tc.wantCreated || strings.Join(targets, " ") != strings.Join(tc.wantTargets, " ") || runner.live() != 0 {
				t.Fatalf("%d pods created for %v, %d left; want %d for %v, 0", runner.created, targets, runner.live(), tc.wantCreated, tc.wantTargets)
			}
			if v := c.volume("v1"); v.Status.Modification != nil || len(modificationEntries(v)) != 0 {
				t.Fatalf("record left %+v, %+v", v.Status.Modification, v.Status.Pods)
			}
		})
	}
}

// TestModifyRecordedBeforeThePod: the change and its pod's entry are in the
// record before the pod is asked for, and the new parameters before it is
// removed.
func TestModifyRecordedBeforeThePod(t *testing.T) {
	p := prov(t, modifyBase+"  volumeModification: "+modifyPod+"\n")
	c := newCluster(t)
	var atRun, atRemoval *v1alpha1.PavVolume
	runner := &fakeRunner{answers: answers{v1alpha1.PhaseModification: func(podrunner.Operation) (*podrunner.Result, error) {
		atRun = c.volume("v1")
		return &podrunner.Result{Files: map[string]string{}}, nil
	}}}
	s := c.server(p, runner)
	if _, err := s.CreateVolume(context.Background(), createReq("v1", 1, 0)); err != nil {
		t.Fatal(err)
	}
	c.records.PrependReactor("update", v1alpha1.VolumeResource, func(a k8stesting.Action) (bool, runtime.Object, error) {
		if runner.live() == 1 && len(runner.deleted) == 0 && atRemoval == nil {
			// The last write before the pod goes is the outcome.
			u := a.(k8stesting.UpdateAction).GetObject().(interface{ UnstructuredContent() map[string]any }).UnstructuredContent()
			if st, _ := u["status"].(map[string]any); st["mutableParams"] != nil {
				atRemoval = &v1alpha1.PavVolume{}
				if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u, atRemoval); err != nil {
					t.Error(err)
				}
			}
		}
		return false, nil, nil
	})
	if _, err := s.ControllerModifyVolume(context.Background(), modifyReq("v1", map[string]string{"tier": "gold"})); err != nil {
		t.Fatal(err)
	}
	if atRun == nil || atRun.Status.Modification == nil || atRun.Status.Modification.MutableParams["tier"] != "gold" || len(modificationEntries(atRun)) != 1 {
		t.Fatalf("when the pod ran, the record was %+v", atRun)
	}
	if atRemoval == nil || atRemoval.Status.MutableParams["tier"] != "gold" || atRemoval.Status.Modification != nil {
		t.Fatalf("before the pod was removed, the record was %+v", atRemoval)
	}
}

// TestModifyRestartBetweenPodAndRecord: the write of the new parameters fails
// (a restart at that point is the same): the pod stays, and the retry adopts
// it by its recorded UID and records its result. One pod in all.
func TestModifyRestartBetweenPodAndRecord(t *testing.T) {
	p := prov(t, modifyBase+"  volumeModification: "+modifyPod+"\n")
	c := newCluster(t)
	runner := &fakeRunner{}
	if _, err := c.server(p, runner).CreateVolume(context.Background(), createReq("v1", 1, 0)); err != nil {
		t.Fatal(err)
	}
	failed := false
	c.records.PrependReactor("update", v1alpha1.VolumeResource, func(a k8stesting.Action) (bool, runtime.Object, error) {
		u := a.(k8stesting.UpdateAction).GetObject().(interface{ UnstructuredContent() map[string]any }).UnstructuredContent()
		if st, _ := u["status"].(map[string]any); st["mutableParams"] != nil && !failed {
			failed = true
			return true, nil, apierrors.NewServiceUnavailable("etcd leader changed")
		}
		return false, nil, nil
	})
	want := map[string]string{"readAheadKiB": "512"}
	if _, err := c.server(p, runner).ControllerModifyVolume(context.Background(), modifyReq("v1", want)); status.Code(err) != codes.Unavailable {
		t.Fatalf("first call: %v, want Unavailable", err)
	}
	if v := c.volume("v1"); v.Status.Modification == nil || !maps.Equal(v.Status.Modification.MutableParams, want) || runner.live() != 1 {
		t.Fatalf("the modification must stay recorded with its pod: %+v, %d pods", v.Status, runner.live())
	}
	if _, err := c.server(p, runner).ControllerModifyVolume(context.Background(), modifyReq("v1", want)); err != nil {
		t.Fatalf("retry: %v", err)
	}
	if runner.created != 1 || runner.live() != 0 {
		t.Fatalf("%d modification pods created, %d left; want 1, 0", runner.created, runner.live())
	}
	if last := runner.ops[len(runner.ops)-1]; last.UID == "" {
		t.Error("the retry did not adopt the pod by its recorded UID")
	}
	if v := c.volume("v1"); !maps.Equal(v.Status.MutableParams, want) {
		t.Fatalf("record %+v", v.Status)
	}
}

// TestModifyPodLost: the modification pod is deleted by someone else before
// it finished: ABORTED, and the retry runs a new one (new token) for the
// recorded change.
func TestModifyPodLost(t *testing.T) {
	p := prov(t, modifyBase+"  volumeModification: "+modifyPod+"\n")
	c := newCluster(t)
	runner := &fakeRunner{answers: answers{v1alpha1.PhaseModification: stillRunning}}
	s := c.server(p, runner)
	if _, err := s.CreateVolume(context.Background(), createReq("v1", 1, 0)); err != nil {
		t.Fatal(err)
	}
	want := map[string]string{"tier": "gold"}
	if _, err := s.ControllerModifyVolume(context.Background(), modifyReq("v1", want)); status.Code(err) != codes.DeadlineExceeded {
		t.Fatal(err)
	}
	runner.mu.Lock()
	runner.pods = map[string]fakePod{}
	runner.answers[v1alpha1.PhaseModification] = nil
	runner.mu.Unlock()
	if _, err := s.ControllerModifyVolume(context.Background(), modifyReq("v1", want)); status.Code(err) != codes.Aborted {
		t.Fatalf("pod lost: %v, want Aborted", err)
	}
	if _, err := s.ControllerModifyVolume(context.Background(), modifyReq("v1", want)); err != nil {
		t.Fatalf("retry: %v", err)
	}
	if runner.created != 2 || runner.live() != 0 {
		t.Fatalf("%d pods created, %d left; want 2, 0", runner.created, runner.live())
	}
	if v := c.volume("v1"); len(modificationEntries(v)) != 0 || !maps.Equal(v.Status.MutableParams, want) {
		t.Fatalf("record: %+v", v.Status)
	}
}

// TestModifyForeignPod: a pod pav did not create holds the modification pod's
// name: final, naming it; the change is over (the next call runs ours).
func TestModifyForeignPod(t *testing.T) {
	p := prov(t, modifyBase+"  volumeModification: "+modifyPod+"\n")
	c := newCluster(t)
	runner := &fakeRunner{}
	s := c.server(p, runner)
	if _, err := s.CreateVolume(context.Background(), createReq("v1", 1, 0)); err != nil {
		t.Fatal(err)
	}
	name := podrunner.PodName(p.Name, v1alpha1.PhaseModification, "v1")
	runner.pods = map[string]fakePod{name: {uid: "tenant's", token: "a guess", done: true, result: &podrunner.Result{}}}
	want := map[string]string{"tier": "gold"}
	_, err := s.ControllerModifyVolume(context.Background(), modifyReq("v1", want))
	if status.Code(err) != codes.FailedPrecondition || !strings.Contains(err.Error(), name) {
		t.Fatalf("error %v", err)
	}
	if v := c.volume("v1"); v.CurrentMutableParams() != nil || v.Status.Modification != nil {
		t.Fatalf("record %+v", v.Status)
	}
	runner.mu.Lock()
	delete(runner.pods, name)
	runner.mu.Unlock()
	if _, err := s.ControllerModifyVolume(context.Background(), modifyReq("v1", want)); err != nil {
		t.Fatalf("after the pod went: %v", err)
	}
}

// TestModifyWhileDeleting: a volume being deleted is not modified.
func TestModifyWhileDeleting(t *testing.T) {
	p := prov(t, modifyBase+"  volumeModification: "+modifyPod+"\n  volumeDeletion: "+`{podTemplate: {spec: {containers: [{name: c, image: b}]}}}`+"\n")
	c := newCluster(t)
	runner := &fakeRunner{answers: answers{v1alpha1.PhaseDeletion: stillRunning}}
	s := c.server(p, runner)
	if _, err := s.CreateVolume(context.Background(), createReq("v1", 1, 0)); err != nil {
		t.Fatal(err)
	}
	if _, err := s.DeleteVolume(context.Background(), &csi.DeleteVolumeRequest{VolumeId: "v1"}); status.Code(err) != codes.DeadlineExceeded {
		t.Fatal(err)
	}
	_, err := s.ControllerModifyVolume(context.Background(), modifyReq("v1", map[string]string{"tier": "gold"}))
	if status.Code(err) != codes.FailedPrecondition || !strings.Contains(err.Error(), "it is Deleting") {
		t.Fatalf("error %v, want FailedPrecondition: it is Deleting", err)
	}
}

// TestLaterPhasesSeeCurrentMutableParams: expansion and deletion see the
// volume's current mutable parameters, and a volume whose claim went while a
// modification ran is deleted once that modification is settled (its pod is
// not left behind).
func TestLaterPhasesSeeCurrentMutableParams(t *testing.T) {
	spec := modifyBase + "  volumeModification: " + modifyPod + "\n" +
		"  volumeExpansion: {podTemplate: {spec: {containers: [{name: c, image: b, command: [grow, \"{{ mutableParams | tojson }}\"]}]}}}\n" +
		"  volumeDeletion: {podTemplate: {spec: {containers: [{name: c, image: b, command: [rm, \"{{ mutableParams | tojson }}\"]}]}}}\n"
	p := prov(t, spec)
	for _, tc := range []struct {
		name    string
		pending func(podrunner.Operation) (*podrunner.Result, error) // the modification pod when DeleteVolume comes
		wantCmd string
	}{
		{name: "after a finished modification", wantCmd: `rm {"tier": "gold"}`},
		{name: "while a modification runs, which then succeeds", pending: files(nil), wantCmd: `rm {"tier": "platinum"}`},
		{name: "while a modification runs, which then fails", pending: podFails("backend down"), wantCmd: `rm {"tier": "gold"}`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := newCluster(t)
			runner := &fakeRunner{answers: answers{}}
			s := c.server(p, runner)
			cr := createReq("v1", 1, 0)
			cr.MutableParameters = map[string]string{"tier": "silver"}
			if _, err := s.CreateVolume(context.Background(), cr); err != nil {
				t.Fatal(err)
			}
			if _, err := s.ControllerModifyVolume(context.Background(), modifyReq("v1", map[string]string{"tier": "gold"})); err != nil {
				t.Fatal(err)
			}
			if _, err := s.ControllerExpandVolume(context.Background(), expandReq("v1", 2<<30, 0)); err != nil {
				t.Fatal(err)
			}
			if got := runner.command(v1alpha1.PhaseExpansion); got != `grow {"tier": "gold"}` {
				t.Fatalf("expansion command %q", got)
			}
			if tc.pending != nil {
				runner.answers[v1alpha1.PhaseModification] = stillRunning
				if _, err := s.ControllerModifyVolume(context.Background(), modifyReq("v1", map[string]string{"tier": "platinum"})); status.Code(err) != codes.DeadlineExceeded {
					t.Fatal(err)
				}
				runner.answers[v1alpha1.PhaseModification] = tc.pending
			}
			if _, err := c.server(p, runner).DeleteVolume(context.Background(), &csi.DeleteVolumeRequest{VolumeId: "v1"}); err != nil {
				t.Fatal(err)
			}
			if got := runner.command(v1alpha1.PhaseDeletion); got != tc.wantCmd {
				t.Fatalf("deletion command %q, want %q", got, tc.wantCmd)
			}
			if len(c.volumes()) != 0 || runner.live() != 0 {
				t.Fatalf("left: %d records, %d pods", len(c.volumes()), runner.live())
			}
		})
	}
}

// TestCreateVolumeMutableParams: CreateVolume's mutable_parameters are
// checked before anything is written, recorded, and seen by validation and
// creation; a repeat with others is ALREADY_EXISTS.
func TestCreateVolumeMutableParams(t *testing.T) {
	const show = `{podTemplate: {spec: {containers: [{name: c, image: b, command: [show, "{{ mutableParams | tojson }}"]}]}}}`
	spec := "  provisioningModes: [Dynamic]\n  volumeValidation: " + show + "\n  volumeCreation: {capacity: 1Gi, podTemplate: " +
		`{spec: {containers: [{name: c, image: b, command: [show, "{{ mutableParams | tojson }}"]}]}}` + "}\n  volumeStaging: " +
		`{podTemplate: {spec: {containers: [{name: c, image: busybox}]}}}` + "\n"
	mut := "  volumeModification: {mutableParameters: [readAheadKiB]}\n"
	ctx := context.Background()

	t.Run("recorded and seen by validation and creation", func(t *testing.T) {
		c := newCluster(t)
		runner := &fakeRunner{}
		s := c.server(prov(t, spec+mut), runner)
		req := createReq("v1", 1, 0)
		req.MutableParameters = map[string]string{"readAheadKiB": "256", "csi.storage.k8s.io/pvc/name": "data"}
		if _, err := s.CreateVolume(ctx, req); err != nil {
			t.Fatal(err)
		}
		want := `show {"readAheadKiB": "256"}`
		if v, c := runner.command(v1alpha1.PhaseValidation), runner.command(v1alpha1.PhaseCreation); v != want || c != want {
			t.Fatalf("validation %q, creation %q, want %q", v, c, want)
		}
		v := c.volume("v1")
		if !maps.Equal(v.Spec.MutableParams, map[string]string{"readAheadKiB": "256"}) || v.Status.MutableParams != nil {
			t.Fatalf("record: spec %v, status %v", v.Spec.MutableParams, v.Status.MutableParams)
		}
		// The same again is the volume; other mutable parameters are not.
		if _, err := s.CreateVolume(ctx, req); err != nil {
			t.Fatal(err)
		}
		other := createReq("v1", 1, 0)
		other.MutableParameters = map[string]string{"readAheadKiB": "4096"}
		_, err := s.CreateVolume(ctx, other)
		if status.Code(err) != codes.AlreadyExists || !strings.Contains(err.Error(), `other mutable parameters (its VolumeAttributesClass's) {readAheadKiB: "256"}, not {readAheadKiB: "4096"}`) {
			t.Fatalf("repeat with other mutable parameters: %v", err)
		}
		if _, err := s.CreateVolume(ctx, createReq("v1", 1, 0)); status.Code(err) != codes.AlreadyExists {
			t.Fatalf("repeat without mutable parameters: %v, want AlreadyExists", err)
		}
	})
	t.Run("without any: {}", func(t *testing.T) {
		runner := &fakeRunner{}
		if _, err := newCluster(t).server(prov(t, spec+mut), runner).CreateVolume(ctx, createReq("v1", 1, 0)); err != nil {
			t.Fatal(err)
		}
		if got := runner.command(v1alpha1.PhaseCreation); got != "show {}" {
			t.Fatalf("creation %q", got)
		}
	})
	for _, tc := range []struct {
		name, spec string
		params     map[string]string
		wantMsgs   []string
	}{
		{"an undeclared key", spec + mut, map[string]string{"readAheadKiB": "256", "iops": "1"},
			[]string{`CreateVolume's mutable_parameters: parameter "iops" is not mutable`, `declares ["readAheadKiB"] in spec.volumeModification.mutableParameters`}},
		{"no volumeModification", spec, map[string]string{"readAheadKiB": "256"},
			[]string{`CreateVolume's mutable_parameters has ["readAheadKiB"], but PavProvisioner "test" has no spec.volumeModification`}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := newCluster(t)
			runner := &fakeRunner{}
			req := createReq("v1", 1, 0)
			req.MutableParameters = tc.params
			_, err := c.server(prov(t, tc.spec), runner).CreateVolume(ctx, req)
			if status.Code(err) != codes.InvalidArgument {
				t.Fatalf("error %v, want InvalidArgument", err)
			}
			for _, m := range tc.wantMsgs {
				if !strings.Contains(err.Error(), m) {
					t.Errorf("error %q does not say %q", err, m)
				}
			}
			if n := recordstest.Writes(c.records); n != 0 || runner.created != 0 {
				t.Fatalf("%d record writes, %d pods: nothing may be written", n, runner.created)
			}
		})
	}
}

func TestModifyCapability(t *testing.T) {
	for _, tc := range []struct {
		spec string
		want string
	}{
		{"", "CREATE_DELETE_VOLUME"},
		{"  volumeModification: {mutableParameters: [iops]}\n", "CREATE_DELETE_VOLUME MODIFY_VOLUME"},
		{"  volumeExpansion: {}\n  volumeModification: " + modifyPod + "\n", "CREATE_DELETE_VOLUME EXPAND_VOLUME MODIFY_VOLUME"},
	} {
		s := newCluster(t).server(prov(t, modifyBase+tc.spec), &fakeRunner{})
		resp, err := s.ControllerGetCapabilities(context.Background(), &csi.ControllerGetCapabilitiesRequest{})
		if err != nil {
			t.Fatal(err)
		}
		var got []string
		for _, c := range resp.Capabilities {
			got = append(got, c.GetRpc().GetType().String())
		}
		if strings.Join(got, " ") != tc.want {
			t.Errorf("spec %q: capabilities %v, want %s", tc.spec, got, tc.want)
		}
	}
}

// TestValidateVolumeCapabilitiesMutableParams: declared mutable parameters are
// confirmed, others are not (with the reason).
func TestValidateVolumeCapabilitiesMutableParams(t *testing.T) {
	s := newCluster(t).server(prov(t, modifyBase+"  volumeModification: {mutableParameters: [tier]}\n"), &fakeRunner{})
	if _, err := s.CreateVolume(context.Background(), createReq("v1", 1, 0)); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		params  map[string]string
		confirm bool
	}{
		{map[string]string{"tier": "gold"}, true},
		{map[string]string{"iops": "1"}, false},
	} {
		resp, err := s.ValidateVolumeCapabilities(context.Background(), &csi.ValidateVolumeCapabilitiesRequest{VolumeId: "v1", VolumeCapabilities: capReq(rwo), MutableParameters: tc.params})
		if err != nil {
			t.Fatal(err)
		}
		if got := resp.Confirmed != nil; got != tc.confirm || !tc.confirm && !strings.Contains(resp.Message, `parameter "iops" is not mutable`) {
			t.Errorf("%v: confirmed %v (%q), want %v", tc.params, got, resp.Message, tc.confirm)
		}
		if tc.confirm && !maps.Equal(resp.Confirmed.MutableParameters, tc.params) {
			t.Errorf("confirmed mutable parameters %v", resp.Confirmed.MutableParameters)
		}
	}
}

// TestModificationWrites pins the API writes of one change with a pod: the
// record's updates (the change with its pod entry, the pod's UID, the outcome
// with the new parameters, the finished entry dropped) and the pod's create
// and delete. A repeat of a finished change writes nothing.
func TestModificationWrites(t *testing.T) {
	p := prov(t, modifyBase+"  volumeModification: "+modifyPod+"\n")
	c := newCluster(t)
	runner := &fakeRunner{}
	s := c.server(p, runner)
	if _, err := s.CreateVolume(context.Background(), createReq("v1", 1, 0)); err != nil {
		t.Fatal(err)
	}
	before := recordstest.Writes(c.records)
	want := map[string]string{"tier": "gold"}
	if _, err := s.ControllerModifyVolume(context.Background(), modifyReq("v1", want)); err != nil {
		t.Fatal(err)
	}
	change := recordstest.Writes(c.records) - before
	if _, err := s.ControllerModifyVolume(context.Background(), modifyReq("v1", want)); err != nil {
		t.Fatal(err)
	}
	repeat := recordstest.Writes(c.records) - before - change
	if pods := runner.created + len(runner.deleted); change != 4 || repeat != 0 || pods != 2 {
		t.Errorf("writes: %d record + %d pod for a change, %d for its repeat; want 4 + 2, 0", change, pods, repeat)
	}
}

// TestModificationNamespaceGone: a modification under way whose pod's
// namespace went (its claim was deleted with it) does not hold the deletion
// up, as an expansion's does not (TestExpansionNamespaceGone).
func TestModificationNamespaceGone(t *testing.T) {
	spec := strings.Replace(nsSpec("Forget", claimNS), "  volumeStaging:",
		`  volumeModification: {mutableParameters: [tier], podTemplate: {metadata: {namespace: "{{ pvc.metadata.namespace }}"}, spec: {containers: [{name: m, image: busybox}]}}}`+"\n  volumeStaging:", 1)
	runner := &fakeRunner{}
	c, s, _ := nsVolume(t, spec, runner, "")
	runner.answers[v1alpha1.PhaseModification] = stillRunning
	if _, err := s.ControllerModifyVolume(context.Background(), modifyReq("pvc-uid-1", map[string]string{"tier": "gold"})); status.Code(err) != codes.DeadlineExceeded {
		t.Fatalf("modification: %v", err)
	}
	runner.mu.Lock()
	runner.pods = map[string]fakePod{} // killed with its namespace
	runner.mu.Unlock()
	runner.refuse = refuseIn("", nsTerminating)
	if _, err := s.DeleteVolume(context.Background(), deleteReq("pvc-uid-1")); status.Code(err) != codes.Aborted {
		// The lost modification pod is recorded first (ABORTED), as any.
		t.Fatalf("DeleteVolume = %v, want Aborted", err)
	}
	if _, err := s.DeleteVolume(context.Background(), deleteReq("pvc-uid-1")); err != nil {
		t.Fatalf("DeleteVolume = %v", err)
	}
	if c.volume("pvc-uid-1") != nil || runner.live() != 0 {
		t.Fatal("the volume was not forgotten")
	}
}
