package deploy

import (
	"bytes"
	"os"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/yaml"

	"github.com/pods-as-volumes/pav/api/v1alpha1"
)

func TestSnapshotCRDManifest(t *testing.T) {
	onDisk, err := os.ReadFile("crd/pavsnapshots.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(onDisk, SnapshotCRDYAML) {
		t.Fatal("SnapshotCRDYAML differs from crd/pavsnapshots.yaml")
	}
	crd := &apiextensionsv1.CustomResourceDefinition{}
	if err := yaml.UnmarshalStrict(SnapshotCRDYAML, crd); err != nil {
		t.Fatalf("the CRD has unknown or duplicate fields: %v", err)
	}
	n := crd.Spec.Names
	for _, c := range []struct{ what, got, want string }{
		{"metadata.name", crd.Name, v1alpha1.SnapshotResource + "." + v1alpha1.GroupName},
		{"kind", n.Kind, v1alpha1.SnapshotKind},
		{"listKind", n.ListKind, v1alpha1.SnapshotKind + "List"},
		{"plural", n.Plural, v1alpha1.SnapshotResource},
		{"scope", string(crd.Spec.Scope), string(apiextensionsv1.ClusterScoped)},
	} {
		if c.got != c.want {
			t.Errorf("%s = %q, want %q", c.what, c.got, c.want)
		}
	}
	if len(n.ShortNames) != 1 || n.ShortNames[0] != v1alpha1.SnapshotShortName {
		t.Errorf("shortNames = %v, want [%s]", n.ShortNames, v1alpha1.SnapshotShortName)
	}
	if len(crd.Spec.Versions) != 1 || crd.Spec.Versions[0].Subresources != nil {
		t.Errorf("want one version without subresources (pav writes spec and status together)")
	}
	// The rendered install must carry it too.
	all, err := os.ReadFile("pav.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Contains(all, []byte("name: "+crd.Name)) {
		t.Errorf("pav.yaml lacks the CRD %s: run make manifests", crd.Name)
	}
}

func snapshotValidator(t *testing.T) *crdValidator {
	t.Helper()
	v, errs, err := loadCRD(SnapshotCRDYAML)
	if err != nil {
		t.Fatal(err)
	}
	if len(errs) > 0 {
		t.Fatalf("the apiserver would reject the CRD:%s", errorsString(errs))
	}
	return v
}

func TestSnapshotCRDPassesCRDAdmission(t *testing.T) {
	v := snapshotValidator(t)
	for _, c := range celRuleCosts(t, v.structural) {
		if c.cost > staticEstimatedCostLimit/100 {
			t.Errorf("CEL rule %s: estimated cost %d is more than 1%% of the per-rule limit", c.path, c.cost)
		}
	}
}

// fullSnapshot is a record with every field set, the source volume's claim
// and StorageClass copied from fullVolume.
func fullSnapshot() *v1alpha1.PavSnapshot {
	vol := fullVolume()
	now := metav1.Now()
	return &v1alpha1.PavSnapshot{
		TypeMeta: metav1.TypeMeta{APIVersion: v1alpha1.SchemeGroupVersion.String(), Kind: v1alpha1.SnapshotKind},
		ObjectMeta: metav1.ObjectMeta{Name: "snapshot-1", ResourceVersion: "3", Labels: map[string]string{v1alpha1.LabelVolumeProvisioner: "hello",
			v1alpha1.LabelVolumeHandle: v1alpha1.HandleLabel("snap-1"), v1alpha1.LabelSnapshotSourceVolume: v1alpha1.HandleLabel("backend-1")}},
		Spec: v1alpha1.PavSnapshotSpec{
			Provisioner: "hello", SnapshotName: "snapshot-1", SourceVolumeID: "backend-1", SourceVolumeRecord: vol.Name,
			Params: map[string]string{"kind": "fast"}, VolumeSnapshot: "team-a/daily", VolumeSnapshotContent: "snapcontent-1",
			Volume: v1alpha1.SnapshotSourceVolume{Handle: "backend-1", Capacity: 1 << 30, VolumeMode: corev1.PersistentVolumeFilesystem,
				Params: vol.Spec.Params, PVC: vol.Spec.PVC, SC: vol.Spec.SC},
			GroupSnapshotName: "groupsnapshot-1", GroupSnapshotHandle: "group-1",
		},
		Status: v1alpha1.PavSnapshotStatus{Phase: v1alpha1.SnapshotCreated, Handle: "snap-1", Size: 1 << 30, CreationTime: &now, ReadyToUse: true,
			Reason: v1alpha1.ReasonCreationFailed, Message: "earlier: busy",
			Pods: []v1alpha1.VolumePod{
				{Phase: v1alpha1.PhaseSnapshotCreation, Namespace: "pav", Name: "pav-hello-snapshotcreation-0123", Token: "00112233", UID: "u-1", Outcome: v1alpha1.PodSucceeded},
				{Phase: v1alpha1.PhaseSnapshotDeletion, Namespace: "pav", Name: "pav-hello-snapshotdeletion-0123", Token: "44556677"},
			}},
	}
}

func TestSnapshotRecords(t *testing.T) {
	v := snapshotValidator(t)
	for _, c := range []struct {
		name    string
		edit    func(s *v1alpha1.PavSnapshot)
		editMap func(m map[string]any)
		wantErr string // "" = accepted
	}{
		// Every field of the Go type is in the schema: nothing is pruned.
		{"every field set", nil, nil, ""},
		{"just created", func(s *v1alpha1.PavSnapshot) {
			s.Status = v1alpha1.PavSnapshotStatus{Phase: v1alpha1.SnapshotCreating,
				Pods: []v1alpha1.VolumePod{{Phase: v1alpha1.PhaseSnapshotCreation, Namespace: "pav", Name: "p", Token: "t"}}}
			s.Spec.Volume.PVC, s.Spec.Volume.SC, s.Spec.VolumeSnapshot = nil, nil, ""
		}, nil, ""},
		{"unknown phase", func(s *v1alpha1.PavSnapshot) { s.Status.Phase = "Reverting" }, nil, "status.phase"},
		{"a volume phase's pod", func(s *v1alpha1.PavSnapshot) { s.Status.Pods[0].Phase = v1alpha1.PhaseCreation }, nil, "status.pods[0].phase"},
		{"no source volume", func(s *v1alpha1.PavSnapshot) { s.Spec.SourceVolumeID = "" }, nil, "spec.sourceVolumeID"},
		{"negative size", func(s *v1alpha1.PavSnapshot) { s.Status.Size = -1 }, nil, "status.size"},
		{"a misspelt field", nil, func(m map[string]any) { m["status"].(map[string]any)["readyToUs"] = true }, "unknown field \"status.readyToUs\""},
	} {
		t.Run(c.name, func(t *testing.T) {
			s := fullSnapshot()
			if c.edit != nil {
				c.edit(s)
			}
			m, err := runtime.DefaultUnstructuredConverter.ToUnstructured(s)
			if err != nil {
				t.Fatal(err)
			}
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
