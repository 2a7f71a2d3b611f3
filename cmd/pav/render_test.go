package main

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"
	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	"sigs.k8s.io/yaml"

	"github.com/pods-as-volumes/pav/api/v1alpha1"
	"github.com/pods-as-volumes/pav/controllerserver"
	"github.com/pods-as-volumes/pav/internal/kube/kubetest"
	"github.com/pods-as-volumes/pav/internal/phase"
	"github.com/pods-as-volumes/pav/internal/provisioner"
	"github.com/pods-as-volumes/pav/internal/records"
	"github.com/pods-as-volumes/pav/internal/records/recordstest"
	"github.com/pods-as-volumes/pav/internal/volume"
	"github.com/pods-as-volumes/pav/nodeserver"
	"github.com/pods-as-volumes/pav/podrunner"
)

// agreeProvisioner has a pod in every phase, in a namespace and with arguments
// taken from the phase's context, so that a pod render builds differently from
// the driver's shows up in the comparison.
const agreeProvisioner = `apiVersion: pav.albertofaria.github.io/v1alpha1
kind: PavProvisioner
metadata: {name: agree}
spec:
  provisioningModes: [Dynamic, Static]
  volumeValidation:
    accessModes: [ReadWriteOnce, ReadWriteMany]
    podTemplate:
      metadata: {namespace: "{{ pvc.metadata.namespace if pvc is defined else 'checks' }}"}
      spec: {containers: [{name: v, image: busybox, args: ["{{ requestedMinCapacity }}", "{{ params | tojson }}"]}]}
  volumeCreation:
    capacity: "{{ requestedMinCapacity }}"
    podTemplate: {spec: {containers: [{name: c, image: busybox, args: ["{{ defaultHandle }}", "{{ params.color }}"]}]}}
  volumeDeletion:
    podTemplate: {spec: {containers: [{name: d, image: busybox, args: ["{{ handle }}", "{{ capacity }}"]}]}}
  volumeStaging:
    podTemplate:
      metadata: {namespace: "{{ pvc.metadata.namespace if pvc is defined else 'default' }}"}
      spec:
        containers:
          - {name: s, image: busybox, args: ["{{ handle }}", "{{ node.metadata.name }}", "{{ readOnly }}", "{{ capacity }}"], securityContext: {privileged: true}}
  volumeUnstaging:
    podTemplate: {spec: {containers: [{name: u, image: busybox, args: ["{{ handle }}", "{{ params | tojson }}"]}]}}
`

// recorder is the servers' PodRunner: it records each operation, and a staging
// pod makes /pav/volume so that staging succeeds.
type recorder struct {
	ops map[string]podrunner.Operation
}

func (r *recorder) Run(_ context.Context, op podrunner.Operation) (*podrunner.Result, error) {
	r.ops[op.VolumeKey+" "+string(op.Phase)] = op
	if op.Phase == v1alpha1.PhaseStaging {
		return &podrunner.Result{Running: true}, os.MkdirAll(filepath.Join(op.HostPath, "volume"), 0o755)
	}
	return &podrunner.Result{Files: map[string]string{}}, nil
}

func (r *recorder) Delete(context.Context, podrunner.Operation) error  { return nil }
func (r *recorder) Discard(context.Context, podrunner.Operation) error { return nil }

func (r *recorder) Namespace(op podrunner.Operation) string { return op.Namespace("") }

func (r *recorder) Cached(string, string) (*corev1.Pod, error) { return nil, nil }

// TestRenderAgreesWithTheDriver runs the controller and node plugins (with a
// pod runner that records what they ask for) and `pav render` on the same
// objects, and checks that render prints, for every phase, exactly the pod
// podrunner.BuildPod makes of the driver's operation: same name, namespace,
// node, /pav host path, labels, and template output.
func TestRenderAgreesWithTheDriver(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	dir := t.TempDir()
	const image = "registry.example/pav:test"
	p, err := provisioner.Load([]byte(agreeProvisioner))
	if err != nil {
		t.Fatal(err)
	}
	sc := &storagev1.StorageClass{ObjectMeta: metav1.ObjectMeta{Name: "fast"}, Provisioner: "agree", Parameters: map[string]string{"color": "blue"}}
	pvc := &corev1.PersistentVolumeClaim{
		ObjectMeta: metav1.ObjectMeta{Name: "claim", Namespace: "apps", UID: "uid-1"},
		Spec: corev1.PersistentVolumeClaimSpec{
			AccessModes:      []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
			StorageClassName: &sc.Name,
			Resources:        corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("1Gi")}},
		},
	}
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node-a"}}
	rec := &recorder{ops: map[string]podrunner.Operation{}}
	client := fake.NewClientset(pvc, sc, node)
	src := provisioner.Static{P: p}

	// The controller plugin creates the volume as external-provisioner asks.
	store := records.New(recordstest.NewClient(), p.Name)
	if err := store.Start(ctx); err != nil {
		t.Fatal(err)
	}
	ctrl := &controllerserver.Server{Source: src, Eval: phase.NewEvaluator(nil), Pods: rec, Client: kubetest.Wrap(client), Records: store}
	name := controllerserver.DefaultHandle(pvc) // external-provisioner's default volume name
	rwo := &csi.VolumeCapability{AccessType: &csi.VolumeCapability_Mount{Mount: &csi.VolumeCapability_MountVolume{}},
		AccessMode: &csi.VolumeCapability_AccessMode{Mode: csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER}}
	created, err := ctrl.CreateVolume(ctx, &csi.CreateVolumeRequest{
		Name: name, VolumeCapabilities: []*csi.VolumeCapability{rwo},
		CapacityRange: &csi.CapacityRange{RequiredBytes: 1 << 30},
		Parameters:    map[string]string{"color": "blue", volume.ParamPVCName: pvc.Name, volume.ParamPVCNamespace: pvc.Namespace, volume.ParamPVName: name},
	})
	if err != nil {
		t.Fatal(err)
	}
	// The PV external-provisioner makes of it, and a static one.
	dynPV := &corev1.PersistentVolume{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: corev1.PersistentVolumeSpec{
			Capacity:                      corev1.ResourceList{corev1.ResourceStorage: *resource.NewQuantity(created.Volume.CapacityBytes, resource.BinarySI)},
			AccessModes:                   pvc.Spec.AccessModes,
			PersistentVolumeReclaimPolicy: corev1.PersistentVolumeReclaimDelete,
			ClaimRef:                      &corev1.ObjectReference{Namespace: pvc.Namespace, Name: pvc.Name, UID: pvc.UID},
			PersistentVolumeSource: corev1.PersistentVolumeSource{CSI: &corev1.CSIPersistentVolumeSource{
				Driver: "agree", VolumeHandle: created.Volume.VolumeId, VolumeAttributes: created.Volume.VolumeContext,
			}},
		},
	}
	staticPV := &corev1.PersistentVolume{
		ObjectMeta: metav1.ObjectMeta{Name: "static"},
		Spec: corev1.PersistentVolumeSpec{
			Capacity:    corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("5Gi")},
			AccessModes: []corev1.PersistentVolumeAccessMode{corev1.ReadWriteMany},
			PersistentVolumeSource: corev1.PersistentVolumeSource{CSI: &corev1.CSIPersistentVolumeSource{
				Driver: "agree", VolumeHandle: "nfs-1", VolumeAttributes: map[string]string{"server": "nfs.example"},
			}},
		},
	}
	// The node plugin finds the dynamic PV by the name in its volume context,
	// the static one through the pod on its node that uses it.
	staticClaim := &corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Name: "static-claim", Namespace: "apps"},
		Spec: corev1.PersistentVolumeClaimSpec{VolumeName: staticPV.Name}}
	user := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "user", Namespace: "apps"}, Spec: corev1.PodSpec{NodeName: node.Name,
		Volumes: []corev1.Volume{{Name: "v", VolumeSource: corev1.VolumeSource{PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: staticClaim.Name}}}}}}
	for _, obj := range []runtime.Object{dynPV, staticPV, staticClaim, user} {
		if err := client.Tracker().Add(obj); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := ctrl.DeleteVolume(ctx, &csi.DeleteVolumeRequest{VolumeId: dynPV.Spec.CSI.VolumeHandle}); err != nil {
		t.Fatal(err)
	}

	// The node plugin stages and unstages both volumes (the static one is
	// validated first).
	stateDir := filepath.Join(dir, "state")
	nodeSrv := &nodeserver.Server{NodeID: node.Name, StateDir: stateDir, Source: src, Eval: phase.NewEvaluator(nil), Pods: rec, Client: kubetest.Wrap(client)}
	for _, pv := range []*corev1.PersistentVolume{dynPV, staticPV} {
		staging := filepath.Join(dir, "staging", pv.Name)
		if _, err := nodeSrv.NodeStageVolume(ctx, &csi.NodeStageVolumeRequest{VolumeId: pv.Spec.CSI.VolumeHandle, StagingTargetPath: staging,
			VolumeCapability: rwo, VolumeContext: pv.Spec.CSI.VolumeAttributes}); err != nil {
			t.Fatalf("stage %s: %v", pv.Name, err)
		}
		if _, err := nodeSrv.NodeUnstageVolume(ctx, &csi.NodeUnstageVolumeRequest{VolumeId: pv.Spec.CSI.VolumeHandle, StagingTargetPath: staging}); err != nil {
			t.Fatalf("unstage %s: %v", pv.Name, err)
		}
	}

	files := map[string]string{}
	for name, obj := range map[string]runtime.Object{"pvc": pvc, "sc": sc, "pv": dynPV, "static": staticPV, "node": node} {
		b, err := yaml.Marshal(obj)
		if err != nil {
			t.Fatal(err)
		}
		files[name] = write(t, name+".yaml", string(b))
	}
	provFile := write(t, "provisioner.yaml", agreeProvisioner)
	dynamic := []string{"--pvc", files["pvc"], "--sc", files["sc"], "--pv", files["pv"], "--node", files["node"]}
	for _, tc := range []struct {
		phase v1alpha1.Phase
		args  []string
		op    string // the recorded operation, by volume key and phase
	}{
		{v1alpha1.PhaseValidation, dynamic, name + " validation"},
		{v1alpha1.PhaseCreation, dynamic, name + " creation"},
		{v1alpha1.PhaseDeletion, dynamic, controllerserver.DeletionKey(dynPV.Spec.CSI.VolumeHandle) + " deletion"},
		{v1alpha1.PhaseStaging, dynamic, dynPV.Spec.CSI.VolumeHandle + "@node-a staging"},
		{v1alpha1.PhaseUnstaging, dynamic, dynPV.Spec.CSI.VolumeHandle + "@node-a unstaging"},
		{v1alpha1.PhaseValidation, []string{"--pv", files["static"], "--node", files["node"]}, "nfs-1@node-a validation"},
		{v1alpha1.PhaseStaging, []string{"--pv", files["static"], "--node", files["node"]}, "nfs-1@node-a staging"},
		{v1alpha1.PhaseUnstaging, []string{"--pv", files["static"], "--node", files["node"]}, "nfs-1@node-a unstaging"},
	} {
		t.Run(tc.op, func(t *testing.T) {
			op, ok := rec.ops[tc.op]
			if !ok {
				t.Fatalf("the driver ran no %s; it ran %v", tc.op, keys(rec.ops))
			}
			// The token is random per pod: render shows a placeholder.
			op.Token = renderedToken
			want, err := podrunner.BuildPod(op, podrunner.PodConfig{ReportImage: image, Report: podrunner.ReportExec})
			if err != nil {
				t.Fatal(err)
			}
			want.APIVersion, want.Kind = "v1", "Pod"
			args := append([]string{"render", "-f", provFile, "--phase", string(tc.phase), "--report-image", image, "--state-dir", stateDir}, tc.args...)
			code, out, errOut := runCmd(t, "", args...)
			if code != 0 {
				t.Fatalf("render: %d %s", code, errOut)
			}
			var got struct {
				Pod *corev1.Pod `json:"pod"`
			}
			if err := yaml.Unmarshal([]byte(out), &got); err != nil || got.Pod == nil {
				t.Fatalf("no pod in the output (%v):\n%s", err, out)
			}
			gotYAML, _ := yaml.Marshal(got.Pod)
			wantYAML, _ := yaml.Marshal(want)
			if string(gotYAML) != string(wantYAML) {
				t.Fatalf("render prints\n%s\nthe driver submits\n%s", gotYAML, wantYAML)
			}
		})
	}

	// Without --node, render cannot know where static validation runs.
	code, out, errOut := runCmd(t, "", "render", "-f", provFile, "--phase", "validation", "--pv", files["static"])
	if flat := strings.Join(strings.Fields(out), " "); code != 0 || !strings.Contains(flat, "give --node to see its pod") || strings.Contains(out, "\npod:") {
		t.Fatalf("static validation without --node: %d %s %s", code, out, errOut)
	}
}

func keys[V any](m map[string]V) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	return out
}
