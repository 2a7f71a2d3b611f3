package volume

import (
	"maps"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

func TestSnapshot(t *testing.T) {
	for _, tc := range []struct {
		name        string
		annotations map[string]string
		want        map[string]string
	}{
		{"last-applied dropped, others kept", map[string]string{corev1.LastAppliedConfigAnnotation: "{…}", "team": "a"}, map[string]string{"team": "a"}},
		{"nothing to drop", map[string]string{"team": "a"}, map[string]string{"team": "a"}},
		{"no annotations", nil, nil},
	} {
		orig := maps.Clone(tc.annotations)
		m := metav1.ObjectMeta{Annotations: tc.annotations, ManagedFields: []metav1.ManagedFieldsEntry{{Manager: "kubectl"}}}
		Snapshot(&m)
		if m.ManagedFields != nil || !maps.Equal(m.Annotations, tc.want) {
			t.Errorf("%s: managedFields %v, annotations %v, want %v", tc.name, m.ManagedFields, m.Annotations, tc.want)
		}
		// The input map may be the informer cache's: it must not be modified.
		if !maps.Equal(tc.annotations, orig) {
			t.Errorf("%s: the original annotations were modified: %v", tc.name, tc.annotations)
		}
	}
}
