package deploy

import (
	"bytes"
	"os"
	"slices"
	"strings"
	"testing"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apiserver/pkg/admission"
	"k8s.io/apiserver/pkg/admission/plugin/policy/validating"
	"k8s.io/apiserver/pkg/authentication/user"

	"github.com/pods-as-volumes/pav/api/v1alpha1"
)

// compiledPolicy loads the policy embedded as embedded, checks that it is the
// file at path, that the apiserver would compile it and that its binding
// denies.
func compiledPolicy(t *testing.T, path string, embedded []byte) *policyValidator {
	t.Helper()
	onDisk, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(onDisk, embedded) {
		t.Fatalf("the embedded policy differs from %s", path)
	}
	p, errs, err := loadPolicy(embedded)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range errs {
		t.Errorf("the apiserver would reject the policy: %v", e)
	}
	if p.binding.Spec.PolicyName != p.policy.Name || !slices.Equal(p.binding.Spec.ValidationActions, []admissionregistrationv1.ValidationAction{admissionregistrationv1.Deny}) {
		t.Errorf("binding %+v", p.binding.Spec)
	}
	return p
}

// nodePlugin is the user info of a node plugin's request in pav's namespace,
// with a token bound to a pod on node ("": a token bound to no node).
func nodePlugin(node string) user.Info {
	u := &user.DefaultInfo{Name: "system:serviceaccount:pav:pav-node", Groups: []string{"system:serviceaccounts", "system:serviceaccounts:pav"}}
	if node != "" {
		u.Extra = map[string][]string{"authentication.kubernetes.io/node-name": {node}, "authentication.kubernetes.io/pod-name": {"pav-p-node-x"}}
	}
	return u
}

// wantDecisions checks a request's decisions: none, or a denial containing deny.
func wantDecisions(t *testing.T, ds []validating.PolicyDecision, deny string) {
	t.Helper()
	var msgs []string
	for _, d := range ds {
		msgs = append(msgs, string(d.Action)+": "+d.Message)
	}
	switch {
	case deny == "" && len(ds) > 0:
		t.Fatalf("denied: %v", msgs)
	case deny != "" && (len(ds) == 0 || !strings.Contains(strings.Join(msgs, "\n"), deny)):
		t.Fatalf("decisions %v, want a denial %q", msgs, deny)
	}
}

func TestVolumePolicyManifestCompiles(t *testing.T) {
	p := compiledPolicy(t, "crd/pavvolumes-policy.yaml", VolumePolicyYAML)
	mc := p.policy.Spec.MatchConstraints
	if mc == nil || len(mc.ResourceRules) != 1 {
		t.Fatalf("want one resource rule, got %+v", mc)
	}
	r := mc.ResourceRules[0]
	if !slices.Equal(r.Resources, []string{v1alpha1.VolumeResource}) || len(r.Operations) != 3 {
		t.Errorf("resource rule %+v: want creates, updates and deletes of %s", r, v1alpha1.VolumeResource)
	}
}

// record is a PavVolume as the API server holds it: an inline volume of
// node, or a persistent volume's record (node "").
func record(t *testing.T, node, labelNode string) map[string]any {
	t.Helper()
	v := &v1alpha1.PavVolume{Spec: v1alpha1.PavVolumeSpec{Provisioner: "p", VolumeName: "csi-1", RequestedVolumeMode: "Filesystem", DefaultHandle: "csi-1"}}
	v.APIVersion, v.Kind, v.Name = v1alpha1.SchemeGroupVersion.String(), v1alpha1.VolumeKind, "csi-1"
	v.Labels = map[string]string{v1alpha1.LabelVolumeProvisioner: "p"}
	if node != "" {
		v.Spec.Ephemeral = &v1alpha1.EphemeralVolume{Node: node, Pod: v1alpha1.EphemeralPod{Namespace: "ns", Name: "pod", UID: "u"}}
	}
	if labelNode != "" {
		v.Labels[v1alpha1.LabelVolumeNode] = labelNode
	}
	m, err := runtime.DefaultUnstructuredConverter.ToUnstructured(v)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// TestVolumePolicy: the node plugins' ServiceAccount writes only its own
// node's inline volumes' PavVolumes (as the API server tells its node, from
// its token); everyone else is left to RBAC.
func TestVolumePolicy(t *testing.T) {
	p, errs, err := loadPolicy(VolumePolicyYAML)
	if err != nil || len(errs) > 0 {
		t.Fatal(err, errs)
	}
	controller := &user.DefaultInfo{Name: "system:serviceaccount:pav:pav-controller"}
	mine, others, persistent := record(t, "vm-2", "vm-2"), record(t, "vm-3", "vm-3"), record(t, "", "")
	for _, tc := range []struct {
		name     string
		op       admission.Operation
		obj, old map[string]any
		who      user.Info
		deny     string // "" = admitted
	}{
		{"create its own node's inline volume", admission.Create, mine, nil, nodePlugin("vm-2"), ""},
		{"update it", admission.Update, mine, mine, nodePlugin("vm-2"), ""},
		{"delete it", admission.Delete, nil, mine, nodePlugin("vm-2"), ""},
		{"the node plugins of another namespace's install", admission.Create, mine, nil,
			&user.DefaultInfo{Name: "system:serviceaccount:storage:pav-node", Extra: map[string][]string{"authentication.kubernetes.io/node-name": {"vm-2"}}}, ""},
		{"create another node's", admission.Create, others, nil, nodePlugin("vm-2"),
			"PavVolume csi-1 would be an inline volume of node vm-3: the node plugin of node vm-2 may not create it"},
		{"delete another node's", admission.Delete, nil, others, nodePlugin("vm-2"),
			"PavVolume csi-1 is an inline volume of node vm-3: the node plugin of node vm-2 may not delete it"},
		{"move another node's to its own", admission.Update, mine, others, nodePlugin("vm-2"),
			"PavVolume csi-1 is an inline volume of node vm-3: the node plugin of node vm-2 may not update it"},
		{"move its own to another node", admission.Update, others, mine, nodePlugin("vm-2"),
			"PavVolume csi-1 would be an inline volume of node vm-3"},
		{"create a persistent volume's record", admission.Create, persistent, nil, nodePlugin("vm-2"),
			"PavVolume csi-1 would be not an inline volume: the node plugin of node vm-2 may not create it"},
		{"update a persistent volume's record", admission.Update, persistent, persistent, nodePlugin("vm-2"),
			"PavVolume csi-1 is not an inline volume: the node plugin of node vm-2 may not update it"},
		{"delete a persistent volume's record", admission.Delete, nil, persistent, nodePlugin("vm-2"),
			"PavVolume csi-1 is not an inline volume"},
		{"without the node label", admission.Create, record(t, "vm-2", ""), nil, nodePlugin("vm-2"),
			"the label pav.albertofaria.github.io/node must be vm-2"},
		{"with another node's label", admission.Create, record(t, "vm-2", "vm-3"), nil, nodePlugin("vm-2"),
			"the label pav.albertofaria.github.io/node must be vm-2"},
		{"a token bound to no node (a legacy Secret token, a bare TokenRequest)", admission.Create, mine, nil, nodePlugin(""),
			"this request's user info has no authentication.kubernetes.io/node-name"},
		{"the controller plugin writes persistent records", admission.Create, persistent, nil, controller, ""},
		{"the controller plugin is not a node plugin", admission.Delete, nil, mine, controller, ""},
		{"an administrator", admission.Delete, nil, others, &user.DefaultInfo{Name: "kubernetes-admin", Groups: []string{"system:masters"}}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			wantDecisions(t, p.ValidateRequest(v1alpha1.VolumeGroupVersionResource, tc.op, tc.obj, tc.old, tc.who), tc.deny)
		})
	}
}
