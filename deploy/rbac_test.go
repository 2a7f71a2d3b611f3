package deploy

import (
	"bytes"
	"os"
	"slices"
	"testing"

	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"
)

// rbac is deploy/base/rbac.yaml (and others): roles by name (Roles as
// "Role/NAME"), and which ServiceAccount each binding gives which role.
type rbac struct {
	roles    map[string][]rbacv1.PolicyRule
	bindings map[string][]string // ServiceAccount → role names
}

func loadRBAC(t *testing.T) *rbac {
	t.Helper()
	return loadRBACFiles(t, "base/rbac.yaml")
}

func loadRBACFiles(t *testing.T, files ...string) *rbac {
	t.Helper()
	r := &rbac{roles: map[string][]rbacv1.PolicyRule{}, bindings: map[string][]string{}}
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		r.add(t, b)
	}
	return r
}

func (r *rbac) add(t *testing.T, b []byte) {
	t.Helper()
	for _, doc := range bytes.Split(b, []byte("\n---\n")) {
		var tm metav1.TypeMeta
		if err := yaml.Unmarshal(doc, &tm); err != nil {
			t.Fatal(err)
		}
		switch tm.Kind {
		case "ClusterRole", "Role":
			var role rbacv1.ClusterRole
			if err := yaml.UnmarshalStrict(doc, &role); err != nil {
				t.Fatal(err)
			}
			key := role.Name
			if tm.Kind == "Role" {
				key = "Role/" + key // a Role and a ClusterRole may share a name
			}
			r.roles[key] = role.Rules
		case "ClusterRoleBinding", "RoleBinding":
			var rb rbacv1.ClusterRoleBinding
			if err := yaml.UnmarshalStrict(doc, &rb); err != nil {
				t.Fatal(err)
			}
			for _, s := range rb.Subjects {
				ref := rb.RoleRef.Name
				if rb.RoleRef.Kind == "Role" {
					ref = "Role/" + ref
				}
				r.bindings[s.Name] = append(r.bindings[s.Name], ref)
			}
		}
	}
}

// can reports whether a ServiceAccount's roles allow verb on group/resource.
func (r *rbac) can(sa, group, resource, verb string) bool {
	for _, role := range r.bindings[sa] {
		for _, rule := range r.roles[role] {
			if slices.Contains(rule.APIGroups, group) && slices.Contains(rule.Resources, resource) && slices.Contains(rule.Verbs, verb) {
				return true
			}
		}
	}
	return false
}

// TestLeastPrivilege is finding 7: the controller and node plugins have their
// own ServiceAccounts and roles, each with what it uses and nothing else.
func TestLeastPrivilege(t *testing.T) {
	r := loadRBAC(t)
	const pav = "pav.albertofaria.github.io"
	for _, tc := range []struct {
		sa, group, resource, verb string
		want                      bool
	}{
		// The controller plugin keeps the records, runs pods, reads claims.
		{"pav-controller", pav, "pavvolumes", "create", true},
		{"pav-controller", pav, "pavvolumes", "update", true},
		{"pav-controller", pav, "pavvolumes", "delete", true},
		{"pav-controller", pav, "pavvolumes", "watch", true},
		{"pav-controller", pav, "pavsnapshots", "create", true},
		{"pav-controller", pav, "pavsnapshots", "update", true},
		{"pav-controller", pav, "pavsnapshots", "delete", true},
		{"pav-controller", pav, "pavsnapshots", "watch", true},
		{"pav-controller", pav, "pavgroupsnapshots", "create", true},
		{"pav-controller", pav, "pavgroupsnapshots", "update", true},
		{"pav-controller", pav, "pavgroupsnapshots", "delete", true},
		{"pav-controller", pav, "pavgroupsnapshots", "watch", true},
		{"pav-controller", "", "pods", "create", true},
		{"pav-controller", "", "pods/log", "get", true},
		{"pav-controller", "", "persistentvolumeclaims", "get", true},
		{"pav-controller", "storage.k8s.io", "storageclasses", "get", true},
		// The driver lists PVs once at start, to adopt v0.2.0's volumes, and gets a
		// volume's PV to put an event on it.
		{"pav-controller", "", "persistentvolumes", "list", true},
		{"pav-controller", "", "persistentvolumes", "get", true},
		{"pav-controller", "", "events", "create", true},
		// ... and no longer writes PVCs (the forgeable annotation is gone).
		{"pav-controller", "", "persistentvolumeclaims", "patch", false},
		// (external-provisioner, in the same pod, does update PVCs and PVs.)
		{"pav-controller", "", "persistentvolumeclaims", "update", true},
		// external-resizer grows PVs and records the claims' resize status, never
		// their spec; external-snapshotter records VolumeSnapshotContents, never
		// creates or deletes them (the cluster's snapshot-controller does).
		{"pav-controller", "", "persistentvolumes", "patch", true},
		{"pav-controller", "", "persistentvolumeclaims/status", "patch", true},
		{"pav-controller", "", "persistentvolumeclaims/status", "update", false},
		{"pav-controller", "snapshot.storage.k8s.io", "volumesnapshotcontents", "update", true},
		{"pav-controller", "snapshot.storage.k8s.io", "volumesnapshotcontents/status", "patch", true},
		{"pav-controller", "snapshot.storage.k8s.io", "volumesnapshotclasses", "watch", true},
		{"pav-controller", "snapshot.storage.k8s.io", "volumesnapshotcontents", "create", false},
		{"pav-controller", "snapshot.storage.k8s.io", "volumesnapshotcontents", "delete", false},
		// ... and so it does VolumeGroupSnapshotContents: it lists the group CRDs when it
		// starts (without these rules it serves no group snapshots), and never creates or
		// deletes a group's content, nor touches VolumeGroupSnapshots.
		{"pav-controller", "groupsnapshot.storage.k8s.io", "volumegroupsnapshotclasses", "list", true},
		{"pav-controller", "groupsnapshot.storage.k8s.io", "volumegroupsnapshotcontents", "watch", true},
		{"pav-controller", "groupsnapshot.storage.k8s.io", "volumegroupsnapshotcontents", "update", true},
		{"pav-controller", "groupsnapshot.storage.k8s.io", "volumegroupsnapshotcontents/status", "patch", true},
		{"pav-controller", "groupsnapshot.storage.k8s.io", "volumegroupsnapshotcontents", "create", false},
		{"pav-controller", "groupsnapshot.storage.k8s.io", "volumegroupsnapshotcontents", "delete", false},
		{"pav-controller", "groupsnapshot.storage.k8s.io", "volumegroupsnapshots", "get", false},
		// external-provisioner reads a claim's dataSource snapshot to restore it
		// (found by e2e: restores were refused without it); it never writes one.
		{"pav-controller", "snapshot.storage.k8s.io", "volumesnapshots", "get", true},
		{"pav-controller", "snapshot.storage.k8s.io", "volumesnapshots", "update", false},
		{"pav-controller", "snapshot.storage.k8s.io", "volumesnapshots", "delete", false},
		{"pav-controller", "", "pods", "update", false},
		// VolumeAttributesClass: external-provisioner GETs a claim's class, external-resizer
		// watches them; neither writes one.
		{"pav-controller", "storage.k8s.io", "volumeattributesclasses", "get", true},
		{"pav-controller", "storage.k8s.io", "volumeattributesclasses", "watch", true},
		{"pav-controller", "storage.k8s.io", "volumeattributesclasses", "update", false},
		{"pav-controller", "storage.k8s.io", "volumeattributesclasses", "delete", false},
		// external-provisioner publishes storage capacity (spec.storageCapacity)
		// in pav's namespace; the node plugin has nothing to do with it.
		{"pav-controller", "storage.k8s.io", "csistoragecapacities", "create", true},
		{"pav-controller", "storage.k8s.io", "csistoragecapacities", "update", true},
		{"pav-controller", "storage.k8s.io", "csistoragecapacities", "delete", true},
		{"pav-controller", "storage.k8s.io", "csistoragecapacities", "watch", true},
		{"pav-node", "storage.k8s.io", "csistoragecapacities", "list", false},
		// The node plugin: its pods, the staging context, nothing else.
		{"pav-node", "", "pods", "create", true},
		{"pav-node", "", "pods", "delete", true},
		{"pav-node", "", "pods/log", "get", true},
		// To relay a controller-side pod's end (pods-policy.yaml narrows
		// it to one annotation on its own node's pods).
		{"pav-node", "", "pods", "patch", true},
		{"pav-node", "", "pods", "update", false},
		{"pav-node", "", "pods/status", "patch", false},
		{"pav-node", "", "persistentvolumes", "get", true},
		{"pav-node", "", "persistentvolumeclaims", "get", true},
		{"pav-node", "", "nodes", "get", true},
		// The class a PV names, by name (mutableParams of the staging context).
		{"pav-node", "storage.k8s.io", "volumeattributesclasses", "get", true},
		{"pav-node", "storage.k8s.io", "volumeattributesclasses", "list", false},
		{"pav-node", pav, "pavprovisioners", "watch", true},
		// Its inline volumes' records, by name (pavvolumes-policy.yaml
		// narrows the writes to its own node's).
		{"pav-node", pav, "pavvolumes", "get", true},
		{"pav-node", pav, "pavvolumes", "create", true},
		{"pav-node", pav, "pavvolumes", "update", true},
		{"pav-node", pav, "pavvolumes", "delete", true},
		{"pav-node", pav, "pavvolumes", "list", false},
		{"pav-node", pav, "pavvolumes", "watch", false},
		{"pav-node", pav, "pavvolumes", "patch", false},
		{"pav-node", pav, "pavsnapshots", "get", false},
		{"pav-node", pav, "pavsnapshots", "list", false},
		{"pav-node", pav, "pavgroupsnapshots", "get", false},
		{"pav-node", pav, "pavprovisioners/status", "patch", false},
		{"pav-node", pav, "pavprovisioners/status", "update", false},
		{"pav-node", "", "persistentvolumeclaims", "patch", false},
		{"pav-node", "", "persistentvolumeclaims", "update", false},
		// Its cost must not grow with the cluster: no PV list or watch (issue 10).
		{"pav-node", "", "persistentvolumes", "list", false},
		{"pav-node", "", "persistentvolumes", "watch", false},
		{"pav-node", "", "persistentvolumes", "create", false},
		{"pav-node", "", "persistentvolumes", "delete", false},
		{"pav-node", "", "nodes", "patch", false},
		{"pav-node", "", "secrets", "get", false},
		// external-snapshot-metadata authenticates and authorizes backup
		// applications and reads what turns a VolumeSnapshot into a handle;
		// it never writes a snapshot, reads no Secret (pav passes no CSI
		// secrets), and reads its driver's SnapshotMetadataService by name
		// for the audience (v1.1.0 does on every request), never lists them.
		{"pav-controller", "authentication.k8s.io", "tokenreviews", "create", true},
		{"pav-controller", "authorization.k8s.io", "subjectaccessreviews", "create", true},
		{"pav-controller", "snapshot.storage.k8s.io", "volumesnapshotclasses", "list", true},
		{"pav-controller", "", "secrets", "get", false},
		{"pav-controller", "", "secrets", "list", false},
		{"pav-controller", "cbt.storage.k8s.io", "snapshotmetadataservices", "get", true},
		{"pav-controller", "cbt.storage.k8s.io", "snapshotmetadataservices", "list", false},
		{"pav-controller", "cbt.storage.k8s.io", "snapshotmetadataservices", "create", false},
		{"pav-controller", "authentication.k8s.io", "tokenreviews", "get", false},
	} {
		if got := r.can(tc.sa, tc.group, tc.resource, tc.verb); got != tc.want {
			t.Errorf("%s may %s %s.%s: %v, want %v", tc.sa, tc.verb, tc.resource, tc.group, got, tc.want)
		}
	}
	// The sidecars' rules are theirs: the pav driver's own role gains none of them
	// (but the PV list it adopts v0.2.0's volumes with, and the PV get of its events).
	for _, rule := range r.roles["pav-driver-controller"] {
		pvList := slices.Equal(rule.Resources, []string{"persistentvolumes"}) && slices.Equal(rule.Verbs, []string{"get", "list"})
		if slices.Contains(rule.APIGroups, "snapshot.storage.k8s.io") || slices.Contains(rule.APIGroups, "groupsnapshot.storage.k8s.io") ||
			slices.Contains(rule.Resources, "persistentvolumes") && !pvList ||
			slices.Contains(rule.Resources, "persistentvolumeclaims/status") {
			t.Errorf("pav-driver-controller has a sidecar's rule %+v", rule)
		}
	}
	// v0.2.0's role, which its leftover bindings name, grants nothing.
	if rules, ok := r.roles["pav-driver"]; !ok || len(rules) != 0 {
		t.Errorf("ClusterRole pav-driver (v0.2.0's, emptied) has rules %+v (present: %v), want none", rules, ok)
	}
	if got := r.bindings["pav-node"]; !slices.Equal(got, []string{"pav-driver-node"}) {
		t.Errorf("pav-node is bound to %v, want only pav-driver-node", got)
	}
	// No wildcard anywhere.
	for name, rules := range r.roles {
		for _, rule := range rules {
			if slices.Contains(rule.Verbs, "*") || slices.Contains(rule.Resources, "*") || slices.Contains(rule.APIGroups, "*") {
				t.Errorf("role %s has a wildcard rule %+v", name, rule)
			}
		}
	}
}

// The manager makes each provisioner's snapshot metadata objects: Services and
// Secrets in pav's namespace (a Role, with a watch it narrows by label), the
// SnapshotMetadataService by name (never listed: its CRD may be absent).
func TestManagerPrivileges(t *testing.T) {
	r := loadRBACFiles(t, "manager/rbac.yaml")
	for _, tc := range []struct {
		group, resource, verb string
		want                  bool
	}{
		{"", "services", "create", true},
		{"", "services", "patch", true},
		{"", "services", "delete", true},
		{"", "secrets", "watch", true},
		{"", "secrets", "patch", true},
		{"", "secrets", "update", false},
		{"cbt.storage.k8s.io", "snapshotmetadataservices", "get", true},
		{"cbt.storage.k8s.io", "snapshotmetadataservices", "patch", true},
		{"cbt.storage.k8s.io", "snapshotmetadataservices", "delete", true},
		{"cbt.storage.k8s.io", "snapshotmetadataservices", "list", false},
		{"cbt.storage.k8s.io", "snapshotmetadataservices", "watch", false},
		{"authentication.k8s.io", "tokenreviews", "create", false},
	} {
		if got := r.can("pav-manager", tc.group, tc.resource, tc.verb); got != tc.want {
			t.Errorf("pav-manager may %s %s.%s: %v, want %v", tc.verb, tc.resource, tc.group, got, tc.want)
		}
	}
	// Secrets and Services only in pav's namespace (a Role, not the ClusterRole).
	for _, rule := range r.roles["pav-manager"] {
		if slices.Contains(rule.APIGroups, "") && (slices.Contains(rule.Resources, "secrets") || slices.Contains(rule.Resources, "services")) {
			t.Errorf("a cluster-wide rule of pav-manager has %v", rule.Resources)
		}
	}
}
