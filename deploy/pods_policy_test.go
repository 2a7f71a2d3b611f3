package deploy

import (
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apiserver/pkg/admission"
	"k8s.io/apiserver/pkg/authentication/user"
)

const endedAnnotation = "pav.albertofaria.github.io/ended"

// pavPod is a controller-side pod of pav's as the API server holds it, on
// node, with the annotations ann, changed by edit.
func pavPod(t *testing.T, ns, node string, ann map[string]string, edit func(*corev1.Pod)) map[string]any {
	t.Helper()
	p := &corev1.Pod{}
	p.APIVersion, p.Kind, p.Namespace, p.Name, p.UID = "v1", "Pod", ns, "pav-p-creation-0123456789abcdef", "u1"
	p.Labels = map[string]string{"pav.albertofaria.github.io/provisioner": "p"}
	p.Annotations = map[string]string{"pav.albertofaria.github.io/token": "t"}
	for k, v := range ann {
		p.Annotations[k] = v
	}
	p.Spec = corev1.PodSpec{NodeName: node, RestartPolicy: corev1.RestartPolicyNever,
		Containers: []corev1.Container{{Name: "c", Image: "busybox", Command: []string{"/.pav-report/pav-report", "--exec", "--", "true"}}}}
	if edit != nil {
		edit(p)
	}
	m, err := runtime.DefaultUnstructuredConverter.ToUnstructured(p)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

func TestPodsPolicyManifest(t *testing.T) {
	compiledPolicy(t, "base/pods-policy.yaml", PodsPolicyYAML)
}

// TestPodsPolicy: the node plugins' ServiceAccount may only add the ended
// annotation, once, to a pod of its own node in its own namespace; everyone
// else is left to RBAC.
func TestPodsPolicy(t *testing.T) {
	p, errs, err := loadPolicy(PodsPolicyYAML)
	if err != nil || len(errs) > 0 {
		t.Fatal(err, errs)
	}
	ended := map[string]string{endedAnnotation: `{"handle":"h"}`}
	before := pavPod(t, "pav", "vm-2", nil, nil)
	after := pavPod(t, "pav", "vm-2", ended, nil)
	gvr := corev1.SchemeGroupVersion.WithResource("pods")
	for _, tc := range []struct {
		name     string
		obj, old map[string]any
		who      user.Info
		deny     string // "" = admitted
	}{
		{"relay the end of its own node's pod", after, before, nodePlugin("vm-2"), ""},
		{"another node's pod", pavPod(t, "pav", "vm-3", ended, nil), pavPod(t, "pav", "vm-3", nil, nil), nodePlugin("vm-2"),
			"does not run on node vm-2"},
		{"a pod not yet scheduled", pavPod(t, "pav", "", ended, nil), pavPod(t, "pav", "", nil, nil), nodePlugin("vm-2"),
			"does not run on node vm-2"},
		{"a tenant's pod on its node", pavPod(t, "tenant", "vm-2", ended, nil), pavPod(t, "tenant", "vm-2", nil, nil), nodePlugin("vm-2"),
			"the node plugins update only pods in their own namespace"},
		{"overwrite a relayed end", pavPod(t, "pav", "vm-2", map[string]string{endedAnnotation: `{"handle":"other"}`}, nil), after, nodePlugin("vm-2"),
			"may only add the annotation pav.albertofaria.github.io/ended, once"},
		{"change another annotation", pavPod(t, "pav", "vm-2", map[string]string{endedAnnotation: "{}", "pav.albertofaria.github.io/token": "mine"}, nil), before, nodePlugin("vm-2"),
			"may only add the annotation"},
		{"add another annotation", pavPod(t, "pav", "vm-2", map[string]string{"x": "y"}, nil), before, nodePlugin("vm-2"),
			"may only add the annotation"},
		{"drop an annotation", pavPod(t, "pav", "vm-2", nil, func(p *corev1.Pod) { p.Annotations = nil }), before, nodePlugin("vm-2"),
			"may only add the annotation"},
		{"change a label", pavPod(t, "pav", "vm-2", ended, func(p *corev1.Pod) { p.Labels["x"] = "y" }), before, nodePlugin("vm-2"),
			"may change nothing of a pod but the annotation"},
		{"add a finalizer", pavPod(t, "pav", "vm-2", ended, func(p *corev1.Pod) { p.Finalizers = []string{"x/y"} }), before, nodePlugin("vm-2"),
			"may change nothing of a pod but the annotation"},
		{"change the spec", pavPod(t, "pav", "vm-2", ended, func(p *corev1.Pod) { p.Spec.Containers[0].Image = "evil" }), before, nodePlugin("vm-2"),
			"may change nothing of a pod but the annotation"},
		{"a token bound to no node", after, before, nodePlugin(""), "this request's user info has no authentication.kubernetes.io/node-name"},
		{"the controller plugin is not a node plugin", pavPod(t, "pav", "vm-3", ended, nil), before,
			&user.DefaultInfo{Name: "system:serviceaccount:pav:pav-controller"}, ""},
		{"an administrator", pavPod(t, "tenant", "vm-3", map[string]string{"x": "y"}, nil), pavPod(t, "tenant", "vm-3", nil, nil),
			&user.DefaultInfo{Name: "kubernetes-admin", Groups: []string{"system:masters"}}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			wantDecisions(t, p.ValidateRequest(gvr, admission.Update, tc.obj, tc.old, tc.who), tc.deny)
		})
	}
}
