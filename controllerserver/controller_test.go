package controllerserver

import (
	"context"
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
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"

	"github.com/pods-as-volumes/pav/api/v1alpha1"
	"github.com/pods-as-volumes/pav/internal/fakekubelet"
	"github.com/pods-as-volumes/pav/internal/phase"
	"github.com/pods-as-volumes/pav/internal/provisioner"
	"github.com/pods-as-volumes/pav/internal/volume"
	"github.com/pods-as-volumes/pav/podrunner"
)

// fakeRunner records the operations it is asked to run and answers per phase.
type fakeRunner struct {
	mu      sync.Mutex
	ops     []podrunner.Operation
	answers map[v1alpha1.Phase]func(op podrunner.Operation) (*podrunner.Result, error)
}

func (f *fakeRunner) Run(_ context.Context, op podrunner.Operation) (*podrunner.Result, error) {
	f.mu.Lock()
	f.ops = append(f.ops, op)
	answer := f.answers[op.Phase]
	f.mu.Unlock()
	if answer != nil {
		return answer(op)
	}
	return &podrunner.Result{Pod: podrunner.PodName(op.Provisioner, op.Phase, op.VolumeKey), Files: map[string]string{}}, nil
}

func (f *fakeRunner) Delete(context.Context, podrunner.Operation) error { return nil }

func (f *fakeRunner) phases() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []string
	for _, op := range f.ops {
		out = append(out, string(op.Phase))
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

func files(m map[string]string) func(podrunner.Operation) (*podrunner.Result, error) {
	return func(podrunner.Operation) (*podrunner.Result, error) { return &podrunner.Result{Files: m}, nil }
}

func podFails(msg string) func(op podrunner.Operation) (*podrunner.Result, error) {
	return func(op podrunner.Operation) (*podrunner.Result, error) {
		return nil, &podrunner.PodFailure{Phase: string(op.Phase), Pod: "p", Namespace: "default", PodPhase: corev1.PodFailed, Reason: "Error", ErrorFile: msg}
	}
}

const pod = `{podTemplate: {spec: {containers: [{name: c, image: busybox, command: [sh, -c, "%s"]}]}}}`

func prov(t *testing.T, spec string) *v1alpha1.PavProvisioner {
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

func TestCreateVolume(t *testing.T) {
	base := "  provisioningModes: [Dynamic]\n  volumeStaging: " + fmt.Sprintf(pod, "true") + "\n"
	for _, tc := range []struct {
		name       string
		spec       string
		req        *csi.CreateVolumeRequest
		answers    map[v1alpha1.Phase]func(podrunner.Operation) (*podrunner.Result, error)
		wantCode   codes.Code
		wantMsg    string
		wantPhases string
		wantHandle string
		wantCap    int64
	}{
		{name: "fixed capacity, no pods", spec: "  volumeCreation: {capacity: 1Gi}\n",
			req: createReq("v1", 1<<20, 0), wantHandle: "v1", wantCap: 1 << 30},
		{name: "handle and capacity from the creation pod, trimmed",
			spec:       "  volumeCreation: " + fmt.Sprintf(pod, "true") + "\n",
			req:        createReq("v1", 100, 0),
			answers:    map[v1alpha1.Phase]func(podrunner.Operation) (*podrunner.Result, error){v1alpha1.PhaseCreation: files(map[string]string{"handle": " my-handle\n", "capacity": " 2Ki\n"})},
			wantPhases: "creation", wantHandle: "my-handle", wantCap: 2048},
		{name: "template handle", spec: "  volumeCreation: {handle: \"h-{{ params.color }}\", capacity: 10}\n",
			req: createReq("v1", 1, 0), wantHandle: "h-blue", wantCap: 10},
		{name: "template error names the field", spec: "  volumeCreation: {capacity: \"{{ nope }}\"}\n",
			req: createReq("v1", 1, 0), wantCode: codes.InvalidArgument, wantMsg: "spec.volumeCreation.capacity"},
		{name: "template capacity not positive", spec: "  volumeCreation: {capacity: \"{{ 0 }}\"}\n",
			req: createReq("v1", 1, 0), wantCode: codes.InvalidArgument, wantMsg: "capacity values must be positive"},
		{name: "volume mode not supported", spec: "  volumeCreation: {capacity: 1Gi}\n",
			req: createReq("v1", 1, 0, blockCap()), wantCode: codes.InvalidArgument, wantMsg: "volume mode Block is not supported"},
		{name: "access mode not supported", spec: "  volumeValidation: {accessModes: [ReadWriteOnce]}\n  volumeCreation: {capacity: 1Gi}\n",
			req: createReq("v1", 1, 0, mountCap(csi.VolumeCapability_AccessMode_MULTI_NODE_MULTI_WRITER)), wantCode: codes.InvalidArgument, wantMsg: "access mode ReadWriteMany is not supported"},
		{name: "ReadWriteOncePod accepted when listed", spec: "  volumeValidation: {accessModes: [ReadWriteOncePod]}\n  volumeCreation: {capacity: 1Gi}\n",
			req: createReq("v1", 1, 0, mountCap(csi.VolumeCapability_AccessMode_SINGLE_NODE_SINGLE_WRITER)), wantHandle: "v1", wantCap: 1 << 30},
		{name: "ReadWriteOncePod refused by default", spec: "  volumeCreation: {capacity: 1Gi}\n",
			req: createReq("v1", 1, 0, mountCap(csi.VolumeCapability_AccessMode_SINGLE_NODE_SINGLE_WRITER)), wantCode: codes.InvalidArgument, wantMsg: "ReadWriteOncePod"},
		{name: "request above maxCapacity", spec: "  volumeValidation: {maxCapacity: 1Mi}\n  volumeCreation: {capacity: 1Mi}\n",
			req: createReq("v1", 2<<20, 0), wantCode: codes.OutOfRange, wantMsg: "above the provisioner's maximum 1Mi"},
		{name: "limit below minCapacity", spec: "  volumeValidation: {minCapacity: 1Gi}\n  volumeCreation: {capacity: 1Gi}\n",
			req: createReq("v1", 1, 1<<20), wantCode: codes.OutOfRange, wantMsg: "below the provisioner's minimum 1Gi"},
		{name: "validation pod fails",
			spec:     "  volumeValidation: " + fmt.Sprintf(pod, "false") + "\n  volumeCreation: {capacity: 1Gi}\n",
			req:      createReq("v1", 1, 0),
			answers:  map[v1alpha1.Phase]func(podrunner.Operation) (*podrunner.Result, error){v1alpha1.PhaseValidation: podFails("color not allowed")},
			wantCode: codes.InvalidArgument, wantMsg: "color not allowed", wantPhases: "validation"},
		{name: "creation pod fails, deletion pod reverts",
			spec:     "  volumeCreation: " + fmt.Sprintf(pod, "false") + "\n  volumeDeletion: " + fmt.Sprintf(pod, "rm") + "\n",
			req:      createReq("v1", 1, 0),
			answers:  map[v1alpha1.Phase]func(podrunner.Operation) (*podrunner.Result, error){v1alpha1.PhaseCreation: podFails("quota exceeded")},
			wantCode: codes.Internal, wantMsg: "quota exceeded", wantPhases: "creation deletion"},
		{name: "creation and deletion pods both fail",
			spec: "  volumeCreation: " + fmt.Sprintf(pod, "false") + "\n  volumeDeletion: " + fmt.Sprintf(pod, "rm") + "\n",
			req:  createReq("v1", 1, 0),
			answers: map[v1alpha1.Phase]func(podrunner.Operation) (*podrunner.Result, error){
				v1alpha1.PhaseCreation: podFails("quota exceeded"), v1alpha1.PhaseDeletion: podFails("backend down")},
			wantCode: codes.Aborted, wantMsg: "undoing it failed too", wantPhases: "creation deletion"},
		{name: "empty /pav/handle reverts",
			spec:     "  volumeCreation: " + fmt.Sprintf(pod, "true") + "\n  volumeDeletion: " + fmt.Sprintf(pod, "rm") + "\n",
			req:      createReq("v1", 1, 0),
			answers:  map[v1alpha1.Phase]func(podrunner.Operation) (*podrunner.Result, error){v1alpha1.PhaseCreation: files(map[string]string{"handle": " \n", "capacity": "1Gi"})},
			wantCode: codes.Internal, wantMsg: "empty /pav/handle", wantPhases: "creation deletion"},
		{name: "capacity unknown",
			spec:     "  volumeCreation: " + fmt.Sprintf(pod, "true") + "\n",
			req:      createReq("v1", 1, 0),
			wantCode: codes.OutOfRange, wantMsg: "capacity is unknown", wantPhases: "creation"},
		{name: "created capacity below request reverts",
			spec:     "  volumeCreation: " + fmt.Sprintf(pod, "true") + "\n  volumeDeletion: " + fmt.Sprintf(pod, "rm") + "\n",
			req:      createReq("v1", 1<<30, 0),
			answers:  map[v1alpha1.Phase]func(podrunner.Operation) (*podrunner.Result, error){v1alpha1.PhaseCreation: files(map[string]string{"capacity": "1Mi"})},
			wantCode: codes.OutOfRange, wantMsg: "below the requested 1Gi", wantPhases: "creation deletion"},
		{name: "call deadline while the pod runs: no revert",
			spec:     "  volumeCreation: " + fmt.Sprintf(pod, "sleep 1000") + "\n  volumeDeletion: " + fmt.Sprintf(pod, "rm") + "\n",
			req:      createReq("v1", 1, 0),
			answers:  map[v1alpha1.Phase]func(podrunner.Operation) (*podrunner.Result, error){v1alpha1.PhaseCreation: func(podrunner.Operation) (*podrunner.Result, error) { return nil, context.DeadlineExceeded }},
			wantCode: codes.DeadlineExceeded, wantPhases: "creation"},
		{name: "pod timeout is final and reverted",
			spec: "  volumeCreation: " + fmt.Sprintf(pod, "sleep 1000") + "\n  volumeDeletion: " + fmt.Sprintf(pod, "rm") + "\n",
			req:  createReq("v1", 1, 0),
			answers: map[v1alpha1.Phase]func(podrunner.Operation) (*podrunner.Result, error){v1alpha1.PhaseCreation: func(op podrunner.Operation) (*podrunner.Result, error) {
				return nil, &podrunner.PodFailure{Phase: "creation", Pod: "p", Namespace: "default", PodPhase: corev1.PodRunning, Reason: "Timeout", Message: "still running after 5m"}
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
			s := &Server{Source: provisioner.Static{P: prov(t, spec)}, Eval: phase.NewEvaluator(nil), Pods: runner}
			resp, err := s.CreateVolume(context.Background(), tc.req)
			if got := strings.Join(runner.phases(), " "); got != tc.wantPhases {
				t.Errorf("pods run: %q, want %q", got, tc.wantPhases)
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
		})
	}
}

func TestCreateVolumeIdempotent(t *testing.T) {
	runner := &fakeRunner{answers: map[v1alpha1.Phase]func(podrunner.Operation) (*podrunner.Result, error){
		v1alpha1.PhaseCreation: files(map[string]string{"capacity": "1Gi", "handle": "h1"})}}
	p := prov(t, "  provisioningModes: [Dynamic]\n  volumeCreation: "+fmt.Sprintf(pod, "true")+"\n  volumeStaging: "+fmt.Sprintf(pod, "true")+"\n")
	s := &Server{Source: provisioner.Static{P: p}, Eval: phase.NewEvaluator(nil), Pods: runner}
	ctx := context.Background()
	first, err := s.CreateVolume(ctx, createReq("v1", 1<<20, 0))
	if err != nil {
		t.Fatal(err)
	}
	again, err := s.CreateVolume(ctx, createReq("v1", 1<<20, 0))
	if err != nil || again.Volume.VolumeId != first.Volume.VolumeId {
		t.Fatalf("repeat = %v, %v", again, err)
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
	// DeleteVolume finds the record (no Kubernetes), runs no pod (no volumeDeletion), forgets it.
	if _, err := s.DeleteVolume(ctx, &csi.DeleteVolumeRequest{VolumeId: "h1"}); err != nil {
		t.Fatal(err)
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
	runner := &fakeRunner{answers: map[v1alpha1.Phase]func(podrunner.Operation) (*podrunner.Result, error){
		v1alpha1.PhaseCreation: func(podrunner.Operation) (*podrunner.Result, error) {
			close(entered)
			<-release
			return &podrunner.Result{Files: map[string]string{"capacity": "1Gi"}}, nil
		}}}
	p := prov(t, "  provisioningModes: [Dynamic]\n  volumeCreation: "+fmt.Sprintf(pod, "true")+"\n  volumeStaging: "+fmt.Sprintf(pod, "true")+"\n")
	s := &Server{Source: provisioner.Static{P: p}, Eval: phase.NewEvaluator(nil), Pods: runner}
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

func TestCreateVolumeFromPVC(t *testing.T) {
	mode := corev1.PersistentVolumeFilesystem
	scName := "fast"
	pvc := &corev1.PersistentVolumeClaim{
		ObjectMeta: metav1.ObjectMeta{Name: "my claim", Namespace: "ns1", UID: "uid-1"},
		Spec: corev1.PersistentVolumeClaimSpec{StorageClassName: &scName, VolumeMode: &mode,
			AccessModes: []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOncePod},
			Resources:   corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("1Mi")}}},
	}
	sc := &storagev1.StorageClass{ObjectMeta: metav1.ObjectMeta{Name: scName}, Provisioner: "test", Parameters: map[string]string{"color": "blue"}}
	client := fake.NewClientset(pvc, sc)
	runner := &fakeRunner{answers: map[v1alpha1.Phase]func(podrunner.Operation) (*podrunner.Result, error){
		v1alpha1.PhaseCreation: files(map[string]string{"capacity": "1Mi"})}}
	p := prov(t, `  provisioningModes: [Dynamic]
  volumeValidation: {accessModes: [ReadWriteOncePod]}
  volumeCreation:
    podTemplate: {spec: {containers: [{name: c, image: busybox, command: [echo, "{{ pvc.metadata.name | tobash }}", "{{ sc.metadata.name }}", "{{ defaultHandle }}", "{{ requestedAccessModes[0] }}", "{{ requestedMinCapacity }}"]}]}}
  volumeStaging: `+fmt.Sprintf(pod, "true")+"\n")
	s := &Server{Source: provisioner.Static{P: p}, Eval: phase.NewEvaluator(nil), Pods: runner, Client: client}
	req := createReq("pvc-uid-1", 1<<20, 0)
	req.Parameters = map[string]string{"color": "blue", volume.ParamPVCName: "my claim", volume.ParamPVCNamespace: "ns1", volume.ParamPVName: "pvc-uid-1"}
	resp, err := s.CreateVolume(context.Background(), req)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := runner.command(v1alpha1.PhaseCreation), "echo 'my claim' fast pvc-uid-1 ReadWriteOncePod 1048576"; got != want {
		t.Fatalf("creation pod command = %q, want %q", got, want)
	}
	if _, ok := resp.Volume.VolumeContext[volume.ParamPVCName]; ok {
		t.Fatal("the sidecar's csi.storage.k8s.io keys must not reach the volume context")
	}
	_, claim, ours, err := volume.ParseContext(resp.Volume.VolumeContext)
	if err != nil || !ours || claim.PVC.Name != "my claim" || claim.SC.Name != "fast" {
		t.Fatalf("claim snapshot = %+v, %v", claim, err)
	}
	got, _ := client.CoreV1().PersistentVolumeClaims("ns1").Get(context.Background(), "my claim", metav1.GetOptions{})
	if !strings.Contains(got.Annotations[volume.AnnotationCreated], `"handle":"pvc-uid-1"`) {
		t.Fatalf("PVC annotation = %q", got.Annotations[volume.AnnotationCreated])
	}
	// A new driver process (no memory) answers the retry from the annotation.
	s2 := &Server{Source: provisioner.Static{P: p}, Eval: phase.NewEvaluator(nil), Pods: runner, Client: client}
	if _, err := s2.CreateVolume(context.Background(), req); err != nil {
		t.Fatal(err)
	}
	if n := len(runner.phases()); n != 1 {
		t.Fatalf("creation ran %d times across a restart, want once", n)
	}
}

// pvs is a pvindex.Lookup over a fixed list.
type pvs []*corev1.PersistentVolume

func (l pvs) ByHandle(h string) (*corev1.PersistentVolume, error) {
	for _, pv := range l {
		if pv.Spec.CSI != nil && pv.Spec.CSI.VolumeHandle == h {
			return pv, nil
		}
	}
	return nil, nil
}

func TestDeleteVolume(t *testing.T) {
	claimJSON := `{"pvc":{"metadata":{"name":"c1","namespace":"ns"}},"requestedVolumeMode":"Filesystem","requestedAccessModes":["ReadWriteOnce"],"requestedMinCapacity":1,"defaultHandle":"pvc-u1"}`
	mkPV := func(name, handle string, policy corev1.PersistentVolumeReclaimPolicy, attrs map[string]string) *corev1.PersistentVolume {
		return &corev1.PersistentVolume{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: corev1.PersistentVolumeSpec{
			PersistentVolumeReclaimPolicy: policy,
			Capacity:                      corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("2Gi")},
			PersistentVolumeSource:        corev1.PersistentVolumeSource{CSI: &corev1.CSIPersistentVolumeSource{Driver: "test", VolumeHandle: handle, VolumeAttributes: attrs}}}}
	}
	index := pvs{
		mkPV("pv1", "h1", corev1.PersistentVolumeReclaimDelete, map[string]string{"color": "red", volume.KeyCapacity: "1", volume.KeyClaim: claimJSON}),
		mkPV("pv2", "h2", corev1.PersistentVolumeReclaimRetain, map[string]string{volume.KeyCapacity: "1"}),
		mkPV("pv3", "static", corev1.PersistentVolumeReclaimDelete, map[string]string{"user": "attr"}),
	}
	spec := "  provisioningModes: [Dynamic, Static]\n  volumeCreation: {capacity: 1}\n  volumeDeletion:\n    podTemplate: {spec: {containers: [{name: c, image: b, command: [rm, \"{{ handle }}\", \"{{ capacity }}\", \"{{ params.color }}\", \"{{ pvc.metadata.name }}\", \"{{ defaultHandle }}\"]}]}}\n  volumeStaging: " + fmt.Sprintf(pod, "true") + "\n"
	for _, tc := range []struct {
		name, handle, wantCmd, wantMsg string
		fail                           bool
		wantCode                       codes.Code
	}{
		{name: "dynamic volume: handle, capacity, params and claim in the context", handle: "h1", wantCmd: "rm h1 2147483648 red c1 pvc-u1"},
		{name: "unknown volume is OK without a pod", handle: "nope"},
		{name: "static volume is not ours to delete", handle: "static"},
		{name: "Retain is never deleted", handle: "h2", wantCode: codes.FailedPrecondition, wantMsg: "reclaim policy Retain"},
		{name: "deletion pod fails", handle: "h1", fail: true, wantCode: codes.Internal, wantMsg: "volume deletion failed"},
		{name: "missing id", handle: "", wantCode: codes.InvalidArgument, wantMsg: "volume id is required"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			runner := &fakeRunner{}
			if tc.fail {
				runner.answers = map[v1alpha1.Phase]func(podrunner.Operation) (*podrunner.Result, error){v1alpha1.PhaseDeletion: podFails("backend down")}
			}
			s := &Server{Source: provisioner.Static{P: prov(t, spec)}, Eval: phase.NewEvaluator(nil), Pods: runner, PVs: index}
			_, err := s.DeleteVolume(context.Background(), &csi.DeleteVolumeRequest{VolumeId: tc.handle})
			if status.Code(err) != tc.wantCode || tc.wantMsg != "" && !strings.Contains(err.Error(), tc.wantMsg) {
				t.Fatalf("error = %v, want %v %q", err, tc.wantCode, tc.wantMsg)
			}
			if got := runner.command(v1alpha1.PhaseDeletion); tc.wantCmd != "" && got != tc.wantCmd {
				t.Fatalf("deletion command = %q, want %q", got, tc.wantCmd)
			}
			if tc.wantCmd == "" && !tc.fail && len(runner.phases()) != 0 {
				t.Fatalf("pods ran: %v", runner.phases())
			}
		})
	}
}

func TestValidateVolumeCapabilities(t *testing.T) {
	p := prov(t, "  provisioningModes: [Dynamic]\n  volumeValidation: {accessModes: [ReadWriteOnce]}\n  volumeCreation: {capacity: 1Gi}\n  volumeStaging: "+fmt.Sprintf(pod, "true")+"\n")
	s := &Server{Source: provisioner.Static{P: p}, Eval: phase.NewEvaluator(nil), Pods: &fakeRunner{}}
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

// TestDriverRestartAdoptsCreationPod: external-provisioner's CreateVolume times
// out while the creation pod runs, the driver restarts, and the retry finds and
// finishes the same pod — one creation pod in all.
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
	// The pods' identities outlive the server, as the PavVolume record that
	// holds them will.
	ids := &podIdentities{}
	newServer := func() *Server {
		r := podrunner.New(podrunner.Config{Client: client, Provisioner: p.Name, ReportImage: "pav:test"})
		if err := r.Start(ctx); err != nil {
			t.Fatal(err)
		}
		return &Server{Source: provisioner.Static{P: p}, Eval: phase.NewEvaluator(nil), Pods: r, pods: ids}
	}
	short, cancelShort := context.WithTimeout(ctx, 200*time.Millisecond)
	defer cancelShort()
	if _, err := newServer().CreateVolume(short, createReq("v1", 1, 0)); status.Code(err) != codes.DeadlineExceeded {
		t.Fatalf("first call: %v, want DeadlineExceeded", err)
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
}
