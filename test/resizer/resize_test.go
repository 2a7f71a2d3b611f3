package main

import (
	"context"
	"encoding/json"
	"errors"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	jsonpatch "gopkg.in/evanphx/json-patch.v4"
	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/informers"
	kubefake "k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/client-go/tools/record"
)

const driver = "my-prov"

// fakeCSI is a CSI controller whose ControllerExpandVolume answers resp or err
// and records the requests.
type fakeCSI struct {
	csi.ControllerClient // anything else panics: the resizer must not call it
	mu                   sync.Mutex
	reqs                 []*csi.ControllerExpandVolumeRequest
	resp                 *csi.ControllerExpandVolumeResponse
	err                  error
}

func (f *fakeCSI) ControllerExpandVolume(_ context.Context, req *csi.ControllerExpandVolumeRequest, _ ...grpc.CallOption) (*csi.ControllerExpandVolumeResponse, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.reqs = append(f.reqs, req)
	return f.resp, f.err
}

func (f *fakeCSI) calls() []*csi.ControllerExpandVolumeRequest {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]*csi.ControllerExpandVolumeRequest(nil), f.reqs...)
}

func q(s string) *resource.Quantity { v := resource.MustParse(s); return &v }

type claimState struct {
	request, capacity, allocated string
	state                        corev1.ClaimResourceStatus
}

func objects(c claimState, pvSize, pvDriver, class string) (*corev1.PersistentVolumeClaim, *corev1.PersistentVolume) {
	pvc := &corev1.PersistentVolumeClaim{
		ObjectMeta: metav1.ObjectMeta{Name: "claim", Namespace: "ns", UID: "claim-uid", ResourceVersion: "1"},
		Spec: corev1.PersistentVolumeClaimSpec{VolumeName: "pv-1", StorageClassName: &class,
			AccessModes: []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
			Resources:   corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: *q(c.request)}}},
		Status: corev1.PersistentVolumeClaimStatus{Phase: corev1.ClaimBound,
			Capacity: corev1.ResourceList{corev1.ResourceStorage: *q(c.capacity)}},
	}
	if c.allocated != "" {
		pvc.Status.AllocatedResources = corev1.ResourceList{corev1.ResourceStorage: *q(c.allocated)}
	}
	if c.state != "" {
		pvc.Status.AllocatedResourceStatuses = map[corev1.ResourceName]corev1.ClaimResourceStatus{corev1.ResourceStorage: c.state}
	}
	pv := &corev1.PersistentVolume{
		ObjectMeta: metav1.ObjectMeta{Name: "pv-1", ResourceVersion: "1"},
		Spec: corev1.PersistentVolumeSpec{
			Capacity:    corev1.ResourceList{corev1.ResourceStorage: *q(pvSize)},
			AccessModes: []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
			ClaimRef:    &corev1.ObjectReference{Namespace: "ns", Name: "claim", UID: "claim-uid"},
			PersistentVolumeSource: corev1.PersistentVolumeSource{CSI: &corev1.CSIPersistentVolumeSource{
				Driver: pvDriver, VolumeHandle: "vol-handle", FSType: "ext4"}},
		},
	}
	return pvc, pv
}

func classes() []runtime.Object {
	yes, no := true, false
	return []runtime.Object{
		&storagev1.StorageClass{ObjectMeta: metav1.ObjectMeta{Name: "grows"}, Provisioner: driver, AllowVolumeExpansion: &yes},
		&storagev1.StorageClass{ObjectMeta: metav1.ObjectMeta{Name: "fixed"}, Provisioner: driver, AllowVolumeExpansion: &no},
	}
}

// harness is a resizer on a fake clientset with synced informers (not running:
// tests call sync, or run, themselves).
func harness(t *testing.T, fc *fakeCSI, objs ...runtime.Object) (*resizer, *kubefake.Clientset, *record.FakeRecorder, context.Context) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	kube := kubefake.NewClientset(append(classes(), objs...)...)
	apiServerVersions(kube)
	f := informers.NewSharedInformerFactory(kube, 0)
	rec := record.NewFakeRecorder(20)
	r := newResizer(driver, kube, fc, f, rec, time.Second)
	f.Start(ctx.Done())
	f.WaitForCacheSync(ctx.Done())
	return r, kube, rec, ctx
}

// apiServerVersions makes the fake's claims behave as the API server's do for
// the resizer: every write gets a new resourceVersion, and a patch that names a
// resourceVersion fails with a conflict unless it is the current one (the
// resizer's guard against acting on a stale informer cache).
func apiServerVersions(kube *kubefake.Clientset) {
	gvr := corev1.SchemeGroupVersion.WithResource("persistentvolumeclaims")
	tracker := kube.Tracker()
	var mu sync.Mutex
	next := 100
	bump := func(o *corev1.PersistentVolumeClaim) {
		next++
		o.ResourceVersion = strconv.Itoa(next)
	}
	kube.PrependReactor("update", "persistentvolumeclaims", func(a k8stesting.Action) (bool, runtime.Object, error) {
		mu.Lock()
		defer mu.Unlock()
		o := a.(k8stesting.UpdateAction).GetObject().(*corev1.PersistentVolumeClaim).DeepCopy()
		bump(o)
		return true, o, tracker.Update(gvr, o, o.Namespace)
	})
	kube.PrependReactor("patch", "persistentvolumeclaims", func(a k8stesting.Action) (bool, runtime.Object, error) {
		mu.Lock()
		defer mu.Unlock()
		pa := a.(k8stesting.PatchAction)
		cur, err := tracker.Get(gvr, pa.GetNamespace(), pa.GetName())
		if err != nil {
			return true, nil, err
		}
		var want struct {
			Metadata struct{ ResourceVersion string } `json:"metadata"`
		}
		if err := json.Unmarshal(pa.GetPatch(), &want); err != nil {
			return true, nil, err
		}
		old := cur.(*corev1.PersistentVolumeClaim)
		if want.Metadata.ResourceVersion != "" && want.Metadata.ResourceVersion != old.ResourceVersion {
			return true, nil, apierrors.NewConflict(gvr.GroupResource(), old.Name, errors.New("the object has been modified"))
		}
		oldJSON, _ := json.Marshal(old)
		newJSON, err := jsonpatch.MergePatch(oldJSON, pa.GetPatch())
		if err != nil {
			return true, nil, err
		}
		o := &corev1.PersistentVolumeClaim{}
		if err := json.Unmarshal(newJSON, o); err != nil {
			return true, nil, err
		}
		bump(o)
		return true, o, tracker.Update(gvr, o, o.Namespace)
	})
}

func events(rec *record.FakeRecorder) string {
	var out []string
	for {
		select {
		case e := <-rec.Events:
			out = append(out, e)
		default:
			return strings.Join(out, "\n")
		}
	}
}

func TestSync(t *testing.T) {
	grown := &csi.ControllerExpandVolumeResponse{CapacityBytes: q("2Gi").Value()}
	for _, tc := range []struct {
		name     string
		claim    claimState
		pvSize   string
		pvDriver string
		class    string
		resp     *csi.ControllerExpandVolumeResponse
		err      error

		wantCall      string // RequiredBytes asked for; "" no call
		wantErr       bool
		wantPV        string
		wantCapacity  string
		wantAllocated string
		wantState     corev1.ClaimResourceStatus
		wantCondition corev1.PersistentVolumeClaimConditionType
		wantEvents    []string
	}{
		{name: "controller only: the claim is finished",
			claim: claimState{request: "2Gi", capacity: "1Gi"}, pvSize: "1Gi", resp: grown,
			wantCall: "2Gi", wantPV: "2Gi", wantCapacity: "2Gi", wantAllocated: "2Gi",
			wantEvents: []string{"Normal Resizing", "Normal VolumeResizeSuccessful"}},
		{name: "the driver makes more than asked",
			claim: claimState{request: "1536Mi", capacity: "1Gi"}, pvSize: "1Gi", resp: grown,
			wantCall: "1536Mi", wantPV: "2Gi", wantCapacity: "2Gi", wantAllocated: "1536Mi",
			wantEvents: []string{"Normal VolumeResizeSuccessful"}},
		{name: "node expansion required: NodeResizePending, the kubelet finishes",
			claim: claimState{request: "2Gi", capacity: "1Gi"}, pvSize: "1Gi",
			resp:     &csi.ControllerExpandVolumeResponse{CapacityBytes: q("2Gi").Value(), NodeExpansionRequired: true},
			wantCall: "2Gi", wantPV: "2Gi", wantCapacity: "1Gi", wantAllocated: "2Gi",
			wantState: corev1.PersistentVolumeClaimNodeResizePending, wantCondition: corev1.PersistentVolumeClaimFileSystemResizePending,
			wantEvents: []string{"Normal FileSystemResizeRequired"}},
		{name: "infeasible: recorded, retried",
			claim: claimState{request: "2Gi", capacity: "1Gi"}, pvSize: "1Gi", err: status.Error(codes.OutOfRange, "too big"),
			wantCall: "2Gi", wantErr: true, wantPV: "1Gi", wantCapacity: "1Gi", wantAllocated: "2Gi",
			wantState: corev1.PersistentVolumeClaimControllerResizeInfeasible, wantCondition: corev1.PersistentVolumeClaimControllerResizeError,
			wantEvents: []string{"Warning VolumeResizeFailed", "too big"}},
		{name: "final, not infeasible: an error condition, still in progress",
			claim: claimState{request: "2Gi", capacity: "1Gi"}, pvSize: "1Gi", err: status.Error(codes.Internal, "pod failed"),
			wantCall: "2Gi", wantErr: true, wantPV: "1Gi", wantCapacity: "1Gi", wantAllocated: "2Gi",
			wantState: corev1.PersistentVolumeClaimControllerResizeInProgress, wantCondition: corev1.PersistentVolumeClaimControllerResizeError,
			wantEvents: []string{"Warning VolumeResizeFailed"}},
		{name: "transient: in progress, retried",
			claim: claimState{request: "2Gi", capacity: "1Gi"}, pvSize: "1Gi", err: status.Error(codes.Unavailable, "busy"),
			wantCall: "2Gi", wantErr: true, wantPV: "1Gi", wantCapacity: "1Gi", wantAllocated: "2Gi",
			wantState: corev1.PersistentVolumeClaimControllerResizeInProgress, wantCondition: corev1.PersistentVolumeClaimResizing,
			wantEvents: []string{"Warning VolumeResizeFailed"}},
		{name: "an expansion in flight finishes at its size first",
			claim:  claimState{request: "3Gi", capacity: "1Gi", allocated: "2Gi", state: corev1.PersistentVolumeClaimControllerResizeInProgress},
			pvSize: "1Gi", resp: grown,
			wantCall: "2Gi", wantPV: "2Gi", wantCapacity: "2Gi", wantAllocated: "2Gi"},
		{name: "PV grown, records missing: resumed",
			claim:  claimState{request: "2Gi", capacity: "1Gi", allocated: "2Gi", state: corev1.PersistentVolumeClaimControllerResizeInProgress},
			pvSize: "2Gi", resp: grown,
			wantCall: "2Gi", wantPV: "2Gi", wantCapacity: "2Gi", wantAllocated: "2Gi"},
		{name: "node resize pending: the kubelet's turn",
			claim:  claimState{request: "2Gi", capacity: "1Gi", allocated: "2Gi", state: corev1.PersistentVolumeClaimNodeResizePending},
			pvSize: "2Gi", wantPV: "2Gi", wantCapacity: "1Gi", wantAllocated: "2Gi", wantState: corev1.PersistentVolumeClaimNodeResizePending},
		{name: "infeasible at the same size: not tried at once",
			claim:  claimState{request: "2Gi", capacity: "1Gi", allocated: "2Gi", state: corev1.PersistentVolumeClaimControllerResizeInfeasible},
			pvSize: "1Gi", wantPV: "1Gi", wantCapacity: "1Gi", wantAllocated: "2Gi", wantState: corev1.PersistentVolumeClaimControllerResizeInfeasible},
		{name: "infeasible, then a smaller request: tried",
			claim:  claimState{request: "1536Mi", capacity: "1Gi", allocated: "2Gi", state: corev1.PersistentVolumeClaimControllerResizeInfeasible},
			pvSize: "1Gi", resp: &csi.ControllerExpandVolumeResponse{CapacityBytes: q("1536Mi").Value()},
			wantCall: "1536Mi", wantPV: "1536Mi", wantCapacity: "1536Mi", wantAllocated: "1536Mi"},
		{name: "another driver's volume",
			claim: claimState{request: "2Gi", capacity: "1Gi"}, pvSize: "1Gi", pvDriver: "other.csi",
			wantPV: "1Gi", wantCapacity: "1Gi"},
		{name: "StorageClass without allowVolumeExpansion",
			claim: claimState{request: "2Gi", capacity: "1Gi"}, pvSize: "1Gi", class: "fixed",
			wantPV: "1Gi", wantCapacity: "1Gi"},
		{name: "nothing asked",
			claim: claimState{request: "1Gi", capacity: "1Gi"}, pvSize: "1Gi", wantPV: "1Gi", wantCapacity: "1Gi"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if tc.pvDriver == "" {
				tc.pvDriver = driver
			}
			if tc.class == "" {
				tc.class = "grows"
			}
			pvc, pv := objects(tc.claim, tc.pvSize, tc.pvDriver, tc.class)
			fc := &fakeCSI{resp: tc.resp, err: tc.err}
			r, kube, rec, ctx := harness(t, fc, pvc, pv)
			err := r.sync(ctx, "ns/claim")
			if (err != nil) != tc.wantErr {
				t.Fatalf("sync: %v, want error %v", err, tc.wantErr)
			}
			calls := fc.calls()
			switch {
			case tc.wantCall == "" && len(calls) > 0:
				t.Fatalf("ControllerExpandVolume called: %v", calls)
			case tc.wantCall != "" && len(calls) != 1:
				t.Fatalf("%d ControllerExpandVolume calls, want 1", len(calls))
			case tc.wantCall != "":
				c := calls[0]
				if c.VolumeId != "vol-handle" || c.CapacityRange.RequiredBytes != q(tc.wantCall).Value() ||
					c.VolumeCapability.GetMount().GetFsType() != "ext4" ||
					c.VolumeCapability.AccessMode.Mode != csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER {
					t.Errorf("request %v, want volume vol-handle, %s, ext4 mount, single node writer", c, tc.wantCall)
				}
			}
			gotPV, _ := kube.CoreV1().PersistentVolumes().Get(ctx, "pv-1", metav1.GetOptions{})
			if s := gotPV.Spec.Capacity[corev1.ResourceStorage]; s.Cmp(*q(tc.wantPV)) != 0 {
				t.Errorf("PV capacity %s, want %s", s.String(), tc.wantPV)
			}
			got, _ := kube.CoreV1().PersistentVolumeClaims("ns").Get(ctx, "claim", metav1.GetOptions{})
			if s := got.Status.Capacity[corev1.ResourceStorage]; s.Cmp(*q(tc.wantCapacity)) != 0 {
				t.Errorf("claim capacity %s, want %s", s.String(), tc.wantCapacity)
			}
			a, ok := got.Status.AllocatedResources[corev1.ResourceStorage]
			if (tc.wantAllocated == "") == ok || (ok && a.Cmp(*q(tc.wantAllocated)) != 0) {
				t.Errorf("allocatedResources %v, want %q", got.Status.AllocatedResources, tc.wantAllocated)
			}
			if s := got.Status.AllocatedResourceStatuses[corev1.ResourceStorage]; s != tc.wantState {
				t.Errorf("allocatedResourceStatuses[storage] %q, want %q", s, tc.wantState)
			}
			if tc.wantState == "" && len(got.Status.AllocatedResourceStatuses) > 0 {
				t.Errorf("allocatedResourceStatuses %v, want none", got.Status.AllocatedResourceStatuses)
			}
			var conds []corev1.PersistentVolumeClaimConditionType
			for _, c := range got.Status.Conditions {
				conds = append(conds, c.Type)
			}
			if (tc.wantCondition == "" && len(conds) > 0) || (tc.wantCondition != "" && (len(conds) != 1 || conds[0] != tc.wantCondition)) {
				t.Errorf("conditions %v, want [%s]", conds, tc.wantCondition)
			}
			ev := events(rec)
			for _, w := range tc.wantEvents {
				if !strings.Contains(ev, w) {
					t.Errorf("events %q lack %q", ev, w)
				}
			}
		})
	}
}

// The resizer is driven by the watch: raising a bound claim's request is
// enough, nothing polls.
func TestWatchesClaims(t *testing.T) {
	pvc, pv := objects(claimState{request: "1Gi", capacity: "1Gi"}, "1Gi", driver, "grows")
	fc := &fakeCSI{resp: &csi.ControllerExpandVolumeResponse{CapacityBytes: q("3Gi").Value()}}
	r, kube, _, ctx := harness(t, fc, pvc, pv)
	go r.run(ctx, 2)
	time.Sleep(100 * time.Millisecond)
	if n := len(fc.calls()); n != 0 {
		t.Fatalf("%d calls before any change", n)
	}
	pvc.Spec.Resources.Requests[corev1.ResourceStorage] = *q("3Gi")
	if _, err := kube.CoreV1().PersistentVolumeClaims("ns").Update(ctx, pvc, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		got, _ := kube.CoreV1().PersistentVolumeClaims("ns").Get(ctx, "claim", metav1.GetOptions{})
		if s := got.Status.Capacity[corev1.ResourceStorage]; s.Cmp(*q("3Gi")) == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("claim not grown: status %+v, calls %d", got.Status, len(fc.calls()))
		}
		time.Sleep(20 * time.Millisecond)
	}
	if n := len(fc.calls()); n != 1 {
		t.Errorf("%d ControllerExpandVolume calls, want 1", n)
	}
}
