package volume

import (
	"strings"
	"testing"
)

// TestInlineParams: an inline volume's params are its pod's volumeAttributes; the
// kubelet's keys go, and a key of a reserved prefix is refused, naming it.
func TestInlineParams(t *testing.T) {
	got, err := InlineParams(map[string]string{"color": "blue", KeyEphemeral: "true", KeyPodName: "p", KeyPodNamespace: "ns",
		KeyPodUID: "u", KeyServiceAccountName: "sa", "csi.storage.k8s.io/serviceAccount.tokens": "{}"})
	if err != nil || len(got) != 1 || got["color"] != "blue" {
		t.Fatalf("params %v, %v", got, err)
	}
	for _, k := range []string{KeyCapacity, KeyPV, "csi.storage.k8s.io/pvc/name", "storage.kubernetes.io/csiProvisionerIdentity"} {
		if _, err := InlineParams(map[string]string{k: "x"}); err == nil || !strings.Contains(err.Error(), `volumeAttributes key "`+k+`" is reserved`) {
			t.Errorf("%s: %v", k, err)
		}
	}
}
