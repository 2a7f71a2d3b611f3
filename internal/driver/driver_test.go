package driver

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/kubernetes-csi/csi-lib-utils/metrics"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/version"
	fakediscovery "k8s.io/client-go/discovery/fake"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"

	"github.com/pods-as-volumes/pav/api/v1alpha1"
	"github.com/pods-as-volumes/pav/identity"
	"github.com/pods-as-volumes/pav/internal/fakekubelet"
	"github.com/pods-as-volumes/pav/internal/kube/kubetest"
	"github.com/pods-as-volumes/pav/internal/provisioner"
	"github.com/pods-as-volumes/pav/internal/records/recordstest"
	"github.com/pods-as-volumes/pav/podrunner"
)

const prov = `apiVersion: pav.albertofaria.github.io/v1alpha1
kind: PavProvisioner
metadata: {name: demo}
spec:
  provisioningModes: [Dynamic]
  volumeCreation: {capacity: 1Gi}
  volumeStaging: {podTemplate: {spec: {containers: [{name: s, image: busybox}]}}}
`

func TestOptionsValidate(t *testing.T) {
	ok := Options{Mode: ModeAll, Provisioner: "x", NodeID: "n", Endpoint: "unix:///csi.sock"}
	if err := ok.Validate(); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		mut  func(*Options)
		want string
	}{
		{func(o *Options) { o.Mode = "both" }, "--mode"},
		{func(o *Options) { o.Provisioner = "" }, "--provisioner NAME"},
		{func(o *Options) { o.ProvisionerFile = "f" }, "not both"},
		{func(o *Options) { o.NodeID = "" }, "--node-id"},
		{func(o *Options) { o.Endpoint = "" }, "--endpoint"},
		{func(o *Options) { o.PodTimeout = -time.Second }, "--pod-timeout"},
		{func(o *Options) { o.NodeID, o.Mode = "", ModeController }, ""},
		{func(o *Options) { o.PodNamespace = "Pav_System" }, "--pod-namespace"},
		{func(o *Options) { o.PodNamespace = "pav-system" }, ""},
	} {
		o := ok
		tc.mut(&o)
		err := o.Validate()
		if tc.want == "" && err != nil || tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)) {
			t.Errorf("Validate(%+v) = %v, want %q", o, err, tc.want)
		}
	}
	if _, err := Listen("http://x"); err == nil {
		t.Error("Listen accepts an http endpoint")
	}
}

// TestServeOverSocket runs the assembled controller over a unix socket: the
// interceptor records csi_plugin_operations_seconds per method and the pod
// runner's own metrics land in the same registry.
func TestServeOverSocket(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "p.yaml")
	if err := os.WriteFile(file, []byte(prov), 0o644); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	client := fake.NewClientset(&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n"}})
	kubelet := fakekubelet.New(client, func(*corev1.Pod) fakekubelet.Outcome { return fakekubelet.Outcome{} }, fakekubelet.Options{})
	if err := kubelet.Start(ctx); err != nil {
		t.Fatal(err)
	}
	defer func() { cancel(); kubelet.Wait() }()
	o := Options{Mode: ModeController, ProvisionerFile: file, Endpoint: "unix://" + filepath.Join(dir, "csi.sock")}
	svc, src, err := Build(ctx, o, Deps{Client: kubetest.Wrap(client), Dynamic: recordstest.NewClient(), Runner: podrunner.New(podrunner.Config{Client: kubetest.Wrap(client), Provisioner: "demo", ReportImage: "pav:test"})})
	if err != nil {
		t.Fatal(err)
	}
	if src.Name() != "demo" || svc.Node != nil || svc.Controller == nil {
		t.Fatalf("controller mode assembled %+v", svc)
	}
	mm := metrics.NewCSIMetricsManagerForPlugin("demo")
	podrunner.RegisterMetrics(mm.GetRegistry())
	lis, err := Listen(o.Endpoint)
	if err != nil {
		t.Fatal(err)
	}
	srv := NewGRPCServer(svc, mm)
	go func() { _ = srv.Serve(lis) }()
	defer srv.Stop()

	conn, err := grpc.NewClient(o.Endpoint, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	info, err := csi.NewIdentityClient(conn).GetPluginInfo(ctx, &csi.GetPluginInfoRequest{})
	if err != nil || info.Name != "demo" {
		t.Fatalf("GetPluginInfo = %v, %v", info, err)
	}
	if _, err := csi.NewIdentityClient(conn).Probe(ctx, &csi.ProbeRequest{}); err != nil {
		t.Fatalf("Probe: %v", err)
	}
	cc := csi.NewControllerClient(conn)
	_, err = cc.CreateVolume(ctx, &csi.CreateVolumeRequest{Name: "v1", VolumeCapabilities: []*csi.VolumeCapability{{
		AccessType: &csi.VolumeCapability_Mount{Mount: &csi.VolumeCapability_MountVolume{}},
		AccessMode: &csi.VolumeCapability_AccessMode{Mode: csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER}}},
		Secrets: map[string]string{"password": "hunter2"}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cc.DeleteVolume(ctx, &csi.DeleteVolumeRequest{}); err == nil {
		t.Fatal("DeleteVolume without id succeeded")
	}
	// The controller's socket answers NodeGetCapabilities with none (external-resizer
	// asks it of a driver without controller EXPAND_VOLUME, and exits on
	// Unimplemented), and serves no other node RPC.
	nc := csi.NewNodeClient(conn)
	if caps, err := nc.NodeGetCapabilities(ctx, &csi.NodeGetCapabilitiesRequest{}); err != nil || len(caps.GetCapabilities()) != 0 {
		t.Fatalf("NodeGetCapabilities on the controller = %v, %v; want none", caps, err)
	}
	if _, err := nc.NodeGetInfo(ctx, &csi.NodeGetInfoRequest{}); status.Code(err) != codes.Unimplemented {
		t.Fatalf("NodeGetInfo on the controller: %v, want Unimplemented", err)
	}
	// The SnapshotMetadata service is served on the same socket (a
	// provisioner without spec.snapshotMetadata refuses what it asks).
	st, err := csi.NewSnapshotMetadataClient(conn).GetMetadataAllocated(ctx, &csi.GetMetadataAllocatedRequest{SnapshotId: "s1"})
	if err == nil {
		_, err = st.Recv()
	}
	if status.Code(err) != codes.FailedPrecondition || !strings.Contains(err.Error(), "spec.snapshotMetadata") {
		t.Fatalf("GetMetadataAllocated: %v, want FAILED_PRECONDITION naming spec.snapshotMetadata", err)
	}
	families, err := mm.GetRegistry().Gather()
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, f := range families {
		names = append(names, f.GetName())
	}
	all := strings.Join(names, " ")
	if !strings.Contains(all, "csi_plugin_operations_seconds") {
		t.Fatalf("csi_plugin_operations_seconds missing from %s", all)
	}
	// Streaming calls are counted too.
	var streamed bool
	for _, f := range families {
		for _, m := range f.GetMetric() {
			for _, l := range m.GetLabel() {
				if strings.HasSuffix(l.GetValue(), "/GetMetadataAllocated") {
					streamed = true
				}
			}
		}
	}
	if !streamed {
		t.Error("GetMetadataAllocated is not in the metrics")
	}
}

// TestProbes is finding 8: liveness never depends on the API server or the
// PavProvisioner (a driver waiting for either must not be killed), readiness
// does.
func TestProbes(t *testing.T) {
	var built atomic.Pointer[Services]
	mux := healthMux(metrics.NewCSIMetricsManagerForPlugin("demo"), &built)
	get := func(path string) (int, string) {
		rec := httptest.NewRecorder()
		mux.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, path, nil))
		return rec.Code, rec.Body.String()
	}
	var readyErr error
	for _, tc := range []struct {
		name      string
		built     bool
		readyErr  error
		wantReady int
		wantMsg   string
	}{
		{name: "starting (informers syncing, or the API server unreachable)", wantReady: 503, wantMsg: "starting"},
		{name: "API server down", built: true, readyErr: errors.New("the Kubernetes API is not reachable: connection refused"), wantReady: 503, wantMsg: "not reachable"},
		{name: "PavProvisioner invalid", built: true, readyErr: errors.New(`PavProvisioner "demo" is invalid: spec.volumeStaging`), wantReady: 503, wantMsg: "invalid"},
		{name: "ready", built: true, wantReady: 200, wantMsg: "ok"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			readyErr = tc.readyErr
			if tc.built {
				built.Store(&Services{Identity: &identity.Server{Ready: func(context.Context) error { return readyErr }}})
			}
			if code, body := get("/livez"); code != 200 || body != "ok\n" {
				t.Errorf("/livez = %d %q, want 200 whatever the state", code, body)
			}
			for _, path := range []string{"/readyz", "/healthz"} {
				if code, body := get(path); code != tc.wantReady || !strings.Contains(body, tc.wantMsg) {
					t.Errorf("%s = %d %q, want %d %q", path, code, body, tc.wantReady, tc.wantMsg)
				}
			}
		})
	}
	if code, _ := get("/metrics"); code != 200 {
		t.Errorf("/metrics = %d", code)
	}
}

// Readiness asks the API server at most once per kube.APICheckInterval while it
// answers (the kubelet probes every 5 s on every node), and at every check
// while it does not.
func TestReadinessAsksTheAPIServerOncePerInterval(t *testing.T) {
	client := fake.NewClientset()
	var asked int
	client.PrependReactor("get", "version", func(k8stesting.Action) (bool, runtime.Object, error) {
		asked++
		return false, nil, nil
	})
	now := time.Unix(1000, 0)
	r := newReadiness(provisioner.Static{P: &v1alpha1.PavProvisioner{}}, kubetest.Wrap(client))
	r.api.Now = func() time.Time { return now }
	for i, step := range []struct {
		advance time.Duration
		want    int
	}{
		{0, 1}, {5 * time.Second, 1}, {50 * time.Second, 1}, {10 * time.Second, 2}, {5 * time.Second, 2},
	} {
		now = now.Add(step.advance)
		if err := r.check(context.Background()); err != nil {
			t.Fatal(err)
		}
		if asked != step.want {
			t.Errorf("check %d: the API server was asked %d times, want %d", i, asked, step.want)
		}
	}
}

func TestPodReport(t *testing.T) {
	cases := []struct {
		name, flag, mode, server string
		versionErr               bool
		want                     podrunner.ReportMode
	}{
		{"exec asked", "exec", ModeController, "v1.30.0", false, podrunner.ReportExec},
		{"sidecar asked", "sidecar", ModeController, "v1.36.3", false, podrunner.ReportSidecar},
		{"auto, 1.35", "auto", ModeController, "v1.35.0", false, podrunner.ReportExec},
		{"auto, a vendor's 1.36", "auto", ModeAll, "v1.36.3-eks-4a2b", false, podrunner.ReportExec},
		{"auto, 1.34", "auto", ModeController, "v1.34.9", false, podrunner.ReportSidecar},
		{"auto, version unreadable", "auto", ModeController, "", true, podrunner.ReportSidecar},
		{"auto, node plugin: no request", "auto", ModeNode, "v1.36.3", false, podrunner.ReportExec},
		{"sidecar asked, node plugin", "sidecar", ModeNode, "v1.36.3", false, podrunner.ReportSidecar},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			client := fake.NewClientset()
			client.Discovery().(*fakediscovery.FakeDiscovery).FakedServerVersion = &version.Info{GitVersion: c.server}
			asked := 0
			client.PrependReactor("get", "version", func(k8stesting.Action) (bool, runtime.Object, error) {
				asked++
				if c.versionErr {
					return true, nil, errors.New("connection refused")
				}
				return false, nil, nil
			})
			got := podReport(context.Background(), Options{PodReport: c.flag, Mode: c.mode}, kubetest.Wrap(client))
			if got != c.want {
				t.Errorf("%s, want %s", got, c.want)
			}
			if c.mode == ModeNode && asked > 0 {
				t.Error("a node plugin asked the API server's version")
			}
		})
	}
	if err := (&Options{Mode: ModeController, Provisioner: "p", Endpoint: "unix:///x", PodReport: "fast"}).Validate(); err == nil ||
		!strings.Contains(err.Error(), "--pod-report must be auto, exec or sidecar") {
		t.Errorf("Validate: %v", err)
	}
}
