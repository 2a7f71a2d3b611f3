package volume

import (
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Snapshot trims an object's metadata to what templates use, so the volume
// context stays small: managedFields and kubectl's last-applied copy go.
func Snapshot(m *metav1.ObjectMeta) {
	m.ManagedFields = nil
	if _, ok := m.Annotations[corev1.LastAppliedConfigAnnotation]; ok {
		a := make(map[string]string, len(m.Annotations))
		for k, v := range m.Annotations {
			if k != corev1.LastAppliedConfigAnnotation {
				a[k] = v
			}
		}
		m.Annotations = a
	}
}
