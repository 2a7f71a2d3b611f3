package phase

import (
	"github.com/pods-as-volumes/pav/api/v1alpha1"
	"github.com/pods-as-volumes/pav/internal/templating"
)

const pathWhenNamespaceGone = "spec.volumeDeletion.whenNamespaceGone"

// WhenNamespaceGoneOf reads spec.volumeDeletion.whenNamespaceGone: what a
// volume's deletion means once the namespace its deletion pod must run in is
// gone. It is a literal, never a template, and is read without evaluating
// anything: it is needed exactly when the deletion cannot go on, and it
// decides whether pav may forget a volume without its deletion pod, which
// nothing a tenant writes (a claim's annotations, which templates read) may
// decide. Absent (or volumeDeletion a template string, or absent): Retry.
func WhenNamespaceGoneOf(s *v1alpha1.PavProvisionerSpec) (v1alpha1.WhenNamespaceGone, error) {
	m, ok := deletionObject(s)
	if !ok {
		return v1alpha1.NamespaceGoneRetry, nil
	}
	return whenNamespaceGone(m["whenNamespaceGone"])
}

// literalWhenNamespaceGone: the spec's volumeDeletion is an object that holds
// whenNamespaceGone itself (not a template that may produce it).
func literalWhenNamespaceGone(s *v1alpha1.PavProvisionerSpec) bool {
	m, ok := deletionObject(s)
	return ok && m["whenNamespaceGone"] != nil
}

func deletionObject(s *v1alpha1.PavProvisionerSpec) (map[string]any, bool) {
	if s.VolumeDeletion == nil || s.VolumeDeletion.Data == nil {
		return nil, false
	}
	m, ok := templating.Normalize(s.VolumeDeletion.Data).(map[string]any)
	return m, ok
}

// whenNamespaceGone checks a whenNamespaceGone value (nil: Retry).
func whenNamespaceGone(v any) (v1alpha1.WhenNamespaceGone, error) {
	switch v {
	case nil, string(v1alpha1.NamespaceGoneRetry):
		return v1alpha1.NamespaceGoneRetry, nil
	case string(v1alpha1.NamespaceGoneForget):
		return v1alpha1.NamespaceGoneForget, nil
	}
	if isTemplate(v) {
		return "", fieldErr(pathWhenNamespaceGone, "must be a literal Retry or Forget, never a template: it decides whether pav may forget a volume without its deletion pod, which no claim's input may decide")
	}
	return "", fieldErr(pathWhenNamespaceGone, "must be Retry (keep the volume and retry its deletion pod until its namespace exists again) or Forget (that namespace held the volume's data: forget the volume without a pod), got %s", describe(v))
}
