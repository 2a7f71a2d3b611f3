package volume

import "testing"

func TestContextRoundTrip(t *testing.T) {
	vc := Context(map[string]string{"a": "b", ParamPVCName: "c", KeyPrefix + "x": "y", "storage.kubernetes.io/csiProvisionerIdentity": "1-2-x"}, 5, "pvc-1")
	if _, ok := vc[ParamPVCName]; ok {
		t.Fatal("sidecar keys leak into the volume context")
	}
	if vc[KeyPV] != "pvc-1" || len(vc) != 3 {
		t.Fatalf("volume context %v", vc)
	}
	if p := UserParams(vc); len(p) != 1 || p["a"] != "b" {
		t.Fatalf("UserParams = %v", p)
	}
	capacity, ours, err := ParseContext(vc)
	if err != nil || !ours || capacity != 5 {
		t.Fatalf("ParseContext = %d %v %v", capacity, ours, err)
	}
	if _, ok := Context(nil, 1, "")[KeyPV]; ok {
		t.Fatal("an unknown PV name is written")
	}
	if _, ours, _ := ParseContext(map[string]string{"user": "x"}); ours {
		t.Fatal("a static PV's attributes read as pav's")
	}
	if _, _, err := ParseContext(map[string]string{KeyCapacity: "lots"}); err == nil {
		t.Fatal("bad capacity accepted")
	}
}
