package controllerserver

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	corev1 "k8s.io/api/core/v1"

	"github.com/pods-as-volumes/pav/api/v1alpha1"
	"github.com/pods-as-volumes/pav/internal/grpcerr"
	"github.com/pods-as-volumes/pav/internal/phase"
	"github.com/pods-as-volumes/pav/internal/provisioner"
	"github.com/pods-as-volumes/pav/internal/records"
	"github.com/pods-as-volumes/pav/podrunner"
)

const inlineID = "csi-3f1a0c9e5d6b7a8f9e0d1c2b3a4f5e6d7c8b9a0f1e2d3c4b5a69788796a5b4c3"

// nodeServer is the Server a node plugin of node runs for its inline volumes:
// its records through a NodeStore.
func (c *cluster) nodeServer(p *v1alpha1.PavProvisioner, runner PodRunner, node string) *Server {
	return &Server{Source: provisioner.Static{P: p}, Eval: phase.NewEvaluator(nil), Pods: runner,
		Records: records.NewNodeStore(c.records, p.Name, node)}
}

func inlineVol(params map[string]string) InlineVolume {
	return InlineVolume{ID: inlineID, Node: "node-1", Params: params,
		Pod: v1alpha1.EphemeralPod{Namespace: "team-a", Name: "web", UID: "pod-uid", ServiceAccountName: "default"}}
}

func TestCreateInline(t *testing.T) {
	base := "  provisioningModes: [Ephemeral]\n  volumeStaging: " + fmt.Sprintf(pod, "true") + "\n"
	deletion := "  volumeDeletion: " + fmt.Sprintf(pod, "rm {{ handle }} {{ capacity or 'unknown' }}") + "\n"
	ctxPod := fmt.Sprintf(pod, "make {{ defaultHandle }} {{ params.color }} {{ pod.namespace }}/{{ pod.name }} {{ pod.uid }} {{ ephemeral }} {{ requestedMinCapacity }} {{ requestedMaxCapacity or 'none' }} {{ requestedVolumeMode }} {{ requestedAccessModes | join(',') }}")
	for _, tc := range []struct {
		name    string
		spec    string
		answers answers
		// wantCode: a final error leaves nothing; wantRecord is the phase
		// of the record left otherwise.
		wantCode   codes.Code
		wantMsg    string
		wantPhases string
		wantCap    int64
		wantCmd    string // the creation pod's
		wantDelete string // the deletion pod's
	}{
		{name: "fixed capacity, no pod", spec: "  volumeCreation: {capacity: 1Gi}\n", wantCap: 1 << 30},
		{name: "the creation context: params, pod, ephemeral, the fixed request",
			spec:       "  volumeCreation: " + ctxPod + "\n",
			answers:    answers{v1alpha1.PhaseCreation: files(map[string]string{"capacity": "1Ki"})},
			wantPhases: "creation", wantCap: 1024,
			wantCmd: "sh -c make " + inlineID + " blue team-a/web pod-uid True 1 none Filesystem ReadWriteOnce"},
		{name: "requestedMinCapacity is volumeValidation's minCapacity",
			spec: "  volumeValidation: {minCapacity: 1Mi}\n  volumeCreation: {capacity: \"{{ requestedMinCapacity * 2 }}\"}\n", wantCap: 2 << 20},
		{name: "without volumeCreation the staging pod alone makes it: the requested capacity",
			spec: "  volumeValidation: {minCapacity: 64Mi}\n", wantCap: 64 << 20},
		{name: "a handle equal to the volume id is fine",
			spec:    "  volumeCreation: " + fmt.Sprintf(pod, "true") + "\n",
			answers: answers{v1alpha1.PhaseCreation: files(map[string]string{"handle": inlineID + "\n", "capacity": "1"})},
			wantCap: 1, wantPhases: "creation"},
		{name: "volumeCreation.handle refused before any pod",
			spec:     "  volumeCreation: {handle: \"{{ params.color }}\", capacity: 1Gi}\n",
			wantCode: codes.InvalidArgument, wantMsg: `spec.volumeCreation.handle is "blue", but the handle of an inline ephemeral volume is always its CSI volume id`},
		{name: "/pav/handle refused: reverted with the volume id as the handle",
			spec:     "  volumeCreation: " + fmt.Sprintf(pod, "true") + "\n" + deletion,
			answers:  answers{v1alpha1.PhaseCreation: files(map[string]string{"handle": "pvc-someone-elses", "capacity": "1Ki"})},
			wantCode: codes.Internal, wantMsg: `/pav/handle is "pvc-someone-elses", but the handle of an inline ephemeral volume is always its CSI volume id ` + inlineID + ` (a pod's author must never choose it`,
			wantPhases: "creation deletion", wantDelete: "sh -c rm " + inlineID + " 1024"},
		{name: "validation pod refuses: nothing left",
			spec:     "  volumeValidation: " + fmt.Sprintf(pod, "false") + "\n  volumeCreation: {capacity: 1}\n",
			answers:  answers{v1alpha1.PhaseValidation: podFails("volumeAttributes key color is not allowed")},
			wantCode: codes.InvalidArgument, wantMsg: "volumeAttributes key color is not allowed", wantPhases: "validation"},
		{name: "a provisioner that takes Block only refuses an inline (Filesystem) volume",
			spec:     "  volumeValidation: {volumeModes: [Block]}\n  volumeCreation: {capacity: 1}\n",
			wantCode: codes.InvalidArgument, wantMsg: "volume mode Filesystem is not supported"},
		{name: "creation pod fails: reverted",
			spec:     "  volumeCreation: " + fmt.Sprintf(pod, "false") + "\n" + deletion,
			answers:  answers{v1alpha1.PhaseCreation: podFails("quota exceeded")},
			wantCode: codes.Internal, wantMsg: "quota exceeded", wantPhases: "creation deletion", wantDelete: "sh -c rm " + inlineID + " unknown"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := newCluster(t)
			runner := &fakeRunner{answers: tc.answers}
			s := c.nodeServer(prov(t, base+tc.spec), runner, "node-1")
			v, err := s.CreateInline(context.Background(), s.Source.(provisioner.Static).P, inlineVol(map[string]string{"color": "blue"}))
			err = grpcerr.Status(err)
			if status.Code(err) != tc.wantCode || tc.wantMsg != "" && !strings.Contains(fmt.Sprint(err), tc.wantMsg) {
				t.Fatalf("error = %v, want %v %q", err, tc.wantCode, tc.wantMsg)
			}
			if got := strings.Join(runner.phases(), " "); got != tc.wantPhases {
				t.Errorf("pods %q, want %q", got, tc.wantPhases)
			}
			for _, op := range runner.ops {
				if op.NodeName != "node-1" {
					t.Errorf("%s pod not pinned to the node: %q", op.Phase, op.NodeName)
				}
			}
			if tc.wantCmd != "" {
				if got := runner.command(v1alpha1.PhaseCreation); got != tc.wantCmd {
					t.Errorf("creation command %q, want %q", got, tc.wantCmd)
				}
			}
			if got := runner.command(v1alpha1.PhaseDeletion); got != tc.wantDelete {
				t.Errorf("deletion command %q, want %q", got, tc.wantDelete)
			}
			if tc.wantCode != codes.OK {
				if n := len(c.volumes()); n != 0 || runner.live() != 0 {
					t.Fatalf("a final error left %d records, %d pods", n, runner.live())
				}
				return
			}
			st, sp := v.Status, v.Spec
			if st.Phase != v1alpha1.VolumeCreated || st.Handle != inlineID || st.Capacity != tc.wantCap {
				t.Fatalf("status %+v", st)
			}
			if e := sp.Ephemeral; e == nil || e.Node != "node-1" || e.Pod.UID != "pod-uid" || e.Pod.Name != "web" {
				t.Fatalf("spec.ephemeral %+v", sp.Ephemeral)
			}
			if sp.RequestedVolumeMode != corev1.PersistentVolumeFilesystem || fmt.Sprint(sp.RequestedAccessModes) != "[ReadWriteOnce]" || sp.RequestedMaxCapacity != nil || sp.Params["color"] != "blue" || sp.PVC != nil {
				t.Fatalf("spec %+v", sp)
			}
			if v.Labels[v1alpha1.LabelVolumeNode] != "node-1" || v.Name != inlineID || v.Labels[v1alpha1.LabelVolumeHandle] != v1alpha1.HandleLabel(inlineID) {
				t.Fatalf("record %s, labels %v", v.Name, v.Labels)
			}
			if runner.live() != 0 {
				t.Fatalf("%d pods left", runner.live())
			}
			// Idempotent: the same call answers the same volume, no pod.
			again, err := s.CreateInline(context.Background(), s.Source.(provisioner.Static).P, inlineVol(map[string]string{"color": "blue"}))
			if err != nil || again.Status.Handle != inlineID || len(runner.phases()) != len(strings.Fields(tc.wantPhases)) {
				t.Fatalf("again: %v %v", again, err)
			}
		})
	}
}

func TestCreateInlineRefusals(t *testing.T) {
	p := prov(t, "  provisioningModes: [Ephemeral]\n  volumeCreation: {capacity: 1}\n  volumeStaging: "+fmt.Sprintf(pod, "true")+"\n")
	c := newCluster(t)
	s := c.nodeServer(p, &fakeRunner{}, "node-1")
	ctx := context.Background()

	dyn := prov(t, "  provisioningModes: [Dynamic]\n  volumeCreation: {capacity: 1}\n  volumeStaging: "+fmt.Sprintf(pod, "true")+"\n")
	if _, err := s.CreateInline(ctx, dyn, inlineVol(nil)); status.Code(grpcerr.Status(err)) != codes.InvalidArgument || !strings.Contains(err.Error(), "add Ephemeral to its spec.provisioningModes") {
		t.Fatalf("provisioner without Ephemeral: %v", err)
	}
	if _, err := s.CreateInline(ctx, p, inlineVol(map[string]string{"a": "1"})); err != nil {
		t.Fatal(err)
	}
	other := inlineVol(map[string]string{"a": "1"})
	other.Pod.UID = "another-pod"
	if _, err := s.CreateInline(ctx, p, other); status.Code(grpcerr.Status(err)) != codes.AlreadyExists {
		t.Fatalf("another pod's volume under the id: %v", err)
	}
	if _, err := s.CreateInline(ctx, p, inlineVol(map[string]string{"a": "2"})); status.Code(grpcerr.Status(err)) != codes.AlreadyExists {
		t.Fatalf("other attributes: %v", err)
	}
	// Another node's plugin neither sees nor writes it.
	if _, err := c.nodeServer(p, &fakeRunner{}, "node-2").CreateInline(ctx, p, InlineVolume{ID: inlineID, Node: "node-2"}); status.Code(grpcerr.Status(err)) != codes.AlreadyExists ||
		!strings.Contains(err.Error(), "an inline volume of node node-1, not an inline volume of node node-2") {
		t.Fatalf("another node: %v", err)
	}
	if err := c.nodeServer(p, &fakeRunner{}, "node-2").DeleteInline(ctx, p, inlineID); err == nil {
		t.Fatal("another node deleted the volume")
	}

	// The controller plugin leaves it alone: DeleteVolume of its handle
	// is a no-op, and CreateVolume of its name is refused.
	ctrl := c.server(p, &fakeRunner{})
	dynP := prov(t, "  provisioningModes: [Dynamic, Ephemeral]\n  volumeCreation: {capacity: 1}\n  volumeStaging: "+fmt.Sprintf(pod, "true")+"\n")
	ctrl.Source = provisioner.Static{P: dynP}
	if _, err := ctrl.DeleteVolume(ctx, &csi.DeleteVolumeRequest{VolumeId: inlineID}); err != nil {
		t.Fatal(err)
	}
	if _, err := ctrl.CreateVolume(ctx, createReq(inlineID, 1, 0)); status.Code(err) != codes.AlreadyExists {
		t.Fatalf("CreateVolume of an inline volume's name: %v", err)
	}
	if v := c.volume(inlineID); v == nil || v.Status.Phase != v1alpha1.VolumeCreated {
		t.Fatalf("record %+v", v)
	}
}

func TestDeleteInline(t *testing.T) {
	spec := "  provisioningModes: [Ephemeral]\n  volumeValidation: " + fmt.Sprintf(pod, "true") + "\n  volumeCreation: " + fmt.Sprintf(pod, "true") +
		"\n  volumeDeletion: " + fmt.Sprintf(pod, "rm {{ handle }} {{ capacity or 'unknown' }}") + "\n  volumeStaging: " + fmt.Sprintf(pod, "true") + "\n"
	p := prov(t, spec)
	running := func(podrunner.Operation) (*podrunner.Result, error) { return nil, context.DeadlineExceeded }
	for _, tc := range []struct {
		name string
		// first: the answers while CreateInline runs (a deadline leaves the
		// record in its phase); then: while DeleteInline runs.
		first, then answers
		wantPhases  string
		wantDeleted string // the deletion pod's command
	}{
		{name: "created", first: answers{v1alpha1.PhaseCreation: files(map[string]string{"capacity": "1Ki"})},
			wantPhases: "validation creation deletion", wantDeleted: "sh -c rm " + inlineID + " 1024"},
		{name: "during its validation: abandoned, no deletion pod", first: answers{v1alpha1.PhaseValidation: running},
			wantPhases: "validation"},
		{name: "during its creation: finished, then deleted", first: answers{v1alpha1.PhaseCreation: running},
			then:       answers{v1alpha1.PhaseCreation: files(map[string]string{"capacity": "2Ki"})},
			wantPhases: "validation creation deletion", wantDeleted: "sh -c rm " + inlineID + " 2048"},
		{name: "during its creation, which fails: reverted, and that is the deletion", first: answers{v1alpha1.PhaseCreation: running},
			then:       answers{v1alpha1.PhaseCreation: podFails("quota")},
			wantPhases: "validation creation deletion", wantDeleted: "sh -c rm " + inlineID + " unknown"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := newCluster(t)
			runner := &fakeRunner{answers: tc.first}
			_, _ = c.nodeServer(p, runner, "node-1").CreateInline(context.Background(), p, inlineVol(nil))
			runner.answers = tc.then
			s := c.nodeServer(p, runner, "node-1") // a restarted node plugin
			if err := s.DeleteInline(context.Background(), p, inlineID); err != nil {
				t.Fatal(err)
			}
			if got := strings.Join(runner.phases(), " "); got != tc.wantPhases {
				t.Errorf("pods %q, want %q", got, tc.wantPhases)
			}
			if got := runner.command(v1alpha1.PhaseDeletion); got != tc.wantDeleted {
				t.Errorf("deletion %q, want %q", got, tc.wantDeleted)
			}
			if n := len(c.volumes()); n != 0 || runner.live() != 0 {
				t.Fatalf("left %d records, %d pods", n, runner.live())
			}
			// Again: nothing to do.
			if err := s.DeleteInline(context.Background(), p, inlineID); err != nil {
				t.Fatal(err)
			}
		})
	}

	// A deletion pod that fails keeps the record Deleting; the retry runs a
	// new one.
	c := newCluster(t)
	runner := &fakeRunner{answers: answers{v1alpha1.PhaseDeletion: podFails("backend down"), v1alpha1.PhaseCreation: files(map[string]string{"capacity": "1"})}}
	s := c.nodeServer(p, runner, "node-1")
	if _, err := s.CreateInline(context.Background(), p, inlineVol(nil)); err != nil {
		t.Fatal(err)
	}
	if err := s.DeleteInline(context.Background(), p, inlineID); status.Code(grpcerr.Status(err)) != codes.Internal || !strings.Contains(err.Error(), "backend down") {
		t.Fatalf("error %v", err)
	}
	if v := c.volume(inlineID); v == nil || v.Status.Phase != v1alpha1.VolumeDeleting {
		t.Fatalf("record %+v", v)
	}
	runner.answers[v1alpha1.PhaseDeletion] = nil
	if err := s.DeleteInline(context.Background(), p, inlineID); err != nil || len(c.volumes()) != 0 {
		t.Fatalf("retry: %v, %d records", err, len(c.volumes()))
	}
}

// The kubelet's id of an inline volume (pkg/volume/csi makeVolumeHandle):
// csi-<hex SHA-256 of the pod's UID and the volume's name>.
func TestInlineVolumeID(t *testing.T) {
	if got, want := InlineVolumeID("pod-uid", "my-volume-0"), "csi-d0df31d82b90f2e8139b409cdde1d72a33942780b6f18c75d3c9d0f7d938d5d3"; got != want {
		t.Fatalf("id %q, want %q", got, want)
	}
}
