package phase

import (
	"context"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/pods-as-volumes/pav/api/v1alpha1"
)

// TestWhenNamespaceGone: spec.volumeDeletion.whenNamespaceGone is Retry by
// default, Forget when written so, and a literal only: Check, the reading
// without evaluation and the evaluation all refuse anything else, naming the
// field.
func TestWhenNamespaceGone(t *testing.T) {
	const dyn = "  provisioningModes: [Dynamic]\n  volumeCreation: {capacity: 1Gi}\n" + staging
	const pod = "podTemplate: {metadata: {namespace: \"{{ pvc.metadata.namespace }}\"}, spec: {containers: [{name: c, image: b}]}}"
	for _, tc := range []struct {
		name, deletion string
		want           v1alpha1.WhenNamespaceGone
		wantErr        string // from Check, WhenNamespaceGoneOf and Deletion alike
		wantEvalErr    string // from Deletion only (what a template produced)
	}{
		{name: "no volumeDeletion", want: v1alpha1.NamespaceGoneRetry},
		{name: "absent", deletion: "{" + pod + "}", want: v1alpha1.NamespaceGoneRetry},
		{name: "Retry", deletion: "{whenNamespaceGone: Retry, " + pod + "}", want: v1alpha1.NamespaceGoneRetry},
		{name: "Forget", deletion: "{whenNamespaceGone: Forget, " + pod + "}", want: v1alpha1.NamespaceGoneForget},
		{name: "Forget without a pod", deletion: "{whenNamespaceGone: Forget}", want: v1alpha1.NamespaceGoneForget},
		{name: "misspelt", deletion: "{whenNamespaceGone: forget}", wantErr: `spec.volumeDeletion.whenNamespaceGone: must be Retry (keep the volume and retry its deletion pod until its namespace exists again) or Forget (that namespace held the volume's data: forget the volume without a pod), got "forget"`},
		{name: "a boolean", deletion: "{whenNamespaceGone: true}", wantErr: "spec.volumeDeletion.whenNamespaceGone: must be Retry"},
		{name: "a template", deletion: `{whenNamespaceGone: "{{ pvc.metadata.annotations.forget }}"}`, wantErr: "spec.volumeDeletion.whenNamespaceGone: must be a literal Retry or Forget, never a template"},
		{name: "produced by a whole-phase template", deletion: `"{% set yaml = true %}whenNamespaceGone: Forget"`, want: v1alpha1.NamespaceGoneRetry,
			wantEvalErr: "spec.volumeDeletion.whenNamespaceGone: must be written literally in the volumeDeletion object"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			spec := dyn
			if tc.deletion != "" {
				spec += "  volumeDeletion: " + tc.deletion + "\n"
			}
			p := load(t, spec)
			checkErr := Check(p)
			got, readErr := WhenNamespaceGoneOf(&p.Spec)
			vars, err := DeletionVars(Request{Params: map[string]string{}}, Objects{PVC: &corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Name: "data", Namespace: "ns1"}}}, "pvc-1", "h", 1)
			if err != nil {
				t.Fatal(err)
			}
			cfg, evalErr := NewEvaluator(nil).Deletion(context.Background(), p, vars)
			if tc.wantErr != "" {
				for what, err := range map[string]error{"Check": checkErr, "WhenNamespaceGoneOf": readErr, "Deletion": evalErr} {
					if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
						t.Errorf("%s = %v, want %q", what, err, tc.wantErr)
					}
				}
				return
			}
			if checkErr != nil || readErr != nil {
				t.Fatalf("Check = %v, WhenNamespaceGoneOf = %v", checkErr, readErr)
			}
			if got != tc.want {
				t.Errorf("WhenNamespaceGoneOf = %q, want %q", got, tc.want)
			}
			if tc.wantEvalErr != "" {
				if evalErr == nil || !strings.Contains(evalErr.Error(), tc.wantEvalErr) {
					t.Fatalf("Deletion = %v, want %q", evalErr, tc.wantEvalErr)
				}
				return
			}
			if evalErr != nil {
				t.Fatal(evalErr)
			}
			if cfg.WhenNamespaceGone != tc.want {
				t.Errorf("Deletion's WhenNamespaceGone = %q, want %q", cfg.WhenNamespaceGone, tc.want)
			}
			if strings.Contains(tc.deletion, "podTemplate") && (cfg.PodTemplate == nil || cfg.PodTemplate.Namespace != "ns1") {
				t.Errorf("pod template %+v, want the claim's namespace", cfg.PodTemplate)
			}
		})
	}
}
