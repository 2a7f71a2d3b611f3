package v1alpha1

import (
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/api/validation"
)

func TestVolumeRecordName(t *testing.T) {
	for _, tc := range []struct {
		volumeName string
		same       bool // the record is named like the volume (and the PV)
	}{
		{"pvc-6f1c2c6e-3b1d-4c36-9d4e-0a8f3e2b9c11", true},
		{"my.volume-1", true},
		{"Upper", false},
		{"with/slash", false},
		{"a_b", false},
		{strings.Repeat("a", 254), false},
		{"", false},
	} {
		got := VolumeRecordName(tc.volumeName)
		if errs := validation.NameIsDNSSubdomain(got, false); len(errs) > 0 {
			t.Errorf("%q: record name %q is not a valid name: %v", tc.volumeName, got, errs)
		}
		if (got == tc.volumeName) != tc.same {
			t.Errorf("%q: record name %q", tc.volumeName, got)
		}
		if !tc.same && (!strings.HasPrefix(got, "v-") || len(got) != 34) {
			t.Errorf("%q: record name %q, want v-<32 hex digits>", tc.volumeName, got)
		}
		if again := VolumeRecordName(tc.volumeName); again != got {
			t.Errorf("%q: not deterministic", tc.volumeName)
		}
	}
	if VolumeRecordName("Upper") == VolumeRecordName("upper!") {
		t.Error("two volume names share a record name")
	}
}

func TestStatusPod(t *testing.T) {
	s := PavVolumeStatus{Pods: []VolumePod{
		{Phase: PhaseValidation, Token: "v"},
		{Phase: PhaseCreation, Token: "c1", Outcome: PodLost},
		{Phase: PhaseCreation, Token: "c2"},
	}}
	if p := s.Pod(PhaseCreation); p == nil || p.Token != "c2" {
		t.Errorf("Pod(creation) = %+v, want the last entry", p)
	}
	if p := s.Pod(PhaseDeletion); p != nil {
		t.Errorf("Pod(deletion) = %+v", p)
	}
	s.Pod(PhaseValidation).UID = "u"
	if s.Pods[0].UID != "u" {
		t.Error("Pod does not point into the status")
	}
}
