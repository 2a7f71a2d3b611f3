package phase

import (
	"errors"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
)

func TestCheckRequest(t *testing.T) {
	max := int64(1 << 30)
	cfg := &ValidationConfig{
		VolumeModes: []corev1.PersistentVolumeMode{corev1.PersistentVolumeFilesystem},
		AccessModes: []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce, corev1.ReadOnlyMany},
		MinCapacity: 1 << 20,
		MaxCapacity: &max,
	}
	limit := func(n int64) *int64 { return &n }
	for _, tc := range []struct {
		name     string
		r        Request
		wantMsg  string // "" = accepted
		capacity bool
	}{
		{"fits", Request{VolumeMode: "Filesystem", AccessModes: []corev1.PersistentVolumeAccessMode{"ReadWriteOnce"}, MinCapacity: 1 << 20, MaxCapacity: limit(1 << 30)}, "", false},
		{"no limit", Request{VolumeMode: "Filesystem", MinCapacity: 5}, "", false},
		{"block", Request{VolumeMode: "Block"}, "volume mode Block is not supported by this provisioner (spec.volumeValidation.volumeModes: [Filesystem])", false},
		{"rwx", Request{VolumeMode: "Filesystem", AccessModes: []corev1.PersistentVolumeAccessMode{"ReadOnlyMany", "ReadWriteMany"}}, "access mode ReadWriteMany is not supported", false},
		{"request above max", Request{VolumeMode: "Filesystem", MinCapacity: 2 << 30}, "requested capacity 2Gi is above the provisioner's maximum 1Gi (spec.volumeValidation.maxCapacity)", true},
		{"limit below min", Request{VolumeMode: "Filesystem", MinCapacity: 1, MaxCapacity: limit(1024)}, "capacity limit 1Ki is below the provisioner's minimum 1Mi (spec.volumeValidation.minCapacity)", true},
	} {
		err := cfg.CheckRequest(tc.r)
		if tc.wantMsg == "" {
			if err != nil {
				t.Errorf("%s: %v", tc.name, err)
			}
			continue
		}
		var re *RequestError
		if !errors.As(err, &re) || !strings.Contains(re.Msg, tc.wantMsg) || re.Capacity != tc.capacity {
			t.Errorf("%s: got %#v, want a RequestError (capacity %v) containing %q", tc.name, err, tc.capacity, tc.wantMsg)
		}
	}
}
