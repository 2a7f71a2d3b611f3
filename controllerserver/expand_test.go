package controllerserver

import (
	"context"
	"fmt"
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

// expandBase makes 1 GiB volumes without a pod; each test adds its
// volumeExpansion (and maybe volumeNodeExpansion).
const expandBase = "  provisioningModes: [Dynamic]\n  volumeCreation: {capacity: 1Gi}\n  volumeStaging: " +
	`{podTemplate: {spec: {containers: [{name: c, image: busybox}]}}}` + "\n"

// expandPod is an expansion pod whose command shows its context.
const expandPod = `{podTemplate: {spec: {containers: [{name: c, image: busybox, command: [grow, "{{ handle }}", "{{ capacity }}", "{{ requestedCapacity }}", "{{ requestedCapacityLimit or 'none' }}", "{{ params.color }}"]}]}}}`

func expandReq(handle string, required, limit int64) *csi.ControllerExpandVolumeRequest {
	return &csi.ControllerExpandVolumeRequest{VolumeId: handle, CapacityRange: &csi.CapacityRange{RequiredBytes: required, LimitBytes: limit}}
}

func stillRunning(podrunner.Operation) (*podrunner.Result, error) {
	return nil, context.DeadlineExceeded
}

// expansionEntries are the record's expansion pod entries.
func expansionEntries(v *v1alpha1.PavVolume) []v1alpha1.VolumePod {
	var out []v1alpha1.VolumePod
	for _, e := range v.Status.Pods {
		if e.Phase == v1alpha1.PhaseExpansion {
			out = append(out, e)
		}
	}
	return out
}

func TestControllerExpandVolume(t *testing.T) {
	const gi = int64(1 << 30)
	for _, tc := range []struct {
		name      string
		spec      string // volumeExpansion and the like, added to expandBase
		req       *csi.ControllerExpandVolumeRequest
		answer    func(podrunner.Operation) (*podrunner.Result, error)
		wantCode  codes.Code
		wantMsg   string
		wantCap   int64 // the answer's and the record's capacity (0: unchanged)
		wantNode  bool
		wantPods  int    // expansion pods created
		wantCmd   string // the expansion pod's command
		wantNoCap bool   // the record keeps 1 GiB
	}{
		{name: "{} grows to what was asked, no pod", spec: "  volumeExpansion: {}\n",
			req: expandReq("v1", 3*gi, 0), wantCap: 3 * gi},
		{name: "spec capacity", spec: "  volumeExpansion: {capacity: \"{{ requestedCapacity * 2 }}\"}\n",
			req: expandReq("v1", 3*gi, 0), wantCap: 6 * gi},
		{name: "pod sees the expansion context; /pav/capacity wins, trimmed",
			spec:   "  volumeExpansion: " + expandPod + "\n",
			req:    expandReq("v1", 3*gi, 5*gi),
			answer: files(map[string]string{"capacity": " 4Gi\n"}), wantCap: 4 * gi, wantPods: 1,
			wantCmd: fmt.Sprintf("grow v1 %d %d %d blue", gi, 3*gi, 5*gi)},
		{name: "pod without /pav/capacity: the request", spec: "  volumeExpansion: " + expandPod + "\n",
			req: expandReq("v1", 3*gi, 0), wantCap: 3 * gi, wantPods: 1, wantCmd: fmt.Sprintf("grow v1 %d %d none blue", gi, 3*gi)},
		{name: "node expansion required", spec: "  volumeExpansion: {}\n  volumeNodeExpansion: " + expandPod + "\n",
			req: expandReq("v1", 2*gi, 0), wantCap: 2 * gi, wantNode: true},
		{name: "shrink request: nothing to do, the current capacity", spec: "  volumeExpansion: " + expandPod + "\n",
			req: expandReq("v1", gi/2, 0), wantCap: gi},
		{name: "same size: nothing to do", spec: "  volumeExpansion: " + expandPod + "\n",
			req: expandReq("v1", gi, gi), wantCap: gi},
		{name: "limit below the current capacity", spec: "  volumeExpansion: {}\n",
			req: expandReq("v1", gi/4, gi/2), wantCode: codes.OutOfRange, wantMsg: "volumes never shrink", wantNoCap: true},
		{name: "/pav/capacity below the request", spec: "  volumeExpansion: " + expandPod + "\n",
			req: expandReq("v1", 3*gi, 0), answer: files(map[string]string{"capacity": "2Gi"}), wantPods: 1,
			wantCode: codes.OutOfRange, wantMsg: "the grown capacity 2Gi (/pav/capacity) is below the requested 3Gi", wantNoCap: true},
		{name: "/pav/capacity above the limit", spec: "  volumeExpansion: " + expandPod + "\n",
			req: expandReq("v1", 3*gi, 4*gi), answer: files(map[string]string{"capacity": "5Gi"}), wantPods: 1,
			wantCode: codes.OutOfRange, wantMsg: "above the requested limit 4Gi", wantNoCap: true},
		{name: "invalid /pav/capacity", spec: "  volumeExpansion: " + expandPod + "\n",
			req: expandReq("v1", 3*gi, 0), answer: files(map[string]string{"capacity": "lots"}), wantPods: 1,
			wantCode: codes.OutOfRange, wantMsg: `invalid /pav/capacity "lots"`, wantNoCap: true},
		{name: "spec capacity above the limit: nothing runs", spec: "  volumeExpansion: {capacity: 10Gi}\n",
			req: expandReq("v1", 3*gi, 4*gi), wantCode: codes.OutOfRange, wantMsg: "(spec.volumeExpansion.capacity) is above the requested limit", wantNoCap: true},
		{name: "pod fails: its failure", spec: "  volumeExpansion: " + expandPod + "\n",
			req: expandReq("v1", 3*gi, 0), answer: podFails("pool full"), wantPods: 1,
			wantCode: codes.Internal, wantMsg: "volume expansion failed", wantNoCap: true},
		{name: "above the provisioner's maxCapacity: nothing runs",
			spec: "  volumeValidation: {maxCapacity: 2Gi}\n  volumeExpansion: " + expandPod + "\n",
			req:  expandReq("v1", 3*gi, 0), wantCode: codes.OutOfRange, wantMsg: "spec.volumeValidation.maxCapacity", wantNoCap: true},
		{name: "template error names the field", spec: "  volumeExpansion: {capacity: \"{{ nope }}\"}\n",
			req: expandReq("v1", 3*gi, 0), wantCode: codes.InvalidArgument, wantMsg: "spec.volumeExpansion.capacity", wantNoCap: true},
		{name: "no volumeExpansion", spec: "",
			req: expandReq("v1", 3*gi, 0), wantCode: codes.FailedPrecondition, wantMsg: "has no spec.volumeExpansion", wantNoCap: true},
		{name: "unknown volume", spec: "  volumeExpansion: {}\n",
			req: expandReq("nope", 3*gi, 0), wantCode: codes.NotFound, wantMsg: `volume "nope" does not exist`, wantNoCap: true},
		{name: "no volume id", spec: "  volumeExpansion: {}\n",
			req: expandReq("", 3*gi, 0), wantCode: codes.InvalidArgument, wantMsg: "volume id is required", wantNoCap: true},
		{name: "no capacity range", spec: "  volumeExpansion: {}\n",
			req: &csi.ControllerExpandVolumeRequest{VolumeId: "v1"}, wantCode: codes.InvalidArgument, wantMsg: "capacity_range is required", wantNoCap: true},
		{name: "required above limit", spec: "  volumeExpansion: {}\n",
			req: expandReq("v1", 3*gi, 2*gi), wantCode: codes.InvalidArgument, wantMsg: "exceed limit_bytes", wantNoCap: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := prov(t, expandBase+tc.spec)
			c := newCluster(t)
			runner := &fakeRunner{answers: answers{v1alpha1.PhaseExpansion: tc.answer}}
			if _, err := c.server(p, runner).CreateVolume(context.Background(), createReq("v1", 1, 0)); err != nil {
				t.Fatal(err)
			}
			resp, err := c.server(p, runner).ControllerExpandVolume(context.Background(), tc.req)
			if status.Code(err) != tc.wantCode || tc.wantMsg != "" && !strings.Contains(err.Error(), tc.wantMsg) {
				t.Fatalf("error = %v, want %v %q", err, tc.wantCode, tc.wantMsg)
			}
			if err == nil && (resp.CapacityBytes != tc.wantCap || resp.NodeExpansionRequired != tc.wantNode) {
				t.Fatalf("response %+v, want capacity %d, node expansion %v", resp, tc.wantCap, tc.wantNode)
			}
			v := c.volume("v1")
			want := tc.wantCap
			if tc.wantNoCap {
				want = gi
			}
			if v.Status.Capacity != want || v.Status.Expansion != nil || len(expansionEntries(v)) != 0 {
				t.Fatalf("record: capacity %d (want %d), expansion %+v, pods %+v", v.Status.Capacity, want, v.Status.Expansion, v.Status.Pods)
			}
			if tc.wantCode != codes.OK && tc.wantPods > 0 && !strings.Contains(v.Status.Message, tc.wantMsg) {
				t.Errorf("record message %q does not tell the failure", v.Status.Message)
			}
			if runner.created != tc.wantPods || runner.live() != 0 {
				t.Fatalf("%d expansion pods created, %d left; want %d, 0", runner.created, runner.live(), tc.wantPods)
			}
			if got := runner.command(v1alpha1.PhaseExpansion); tc.wantCmd != "" && got != tc.wantCmd || tc.wantPods == 0 && got != "" {
				t.Fatalf("command %q, want %q", got, tc.wantCmd)
			}
		})
	}
}

// TestExpandRetries: what a resizer's retries meet. Each step is one
// ControllerExpandVolume on a fresh server (a restarted driver shares nothing
// with the last but the API).
func TestExpandRetries(t *testing.T) {
	const gi = int64(1 << 30)
	p := prov(t, expandBase+"  volumeExpansion: "+expandPod+"\n")
	type step struct {
		req      int64
		answer   func(podrunner.Operation) (*podrunner.Result, error)
		wantCode codes.Code
		wantCap  int64 // the record's capacity after the step
	}
	for _, tc := range []struct {
		name        string
		steps       []step
		wantCreated int
		wantCmds    []string // requested capacities the pods were given
	}{
		{name: "a timed-out call's retry adopts the same pod",
			steps: []step{
				{req: 2 * gi, answer: stillRunning, wantCode: codes.DeadlineExceeded, wantCap: gi},
				{req: 2 * gi, answer: stillRunning, wantCode: codes.DeadlineExceeded, wantCap: gi},
				{req: 2 * gi, wantCap: 2 * gi},
			},
			wantCreated: 1, wantCmds: []string{"2147483648"}},
		{name: "a retry with a larger request finishes the recorded one first, then grows again in a new pod",
			steps: []step{
				{req: 2 * gi, answer: stillRunning, wantCode: codes.DeadlineExceeded, wantCap: gi},
				{req: 3 * gi, wantCap: 3 * gi},
			},
			wantCreated: 2, wantCmds: []string{"2147483648", "3221225472"}},
		{name: "a retry with a smaller request finishes the recorded one, which is enough",
			steps: []step{
				{req: 3 * gi, answer: stillRunning, wantCode: codes.DeadlineExceeded, wantCap: gi},
				{req: 2 * gi, wantCap: 3 * gi},
			},
			wantCreated: 1, wantCmds: []string{"3221225472"}},
		{name: "a failed pod: the retry runs a new pod",
			steps: []step{
				{req: 2 * gi, answer: podFails("pool full"), wantCode: codes.Internal, wantCap: gi},
				{req: 2 * gi, wantCap: 2 * gi},
			},
			wantCreated: 2, wantCmds: []string{"2147483648", "2147483648"}},
		{name: "each growth after a success runs a new pod; repeats run none",
			steps: []step{
				{req: 2 * gi, wantCap: 2 * gi},
				{req: 2 * gi, wantCap: 2 * gi},
				{req: 4 * gi, wantCap: 4 * gi},
				{req: 3 * gi, wantCap: 4 * gi},
			},
			wantCreated: 2, wantCmds: []string{"2147483648", "4294967296"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := newCluster(t)
			runner := &fakeRunner{answers: answers{}}
			if _, err := c.server(p, runner).CreateVolume(context.Background(), createReq("v1", 1, 0)); err != nil {
				t.Fatal(err)
			}
			for i, st := range tc.steps {
				runner.mu.Lock()
				runner.answers[v1alpha1.PhaseExpansion] = st.answer
				runner.mu.Unlock()
				resp, err := c.server(p, runner).ControllerExpandVolume(context.Background(), expandReq("v1", st.req, 0))
				if status.Code(err) != st.wantCode {
					t.Fatalf("step %d: %v, want %v", i, err, st.wantCode)
				}
				if err == nil && resp.CapacityBytes != st.wantCap {
					t.Fatalf("step %d: capacity %d, want %d", i, resp.CapacityBytes, st.wantCap)
				}
				if v := c.volume("v1"); v.Status.Capacity != st.wantCap {
					t.Fatalf("step %d: record capacity %d, want %d", i, v.Status.Capacity, st.wantCap)
				}
			}
			var cmds []string
			seen := map[string]bool{}
			for _, op := range runner.ops {
				if !seen[op.Token] {
					seen[op.Token] = true
					cmds = append(cmds, op.Template.Spec.Containers[0].Command[3])
				}
			}
			if runner.created != tc.wantCreated || strings.Join(cmds, " ") != strings.Join(tc.wantCmds, " ") || runner.live() != 0 {
				t.Fatalf("%d pods created for %v, %d left; want %d for %v, 0", runner.created, cmds, runner.live(), tc.wantCreated, tc.wantCmds)
			}
			if v := c.volume("v1"); v.Status.Expansion != nil || len(expansionEntries(v)) != 0 {
				t.Fatalf("record left %+v, %+v", v.Status.Expansion, v.Status.Pods)
			}
		})
	}
}

// TestExpandRestartBetweenPodAndRecord: the write of the new capacity fails
// (a restart at that point is the same): the pod stays, and the retry adopts
// it by its recorded UID and records its result. One pod in all.
func TestExpandRestartBetweenPodAndRecord(t *testing.T) {
	p := prov(t, expandBase+"  volumeExpansion: "+expandPod+"\n")
	c := newCluster(t)
	runner := &fakeRunner{answers: answers{v1alpha1.PhaseExpansion: files(map[string]string{"capacity": "5Gi"})}}
	if _, err := c.server(p, runner).CreateVolume(context.Background(), createReq("v1", 1, 0)); err != nil {
		t.Fatal(err)
	}
	failed := false
	c.records.PrependReactor("update", v1alpha1.VolumeResource, func(a k8stesting.Action) (bool, runtime.Object, error) {
		u := a.(k8stesting.UpdateAction).GetObject().(interface{ UnstructuredContent() map[string]any }).UnstructuredContent()
		st, _ := u["status"].(map[string]any)
		if st["capacity"] == int64(5<<30) && !failed {
			failed = true
			return true, nil, apierrors.NewServiceUnavailable("etcd leader changed")
		}
		return false, nil, nil
	})
	if _, err := c.server(p, runner).ControllerExpandVolume(context.Background(), expandReq("v1", 2<<30, 0)); status.Code(err) != codes.Unavailable {
		t.Fatalf("first call: %v, want Unavailable", err)
	}
	if v := c.volume("v1"); v.Status.Expansion == nil || v.Status.Expansion.RequiredBytes != 2<<30 || runner.live() != 1 {
		t.Fatalf("the expansion must stay recorded with its pod: %+v, %d pods", v.Status, runner.live())
	}
	resp, err := c.server(p, runner).ControllerExpandVolume(context.Background(), expandReq("v1", 2<<30, 0))
	if err != nil || resp.CapacityBytes != 5<<30 {
		t.Fatalf("retry: %v, %v", resp, err)
	}
	if runner.created != 1 || runner.live() != 0 {
		t.Fatalf("%d expansion pods created, %d left; want 1, 0", runner.created, runner.live())
	}
	if last := runner.ops[len(runner.ops)-1]; last.UID == "" {
		t.Error("the retry did not adopt the pod by its recorded UID")
	}
}

// TestExpandPodLost: the expansion pod is deleted by someone else before it
// finished: ABORTED, and the retry runs a new one (new token) for the
// recorded expansion.
func TestExpandPodLost(t *testing.T) {
	p := prov(t, expandBase+"  volumeExpansion: "+expandPod+"\n")
	c := newCluster(t)
	runner := &fakeRunner{answers: answers{v1alpha1.PhaseExpansion: stillRunning}}
	s := c.server(p, runner)
	if _, err := s.CreateVolume(context.Background(), createReq("v1", 1, 0)); err != nil {
		t.Fatal(err)
	}
	if _, err := s.ControllerExpandVolume(context.Background(), expandReq("v1", 2<<30, 0)); status.Code(err) != codes.DeadlineExceeded {
		t.Fatal(err)
	}
	runner.mu.Lock()
	runner.pods = map[string]fakePod{}
	runner.answers[v1alpha1.PhaseExpansion] = nil
	runner.mu.Unlock()
	if _, err := s.ControllerExpandVolume(context.Background(), expandReq("v1", 2<<30, 0)); status.Code(err) != codes.Aborted {
		t.Fatalf("pod lost: %v, want Aborted", err)
	}
	if resp, err := s.ControllerExpandVolume(context.Background(), expandReq("v1", 2<<30, 0)); err != nil || resp.CapacityBytes != 2<<30 {
		t.Fatalf("retry: %v, %v", resp, err)
	}
	if runner.created != 2 || runner.live() != 0 {
		t.Fatalf("%d pods created, %d left; want 2, 0", runner.created, runner.live())
	}
	if v := c.volume("v1"); len(expansionEntries(v)) != 0 {
		t.Fatalf("entries left: %+v", v.Status.Pods)
	}
}

// TestExpandForeignPod: a pod pav did not create holds the expansion pod's
// name: final, naming it; the expansion is over (the next call runs ours).
func TestExpandForeignPod(t *testing.T) {
	p := prov(t, expandBase+"  volumeExpansion: "+expandPod+"\n")
	c := newCluster(t)
	runner := &fakeRunner{}
	s := c.server(p, runner)
	if _, err := s.CreateVolume(context.Background(), createReq("v1", 1, 0)); err != nil {
		t.Fatal(err)
	}
	name := podrunner.PodName(p.Name, v1alpha1.PhaseExpansion, "v1")
	runner.pods = map[string]fakePod{name: {uid: "tenant's", token: "a guess", done: true, result: &podrunner.Result{Files: map[string]string{"capacity": "1Pi"}}}}
	_, err := s.ControllerExpandVolume(context.Background(), expandReq("v1", 2<<30, 0))
	if status.Code(err) != codes.FailedPrecondition || !strings.Contains(err.Error(), name) {
		t.Fatalf("error %v", err)
	}
	if v := c.volume("v1"); v.Status.Capacity != 1<<30 || v.Status.Expansion != nil {
		t.Fatalf("record %+v", v.Status)
	}
	runner.mu.Lock()
	delete(runner.pods, name)
	runner.mu.Unlock()
	if resp, err := s.ControllerExpandVolume(context.Background(), expandReq("v1", 2<<30, 0)); err != nil || resp.CapacityBytes != 2<<30 {
		t.Fatalf("after the pod went: %v, %v", resp, err)
	}
}

// TestDeleteAfterExpansion: the deletion pod sees the grown capacity, and a
// volume whose claim went while its expansion ran is deleted once that
// expansion is settled (its pod is not left behind).
func TestDeleteAfterExpansion(t *testing.T) {
	spec := expandBase + "  volumeExpansion: " + expandPod + "\n  volumeDeletion: {podTemplate: {spec: {containers: [{name: c, image: b, command: [rm, \"{{ handle }}\", \"{{ capacity }}\"]}]}}}\n"
	p := prov(t, spec)
	for _, tc := range []struct {
		name    string
		pending func(podrunner.Operation) (*podrunner.Result, error) // the expansion pod when DeleteVolume comes
		wantCmd string
	}{
		{name: "after a finished expansion", wantCmd: "rm v1 3221225472"},
		{name: "while an expansion runs, which then succeeds", pending: files(map[string]string{"capacity": "4Gi"}), wantCmd: "rm v1 4294967296"},
		{name: "while an expansion runs, which then fails", pending: podFails("pool full"), wantCmd: "rm v1 3221225472"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := newCluster(t)
			runner := &fakeRunner{answers: answers{}}
			s := c.server(p, runner)
			if _, err := s.CreateVolume(context.Background(), createReq("v1", 1, 0)); err != nil {
				t.Fatal(err)
			}
			if _, err := s.ControllerExpandVolume(context.Background(), expandReq("v1", 3<<30, 0)); err != nil {
				t.Fatal(err)
			}
			if tc.pending != nil {
				runner.answers[v1alpha1.PhaseExpansion] = stillRunning
				if _, err := s.ControllerExpandVolume(context.Background(), expandReq("v1", 4<<30, 0)); status.Code(err) != codes.DeadlineExceeded {
					t.Fatal(err)
				}
				runner.answers[v1alpha1.PhaseExpansion] = tc.pending
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

func TestControllerCapabilities(t *testing.T) {
	for _, tc := range []struct {
		spec string
		want string
	}{
		{"", "CREATE_DELETE_VOLUME"},
		{"  volumeExpansion: {}\n", "CREATE_DELETE_VOLUME EXPAND_VOLUME"},
		{"  volumeExpansion: {online: false}\n  volumeNodeExpansion: " + expandPod + "\n", "CREATE_DELETE_VOLUME EXPAND_VOLUME"},
	} {
		s := newCluster(t).server(prov(t, expandBase+tc.spec), &fakeRunner{})
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

// TestExpansionWrites pins the API writes of one growth with a pod: the
// record's updates (the expansion with its pod entry, the pod's UID, the
// outcome with the new capacity, the finished entry dropped) and the pod's
// create and delete. A repeat of a finished growth writes nothing.
func TestExpansionWrites(t *testing.T) {
	p := prov(t, expandBase+"  volumeExpansion: "+expandPod+"\n")
	c := newCluster(t)
	runner := &fakeRunner{}
	s := c.server(p, runner)
	if _, err := s.CreateVolume(context.Background(), createReq("v1", 1, 0)); err != nil {
		t.Fatal(err)
	}
	before := recordstest.Writes(c.records)
	if _, err := s.ControllerExpandVolume(context.Background(), expandReq("v1", 2<<30, 0)); err != nil {
		t.Fatal(err)
	}
	grow := recordstest.Writes(c.records) - before
	if _, err := s.ControllerExpandVolume(context.Background(), expandReq("v1", 2<<30, 0)); err != nil {
		t.Fatal(err)
	}
	repeat := recordstest.Writes(c.records) - before - grow
	if pods := runner.created + len(runner.deleted); grow != 4 || repeat != 0 || pods != 2 {
		t.Errorf("writes: %d record + %d pod for a growth, %d for its repeat; want 4 + 2, 0", grow, pods, repeat)
	}
}
