package controllerserver

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	dynamicfake "k8s.io/client-go/dynamic/fake"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"

	"github.com/pods-as-volumes/pav/api/v1alpha1"
	"github.com/pods-as-volumes/pav/internal/fakekubelet"
	"github.com/pods-as-volumes/pav/internal/kube/kubetest"
	"github.com/pods-as-volumes/pav/internal/phase"
	"github.com/pods-as-volumes/pav/internal/provisioner"
	"github.com/pods-as-volumes/pav/internal/records"
	"github.com/pods-as-volumes/pav/internal/records/recordstest"
	"github.com/pods-as-volumes/pav/internal/volume"
	"github.com/pods-as-volumes/pav/podrunner"
)

// fakeRunner plays the pod runner: it answers per phase, and keeps the pods
// that exist (created by a Run with no recorded UID, removed by Delete) as a
// real runner would, adopting a pod by its recorded UID or token.
type fakeRunner struct {
	mu      sync.Mutex
	ops     []podrunner.Operation // every Run
	answers map[v1alpha1.Phase]func(op podrunner.Operation) (*podrunner.Result, error)
	pods    map[string]fakePod // by pod name: the pods that exist
	created int                // pods created
	// refuse, if set, is the API server's answer to creating a pod that
	// does not exist yet (nil: created).
	refuse  func(op podrunner.Operation) error
	deleted []string // pods removed by Delete
	nextUID int
}

type fakePod struct {
	uid    types.UID
	token  string
	result *podrunner.Result
	err    error
	done   bool
}

func (f *fakeRunner) Namespace(op podrunner.Operation) string { return op.Namespace("") }

func (f *fakeRunner) Run(ctx context.Context, op podrunner.Operation) (*podrunner.Result, error) {
	if op.Token == "" {
		return nil, fmt.Errorf("%w: no token", podrunner.ErrInvalidOperation)
	}
	f.mu.Lock()
	if f.pods == nil {
		f.pods = map[string]fakePod{}
	}
	f.ops = append(f.ops, op)
	name := op.PodName()
	p, exists := f.pods[name]
	switch {
	case exists && (op.UID != "" && p.uid != op.UID || op.UID == "" && p.token != op.Token):
		f.mu.Unlock()
		return nil, fmt.Errorf("%w: pod %s", podrunner.ErrForeignPod, name)
	case !exists && op.UID != "":
		f.mu.Unlock()
		return nil, fmt.Errorf("%w: %s", podrunner.ErrPodDeleted, name)
	case !exists && f.refuse != nil && f.refuse(op) != nil:
		f.mu.Unlock()
		return nil, f.refuse(op)
	case !exists:
		f.nextUID++
		p = fakePod{uid: types.UID(fmt.Sprintf("uid-%d", f.nextUID)), token: op.Token}
		f.pods[name] = p
		f.created++
	}
	adoptedByToken := op.UID == ""
	answer := f.answers[op.Phase]
	f.mu.Unlock()
	if adoptedByToken && op.Created != nil {
		if err := op.Created(ctx, p.uid); err != nil {
			return nil, err
		}
	}
	if !p.done {
		p.result, p.err = &podrunner.Result{Pod: name, Files: map[string]string{}}, nil
		if answer != nil {
			p.result, p.err = answer(op)
		}
		if errors.Is(p.err, context.DeadlineExceeded) {
			return nil, p.err // still running
		}
		p.done = true
		f.mu.Lock()
		f.pods[name] = p
		f.mu.Unlock()
	}
	if p.result != nil {
		p.result.UID = p.uid
	}
	var pf *podrunner.PodFailure
	if errors.As(p.err, &pf) {
		pf.UID = p.uid
	}
	return p.result, p.err
}

func (f *fakeRunner) Delete(_ context.Context, op podrunner.Operation) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	name := op.PodName()
	if p, ok := f.pods[name]; ok && (op.UID != "" && p.uid == op.UID || op.UID == "" && p.token == op.Token) {
		delete(f.pods, name)
		f.deleted = append(f.deleted, name)
	}
	return nil
}

// phases lists the phases of the pods that were created, in order.
func (f *fakeRunner) phases() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []string
	seen := map[string]bool{}
	for _, op := range f.ops {
		if k := op.PodName() + op.Token; !seen[k] {
			seen[k] = true
			out = append(out, string(op.Phase))
		}
	}
	return out
}

func (f *fakeRunner) command(ph v1alpha1.Phase) string {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, op := range f.ops {
		if op.Phase == ph {
			return strings.Join(op.Template.Spec.Containers[0].Command, " ")
		}
	}
	return ""
}

// live is the number of pods that exist.
func (f *fakeRunner) live() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.pods)
}

func files(m map[string]string) func(podrunner.Operation) (*podrunner.Result, error) {
	return func(podrunner.Operation) (*podrunner.Result, error) { return &podrunner.Result{Files: m}, nil }
}

func podFails(msg string) func(op podrunner.Operation) (*podrunner.Result, error) {
	return func(op podrunner.Operation) (*podrunner.Result, error) {
		return nil, &podrunner.PodFailure{Phase: string(op.Phase), Pod: "p", Namespace: "pav", PodPhase: corev1.PodFailed, Reason: "Error", ErrorFile: msg}
	}
}

const pod = `{podTemplate: {spec: {containers: [{name: c, image: busybox, command: [sh, -c, "%s"]}]}}}`

func prov(t testing.TB, spec string) *v1alpha1.PavProvisioner {
	t.Helper()
	p, err := provisioner.Load([]byte("apiVersion: pav.albertofaria.github.io/v1alpha1\nkind: PavProvisioner\nmetadata: {name: test}\nspec:\n" + spec))
	if err != nil {
		t.Fatal(err)
	}
	if err := phase.Check(p); err != nil {
		t.Fatal(err)
	}
	return p
}

// cluster is the API a controller plugin talks to: PavVolume records behind a
// fake dynamic client with API server write semantics, PVCs and
// StorageClasses behind a fake clientset.
type cluster struct {
	t       testing.TB
	records *dynamicfake.FakeDynamicClient
	client  kubernetes.Interface
}

func newCluster(t testing.TB, objects ...runtime.Object) *cluster {
	return &cluster{t: t, records: recordstest.NewClient(), client: fake.NewClientset(objects...)}
}

// server is a controller plugin process on the cluster: a new one after a
// restart shares nothing with the old but the API.
func (c *cluster) server(p *v1alpha1.PavProvisioner, runner PodRunner) *Server {
	c.t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	c.t.Cleanup(cancel)
	store := records.New(c.records, p.Name)
	if err := store.Start(ctx); err != nil {
		c.t.Fatal(err)
	}
	snaps := records.NewSnapshots(c.records, p.Name)
	if err := snaps.Start(ctx); err != nil {
		c.t.Fatal(err)
	}
	groups := records.NewGroupSnapshots(c.records, p.Name)
	if err := groups.Start(ctx); err != nil {
		c.t.Fatal(err)
	}
	return &Server{Source: provisioner.Static{P: p}, Eval: phase.NewEvaluator(nil), Pods: runner, Records: store, Snapshots: snaps,
		GroupSnapshots: groups, Client: kubetest.Wrap(c.client)}
}

// volumes is every PavVolume, read from the API.
func (c *cluster) volumes() []*v1alpha1.PavVolume {
	c.t.Helper()
	l, err := c.records.Resource(v1alpha1.VolumeGroupVersionResource).List(context.Background(), metav1.ListOptions{})
	if err != nil {
		c.t.Fatal(err)
	}
	var out []*v1alpha1.PavVolume
	for i := range l.Items {
		v := &v1alpha1.PavVolume{}
		if err := runtime.DefaultUnstructuredConverter.FromUnstructured(l.Items[i].Object, v); err != nil {
			c.t.Fatal(err)
		}
		out = append(out, v)
	}
	return out
}

func (c *cluster) volume(name string) *v1alpha1.PavVolume {
	c.t.Helper()
	for _, v := range c.volumes() {
		if v.Spec.VolumeName == name {
			return v
		}
	}
	return nil
}

func capReq(caps ...*csi.VolumeCapability) []*csi.VolumeCapability { return caps }

func mountCap(m csi.VolumeCapability_AccessMode_Mode) *csi.VolumeCapability {
	return &csi.VolumeCapability{AccessType: &csi.VolumeCapability_Mount{Mount: &csi.VolumeCapability_MountVolume{}},
		AccessMode: &csi.VolumeCapability_AccessMode{Mode: m}}
}

func blockCap() *csi.VolumeCapability {
	return &csi.VolumeCapability{AccessType: &csi.VolumeCapability_Block{Block: &csi.VolumeCapability_BlockVolume{}},
		AccessMode: &csi.VolumeCapability_AccessMode{Mode: csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER}}
}

var rwo = mountCap(csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER)

func createReq(name string, required, limit int64, caps ...*csi.VolumeCapability) *csi.CreateVolumeRequest {
	if len(caps) == 0 {
		caps = capReq(rwo)
	}
	return &csi.CreateVolumeRequest{Name: name, VolumeCapabilities: caps,
		CapacityRange: &csi.CapacityRange{RequiredBytes: required, LimitBytes: limit}, Parameters: map[string]string{"color": "blue"}}
}

type answers = map[v1alpha1.Phase]func(podrunner.Operation) (*podrunner.Result, error)

func TestCreateVolume(t *testing.T) {
	base := "  provisioningModes: [Dynamic]\n  volumeStaging: " + fmt.Sprintf(pod, "true") + "\n"
	for _, tc := range []struct {
		name       string
		spec       string
		req        *csi.CreateVolumeRequest
		answers    answers
		wantCode   codes.Code
		wantMsg    string
		wantPhases string
		wantHandle string
		wantCap    int64
		// wantRecord is the phase of the record left (final errors leave none).
		wantRecord v1alpha1.VolumePhase
	}{
		{name: "fixed capacity, no pods", spec: "  volumeCreation: {capacity: 1Gi}\n",
			req: createReq("v1", 1<<20, 0), wantHandle: "v1", wantCap: 1 << 30, wantRecord: v1alpha1.VolumeCreated},
		{name: "handle and capacity from the creation pod, trimmed",
			spec:       "  volumeCreation: " + fmt.Sprintf(pod, "true") + "\n",
			req:        createReq("v1", 100, 0),
			answers:    answers{v1alpha1.PhaseCreation: files(map[string]string{"handle": " my-handle\n", "capacity": " 2Ki\n"})},
			wantPhases: "creation", wantHandle: "my-handle", wantCap: 2048, wantRecord: v1alpha1.VolumeCreated},
		{name: "validation and creation pods",
			spec:       "  volumeValidation: " + fmt.Sprintf(pod, "true") + "\n  volumeCreation: " + fmt.Sprintf(pod, "true") + "\n",
			req:        createReq("v1", 100, 0),
			answers:    answers{v1alpha1.PhaseCreation: files(map[string]string{"capacity": "1Ki"})},
			wantPhases: "validation creation", wantHandle: "v1", wantCap: 1024, wantRecord: v1alpha1.VolumeCreated},
		{name: "template handle", spec: "  volumeCreation: {handle: \"h-{{ params.color }}\", capacity: 10}\n",
			req: createReq("v1", 1, 0), wantHandle: "h-blue", wantCap: 10, wantRecord: v1alpha1.VolumeCreated},
		{name: "template error names the field", spec: "  volumeCreation: {capacity: \"{{ nope }}\"}\n",
			req: createReq("v1", 1, 0), wantCode: codes.InvalidArgument, wantMsg: "spec.volumeCreation.capacity"},
		{name: "template capacity not positive", spec: "  volumeCreation: {capacity: \"{{ 0 }}\"}\n",
			req: createReq("v1", 1, 0), wantCode: codes.InvalidArgument, wantMsg: "capacity values must be positive"},
		{name: "volume mode not supported", spec: "  volumeCreation: {capacity: 1Gi}\n",
			req: createReq("v1", 1, 0, blockCap()), wantCode: codes.InvalidArgument, wantMsg: "volume mode Block is not supported"},
		{name: "access mode not supported", spec: "  volumeValidation: {accessModes: [ReadWriteOnce]}\n  volumeCreation: {capacity: 1Gi}\n",
			req: createReq("v1", 1, 0, mountCap(csi.VolumeCapability_AccessMode_MULTI_NODE_MULTI_WRITER)), wantCode: codes.InvalidArgument, wantMsg: "access mode ReadWriteMany is not supported"},
		{name: "ReadWriteOncePod accepted when listed", spec: "  volumeValidation: {accessModes: [ReadWriteOncePod]}\n  volumeCreation: {capacity: 1Gi}\n",
			req: createReq("v1", 1, 0, mountCap(csi.VolumeCapability_AccessMode_SINGLE_NODE_SINGLE_WRITER)), wantHandle: "v1", wantCap: 1 << 30, wantRecord: v1alpha1.VolumeCreated},
		{name: "ReadWriteOncePod refused by default", spec: "  volumeCreation: {capacity: 1Gi}\n",
			req: createReq("v1", 1, 0, mountCap(csi.VolumeCapability_AccessMode_SINGLE_NODE_SINGLE_WRITER)), wantCode: codes.InvalidArgument, wantMsg: "ReadWriteOncePod"},
		{name: "request above maxCapacity", spec: "  volumeValidation: {maxCapacity: 1Mi}\n  volumeCreation: {capacity: 1Mi}\n",
			req: createReq("v1", 2<<20, 0), wantCode: codes.OutOfRange, wantMsg: "above the provisioner's maximum 1Mi"},
		{name: "limit below minCapacity", spec: "  volumeValidation: {minCapacity: 1Gi}\n  volumeCreation: {capacity: 1Gi}\n",
			req: createReq("v1", 1, 1<<20), wantCode: codes.OutOfRange, wantMsg: "below the provisioner's minimum 1Gi"},
		{name: "fixed capacity below the request: nothing made, nothing recorded", spec: "  volumeCreation: {capacity: 1Ki}\n",
			req: createReq("v1", 1<<20, 0), wantCode: codes.OutOfRange, wantMsg: "below the requested 1Mi"},
		{name: "validation pod fails",
			spec:     "  volumeValidation: " + fmt.Sprintf(pod, "false") + "\n  volumeCreation: {capacity: 1Gi}\n",
			req:      createReq("v1", 1, 0),
			answers:  answers{v1alpha1.PhaseValidation: podFails("color not allowed")},
			wantCode: codes.InvalidArgument, wantMsg: "color not allowed", wantPhases: "validation"},
		{name: "creation pod fails, deletion pod reverts",
			spec:     "  volumeCreation: " + fmt.Sprintf(pod, "false") + "\n  volumeDeletion: " + fmt.Sprintf(pod, "rm") + "\n",
			req:      createReq("v1", 1, 0),
			answers:  answers{v1alpha1.PhaseCreation: podFails("quota exceeded")},
			wantCode: codes.Internal, wantMsg: "quota exceeded", wantPhases: "creation deletion"},
		{name: "creation and deletion pods both fail: non-final, the record stays",
			spec:     "  volumeCreation: " + fmt.Sprintf(pod, "false") + "\n  volumeDeletion: " + fmt.Sprintf(pod, "rm") + "\n",
			req:      createReq("v1", 1, 0),
			answers:  answers{v1alpha1.PhaseCreation: podFails("quota exceeded"), v1alpha1.PhaseDeletion: podFails("backend down")},
			wantCode: codes.Aborted, wantMsg: "undoing it failed too", wantPhases: "creation deletion", wantRecord: v1alpha1.VolumeReverting},
		{name: "empty /pav/handle reverts",
			spec:     "  volumeCreation: " + fmt.Sprintf(pod, "true") + "\n  volumeDeletion: " + fmt.Sprintf(pod, "rm") + "\n",
			req:      createReq("v1", 1, 0),
			answers:  answers{v1alpha1.PhaseCreation: files(map[string]string{"handle": " \n", "capacity": "1Gi"})},
			wantCode: codes.Internal, wantMsg: "empty /pav/handle", wantPhases: "creation deletion"},
		{name: "capacity unknown",
			spec:     "  volumeCreation: " + fmt.Sprintf(pod, "true") + "\n",
			req:      createReq("v1", 1, 0),
			wantCode: codes.OutOfRange, wantMsg: "capacity is unknown", wantPhases: "creation"},
		{name: "created capacity below request reverts",
			spec:     "  volumeCreation: " + fmt.Sprintf(pod, "true") + "\n  volumeDeletion: " + fmt.Sprintf(pod, "rm") + "\n",
			req:      createReq("v1", 1<<30, 0),
			answers:  answers{v1alpha1.PhaseCreation: files(map[string]string{"capacity": "1Mi"})},
			wantCode: codes.OutOfRange, wantMsg: "below the requested 1Gi", wantPhases: "creation deletion"},
		{name: "call deadline while the pod runs: no revert, the record stays",
			spec:     "  volumeCreation: " + fmt.Sprintf(pod, "sleep 1000") + "\n  volumeDeletion: " + fmt.Sprintf(pod, "rm") + "\n",
			req:      createReq("v1", 1, 0),
			answers:  answers{v1alpha1.PhaseCreation: func(podrunner.Operation) (*podrunner.Result, error) { return nil, context.DeadlineExceeded }},
			wantCode: codes.DeadlineExceeded, wantPhases: "creation", wantRecord: v1alpha1.VolumeCreating},
		{name: "pod timeout is final and reverted",
			spec: "  volumeCreation: " + fmt.Sprintf(pod, "sleep 1000") + "\n  volumeDeletion: " + fmt.Sprintf(pod, "rm") + "\n",
			req:  createReq("v1", 1, 0),
			answers: answers{v1alpha1.PhaseCreation: func(op podrunner.Operation) (*podrunner.Result, error) {
				return nil, &podrunner.PodFailure{Phase: "creation", Pod: "p", Namespace: "pav", PodPhase: corev1.PodRunning, Reason: "Timeout", Message: "still running after 5m"}
			}},
			wantCode: codes.Internal, wantMsg: "Timeout", wantPhases: "creation deletion"},
		{name: "static-only provisioner refuses dynamic", spec: "",
			req: createReq("v1", 1, 0), wantCode: codes.InvalidArgument, wantMsg: "does not allow dynamic provisioning"},
		{name: "missing name", spec: "  volumeCreation: {capacity: 1Gi}\n",
			req: createReq("", 1, 0), wantCode: codes.InvalidArgument, wantMsg: "name is required"},
		{name: "missing capabilities", spec: "  volumeCreation: {capacity: 1Gi}\n",
			req: &csi.CreateVolumeRequest{Name: "v"}, wantCode: codes.InvalidArgument, wantMsg: "capabilities are required"},
		{name: "required above limit", spec: "  volumeCreation: {capacity: 1Gi}\n",
			req: createReq("v1", 10, 5), wantCode: codes.InvalidArgument, wantMsg: "exceed limit"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			spec := base + tc.spec
			if tc.name == "static-only provisioner refuses dynamic" {
				spec = "  provisioningModes: [Static]\n  volumeStaging: " + fmt.Sprintf(pod, "true") + "\n"
			}
			runner := &fakeRunner{answers: tc.answers}
			c := newCluster(t)
			s := c.server(prov(t, spec), runner)
			resp, err := s.CreateVolume(context.Background(), tc.req)
			if got := strings.Join(runner.phases(), " "); got != tc.wantPhases {
				t.Errorf("pods run: %q, want %q", got, tc.wantPhases)
			}
			var left v1alpha1.VolumePhase
			if vs := c.volumes(); len(vs) > 0 {
				left = vs[0].Status.Phase
			}
			if left != tc.wantRecord {
				t.Errorf("record left: %q, want %q", left, tc.wantRecord)
			}
			if tc.wantRecord != v1alpha1.VolumeCreating && runner.live() != 0 {
				t.Errorf("%d pods left behind", runner.live())
			}
			if tc.wantCode != codes.OK {
				if status.Code(err) != tc.wantCode || !strings.Contains(status.Convert(err).Message(), tc.wantMsg) {
					t.Fatalf("error = %v, want %v containing %q", err, tc.wantCode, tc.wantMsg)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if resp.Volume.VolumeId != tc.wantHandle || resp.Volume.CapacityBytes != tc.wantCap {
				t.Fatalf("volume = %s/%d, want %s/%d", resp.Volume.VolumeId, resp.Volume.CapacityBytes, tc.wantHandle, tc.wantCap)
			}
			if resp.Volume.VolumeContext["color"] != "blue" || resp.Volume.VolumeContext[volume.KeyCapacity] == "" {
				t.Fatalf("volume context %v lacks the parameters or pav's keys", resp.Volume.VolumeContext)
			}
			v := c.volume("v1")
			if v.Status.Handle != tc.wantHandle || v.Status.Capacity != tc.wantCap || v.Labels[v1alpha1.LabelVolumeHandle] != v1alpha1.HandleLabel(tc.wantHandle) {
				t.Fatalf("record %+v", v.Status)
			}
		})
	}
}

func TestCreateVolumeIdempotent(t *testing.T) {
	runner := &fakeRunner{answers: answers{v1alpha1.PhaseCreation: files(map[string]string{"capacity": "1Gi", "handle": "h1"})}}
	p := prov(t, "  provisioningModes: [Dynamic]\n  volumeCreation: "+fmt.Sprintf(pod, "true")+"\n  volumeStaging: "+fmt.Sprintf(pod, "true")+"\n")
	c := newCluster(t)
	s := c.server(p, runner)
	ctx := context.Background()
	first, err := s.CreateVolume(ctx, createReq("v1", 1<<20, 0))
	if err != nil {
		t.Fatal(err)
	}
	// The same request again, to this process or a restarted one.
	for _, srv := range []*Server{s, c.server(p, runner)} {
		again, err := srv.CreateVolume(ctx, createReq("v1", 1<<20, 0))
		if err != nil || again.Volume.VolumeId != first.Volume.VolumeId {
			t.Fatalf("repeat = %v, %v", again, err)
		}
	}
	if n := len(runner.phases()); n != 1 {
		t.Fatalf("creation pod ran %d times, want once", n)
	}
	if _, err := s.CreateVolume(ctx, createReq("v1", 2<<30, 0)); status.Code(err) != codes.AlreadyExists {
		t.Fatalf("incompatible repeat: %v, want AlreadyExists", err)
	}
	if _, err := s.CreateVolume(ctx, createReq("v1", 1<<20, 0, blockCap())); status.Code(err) != codes.AlreadyExists {
		t.Fatalf("repeat as Block: %v, want AlreadyExists", err)
	}
	other := createReq("v1", 1<<20, 0)
	other.Parameters["color"] = "red"
	if _, err := s.CreateVolume(ctx, other); status.Code(err) != codes.AlreadyExists {
		t.Fatalf("repeat with other parameters: %v, want AlreadyExists", err)
	}
	// DeleteVolume finds the record, runs no pod (no volumeDeletion), removes it.
	if _, err := s.DeleteVolume(ctx, &csi.DeleteVolumeRequest{VolumeId: "h1"}); err != nil {
		t.Fatal(err)
	}
	if len(c.volumes()) != 0 {
		t.Fatal("record left after DeleteVolume")
	}
	if _, err := s.CreateVolume(ctx, createReq("v1", 1<<20, 0)); err != nil {
		t.Fatal(err)
	}
	if n := len(runner.phases()); n != 2 {
		t.Fatalf("after deletion the volume must be created again: %d creations", n)
	}
}

func TestCreateVolumeConcurrentCallAborted(t *testing.T) {
	entered, release := make(chan struct{}), make(chan struct{})
	runner := &fakeRunner{answers: answers{v1alpha1.PhaseCreation: func(podrunner.Operation) (*podrunner.Result, error) {
		close(entered)
		<-release
		return &podrunner.Result{Files: map[string]string{"capacity": "1Gi"}}, nil
	}}}
	p := prov(t, "  provisioningModes: [Dynamic]\n  volumeCreation: "+fmt.Sprintf(pod, "true")+"\n  volumeStaging: "+fmt.Sprintf(pod, "true")+"\n")
	s := newCluster(t).server(p, runner)
	done := make(chan error)
	go func() {
		_, err := s.CreateVolume(context.Background(), createReq("v1", 1, 0))
		done <- err
	}()
	<-entered
	if _, err := s.CreateVolume(context.Background(), createReq("v1", 1, 0)); status.Code(err) != codes.Aborted {
		t.Fatalf("second call while the first runs: %v, want Aborted", err)
	}
	close(release)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

func claimObjects() (*corev1.PersistentVolumeClaim, *storagev1.StorageClass) {
	mode := corev1.PersistentVolumeFilesystem
	scName := "fast"
	pvc := &corev1.PersistentVolumeClaim{
		ObjectMeta: metav1.ObjectMeta{Name: "my claim", Namespace: "ns1", UID: "uid-1",
			ManagedFields: []metav1.ManagedFieldsEntry{{Manager: "kubectl"}}},
		Spec: corev1.PersistentVolumeClaimSpec{StorageClassName: &scName, VolumeMode: &mode,
			AccessModes: []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOncePod},
			Resources:   corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("1Mi")}}},
	}
	sc := &storagev1.StorageClass{ObjectMeta: metav1.ObjectMeta{Name: scName}, Provisioner: "test", Parameters: map[string]string{"color": "blue"}}
	return pvc, sc
}

func claimReq(pvc *corev1.PersistentVolumeClaim) *csi.CreateVolumeRequest {
	req := createReq(DefaultHandle(pvc), 1<<20, 0)
	req.Parameters = map[string]string{"color": "blue", volume.ParamPVCName: pvc.Name, volume.ParamPVCNamespace: pvc.Namespace, volume.ParamPVName: DefaultHandle(pvc)}
	return req
}

const claimSpec = `  provisioningModes: [Dynamic]
  volumeValidation: {accessModes: [ReadWriteOncePod]}
  volumeCreation:
    podTemplate: {spec: {containers: [{name: c, image: busybox, command: [echo, "{{ pvc.metadata.name | tobash }}", "{{ sc.metadata.name }}", "{{ defaultHandle }}", "{{ requestedAccessModes[0] }}", "{{ requestedMinCapacity }}"]}]}}
  volumeDeletion:
    podTemplate: {spec: {containers: [{name: d, image: busybox, command: [echo, "{{ pvc.metadata.name | tobash }}", "{{ sc.metadata.name }}", "{{ handle }}", "{{ capacity or 'unknown' }}", "{{ params.color }}"]}]}}
  volumeStaging: {podTemplate: {spec: {containers: [{name: s, image: busybox}]}}}
`

func TestCreateVolumeFromPVC(t *testing.T) {
	pvc, sc := claimObjects()
	c := newCluster(t, pvc, sc)
	runner := &fakeRunner{answers: answers{v1alpha1.PhaseCreation: files(map[string]string{"capacity": "1Mi"})}}
	p := prov(t, claimSpec)
	s := c.server(p, runner)
	resp, err := s.CreateVolume(context.Background(), claimReq(pvc))
	if err != nil {
		t.Fatal(err)
	}
	if got, want := runner.command(v1alpha1.PhaseCreation), "echo 'my claim' fast pvc-uid-1 ReadWriteOncePod 1048576"; got != want {
		t.Fatalf("creation pod command = %q, want %q", got, want)
	}
	vc := resp.Volume.VolumeContext
	if _, ok := vc[volume.ParamPVCName]; ok {
		t.Fatal("the sidecar's csi.storage.k8s.io keys must not reach the volume context")
	}
	if vc[volume.KeyPV] != "pvc-uid-1" || len(vc) != 3 {
		t.Fatalf("volume context %v: want the parameters, the capacity and the PV name, nothing else", vc)
	}
	v := c.volume("pvc-uid-1")
	if v == nil || v.Name != "pvc-uid-1" || v.Spec.Claim != "ns1/my claim" || v.Spec.PVC.Name != "my claim" || v.Spec.SC.Name != "fast" ||
		v.Spec.PVC.ManagedFields != nil || v.Spec.DefaultHandle != "pvc-uid-1" || v.Spec.RequestedAccessModes[0] != corev1.ReadWriteOncePod {
		t.Fatalf("record %+v", v)
	}
	// pav never writes PVCs (or PVs).
	for _, a := range c.client.(*fake.Clientset).Actions() {
		if a.GetVerb() != "get" && a.GetVerb() != "list" && a.GetVerb() != "watch" {
			t.Errorf("wrote to the API: %s %s", a.GetVerb(), a.GetResource().Resource)
		}
	}
	// The claim and its class go; a new driver process deletes the volume
	// with the context creation had.
	_ = c.client.CoreV1().PersistentVolumeClaims("ns1").Delete(context.Background(), "my claim", metav1.DeleteOptions{})
	_ = c.client.StorageV1().StorageClasses().Delete(context.Background(), "fast", metav1.DeleteOptions{})
	if _, err := c.server(p, runner).DeleteVolume(context.Background(), &csi.DeleteVolumeRequest{VolumeId: resp.Volume.VolumeId}); err != nil {
		t.Fatal(err)
	}
	if got, want := runner.command(v1alpha1.PhaseDeletion), "echo 'my claim' fast pvc-uid-1 1048576 blue"; got != want {
		t.Fatalf("deletion pod command = %q, want %q", got, want)
	}
	if len(c.volumes()) != 0 || runner.live() != 0 {
		t.Fatalf("left: %d records, %d pods", len(c.volumes()), runner.live())
	}
}

// TestForgedRecordIgnored is finding 1: a tenant annotates its PVC (of a
// WaitForFirstConsumer class, before its consumer exists) with a record of the
// volume it wants, naming its own volume name and the victim's handle. pav
// takes no record from a PVC: the claim gets its own new volume.
func TestForgedRecordIgnored(t *testing.T) {
	pvc, sc := claimObjects()
	pvc.Annotations = map[string]string{v1alpha1.GroupName + "/created-volume": `{"name":"pvc-uid-1","handle":"victim-handle","capacity":1048576}`}
	c := newCluster(t, pvc, sc)
	runner := &fakeRunner{answers: answers{v1alpha1.PhaseCreation: files(map[string]string{"capacity": "1Mi"})}}
	resp, err := c.server(prov(t, claimSpec), runner).CreateVolume(context.Background(), claimReq(pvc))
	if err != nil {
		t.Fatal(err)
	}
	if resp.Volume.VolumeId != "pvc-uid-1" || strings.Join(runner.phases(), " ") != "creation" {
		t.Fatalf("volume %q, pods %v: want a new volume of its own", resp.Volume.VolumeId, runner.phases())
	}
}

// TestClaimGone: a claim deleted before its volume is recorded fails finally
// (nothing was made); once recorded, the snapshot is used and creation
// finishes (finding 3), whatever happens to the claim.
func TestClaimGone(t *testing.T) {
	p := prov(t, claimSpec)
	pvc, sc := claimObjects()
	c := newCluster(t, sc)
	runner := &fakeRunner{}
	_, err := c.server(p, runner).CreateVolume(context.Background(), claimReq(pvc))
	if status.Code(err) != codes.FailedPrecondition || !strings.Contains(err.Error(), "PersistentVolumeClaim ns1/my claim no longer exists") {
		t.Fatalf("error %v", err)
	}
	if len(c.volumes()) != 0 || len(runner.ops) != 0 {
		t.Fatal("something was made for a claim that is gone")
	}

	c = newCluster(t, pvc, sc)
	runner = &fakeRunner{answers: answers{v1alpha1.PhaseCreation: func(podrunner.Operation) (*podrunner.Result, error) { return nil, context.DeadlineExceeded }}}
	if _, err := c.server(p, runner).CreateVolume(context.Background(), claimReq(pvc)); status.Code(err) != codes.DeadlineExceeded {
		t.Fatalf("first call: %v", err)
	}
	_ = c.client.CoreV1().PersistentVolumeClaims("ns1").Delete(context.Background(), "my claim", metav1.DeleteOptions{})
	runner.answers = answers{v1alpha1.PhaseCreation: files(map[string]string{"capacity": "1Mi"})}
	resp, err := c.server(p, runner).CreateVolume(context.Background(), claimReq(pvc))
	if err != nil || resp.Volume.VolumeId != "pvc-uid-1" {
		t.Fatalf("retry after the claim went: %v, %v", resp, err)
	}
	if runner.created != 1 {
		t.Fatalf("%d creation pods, want 1", runner.created)
	}
}

// TestRestartBetweenPodAndRecord is finding 2: the creation pod finished but
// the record of its outcome could not be written (the API server failed; a
// crash is the same). The pod stays, and the retry reads its result again:
// creation runs once.
func TestRestartBetweenPodAndRecord(t *testing.T) {
	p := prov(t, "  provisioningModes: [Dynamic]\n  volumeCreation: "+fmt.Sprintf(pod, "true")+"\n  volumeStaging: "+fmt.Sprintf(pod, "true")+"\n")
	c := newCluster(t)
	failed := false
	c.records.PrependReactor("update", v1alpha1.VolumeResource, func(a k8stesting.Action) (bool, runtime.Object, error) {
		if phase, _, _ := unstructuredPhase(a); phase == string(v1alpha1.VolumeCreated) && !failed {
			failed = true
			return true, nil, apierrors.NewServiceUnavailable("etcd leader changed")
		}
		return false, nil, nil
	})
	runner := &fakeRunner{answers: answers{v1alpha1.PhaseCreation: files(map[string]string{"handle": "h", "capacity": "1Gi"})}}
	if _, err := c.server(p, runner).CreateVolume(context.Background(), createReq("v1", 1, 0)); status.Code(err) != codes.Unavailable {
		t.Fatalf("first call: %v, want Unavailable", err)
	}
	if runner.live() != 1 {
		t.Fatal("the finished pod was removed before its outcome was recorded")
	}
	resp, err := c.server(p, runner).CreateVolume(context.Background(), createReq("v1", 1, 0))
	if err != nil || resp.Volume.VolumeId != "h" {
		t.Fatalf("retry: %v, %v", resp, err)
	}
	if runner.created != 1 || runner.live() != 0 {
		t.Fatalf("%d creation pods created, %d left; want 1, 0", runner.created, runner.live())
	}
	last := runner.ops[len(runner.ops)-1]
	if last.UID == "" {
		t.Error("the retry did not adopt the pod by its recorded UID")
	}
}

func unstructuredPhase(a k8stesting.Action) (string, bool, error) {
	u, ok := a.(k8stesting.UpdateAction).GetObject().(interface{ UnstructuredContent() map[string]any })
	if !ok {
		return "", false, nil
	}
	st, _ := u.UnstructuredContent()["status"].(map[string]any)
	ph, _ := st["phase"].(string)
	return ph, true, nil
}

// TestRevertRetried: the deletion pod that reverts a failed creation fails
// too: non-final (ABORTED), the record stays Reverting, and the retry (even
// with the claim gone) runs a new deletion pod; once it succeeds the caller
// gets the creation's failure, final, and nothing is left.
func TestRevertRetried(t *testing.T) {
	p := prov(t, claimSpec)
	pvc, sc := claimObjects()
	c := newCluster(t, pvc, sc)
	runner := &fakeRunner{answers: answers{v1alpha1.PhaseCreation: podFails("quota exceeded"), v1alpha1.PhaseDeletion: podFails("backend down")}}
	if _, err := c.server(p, runner).CreateVolume(context.Background(), claimReq(pvc)); status.Code(err) != codes.Aborted {
		t.Fatalf("first call: %v", err)
	}
	if v := c.volume("pvc-uid-1"); v == nil || v.Status.Phase != v1alpha1.VolumeReverting || v.Status.Reason != v1alpha1.ReasonCreationFailed ||
		!strings.Contains(v.Status.Message, "quota exceeded") {
		t.Fatalf("record %+v", v)
	}
	_ = c.client.CoreV1().PersistentVolumeClaims("ns1").Delete(context.Background(), "my claim", metav1.DeleteOptions{})
	runner.answers[v1alpha1.PhaseDeletion] = nil
	_, err := c.server(p, runner).CreateVolume(context.Background(), claimReq(pvc))
	if status.Code(err) != codes.Internal || !strings.Contains(err.Error(), "quota exceeded") {
		t.Fatalf("retry: %v, want the creation's failure", err)
	}
	if got := strings.Join(runner.phases(), " "); got != "creation deletion deletion" {
		t.Fatalf("pods %q", got)
	}
	if len(c.volumes()) != 0 || runner.live() != 0 {
		t.Fatalf("left: %d records, %d pods", len(c.volumes()), runner.live())
	}
}

// TestHandleCollision: a creation pod that reports another volume's handle
// gets no record and no deletion pod (it would delete the other volume).
func TestHandleCollision(t *testing.T) {
	p := prov(t, "  provisioningModes: [Dynamic]\n  volumeCreation: "+fmt.Sprintf(pod, "true")+"\n  volumeDeletion: "+fmt.Sprintf(pod, "rm")+"\n  volumeStaging: "+fmt.Sprintf(pod, "true")+"\n")
	c := newCluster(t)
	runner := &fakeRunner{answers: answers{v1alpha1.PhaseCreation: files(map[string]string{"handle": "shared", "capacity": "1Gi"})}}
	s := c.server(p, runner)
	if _, err := s.CreateVolume(context.Background(), createReq("v1", 1, 0)); err != nil {
		t.Fatal(err)
	}
	_, err := s.CreateVolume(context.Background(), createReq("v2", 1, 0))
	if status.Code(err) != codes.FailedPrecondition || !strings.Contains(err.Error(), `handle "shared" is already the handle of volume v1`) {
		t.Fatalf("error %v", err)
	}
	if got := strings.Join(runner.phases(), " "); got != "creation creation" {
		t.Fatalf("pods %q: no deletion pod may run", got)
	}
	if vs := c.volumes(); len(vs) != 1 || vs[0].Spec.VolumeName != "v1" || runner.live() != 0 {
		t.Fatalf("records %d, pods %d", len(vs), runner.live())
	}
}

// TestPodLost: a pod deleted by someone else before it finished (ABORTED):
// the record keeps it as Lost and the retry runs the phase in a new pod with a
// new token.
func TestPodLost(t *testing.T) {
	p := prov(t, "  provisioningModes: [Dynamic]\n  volumeCreation: "+fmt.Sprintf(pod, "true")+"\n  volumeStaging: "+fmt.Sprintf(pod, "true")+"\n")
	c := newCluster(t)
	runner := &fakeRunner{answers: answers{v1alpha1.PhaseCreation: func(podrunner.Operation) (*podrunner.Result, error) { return nil, context.DeadlineExceeded }}}
	s := c.server(p, runner)
	if _, err := s.CreateVolume(context.Background(), createReq("v1", 1, 0)); status.Code(err) != codes.DeadlineExceeded {
		t.Fatal(err)
	}
	runner.mu.Lock()
	runner.pods = map[string]fakePod{} // someone deletes it
	runner.mu.Unlock()
	if _, err := s.CreateVolume(context.Background(), createReq("v1", 1, 0)); status.Code(err) != codes.Aborted {
		t.Fatalf("pod lost: %v, want Aborted", err)
	}
	v := c.volume("v1")
	if n := len(v.Status.Pods); n != 2 || v.Status.Pods[0].Outcome != v1alpha1.PodLost || v.Status.Pods[1].Outcome != v1alpha1.PodRunning ||
		v.Status.Pods[0].Token == v.Status.Pods[1].Token {
		t.Fatalf("pods recorded %+v", v.Status.Pods)
	}
	runner.answers[v1alpha1.PhaseCreation] = files(map[string]string{"capacity": "1Gi"})
	if _, err := s.CreateVolume(context.Background(), createReq("v1", 1, 0)); err != nil {
		t.Fatal(err)
	}
	if runner.created != 2 {
		t.Fatalf("%d pods created, want 2", runner.created)
	}
}

// TestForeignPod: a pod pav did not create holds the creation pod's name.
// Nothing of pav's ran: the record goes, the error is final and names the pod;
// once the pod is gone the volume is made.
func TestForeignPod(t *testing.T) {
	p := prov(t, "  provisioningModes: [Dynamic]\n  volumeCreation: "+fmt.Sprintf(pod, "true")+"\n  volumeStaging: "+fmt.Sprintf(pod, "true")+"\n")
	c := newCluster(t)
	runner := &fakeRunner{answers: answers{v1alpha1.PhaseCreation: files(map[string]string{"capacity": "1Gi"})}}
	name := podrunner.PodName(p.Name, v1alpha1.PhaseCreation, "v1")
	runner.pods = map[string]fakePod{name: {uid: "tenant's", token: "a guess", done: true, result: &podrunner.Result{Files: map[string]string{"handle": "victim"}}}}
	s := c.server(p, runner)
	_, err := s.CreateVolume(context.Background(), createReq("v1", 1, 0))
	if status.Code(err) != codes.FailedPrecondition || !strings.Contains(err.Error(), name) {
		t.Fatalf("error %v", err)
	}
	if len(c.volumes()) != 0 {
		t.Fatal("record left")
	}
	runner.mu.Lock()
	delete(runner.pods, name) // the tenant deletes it
	runner.mu.Unlock()
	resp, err := s.CreateVolume(context.Background(), createReq("v1", 1, 0))
	if err != nil || resp.Volume.VolumeId != "v1" {
		t.Fatalf("after the pod went: %v, %v", resp, err)
	}
}

func TestDeleteVolume(t *testing.T) {
	spec := "  provisioningModes: [Dynamic, Static]\n  volumeCreation: " + fmt.Sprintf(pod, "true") + "\n  volumeDeletion:\n    podTemplate: {spec: {containers: [{name: c, image: b, command: [rm, \"{{ handle }}\", \"{{ capacity }}\", \"{{ params.color }}\", \"{{ defaultHandle }}\"]}]}}\n  volumeStaging: " + fmt.Sprintf(pod, "true") + "\n"
	p := prov(t, spec)
	for _, tc := range []struct {
		name, handle, wantCmd, wantMsg string
		fail                           bool
		wantCode                       codes.Code
	}{
		{name: "created volume: handle, capacity, params and default handle in the context, after a restart", handle: "h1", wantCmd: "rm h1 2147483648 blue v1"},
		{name: "unknown or static volume is OK without a pod", handle: "nope"},
		{name: "deletion pod fails: final, the record stays Deleting", handle: "h1", fail: true, wantCode: codes.Internal, wantMsg: "volume deletion failed"},
		{name: "missing id", handle: "", wantCode: codes.InvalidArgument, wantMsg: "volume id is required"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := newCluster(t)
			runner := &fakeRunner{answers: answers{v1alpha1.PhaseCreation: files(map[string]string{"handle": "h1", "capacity": "2Gi"})}}
			if _, err := c.server(p, runner).CreateVolume(context.Background(), createReq("v1", 1, 0)); err != nil {
				t.Fatal(err)
			}
			if tc.fail {
				runner.answers[v1alpha1.PhaseDeletion] = podFails("backend down")
			}
			s := c.server(p, runner) // a restarted driver
			_, err := s.DeleteVolume(context.Background(), &csi.DeleteVolumeRequest{VolumeId: tc.handle})
			if status.Code(err) != tc.wantCode || tc.wantMsg != "" && !strings.Contains(err.Error(), tc.wantMsg) {
				t.Fatalf("error = %v, want %v %q", err, tc.wantCode, tc.wantMsg)
			}
			if got := runner.command(v1alpha1.PhaseDeletion); got != tc.wantCmd && !tc.fail {
				t.Fatalf("deletion command = %q, want %q", got, tc.wantCmd)
			}
			if tc.fail {
				v := c.volume("v1")
				if v.Status.Phase != v1alpha1.VolumeDeleting || !strings.Contains(v.Status.Message, "backend down") || runner.live() != 0 {
					t.Fatalf("record %+v, %d pods", v.Status, runner.live())
				}
				// external-provisioner retries: a new deletion pod, then the record goes.
				runner.answers[v1alpha1.PhaseDeletion] = nil
				if _, err := s.DeleteVolume(context.Background(), &csi.DeleteVolumeRequest{VolumeId: tc.handle}); err != nil {
					t.Fatal(err)
				}
				if got := strings.Join(runner.phases(), " "); got != "creation deletion deletion" {
					t.Fatalf("pods %q", got)
				}
			}
			if tc.wantCmd != "" || tc.fail {
				if len(c.volumes()) != 0 || runner.live() != 0 {
					t.Fatalf("left: %d records, %d pods", len(c.volumes()), runner.live())
				}
			}
		})
	}
}

func TestDeleteVolumeWhileCreating(t *testing.T) {
	p := prov(t, "  provisioningModes: [Dynamic]\n  volumeCreation: {handle: h1, capacity: 1Gi}\n  volumeValidation: "+fmt.Sprintf(pod, "true")+"\n  volumeStaging: "+fmt.Sprintf(pod, "true")+"\n")
	c := newCluster(t)
	runner := &fakeRunner{answers: answers{v1alpha1.PhaseValidation: func(podrunner.Operation) (*podrunner.Result, error) { return nil, context.DeadlineExceeded }}}
	s := c.server(p, runner)
	if _, err := s.CreateVolume(context.Background(), createReq("v1", 1, 0)); status.Code(err) != codes.DeadlineExceeded {
		t.Fatal(err)
	}
	// No handle is known while validating: a DeleteVolume of the handle to be
	// finds no record, as CSI wants.
	if _, err := s.DeleteVolume(context.Background(), &csi.DeleteVolumeRequest{VolumeId: "h1"}); err != nil {
		t.Fatal(err)
	}
	if c.volume("v1") == nil {
		t.Fatal("the record of a volume being validated was deleted")
	}
}

func TestValidateVolumeCapabilities(t *testing.T) {
	p := prov(t, "  provisioningModes: [Dynamic]\n  volumeValidation: {accessModes: [ReadWriteOnce]}\n  volumeCreation: {capacity: 1Gi}\n  volumeStaging: "+fmt.Sprintf(pod, "true")+"\n")
	s := newCluster(t).server(p, &fakeRunner{})
	ctx := context.Background()
	if _, err := s.CreateVolume(ctx, createReq("v1", 1, 0)); err != nil {
		t.Fatal(err)
	}
	ok, err := s.ValidateVolumeCapabilities(ctx, &csi.ValidateVolumeCapabilitiesRequest{VolumeId: "v1", VolumeCapabilities: capReq(rwo)})
	if err != nil || ok.Confirmed == nil {
		t.Fatalf("RWO: %v, %v", ok, err)
	}
	no, err := s.ValidateVolumeCapabilities(ctx, &csi.ValidateVolumeCapabilitiesRequest{VolumeId: "v1",
		VolumeCapabilities: capReq(mountCap(csi.VolumeCapability_AccessMode_MULTI_NODE_MULTI_WRITER))})
	if err != nil || no.Confirmed != nil || !strings.Contains(no.Message, "ReadWriteMany") {
		t.Fatalf("RWX: %v, %v", no, err)
	}
	if _, err := s.ValidateVolumeCapabilities(ctx, &csi.ValidateVolumeCapabilitiesRequest{VolumeId: "x", VolumeCapabilities: capReq(rwo)}); status.Code(err) != codes.NotFound {
		t.Fatalf("unknown volume: %v", err)
	}
}

// TestWritesPerVolume measures the API writes of one volume's life on the
// controller side, with validation, creation and deletion pods: the record's
// create, one update per transition and per pod UID, its delete; each pod's
// create and delete.
func TestWritesPerVolume(t *testing.T) {
	pvc, sc := claimObjects()
	c := newCluster(t, pvc, sc)
	spec := strings.Replace(claimSpec, "  volumeValidation: {accessModes: [ReadWriteOncePod]}\n",
		"  volumeValidation: {accessModes: [ReadWriteOncePod], podTemplate: {spec: {containers: [{name: v, image: busybox}]}}}\n", 1)
	runner := &fakeRunner{answers: answers{v1alpha1.PhaseCreation: files(map[string]string{"capacity": "1Mi"})}}
	s := c.server(prov(t, spec), runner)
	resp, err := s.CreateVolume(context.Background(), claimReq(pvc))
	if err != nil {
		t.Fatal(err)
	}
	createWrites := recordstest.Writes(c.records)
	if _, err := s.DeleteVolume(context.Background(), &csi.DeleteVolumeRequest{VolumeId: resp.Volume.VolumeId}); err != nil {
		t.Fatal(err)
	}
	all := recordstest.Writes(c.records)
	podWrites := runner.created + len(runner.deleted)
	t.Logf("PavVolume writes: %d for CreateVolume, %d for DeleteVolume; pod writes: %d (3 creates, 3 deletes)", createWrites, all-createWrites, podWrites)
	// create, validation UID, →Creating, creation UID, →Created;
	// →Deleting, deletion UID, deletion Succeeded, delete.
	if createWrites != 5 || all-createWrites != 4 || podWrites != 6 {
		t.Errorf("writes: %d + %d records, %d pods; want 5 + 4, 6", createWrites, all-createWrites, podWrites)
	}
}

// TestDriverRestartAdoptsCreationPod: external-provisioner's CreateVolume times
// out while the creation pod runs, the driver restarts, and the retry finds and
// finishes the same pod — one creation pod in all — with the real pod runner.
func TestDriverRestartAdoptsCreationPod(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	client := fake.NewClientset()
	var mu sync.Mutex
	creations := 0
	client.PrependReactor("create", "pods", func(a k8stesting.Action) (bool, runtime.Object, error) {
		pod := a.(k8stesting.CreateAction).GetObject().(*corev1.Pod)
		if _, err := client.Tracker().Get(corev1.SchemeGroupVersion.WithResource("pods"), a.GetNamespace(), pod.Name); err == nil {
			return false, nil, nil // adoption, not a new pod
		}
		mu.Lock()
		creations++
		mu.Unlock()
		return false, nil, nil
	})
	kubelet := fakekubelet.New(client, func(*corev1.Pod) fakekubelet.Outcome {
		return fakekubelet.Outcome{Kind: fakekubelet.Succeed, RunFor: time.Second, Files: map[string]string{"handle": "backend-42", "capacity": "1Gi"}}
	}, fakekubelet.Options{})
	if err := kubelet.Start(ctx); err != nil {
		t.Fatal(err)
	}
	defer func() { cancel(); kubelet.Wait() }()
	p := prov(t, "  provisioningModes: [Dynamic]\n  volumeCreation: "+fmt.Sprintf(pod, "true")+"\n  volumeStaging: "+fmt.Sprintf(pod, "true")+"\n")
	c := &cluster{t: t, records: recordstest.NewClient(), client: client}
	newServer := func() *Server {
		r := podrunner.New(podrunner.Config{Client: kubetest.Wrap(client), Provisioner: p.Name, ReportImage: "pav:test"})
		if err := r.Start(ctx); err != nil {
			t.Fatal(err)
		}
		return c.server(p, r)
	}
	short, cancelShort := context.WithTimeout(ctx, 200*time.Millisecond)
	defer cancelShort()
	if _, err := newServer().CreateVolume(short, createReq("v1", 1, 0)); status.Code(err) != codes.DeadlineExceeded {
		t.Fatalf("first call: %v, want DeadlineExceeded", err)
	}
	if v := c.volume("v1"); v == nil || v.Status.Pods[0].UID == "" {
		t.Fatalf("the creation pod's UID is not recorded: %+v", v)
	}
	resp, err := newServer().CreateVolume(ctx, createReq("v1", 1, 0))
	if err != nil {
		t.Fatal(err)
	}
	if resp.Volume.VolumeId != "backend-42" || resp.Volume.CapacityBytes != 1<<30 {
		t.Fatalf("volume %s/%d", resp.Volume.VolumeId, resp.Volume.CapacityBytes)
	}
	mu.Lock()
	defer mu.Unlock()
	if creations != 1 {
		t.Fatalf("%d creation pods, want 1", creations)
	}
	pods, _ := client.CoreV1().Pods("").List(ctx, metav1.ListOptions{})
	if len(pods.Items) != 0 {
		t.Fatalf("%d pods left", len(pods.Items))
	}
}
