package volume

import (
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

func TestContextRoundTrip(t *testing.T) {
	max := int64(10)
	claim := &Claim{PVC: &corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Name: "c"}}, RequestedMinCapacity: 1, RequestedMaxCapacity: &max, DefaultHandle: "pvc-1"}
	vc, err := Context(map[string]string{"a": "b", ParamPVCName: "c", KeyPrefix + "x": "y", "storage.kubernetes.io/csiProvisionerIdentity": "1-2-x"}, 5, claim)
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := vc[ParamPVCName]; ok {
		t.Fatal("sidecar keys leak into the volume context")
	}
	if p := UserParams(vc); len(p) != 1 || p["a"] != "b" {
		t.Fatalf("UserParams = %v", p)
	}
	capacity, got, ours, err := ParseContext(vc)
	if err != nil || !ours || capacity != 5 || got.PVC.Name != "c" || *got.RequestedMaxCapacity != 10 {
		t.Fatalf("ParseContext = %d %+v %v %v", capacity, got, ours, err)
	}
	if _, _, ours, _ := ParseContext(map[string]string{"user": "x"}); ours {
		t.Fatal("a static PV's attributes read as pav's")
	}
	if _, _, _, err := ParseContext(map[string]string{KeyCapacity: "lots"}); err == nil {
		t.Fatal("bad capacity accepted")
	}
}
