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

func TestGroupSnapshotCRDManifest(t *testing.T) {
	onDisk, err := os.ReadFile("crd/pavgroupsnapshots.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(onDisk, GroupSnapshotCRDYAML) {
		t.Fatal("GroupSnapshotCRDYAML differs from crd/pavgroupsnapshots.yaml")
	}
	crd := &apiextensionsv1.CustomResourceDefinition{}
	if err := yaml.UnmarshalStrict(GroupSnapshotCRDYAML, crd); err != nil {
		t.Fatalf("the CRD has unknown or duplicate fields: %v", err)
	}
	n := crd.Spec.Names
	for _, c := range []struct{ what, got, want string }{
		{"metadata.name", crd.Name, v1alpha1.GroupSnapshotResource + "." + v1alpha1.GroupName},
		{"kind", n.Kind, v1alpha1.GroupSnapshotKind},
		{"listKind", n.ListKind, v1alpha1.GroupSnapshotKind + "List"},
		{"plural", n.Plural, v1alpha1.GroupSnapshotResource},
		{"scope", string(crd.Spec.Scope), string(apiextensionsv1.ClusterScoped)},
	} {
		if c.got != c.want {
			t.Errorf("%s = %q, want %q", c.what, c.got, c.want)
		}
	}
	if len(n.ShortNames) != 1 || n.ShortNames[0] != v1alpha1.GroupSnapshotShortName {
		t.Errorf("shortNames = %v, want [%s]", n.ShortNames, v1alpha1.GroupSnapshotShortName)
	}
	if len(crd.Spec.Versions) != 1 || crd.Spec.Versions[0].Subresources != nil {
		t.Errorf("want one version without subresources (pav writes spec and status together)")
	}
	all, err := os.ReadFile("pav.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Contains(all, []byte("name: "+crd.Name)) {
		t.Errorf("pav.yaml lacks the CRD %s: run make manifests", crd.Name)
	}
}

func groupSnapshotValidator(t *testing.T) *crdValidator {
	t.Helper()
	v, errs, err := loadCRD(GroupSnapshotCRDYAML)
	if err != nil {
		t.Fatal(err)
	}
	if len(errs) > 0 {
		t.Fatalf("the apiserver would reject the CRD:%s", errorsString(errs))
	}
	return v
}

func TestGroupSnapshotCRDPassesCRDAdmission(t *testing.T) {
	v := groupSnapshotValidator(t)
	for _, c := range celRuleCosts(t, v.structural) {
		if c.cost > staticEstimatedCostLimit/100 {
			t.Errorf("CEL rule %s: estimated cost %d is more than 1%% of the per-rule limit", c.path, c.cost)
		}
	}
}

// fullGroupSnapshot is a record with every field set, its members' source
// volume claim and StorageClass copied from fullVolume.
func fullGroupSnapshot() *v1alpha1.PavGroupSnapshot {
	vol := fullVolume()
	now := metav1.Now()
	member := func(i string) v1alpha1.GroupSnapshotMember {
		return v1alpha1.GroupSnapshotMember{SnapshotName: "groupsnapshot-1-" + i, SourceVolumeID: "backend-" + i, SourceVolumeRecord: vol.Name,
			Volume: v1alpha1.SnapshotSourceVolume{Handle: "backend-" + i, Capacity: 1 << 30, VolumeMode: corev1.PersistentVolumeFilesystem,
				Params: vol.Spec.Params, PVC: vol.Spec.PVC, SC: vol.Spec.SC}}
	}
	return &v1alpha1.PavGroupSnapshot{
		TypeMeta: metav1.TypeMeta{APIVersion: v1alpha1.SchemeGroupVersion.String(), Kind: v1alpha1.GroupSnapshotKind},
		ObjectMeta: metav1.ObjectMeta{Name: "groupsnapshot-1", ResourceVersion: "3", Labels: map[string]string{v1alpha1.LabelVolumeProvisioner: "hello",
			v1alpha1.LabelVolumeHandle: v1alpha1.HandleLabel("group-1")}},
		Spec: v1alpha1.PavGroupSnapshotSpec{
			Provisioner: "hello", GroupSnapshotName: "groupsnapshot-1", Params: map[string]string{"kind": "fast"},
			VolumeGroupSnapshot: "team-a/nightly", VolumeGroupSnapshotContent: "groupsnapcontent-1",
			Members: []v1alpha1.GroupSnapshotMember{member("0"), member("1")}, FormatVersion: 1,
		},
		Status: v1alpha1.PavGroupSnapshotStatus{Phase: v1alpha1.SnapshotCreated, Handle: "group-1", CreationTime: &now, ReadyToUse: true,
			Snapshots: []v1alpha1.GroupMemberSnapshot{{SourceVolumeID: "backend-0", Handle: "s-0", Size: 1 << 30}, {SourceVolumeID: "backend-1", Handle: "s-1"}},
			Reason:    v1alpha1.ReasonInvalidCreationOutput, Message: "earlier: busy",
			Pods: []v1alpha1.VolumePod{
				{Phase: v1alpha1.PhaseGroupSnapshotCreation, Namespace: "pav", Name: "pav-hello-groupsnapsh-0123", Token: "00112233", UID: "u-1", Outcome: v1alpha1.PodSucceeded},
				{Phase: v1alpha1.PhaseGroupSnapshotDeletion, Namespace: "pav", Name: "pav-hello-groupsnapsh-4567", Token: "44556677"},
			}},
	}
}

func TestGroupSnapshotRecords(t *testing.T) {
	v := groupSnapshotValidator(t)
	for _, c := range []struct {
		name    string
		edit    func(s *v1alpha1.PavGroupSnapshot)
		editMap func(m map[string]any)
		wantErr string // "" = accepted
	}{
		// Every field of the Go type is in the schema: nothing is pruned.
		{"every field set", nil, nil, ""},
		{"just created", func(s *v1alpha1.PavGroupSnapshot) {
			s.Status = v1alpha1.PavGroupSnapshotStatus{Phase: v1alpha1.SnapshotCreating,
				Pods: []v1alpha1.VolumePod{{Phase: v1alpha1.PhaseGroupSnapshotCreation, Namespace: "pav", Name: "p", Token: "t"}}}
			s.Spec.VolumeGroupSnapshot = ""
		}, nil, ""},
		{"unknown phase", func(s *v1alpha1.PavGroupSnapshot) { s.Status.Phase = "Reverting" }, nil, "status.phase"},
		{"a snapshot phase's pod", func(s *v1alpha1.PavGroupSnapshot) { s.Status.Pods[0].Phase = v1alpha1.PhaseSnapshotCreation }, nil, "status.pods[0].phase"},
		{"no members", func(s *v1alpha1.PavGroupSnapshot) { s.Spec.Members = nil }, nil, "spec.members"},
		{"a member without its volume's handle", func(s *v1alpha1.PavGroupSnapshot) { s.Spec.Members[1].SourceVolumeID = "" }, nil, "spec.members[1].sourceVolumeID"},
		{"negative size", func(s *v1alpha1.PavGroupSnapshot) { s.Status.Snapshots[0].Size = -1 }, nil, "status.snapshots[0].size"},
		{"a misspelt field", nil, func(m map[string]any) { m["status"].(map[string]any)["readyToUs"] = true }, "unknown field \"status.readyToUs\""},
	} {
		t.Run(c.name, func(t *testing.T) {
			s := fullGroupSnapshot()
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
