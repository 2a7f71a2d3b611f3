package controllerserver

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/record"

	"github.com/pods-as-volumes/pav/api/v1alpha1"
	"github.com/pods-as-volumes/pav/podrunner"
)

const hostKey = "kubernetes.io/hostname"

// capacitySpec is a node-local provisioner whose capacity pod echoes its
// context (the fake runner answers for it).
func capacitySpec(extra string) string {
	return `  provisioningModes: [Dynamic]
  topology: {nodeLabels: [kubernetes.io/hostname]}
  volumeCreation: {capacity: 1Mi}
  volumeStaging: ` + fmt.Sprintf(pod, "true") + `
  storageCapacity:
    podTemplate:
      spec:
        containers: [{name: c, image: busybox, command: [sh, -c, "df {{ params.pool | default('main') }}"]}]
` + extra
}

// capacityServer is a controller plugin whose refresh interval is interval,
// with a recorder for its events.
func capacityServer(t *testing.T, spec string, runner *fakeRunner, interval time.Duration) (*Server, *record.FakeRecorder) {
	t.Helper()
	s := newCluster(t).server(prov(t, spec), runner)
	rec := record.NewFakeRecorder(100)
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	s.Recorder, s.Background, s.capacityInterval = rec, ctx, interval
	return s, rec
}

func capReqFor(node string, params map[string]string) *csi.GetCapacityRequest {
	req := &csi.GetCapacityRequest{Parameters: params}
	if node != "" {
		req.AccessibleTopology = &csi.Topology{Segments: map[string]string{hostKey: node}}
	}
	return req
}

// nodeOf is the node a capacity pod is pinned to (its node affinity).
func nodeOf(op podrunner.Operation) string {
	a := op.Template.Spec.Affinity
	if a == nil || a.NodeAffinity == nil || a.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution == nil {
		return ""
	}
	for _, term := range a.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution.NodeSelectorTerms {
		for _, r := range term.MatchExpressions {
			if r.Key == hostKey && r.Operator == corev1.NodeSelectorOpIn && len(r.Values) == 1 {
				return r.Values[0]
			}
		}
	}
	return ""
}

// capacityRuns lists the capacity pods run, as "node" (their pin) in order.
func (f *fakeRunner) capacityRuns() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []string
	for _, op := range f.ops {
		if op.Phase == v1alpha1.PhaseCapacity {
			out = append(out, nodeOf(op))
		}
	}
	return out
}

// perNode answers each capacity pod with the free bytes of its node.
func perNode(free map[string]string, max map[string]string) func(podrunner.Operation) (*podrunner.Result, error) {
	var mu sync.Mutex
	return func(op podrunner.Operation) (*podrunner.Result, error) {
		mu.Lock()
		defer mu.Unlock()
		n := nodeOf(op)
		files := map[string]string{}
		if v, ok := free[n]; ok {
			files["capacity"] = v
		}
		if v, ok := max[n]; ok {
			files["maximumVolumeSize"] = v
		}
		return &podrunner.Result{Files: files}, nil
	}
}

func getCapacity(t *testing.T, s *Server, req *csi.GetCapacityRequest) (*csi.GetCapacityResponse, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	return s.GetCapacity(ctx, req)
}

func TestCapacityCapability(t *testing.T) {
	for _, tc := range []struct {
		name string
		spec string
		want bool
	}{
		{"with storageCapacity", capacitySpec(""), true},
		{"without", "  provisioningModes: [Dynamic]\n  volumeCreation: {capacity: 1Mi}\n  volumeStaging: " + fmt.Sprintf(pod, "true") + "\n", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := newCluster(t).server(prov(t, tc.spec), &fakeRunner{})
			resp, err := s.ControllerGetCapabilities(context.Background(), &csi.ControllerGetCapabilitiesRequest{})
			if err != nil {
				t.Fatal(err)
			}
			got := false
			for _, c := range resp.Capabilities {
				got = got || c.GetRpc().GetType() == csi.ControllerServiceCapability_RPC_GET_CAPACITY
			}
			if got != tc.want {
				t.Fatalf("GET_CAPACITY advertised: %v, want %v", got, tc.want)
			}
		})
	}
	s := newCluster(t).server(prov(t, "  provisioningModes: [Dynamic]\n  volumeCreation: {capacity: 1Mi}\n  volumeStaging: "+fmt.Sprintf(pod, "true")+"\n"), &fakeRunner{})
	_, err := s.GetCapacity(context.Background(), capReqFor("", nil))
	if status.Code(err) != codes.FailedPrecondition || !strings.Contains(err.Error(), "no spec.storageCapacity") {
		t.Fatalf("GetCapacity without storageCapacity: %v, want FAILED_PRECONDITION naming spec.storageCapacity", err)
	}
}

// The report of each segment comes from one pod pinned to it, run for the
// first request (which waits for it) and not again for the next requests;
// StorageClasses whose parameters render the same pod share it.
func TestGetCapacityReports(t *testing.T) {
	runner := &fakeRunner{answers: answers{v1alpha1.PhaseCapacity: perNode(
		map[string]string{"n1": "10Gi\n", "n2": "0", "n3": "1000"},
		map[string]string{"n1": "4Gi"})}}
	s, rec := capacityServer(t, capacitySpec(""), runner, time.Hour)

	for _, tc := range []struct {
		node    string
		params  map[string]string
		want    int64
		wantMax int64 // -1: none
	}{
		{"n1", nil, 10 << 30, 4 << 30},
		{"n2", nil, 0, -1},
		{"n1", map[string]string{"other": "x"}, 10 << 30, 4 << 30}, // same pod: same report
		{"n1", map[string]string{"csi.storage.k8s.io/fstype": "ext4"}, 10 << 30, 4 << 30},
		{"n3", nil, 1000, -1},
	} {
		resp, err := getCapacity(t, s, capReqFor(tc.node, tc.params))
		if err != nil {
			t.Fatalf("%s: %v", tc.node, err)
		}
		if resp.AvailableCapacity != tc.want {
			t.Errorf("%s: available %d, want %d", tc.node, resp.AvailableCapacity, tc.want)
		}
		switch {
		case tc.wantMax < 0 && resp.MaximumVolumeSize != nil:
			t.Errorf("%s: maximum volume size %v, want none", tc.node, resp.MaximumVolumeSize)
		case tc.wantMax >= 0 && (resp.MaximumVolumeSize == nil || resp.MaximumVolumeSize.Value != tc.wantMax):
			t.Errorf("%s: maximum volume size %v, want %d", tc.node, resp.MaximumVolumeSize, tc.wantMax)
		}
	}
	if got := runner.capacityRuns(); !slices.Equal(got, []string{"n1", "n2", "n3"}) {
		t.Fatalf("capacity pods pinned to %v, want one per node: n1 n2 n3", got)
	}
	// Another pool renders another pod: a report of its own.
	if _, err := getCapacity(t, s, capReqFor("n1", map[string]string{"pool": "fast"})); err != nil {
		t.Fatal(err)
	}
	if got := runner.capacityRuns(); len(got) != 4 || !strings.Contains(runner.command(v1alpha1.PhaseCapacity), "df main") {
		t.Fatalf("runs %v", got)
	}
	// Every pod was removed once read.
	if n := runner.live(); n != 0 {
		t.Errorf("%d capacity pods left", n)
	}
	if len(rec.Events) != 0 {
		t.Errorf("unexpected event %s", <-rec.Events)
	}
}

// The segment's node affinity is added to each of the template's own terms.
func TestCapacityPodPinned(t *testing.T) {
	runner := &fakeRunner{answers: answers{v1alpha1.PhaseCapacity: files(map[string]string{"capacity": "1"})}}
	s, _ := capacityServer(t, capacitySpec("")+`        affinity:
          nodeAffinity:
            requiredDuringSchedulingIgnoredDuringExecution:
              nodeSelectorTerms:
                - matchExpressions: [{key: disk, operator: In, values: [ssd]}]
                - matchExpressions: [{key: disk, operator: In, values: [nvme]}]
`, runner, time.Hour)
	s.Self = &corev1.ObjectReference{Kind: "Pod", Namespace: "pav", Name: "pav-test-controller-0", UID: "uid-ctrl"}
	if _, err := getCapacity(t, s, capReqFor("n1", nil)); err != nil {
		t.Fatal(err)
	}
	runner.mu.Lock()
	op := runner.ops[0]
	runner.mu.Unlock()
	// The pod goes with the controller plugin's pod.
	if o := op.Owner; o == nil || o.Kind != "Pod" || o.Name != "pav-test-controller-0" || o.UID != "uid-ctrl" || op.OwnerNamespace != "pav" {
		t.Errorf("owner %+v in %q, want the controller plugin's pod", op.Owner, op.OwnerNamespace)
	}
	terms := op.Template.Spec.Affinity.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution.NodeSelectorTerms
	if len(terms) != 2 {
		t.Fatalf("terms %+v", terms)
	}
	for i, disk := range []string{"ssd", "nvme"} {
		want := fmt.Sprintf("[{disk In [%s]} {%s In [n1]}]", disk, hostKey)
		if got := fmt.Sprint(terms[i].MatchExpressions); got != want {
			t.Errorf("term %d: %s, want %s", i, got, want)
		}
	}
	if !strings.HasPrefix(op.VolumeKey, capacityKeyPrefix) {
		t.Errorf("volume key %q", op.VolumeKey)
	}
}

func TestCapacitySegmentChecked(t *testing.T) {
	s, _ := capacityServer(t, capacitySpec(""), &fakeRunner{}, time.Hour)
	for _, tc := range []struct {
		segment map[string]string
		msg     string
	}{
		{map[string]string{"topology.kubernetes.io/zone": "a"}, `"topology.kubernetes.io/zone" is not a topology key of this provisioner`},
		{map[string]string{hostKey: "not a value!"}, "is not a node label value"},
	} {
		_, err := s.GetCapacity(context.Background(), &csi.GetCapacityRequest{AccessibleTopology: &csi.Topology{Segments: tc.segment}})
		if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), tc.msg) {
			t.Errorf("%v: %v, want INVALID_ARGUMENT %q", tc.segment, err, tc.msg)
		}
	}
}

// Without spec.topology there is one segment, {}: the pod is not pinned.
func TestCapacityWithoutTopology(t *testing.T) {
	runner := &fakeRunner{answers: answers{v1alpha1.PhaseCapacity: files(map[string]string{"capacity": "5Gi"})}}
	spec := strings.Replace(capacitySpec(""), "  topology: {nodeLabels: [kubernetes.io/hostname]}\n", "", 1)
	s, _ := capacityServer(t, spec, runner, time.Hour)
	for _, node := range []string{"", "n1"} {
		resp, err := getCapacity(t, s, capReqFor(node, nil))
		if err != nil || resp.AvailableCapacity != 5<<30 {
			t.Fatalf("%q: %v %v", node, resp, err)
		}
	}
	runner.mu.Lock()
	defer runner.mu.Unlock()
	if len(runner.ops) != 1 || runner.ops[0].Template.Spec.Affinity != nil {
		t.Fatalf("want one unpinned pod, got %d: %+v", len(runner.ops), runner.ops)
	}
}

// A pod that fails or writes garbage fails the call with a message naming
// the pod, the file and the fix, puts a Warning event on the PavProvisioner,
// and is not run again before the next refresh.
func TestCapacityBadReports(t *testing.T) {
	for _, tc := range []struct {
		name   string
		answer func(podrunner.Operation) (*podrunner.Result, error)
		code   codes.Code
		reason string
		msgs   []string
	}{
		{"no /pav/capacity", files(map[string]string{}), codes.Internal, ReasonInvalidCapacityReport,
			[]string{"capacity pod pav/pav-test-capacity-", "segment kubernetes.io/hostname=n1", "wrote no /pav/capacity", "0 when full"}},
		{"garbage", files(map[string]string{"capacity": "plenty\n"}), codes.Internal, ReasonInvalidCapacityReport,
			[]string{"capacity pod pav/pav-test-capacity-", `wrote "plenty" to /pav/capacity`, "is not a quantity", "have it write the free bytes"}},
		{"negative", files(map[string]string{"capacity": "-5"}), codes.Internal, ReasonInvalidCapacityReport,
			[]string{`wrote "-5" to /pav/capacity`, "must not be negative"}},
		{"bad maximum", files(map[string]string{"capacity": "1Gi", "maximumVolumeSize": "big"}), codes.Internal, ReasonInvalidCapacityReport,
			[]string{`wrote "big" to /pav/maximumVolumeSize`, "or no such file"}},
		{"pod fails", podFails("pool offline"), codes.Internal, ReasonCapacityPodFailed,
			[]string{"the capacity of segment kubernetes.io/hostname=n1 is unknown", "/pav/error: pool offline", "fix spec.storageCapacity.podTemplate"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			runner := &fakeRunner{answers: answers{v1alpha1.PhaseCapacity: tc.answer}}
			s, rec := capacityServer(t, capacitySpec(""), runner, time.Hour)
			for range 3 {
				_, err := getCapacity(t, s, capReqFor("n1", nil))
				if status.Code(err) != tc.code {
					t.Fatalf("code %s, want %s: %v", status.Code(err), tc.code, err)
				}
				for _, m := range tc.msgs {
					if !strings.Contains(err.Error(), m) {
						t.Errorf("error %q lacks %q", err, m)
					}
				}
			}
			if n := len(runner.capacityRuns()); n != 1 {
				t.Errorf("%d pods for 3 calls, want 1: the failure is the report until the next refresh", n)
			}
			select {
			case ev := <-rec.Events:
				if !strings.HasPrefix(ev, "Warning "+tc.reason+" ") || !strings.Contains(ev, tc.msgs[0]) {
					t.Errorf("event %q, want a Warning %s naming %q", ev, tc.reason, tc.msgs[0])
				}
			default:
				t.Errorf("no event")
			}
			if n := runner.live(); n != 0 {
				t.Errorf("%d capacity pods left", n)
			}
		})
	}
}

func TestCapacityTemplateError(t *testing.T) {
	spec := strings.Replace(capacitySpec(""), "df {{ params.pool | default('main') }}", "df {{ params.pool }}", 1)
	runner := &fakeRunner{}
	s, rec := capacityServer(t, spec, runner, time.Hour)
	_, err := getCapacity(t, s, capReqFor("n1", nil))
	if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "spec.storageCapacity") {
		t.Fatalf("%v, want INVALID_ARGUMENT naming spec.storageCapacity", err)
	}
	if ev := <-rec.Events; !strings.HasPrefix(ev, "Warning "+ReasonCapacityTemplateFailed) {
		t.Errorf("event %q", ev)
	}
	if n := len(runner.capacityRuns()); n != 0 {
		t.Errorf("%d pods", n)
	}
}

// The first request waits for the first report as long as its deadline
// allows; the pod goes on, and a later request gets its report.
func TestCapacityFirstReportWaits(t *testing.T) {
	release := make(chan struct{})
	runner := &fakeRunner{answers: answers{v1alpha1.PhaseCapacity: func(podrunner.Operation) (*podrunner.Result, error) {
		<-release
		return &podrunner.Result{Files: map[string]string{"capacity": "7"}}, nil
	}}}
	s, _ := capacityServer(t, capacitySpec(""), runner, time.Hour)
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	_, err := s.GetCapacity(ctx, capReqFor("n1", nil))
	if status.Code(err) != codes.DeadlineExceeded || !strings.Contains(err.Error(), "waiting for the first report of capacity pod") {
		t.Fatalf("%v, want DEADLINE_EXCEEDED", err)
	}
	close(release)
	resp, err := getCapacity(t, s, capReqFor("n1", nil))
	if err != nil || resp.AvailableCapacity != 7 {
		t.Fatalf("%v %v", resp, err)
	}
	if n := len(runner.capacityRuns()); n != 1 {
		t.Errorf("%d pods, want 1", n)
	}
}

// A volume created, grown or deleted in a segment makes its report stale:
// its pod runs at once, and a request meanwhile waits for the new report.
// Other segments keep theirs.
func TestCapacityRefreshedAfterVolumeChanges(t *testing.T) {
	var mu sync.Mutex
	free := map[string]int{"n1": 100, "n2": 200}
	gate := make(chan struct{}, 10)
	runner := &fakeRunner{answers: answers{
		v1alpha1.PhaseCapacity: func(op podrunner.Operation) (*podrunner.Result, error) {
			<-gate
			mu.Lock()
			defer mu.Unlock()
			return &podrunner.Result{Files: map[string]string{"capacity": fmt.Sprint(free[nodeOf(op)])}}, nil
		},
	}}
	s, _ := capacityServer(t, capacitySpec(""), runner, time.Hour)
	for range 2 {
		gate <- struct{}{}
	}
	for node, want := range map[string]int64{"n1": 100, "n2": 200} {
		if resp, err := getCapacity(t, s, capReqFor(node, nil)); err != nil || resp.AvailableCapacity != want {
			t.Fatalf("%s: %v %v", node, resp, err)
		}
	}

	// A volume made on n1 (its creation's selected node).
	req := createReq("v1", 1<<20, 0)
	req.AccessibilityRequirements = wffc("n1")
	if _, err := s.CreateVolume(context.Background(), req); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	free["n1"] = 50
	mu.Unlock()
	done := make(chan *csi.GetCapacityResponse)
	go func() {
		resp, err := getCapacity(t, s, capReqFor("n1", nil))
		if err != nil {
			t.Error(err)
		}
		done <- resp
	}()
	select {
	case resp := <-done:
		t.Fatalf("answered %d before the refresh after the creation", resp.AvailableCapacity)
	case <-time.After(100 * time.Millisecond):
	}
	// n2's report is fresh: answered at once.
	if resp, err := getCapacity(t, s, capReqFor("n2", nil)); err != nil || resp.AvailableCapacity != 200 {
		t.Fatalf("n2: %v %v", resp, err)
	}
	gate <- struct{}{}
	if resp := <-done; resp == nil || resp.AvailableCapacity != 50 {
		t.Fatalf("after the creation: %v, want 50", resp)
	}

	// Its deletion: the same.
	if _, err := s.DeleteVolume(context.Background(), &csi.DeleteVolumeRequest{VolumeId: "v1"}); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	free["n1"] = 100
	mu.Unlock()
	gate <- struct{}{}
	if resp, err := getCapacity(t, s, capReqFor("n1", nil)); err != nil || resp.AvailableCapacity != 100 {
		t.Fatalf("after the deletion: %v %v", resp, err)
	}
	if got := runner.capacityRuns(); !slices.Equal(got, []string{"n1", "n2", "n1", "n1"}) && !slices.Equal(got, []string{"n2", "n1", "n1", "n1"}) {
		t.Fatalf("capacity pods %v, want n1 and n2, then n1 twice", got)
	}
}

// Reports are refreshed every interval while asked for, and a key asked for
// no longer is dropped.
func TestCapacityRefreshAndIdle(t *testing.T) {
	runner := &fakeRunner{answers: answers{v1alpha1.PhaseCapacity: files(map[string]string{"capacity": "1"})}}
	const interval = 40 * time.Millisecond
	s, _ := capacityServer(t, capacitySpec(""), runner, interval)
	stop := time.Now().Add(300 * time.Millisecond)
	for time.Now().Before(stop) {
		if _, err := getCapacity(t, s, capReqFor("n1", nil)); err != nil {
			t.Fatal(err)
		}
		time.Sleep(10 * time.Millisecond)
	}
	asked := len(runner.capacityRuns())
	if asked < 4 {
		t.Errorf("%d pods in 300ms of requests with an interval of %v, want a refresh each interval", asked, interval)
	}
	// No request for more than 3 intervals: dropped, no more pods.
	deadline := time.Now().Add(2 * time.Second)
	for {
		r := s.capacityReporter()
		r.mu.Lock()
		n := len(r.keys)
		r.mu.Unlock()
		if n == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the key was never dropped")
		}
		time.Sleep(10 * time.Millisecond)
	}
	after := len(runner.capacityRuns())
	time.Sleep(5 * interval)
	if n := len(runner.capacityRuns()); n != after {
		t.Errorf("%d pods ran after the key was dropped", n-after)
	}
	if after-asked > capacityIdleIntervals+1 {
		t.Errorf("%d refreshes after the last request, want at most %d", after-asked, capacityIdleIntervals+1)
	}
}

// A capacity pod an earlier process left is removed (by its UID), never
// read: at start, and when it holds the name of a key's pod.
func TestCapacityPodsOfAnEarlierProcess(t *testing.T) {
	runner := &fakeRunner{answers: answers{v1alpha1.PhaseCapacity: files(map[string]string{"capacity": "3"})}}
	c := newCluster(t)
	s := c.server(prov(t, capacitySpec("")), runner)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	s.Background = ctx

	// The name of n1's pod, held by a pod of an earlier process (its token
	// is not ours), whose report says 999.
	tmplOp := func(node string) podrunner.Operation {
		cfg, err := s.Eval.Capacity(ctx, prov(t, capacitySpec("")), map[string]any{"segment": map[string]any{hostKey: node}, "params": map[string]any{}})
		if err != nil {
			t.Fatal(err)
		}
		tmpl := pinnedToSegment(*cfg.PodTemplate, map[string]string{hostKey: node})
		key, _ := capacityKey(tmpl)
		return PodOperation("test", v1alpha1.PhaseCapacity, key, tmpl)
	}
	stale := func(op podrunner.Operation, uid string) {
		runner.mu.Lock()
		if runner.pods == nil {
			runner.pods = map[string]fakePod{}
		}
		runner.pods[op.PodName()] = fakePod{uid: types.UID(uid), token: "earlier", done: true,
			result: &podrunner.Result{Files: map[string]string{"capacity": "999"}}}
		runner.mu.Unlock()
		p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: op.PodName(), Namespace: "pav", UID: types.UID(uid),
			Labels:      map[string]string{podrunner.LabelProvisioner: "test", podrunner.LabelPhase: "capacity"},
			Annotations: map[string]string{podrunner.AnnotationVolumeKey: op.VolumeKey, podrunner.AnnotationToken: "earlier"}}}
		if _, err := c.client.CoreV1().Pods("pav").Create(ctx, p, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	stale(tmplOp("n1"), "uid-old-1")
	resp, err := getCapacity(t, s, capReqFor("n1", nil))
	if err != nil || resp.AvailableCapacity != 3 {
		t.Fatalf("%v %v: want the new pod's report, 3", resp, err)
	}
	runner.mu.Lock()
	deleted := slices.Clone(runner.deleted)
	runner.mu.Unlock()
	n1 := tmplOp("n1")
	if len(deleted) != 2 || deleted[0] != n1.PodName() {
		t.Fatalf("deleted %v, want the earlier pod, then ours", deleted)
	}

	// At start: every capacity pod of the provisioner goes.
	stale(tmplOp("n2"), "uid-old-2")
	if err := s.SweepCapacityPods(ctx); err != nil {
		t.Fatal(err)
	}
	if n := runner.live(); n != 0 {
		t.Fatalf("%d pods left after the sweep", n)
	}
}

// A pod pav refuses to run, or the API refuses, is an event and the answer until the
// next refresh; the API server not answering is retried soon, without an event.
func TestCapacityRunErrors(t *testing.T) {
	for _, tc := range []struct {
		name      string
		err       error
		code      codes.Code
		event     string // "" for none
		transient bool
	}{
		{"a pod pav refuses", fmt.Errorf("%w: the pod template declares a volume named \"pav\"", podrunner.ErrInvalidOperation), codes.InvalidArgument, ReasonCapacityTemplateFailed, false},
		{"forbidden", apierrors.NewForbidden(corev1.Resource("pods"), "x", fmt.Errorf("no")), codes.PermissionDenied, ReasonCapacityPodFailed, false},
		{"the API server is down", apierrors.NewServiceUnavailable("down"), codes.Unavailable, "", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			runner := &fakeRunner{answers: answers{v1alpha1.PhaseCapacity: func(podrunner.Operation) (*podrunner.Result, error) { return nil, tc.err }}}
			s, rec := capacityServer(t, capacitySpec(""), runner, time.Hour)
			_, err := getCapacity(t, s, capReqFor("n1", nil))
			if status.Code(err) != tc.code || !strings.Contains(err.Error(), "segment kubernetes.io/hostname=n1") {
				t.Fatalf("%v, want %s naming the segment", err, tc.code)
			}
			select {
			case ev := <-rec.Events:
				if tc.event == "" || !strings.HasPrefix(ev, "Warning "+tc.event) {
					t.Errorf("event %q, want %q", ev, tc.event)
				}
			default:
				if tc.event != "" {
					t.Errorf("no event, want %s", tc.event)
				}
			}
			r := s.capacityReporter()
			r.mu.Lock()
			defer r.mu.Unlock()
			for _, e := range r.keys {
				if e.report.transient != tc.transient {
					t.Errorf("transient %v, want %v", e.report.transient, tc.transient)
				}
			}
		})
	}
}
