package controllerserver

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/pods-as-volumes/pav/api/v1alpha1"
	"github.com/pods-as-volumes/pav/internal/records"
)

// legacyAttrs are the volume attributes v0.2.0's CreateVolume returned for a
// claim team-a/data (uid u-1) of StorageClass fast, as external-provisioner
// copied them into the PV: the StorageClass parameters, pav's capacity and
// the claim snapshot (v0.2.0's volume.Claim), and external-provisioner's
// own key.
func legacyAttrs(defaultHandle string) map[string]string {
	return map[string]string{
		"color":                               "blue",
		"pav.albertofaria.github.io/capacity": "2147483648",
		"pav.albertofaria.github.io/claim": `{"pvc":{"metadata":{"name":"data","namespace":"team-a","uid":"u-1","annotations":{"note":"kept"}},` +
			`"spec":{"accessModes":["ReadWriteOnce"],"resources":{"requests":{"storage":"1Gi"}},"storageClassName":"fast"}},` +
			`"sc":{"metadata":{"name":"fast"},"provisioner":"test","parameters":{"color":"blue"}},` +
			`"requestedVolumeMode":"Filesystem","requestedAccessModes":["ReadWriteOnce"],"requestedMinCapacity":1073741824,` +
			`"defaultHandle":"` + defaultHandle + `"}`,
		"storage.kubernetes.io/csiProvisionerIdentity": "1700000000000-1234-test",
	}
}

// legacyPV is a PV of driver "test" as external-provisioner made it for v0.2.0.
func legacyPV(name, handle string, mutate ...func(*corev1.PersistentVolume)) *corev1.PersistentVolume {
	fs := corev1.PersistentVolumeFilesystem
	pv := &corev1.PersistentVolume{
		ObjectMeta: metav1.ObjectMeta{Name: name, Annotations: map[string]string{AnnotationProvisionedBy: "test"}},
		Spec: corev1.PersistentVolumeSpec{
			Capacity:                      corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("2Gi")},
			AccessModes:                   []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
			VolumeMode:                    &fs,
			PersistentVolumeReclaimPolicy: corev1.PersistentVolumeReclaimDelete,
			ClaimRef:                      &corev1.ObjectReference{Namespace: "team-a", Name: "data", UID: "u-1"},
			PersistentVolumeSource: corev1.PersistentVolumeSource{CSI: &corev1.CSIPersistentVolumeSource{
				Driver: "test", VolumeHandle: handle, VolumeAttributes: legacyAttrs(name)}},
		},
	}
	for _, m := range mutate {
		m(pv)
	}
	return pv
}

const adoptSpec = "  provisioningModes: [Dynamic]\n  volumeCreation: " + `{capacity: 1Gi}` +
	"\n  volumeDeletion:\n    podTemplate: {spec: {containers: [{name: c, image: b, command: [rm, \"{{ handle }}\", \"{{ capacity }}\", \"{{ params.color }}\", \"{{ defaultHandle }}\", \"{{ pvc.metadata.namespace }}/{{ pvc.metadata.name }}\", \"{{ sc.metadata.name }}\"]}]}}" +
	"\n  volumeExpansion: " + expandPod +
	"\n  snapshotCreation: " + `{podTemplate: {spec: {containers: [{name: c, image: busybox, command: [snap, "{{ volume.handle }}", "{{ volume.capacity }}", "{{ pvc.metadata.name }}"]}]}}}` +
	"\n  volumeStaging: " + `{podTemplate: {spec: {containers: [{name: c, image: busybox}]}}}` + "\n"

// TestAdoptLegacyVolumes: which PVs get a record, built from what, and what
// becomes of the handles pav refuses to adopt.
func TestAdoptLegacyVolumes(t *testing.T) {
	for _, tc := range []struct {
		name string
		pvs  []runtime.Object
		// records made before the controller plugin starts: volume name → handle.
		recorded map[string]string
		// wantAdopted: PV names given a record; wantRefused: handles whose
		// operations are refused, with a word of why.
		wantAdopted []string
		wantRefused map[string]string
	}{
		{name: "a v0.2.0 volume", pvs: []runtime.Object{legacyPV("pvc-a", "h-a")}, wantAdopted: []string{"pvc-a"}},
		{name: "another driver's", pvs: []runtime.Object{legacyPV("pvc-a", "h-a", func(pv *corev1.PersistentVolume) {
			pv.Spec.CSI.Driver = "other"
			pv.Annotations[AnnotationProvisionedBy] = "other"
		})}},
		{name: "a static PV with v0.2.0's attributes (not made by external-provisioner for this driver)", pvs: []runtime.Object{
			legacyPV("pv-static", "h-s", func(pv *corev1.PersistentVolume) { delete(pv.Annotations, AnnotationProvisionedBy) })}},
		{name: "a volume made since v0.2.0 (its attributes carry no claim: it has a record of its own)", pvs: []runtime.Object{
			legacyPV("pvc-new", "h-n", func(pv *corev1.PersistentVolume) {
				delete(pv.Spec.CSI.VolumeAttributes, legacyKeyClaim)
			})}},
		{name: "already adopted (or recorded): left alone", pvs: []runtime.Object{legacyPV("pvc-a", "h-a")}, recorded: map[string]string{"pvc-a": "h-a"}},
		{name: "two v0.2.0 volumes of one handle: neither", pvs: []runtime.Object{legacyPV("pvc-a", "h-x"), legacyPV("pvc-b", "h-x")},
			wantRefused: map[string]string{"h-x": "PersistentVolumes pvc-a, pvc-b, which pav v0.2.0 created, all have volume handle \"h-x\""}},
		{name: "a handle another volume's record has: never re-adopted", pvs: []runtime.Object{legacyPV("pvc-a", "h-a")}, recorded: map[string]string{"v-other": "h-a"},
			wantRefused: map[string]string{"h-a": "which is already the handle of volume v-other"}},
		{name: "a record of the PV's name with another handle", pvs: []runtime.Object{legacyPV("pvc-a", "h-a")}, recorded: map[string]string{"pvc-a": "h-other"},
			wantRefused: map[string]string{"h-a": "but pav's record pvc-a of that volume has handle \"h-other\""}},
		{name: "an unreadable claim snapshot", pvs: []runtime.Object{legacyPV("pvc-a", "h-a", func(pv *corev1.PersistentVolume) {
			pv.Spec.CSI.VolumeAttributes[legacyKeyClaim] = "{not json"
		})}, wantRefused: map[string]string{"h-a": "volume attribute pav.albertofaria.github.io/claim (written by pav v0.2.0) is not a claim snapshot"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.Background()
			p := prov(t, adoptSpec)
			c := newCluster(t, tc.pvs...)
			runner := &fakeRunner{}
			for name, handle := range tc.recorded {
				runner.answers = answers{v1alpha1.PhaseCreation: files(map[string]string{"handle": handle, "capacity": "1Gi"})}
				if _, err := c.server(prov(t, "  provisioningModes: [Dynamic]\n  volumeCreation: "+fmt.Sprintf(pod, "true")+"\n  volumeStaging: "+fmt.Sprintf(pod, "true")+"\n"), runner).
					CreateVolume(ctx, createReq(name, 1, 0)); err != nil {
					t.Fatal(err)
				}
			}
			before := len(c.volumes())
			s := c.server(p, runner)
			n, err := s.AdoptLegacyVolumes(ctx, "test")
			if err != nil {
				t.Fatal(err)
			}
			if n != len(tc.wantAdopted) || len(c.volumes()) != before+n {
				t.Fatalf("adopted %d (records %d → %d), want %v", n, before, len(c.volumes()), tc.wantAdopted)
			}
			for _, name := range tc.wantAdopted {
				v := c.volume(name)
				if v == nil || v.Spec.Adopted == nil || v.Spec.Adopted.PersistentVolume != name || v.Spec.Adopted.Release != "v0.2.0" ||
					v.Spec.FormatVersion != records.VolumeFormat.Current {
					t.Fatalf("record of %s: %+v", name, v)
				}
			}
			for handle, why := range tc.wantRefused {
				_, err := s.DeleteVolume(ctx, &csi.DeleteVolumeRequest{VolumeId: handle})
				if status.Code(err) != codes.FailedPrecondition || !strings.Contains(err.Error(), why) {
					t.Errorf("DeleteVolume(%s) = %v, want FailedPrecondition with %q", handle, err, why)
				}
				_, err = s.ControllerExpandVolume(ctx, expandReq(handle, 3<<30, 0))
				if status.Code(err) != codes.FailedPrecondition {
					t.Errorf("ControllerExpandVolume(%s) = %v, want FailedPrecondition", handle, err)
				}
			}
			if got := runner.phases(); len(got) != len(tc.recorded) {
				t.Errorf("pods %v: adoption runs none, and a refused handle's deletion none", got)
			}
			// A second start adopts nothing more.
			if n, err := c.server(p, runner).AdoptLegacyVolumes(ctx, "test"); n != 0 || err != nil {
				t.Errorf("second start adopted %d: %v", n, err)
			}
		})
	}
}

// TestAdoptedVolumeLifecycle: a volume v0.2.0 created, once adopted, grows,
// is snapshotted and deleted with the context its creation had (the claim and
// StorageClass snapshot from the PV), and no PVC annotation plays any part.
func TestAdoptedVolumeLifecycle(t *testing.T) {
	ctx := context.Background()
	// A forged annotation of v0.2.0's on a claim, naming the handle: ignored.
	forged := &corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Name: "data", Namespace: "team-a", UID: "u-1",
		Annotations: map[string]string{v1alpha1.GroupName + "/created-volume": `{"name":"pvc-victim","handle":"h-victim","capacity":1}`}}}
	c := newCluster(t, legacyPV("pvc-a", "h-a"), forged)
	runner := &fakeRunner{answers: answers{
		v1alpha1.PhaseExpansion:        files(map[string]string{"capacity": "3Gi"}),
		v1alpha1.PhaseSnapshotCreation: files(map[string]string{"handle": "s-1", "capacity": "2Gi"}),
	}}
	p := prov(t, adoptSpec)
	s := c.server(p, runner)
	if n, err := s.AdoptLegacyVolumes(ctx, "test"); n != 1 || err != nil {
		t.Fatalf("adopted %d: %v", n, err)
	}
	v := c.volume("pvc-a")
	want := v1alpha1.PavVolumeSpec{Provisioner: "test", VolumeName: "pvc-a", Claim: "team-a/data", RequestedVolumeMode: corev1.PersistentVolumeFilesystem,
		RequestedAccessModes: []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce}, RequestedMinCapacity: 1 << 30,
		Params: map[string]string{"color": "blue"}, DefaultHandle: "pvc-a"}
	got := v.Spec
	got.PVC, got.SC, got.Adopted, got.FormatVersion = nil, nil, nil, 0
	if fmt.Sprint(got) != fmt.Sprint(want) || v.Spec.PVC.Annotations["note"] != "kept" || v.Spec.SC.Name != "fast" ||
		v.Status.Phase != v1alpha1.VolumeCreated || v.Status.Handle != "h-a" || v.Status.Capacity != 2<<30 {
		t.Fatalf("adopted record %+v / %+v", v.Spec, v.Status)
	}
	if time.Since(v.Spec.Adopted.Time.Time) > time.Minute {
		t.Errorf("adopted at %v", v.Spec.Adopted.Time)
	}
	if c.volume("pvc-victim") != nil {
		t.Fatal("a record was made from a claim annotation")
	}

	resp, err := s.ControllerExpandVolume(ctx, expandReq("h-a", 3<<30, 0))
	if err != nil || resp.CapacityBytes != 3<<30 {
		t.Fatalf("expansion: %v %v", resp, err)
	}
	if got := runner.command(v1alpha1.PhaseExpansion); got != "grow h-a 2147483648 3221225472 none blue" {
		t.Errorf("expansion command %q", got)
	}
	snap, err := s.CreateSnapshot(ctx, &csi.CreateSnapshotRequest{Name: "snapshot-1", SourceVolumeId: "h-a"})
	if err != nil || snap.Snapshot.SnapshotId != "s-1" {
		t.Fatalf("snapshot: %v %v", snap, err)
	}
	if got := runner.command(v1alpha1.PhaseSnapshotCreation); got != "snap h-a 3221225472 data" {
		t.Errorf("snapshot command %q", got)
	}
	// A restarted plugin: the record is there; deletion runs the pod once.
	s = c.server(p, runner)
	if n, err := s.AdoptLegacyVolumes(ctx, "test"); n != 0 || err != nil {
		t.Fatalf("re-adopted %d: %v", n, err)
	}
	if _, err := s.DeleteVolume(ctx, &csi.DeleteVolumeRequest{VolumeId: "h-a"}); err != nil {
		t.Fatal(err)
	}
	if got := runner.command(v1alpha1.PhaseDeletion); got != "rm h-a 3221225472 blue pvc-a team-a/data fast" {
		t.Errorf("deletion command %q", got)
	}
	if got := strings.Join(runner.phases(), " "); got != "expansion snapshotcreation deletion" {
		t.Errorf("pods %q", got)
	}
	if c.volume("pvc-a") != nil {
		t.Error("the record outlived the deletion")
	}
}
