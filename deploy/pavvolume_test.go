package deploy

import (
	"bytes"
	"os"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"k8s.io/apiextensions-apiserver/pkg/controller/openapi/builder"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/yaml"

	"github.com/pods-as-volumes/pav/api/v1alpha1"
)

func TestVolumeCRDManifest(t *testing.T) {
	onDisk, err := os.ReadFile("crd/pavvolumes.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(onDisk, VolumeCRDYAML) {
		t.Fatal("VolumeCRDYAML differs from crd/pavvolumes.yaml")
	}
	crd := &apiextensionsv1.CustomResourceDefinition{}
	if err := yaml.UnmarshalStrict(VolumeCRDYAML, crd); err != nil {
		t.Fatalf("the CRD has unknown or duplicate fields: %v", err)
	}
	n := crd.Spec.Names
	for _, c := range []struct{ what, got, want string }{
		{"metadata.name", crd.Name, v1alpha1.VolumeResource + "." + v1alpha1.GroupName},
		{"group", crd.Spec.Group, v1alpha1.GroupName},
		{"kind", n.Kind, v1alpha1.VolumeKind},
		{"listKind", n.ListKind, v1alpha1.VolumeKind + "List"},
		{"plural", n.Plural, v1alpha1.VolumeResource},
		{"scope", string(crd.Spec.Scope), string(apiextensionsv1.ClusterScoped)},
	} {
		if c.got != c.want {
			t.Errorf("%s = %q, want %q", c.what, c.got, c.want)
		}
	}
	if len(n.ShortNames) != 1 || n.ShortNames[0] != v1alpha1.VolumeShortName {
		t.Errorf("shortNames = %v, want [%s]", n.ShortNames, v1alpha1.VolumeShortName)
	}
	if len(crd.Spec.Versions) != 1 {
		t.Fatalf("want exactly one version, got %d", len(crd.Spec.Versions))
	}
	v := crd.Spec.Versions[0]
	if v.Name != v1alpha1.Version || !v.Served || !v.Storage {
		t.Errorf("version %q served=%v storage=%v", v.Name, v.Served, v.Storage)
	}
	// One writer (pav), spec and status change together in one Update.
	if v.Subresources != nil {
		t.Errorf("want no subresources, got %+v", v.Subresources)
	}
	cols := map[string]string{}
	for _, c := range v.AdditionalPrinterColumns {
		cols[c.Name] = c.JSONPath
	}
	for name, path := range map[string]string{
		"Provisioner": ".spec.provisioner", "Phase": ".status.phase", "Handle": ".status.handle",
		"Capacity": ".status.capacity", "Claim": ".spec.claim", "Age": ".metadata.creationTimestamp",
	} {
		if cols[name] != path {
			t.Errorf("printer column %s: jsonPath %q, want %q", name, cols[name], path)
		}
	}
	if _, err := builder.BuildOpenAPIV3(crd, v1alpha1.Version, builder.Options{V2: false}); err != nil {
		t.Errorf("OpenAPI v3: %v", err)
	}
	if _, err := builder.BuildOpenAPIV2(crd, v1alpha1.Version, builder.Options{V2: true, StripValueValidation: true, StripNullable: true}); err != nil {
		t.Errorf("OpenAPI v2: %v", err)
	}
}

func volumeValidator(t *testing.T) *crdValidator {
	t.Helper()
	v, errs, err := loadCRD(VolumeCRDYAML)
	if err != nil {
		t.Fatal(err)
	}
	if len(errs) > 0 {
		t.Fatalf("the apiserver would reject the CRD:%s", errorsString(errs))
	}
	return v
}

func TestVolumeCRDPassesCRDAdmission(t *testing.T) {
	v := volumeValidator(t)
	for _, c := range celRuleCosts(t, v.structural) {
		if c.cost > staticEstimatedCostLimit/100 {
			t.Errorf("CEL rule %s: estimated cost %d is more than 1%% of the per-rule limit", c.path, c.cost)
		}
	}
}

// fullVolume is a record with every field set, as the controller writes it:
// the claim and StorageClass snapshots are whole API objects.
func fullVolume() *v1alpha1.PavVolume {
	fs := corev1.PersistentVolumeFilesystem
	sc := "fast"
	max := int64(2 << 30)
	pvc := &corev1.PersistentVolumeClaim{
		TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "PersistentVolumeClaim"},
		ObjectMeta: metav1.ObjectMeta{Name: "data", Namespace: "team-a", UID: "6f1c2c6e-3b1d-4c36-9d4e-0a8f3e2b9c11",
			ResourceVersion: "42", Labels: map[string]string{"app": "db"}, Annotations: map[string]string{"volume.kubernetes.io/storage-provisioner": "hello"},
			Finalizers: []string{"kubernetes.io/pvc-protection"}, CreationTimestamp: metav1.Now()},
		Spec: corev1.PersistentVolumeClaimSpec{
			AccessModes:      []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
			StorageClassName: &sc, VolumeMode: &fs,
			Resources: corev1.VolumeResourceRequirements{
				Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("1Gi")},
				Limits:   corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("2Gi")},
			},
		},
		Status: corev1.PersistentVolumeClaimStatus{Phase: corev1.ClaimPending},
	}
	wffc := storagev1.VolumeBindingWaitForFirstConsumer
	return &v1alpha1.PavVolume{
		TypeMeta:   metav1.TypeMeta{APIVersion: v1alpha1.SchemeGroupVersion.String(), Kind: v1alpha1.VolumeKind},
		ObjectMeta: metav1.ObjectMeta{Name: "pvc-6f1c2c6e-3b1d-4c36-9d4e-0a8f3e2b9c11", ResourceVersion: "7", Labels: map[string]string{v1alpha1.LabelVolumeProvisioner: "hello", v1alpha1.LabelVolumeHandle: v1alpha1.HandleLabel("backend-1")}},
		Spec: v1alpha1.PavVolumeSpec{
			Provisioner: "hello", VolumeName: "pvc-6f1c2c6e-3b1d-4c36-9d4e-0a8f3e2b9c11", Claim: "team-a/data",
			RequestedVolumeMode: fs, RequestedAccessModes: []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce, corev1.ReadWriteOncePod},
			RequestedMinCapacity: 1 << 30, RequestedMaxCapacity: &max, Params: map[string]string{"color": "blue"},
			DefaultHandle: "pvc-6f1c2c6e-3b1d-4c36-9d4e-0a8f3e2b9c11", PVC: pvc,
			SC: &storagev1.StorageClass{TypeMeta: metav1.TypeMeta{APIVersion: "storage.k8s.io/v1", Kind: "StorageClass"},
				ObjectMeta: metav1.ObjectMeta{Name: sc}, Provisioner: "hello", Parameters: map[string]string{"color": "blue"}, VolumeBindingMode: &wffc},
			Source:        &v1alpha1.VolumeSource{Kind: v1alpha1.SourceKindSnapshot, Handle: "snap-1", Capacity: 1 << 30, VolumeHandle: "backend-0"},
			MutableParams: map[string]string{"readAheadKiB": "128"},
		},
		Status: v1alpha1.PavVolumeStatus{
			Phase: v1alpha1.VolumeCreated, Handle: "backend-1", Capacity: 1 << 30, Reason: v1alpha1.ReasonCreationFailed, Message: "earlier: quota exceeded",
			Pods: []v1alpha1.VolumePod{
				{Phase: v1alpha1.PhaseValidation, Namespace: "pav", Name: "pav-hello-validation-0123456789abcdef", Token: "00112233445566778899aabbccddeeff", UID: "u-1", Outcome: v1alpha1.PodSucceeded},
				{Phase: v1alpha1.PhaseCreation, Namespace: "team-a", Name: "pav-hello-creation-0123456789abcdef", Token: "ffeeddccbbaa99887766554433221100", UID: "u-2", Outcome: v1alpha1.PodLost},
				{Phase: v1alpha1.PhaseCreation, Namespace: "team-a", Name: "pav-hello-creation-0123456789abcdef", Token: "0f1e2d3c4b5a69788796a5b4c3d2e1f0"},
				{Phase: v1alpha1.PhaseExpansion, Namespace: "pav", Name: "pav-hello-expansion-0123456789abcdef", Token: "aabbccddeeff00112233445566778899"},
				{Phase: v1alpha1.PhaseModification, Namespace: "pav", Name: "pav-hello-modification-0123456789abcdef", Token: "99887766554433221100ffeeddccbbaa"},
			},
			Expansion:     &v1alpha1.VolumeExpansion{RequiredBytes: 3 << 29, LimitBytes: &max},
			MutableParams: map[string]string{"readAheadKiB": "512"},
			Modification:  &v1alpha1.VolumeModification{MutableParams: map[string]string{"readAheadKiB": "1024"}},
		},
	}
}

func toMap(t *testing.T, v *v1alpha1.PavVolume) map[string]any {
	t.Helper()
	m, err := runtime.DefaultUnstructuredConverter.ToUnstructured(v)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

func TestVolumeRecords(t *testing.T) {
	v := volumeValidator(t)
	cases := []struct {
		name    string
		edit    func(v *v1alpha1.PavVolume)
		editMap func(m map[string]any) // after conversion: what the Go type cannot express
		wantErr string                 // "" = accepted
	}{
		// Every field the Go type has is in the schema (nothing is pruned, and
		// strict decoding reports nothing), so what pav writes is what it reads.
		{"every field set", nil, nil, ""},
		{"just created: Validating, no status handle", func(v *v1alpha1.PavVolume) {
			v.Status = v1alpha1.PavVolumeStatus{Phase: v1alpha1.VolumeValidating,
				Pods: []v1alpha1.VolumePod{{Phase: v1alpha1.PhaseValidation, Namespace: "pav", Name: "p", Token: "t"}}}
			v.Spec.PVC, v.Spec.SC, v.Spec.Claim, v.Spec.RequestedMaxCapacity = nil, nil, "", nil
		}, nil, ""},
		{"an inline ephemeral volume's", inlineVolume, nil, ""},
		{"an inline volume without its pod's uid", func(v *v1alpha1.PavVolume) {
			inlineVolume(v)
			v.Spec.Ephemeral.Pod.UID = ""
		}, nil, "spec.ephemeral.pod.uid"},
		{"an inline volume without its node", func(v *v1alpha1.PavVolume) {
			inlineVolume(v)
			v.Spec.Ephemeral.Node = ""
		}, nil, "spec.ephemeral.node"},
		{"unknown phase", func(v *v1alpha1.PavVolume) { v.Status.Phase = "Done" }, nil, "status.phase"},
		{"unknown pod outcome", func(v *v1alpha1.PavVolume) { v.Status.Pods[0].Outcome = "Maybe" }, nil, "status.pods[0].outcome"},
		{"pod entry without a token", func(v *v1alpha1.PavVolume) { v.Status.Pods[1].Token = "" }, nil, "status.pods[1].token"},
		{"a node phase in the controller's record", func(v *v1alpha1.PavVolume) { v.Status.Pods[0].Phase = v1alpha1.PhaseStaging }, nil, "status.pods[0].phase"},
		{"no provisioner", func(v *v1alpha1.PavVolume) { v.Spec.Provisioner = "" }, nil, "spec.provisioner"},
		{"negative capacity", func(v *v1alpha1.PavVolume) { v.Status.Capacity = -1 }, nil, "status.capacity"},
		{"an expansion without its size", func(v *v1alpha1.PavVolume) { v.Status.Expansion.RequiredBytes = 0 }, nil, "status.expansion.requiredBytes"},
		{"a modification without its parameters", func(v *v1alpha1.PavVolume) { v.Status.Modification.MutableParams = nil }, nil, "status.modification.mutableParams"},
		{"a modification to no parameters", nil, func(m map[string]any) {
			m["status"].(map[string]any)["modification"] = map[string]any{"mutableParams": map[string]any{}}
		}, "status.modification.mutableParams"},
		{"unknown access mode", func(v *v1alpha1.PavVolume) {
			v.Spec.RequestedAccessModes = []corev1.PersistentVolumeAccessMode{"ReadWriteSometimes"}
		}, nil, "spec.requestedAccessModes[0]"},
		{"a misspelt field", nil, func(m map[string]any) {
			m["spec"].(map[string]any)["requestedMaxCapcity"] = int64(3)
		}, "unknown field \"spec.requestedMaxCapcity\""},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			vol := fullVolume()
			if c.edit != nil {
				c.edit(vol)
			}
			m := toMap(t, vol)
			if c.editMap != nil {
				c.editMap(m)
			}
			errs := v.ValidateObject(m)
			switch {
			case c.wantErr == "" && len(errs) > 0:
				t.Fatalf("refused:%s", errorsString(errs))
			case c.wantErr != "" && !strings.Contains(errorsString(errs), c.wantErr):
				t.Fatalf("want an error on %s, got:%s", c.wantErr, errorsString(errs))
			}
		})
	}
}

func TestVolumeSpecIdentityImmutable(t *testing.T) {
	v := volumeValidator(t)
	old := toMap(t, fullVolume())
	for _, c := range []struct {
		name    string
		edit    func(v *v1alpha1.PavVolume)
		wantErr string
	}{
		{"a transition (status)", func(v *v1alpha1.PavVolume) { v.Status.Phase = v1alpha1.VolumeDeleting }, ""},
		{"another provisioner", func(v *v1alpha1.PavVolume) { v.Spec.Provisioner = "other" }, "spec.provisioner"},
		{"another volume", func(v *v1alpha1.PavVolume) { v.Spec.VolumeName = "pvc-else" }, "spec.volumeName"},
		{"made an inline volume", inlineVolume, "ephemeral cannot be added or removed"},
	} {
		t.Run(c.name, func(t *testing.T) {
			vol := fullVolume()
			c.edit(vol)
			errs := v.ValidateUpdate(toMap(t, vol), old)
			switch {
			case c.wantErr == "" && len(errs) > 0:
				t.Fatalf("refused:%s", errorsString(errs))
			case c.wantErr != "" && !strings.Contains(errorsString(errs), c.wantErr):
				t.Fatalf("want an error on %s, got:%s", c.wantErr, errorsString(errs))
			}
		})
	}
}

// inlineVolume makes v the record of an inline ephemeral volume, as a node
// plugin writes it: no claim, its node and pod.
func inlineVolume(v *v1alpha1.PavVolume) {
	id := "csi-9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08"
	v.Name, v.Spec.VolumeName, v.Spec.DefaultHandle, v.Status.Handle = id, id, id, id
	v.Spec.PVC, v.Spec.SC, v.Spec.Claim, v.Spec.RequestedMaxCapacity, v.Spec.Source = nil, nil, "", nil, nil
	v.Spec.RequestedAccessModes = []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce}
	v.Spec.Ephemeral = &v1alpha1.EphemeralVolume{Node: "vm-2", Pod: v1alpha1.EphemeralPod{Namespace: "team-a", Name: "web-0", UID: "8d2c6b1e-0a3f-4e5d-9c7b-1a2b3c4d5e6f", ServiceAccountName: "default"}}
	v.Labels[v1alpha1.LabelVolumeNode] = "vm-2"
}

// TestInlineVolumeRecordImmutable: an inline volume's node and pod never
// change, and it never becomes a persistent volume's record.
func TestInlineVolumeRecordImmutable(t *testing.T) {
	v := volumeValidator(t)
	inline := fullVolume()
	inlineVolume(inline)
	old := toMap(t, inline)
	for _, c := range []struct {
		name    string
		edit    func(v *v1alpha1.PavVolume)
		wantErr string
	}{
		{"a transition (status)", func(v *v1alpha1.PavVolume) { v.Status.Phase = v1alpha1.VolumeDeleting }, ""},
		{"another node", func(v *v1alpha1.PavVolume) { v.Spec.Ephemeral.Node = "vm-3" }, "spec.ephemeral: Invalid value: is immutable"},
		{"another pod", func(v *v1alpha1.PavVolume) { v.Spec.Ephemeral.Pod.UID = "other" }, "spec.ephemeral: Invalid value: is immutable"},
		{"no longer inline", func(v *v1alpha1.PavVolume) { v.Spec.Ephemeral = nil }, "ephemeral cannot be added or removed"},
	} {
		t.Run(c.name, func(t *testing.T) {
			vol := fullVolume()
			inlineVolume(vol)
			c.edit(vol)
			errs := v.ValidateUpdate(toMap(t, vol), old)
			switch {
			case c.wantErr == "" && len(errs) > 0:
				t.Fatalf("refused:%s", errorsString(errs))
			case c.wantErr != "" && !strings.Contains(errorsString(errs), c.wantErr):
				t.Fatalf("want an error on %s, got:%s", c.wantErr, errorsString(errs))
			}
		})
	}
}
