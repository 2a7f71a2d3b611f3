package manager

import (
	"fmt"
	"sort"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/tools/cache"

	"github.com/pods-as-volumes/pav/api/v1alpha1"
	"github.com/pods-as-volumes/pav/podrunner"
)

// The deletion guard (spec §6). A PavProvisioner keeps its finalizer, and its
// drivers keep running, while anything still needs them:
//
//   - a dynamically provisioned PV of its driver, in any phase: only the driver
//     can delete its volume (a Retain PV too: the user may still stage it);
//   - a static PV of its driver bound to a claim: a pod may stage it at any
//     moment. A Released or Available static PV does not block: its storage is
//     the user's, and PaV let such a provisioner go as well;
//   - a volume record (PavVolume) of the provisioner: a volume being created,
//     reverted or deleted, or one whose PV is gone before DeleteVolume ran;
//   - a snapshot record (PavSnapshot) of the provisioner: only its driver can
//     delete the snapshot (which outlives its volume);
//   - a group snapshot record (PavGroupSnapshot) of the provisioner: only its
//     driver can delete the group (its pods, its members' snapshots);
//   - one of pav's pods of the provisioner that has not finished, and every
//     staging pod: a staging pod stays until its volume is unstaged, so it is how
//     the manager knows a volume (static ones too) is still staged on a node, and
//     an operation in progress must be allowed to finish. Capacity pods do not
//     count: their reports change nothing, and they go with the controller
//     plugin's pod, which owns them.
//
// Each guard is one informer index and one function (Controller.guards).
type guard func(provisioner string) ([]string, error)

// Index names of the manager's informers.
const (
	indexByDriver      = "driver"      // PVs by spec.csi.driver
	indexByProvisioner = "provisioner" // pav's pods by their provisioner label
)

func pvByDriver(obj any) ([]string, error) {
	pv, ok := obj.(*corev1.PersistentVolume)
	if !ok || pv.Spec.CSI == nil {
		return nil, nil
	}
	return []string{pv.Spec.CSI.Driver}, nil
}

func podByProvisioner(obj any) ([]string, error) {
	pod, ok := obj.(*corev1.Pod)
	if !ok || pod.Labels[podrunner.LabelProvisioner] == "" {
		return nil, nil
	}
	return []string{pod.Labels[podrunner.LabelProvisioner]}, nil
}

// annProvisionedBy marks a PV made by a dynamic provisioner (external-provisioner
// sets it to the CSI driver name).
const annProvisionedBy = "pv.kubernetes.io/provisioned-by"

// pvGuard: dynamically provisioned PVs, and bound static ones, of the driver.
func pvGuard(pvs cache.Indexer) guard {
	return func(driver string) ([]string, error) {
		objs, err := pvs.ByIndex(indexByDriver, driver)
		if err != nil {
			return nil, err
		}
		var out []string
		for _, o := range objs {
			pv := o.(*corev1.PersistentVolume)
			switch {
			case pv.Annotations[annProvisionedBy] == driver:
				out = append(out, fmt.Sprintf("PV %s (%s)", pv.Name, pv.Status.Phase))
			case pv.Status.Phase == corev1.VolumeBound:
				claim := ""
				if r := pv.Spec.ClaimRef; r != nil {
					claim = " to " + r.Namespace + "/" + r.Name
				}
				out = append(out, fmt.Sprintf("static PV %s (bound%s)", pv.Name, claim))
			}
		}
		return out, nil
	}
}

// podGuard: pav's pods of the provisioner still at work, and its staging pods.
func podGuard(pods cache.Indexer) guard {
	return func(provisioner string) ([]string, error) {
		objs, err := pods.ByIndex(indexByProvisioner, provisioner)
		if err != nil {
			return nil, err
		}
		var out []string
		for _, o := range objs {
			pod := o.(*corev1.Pod)
			ph := pod.Labels[podrunner.LabelPhase]
			switch {
			case ph == string(v1alpha1.PhaseCapacity):
			case ph == string(v1alpha1.PhaseStaging):
				out = append(out, fmt.Sprintf("staging pod %s/%s (a volume is staged on node %s)", pod.Namespace, pod.Name, pod.Spec.NodeName))
			case podrunner.Finished(pod):
			default:
				out = append(out, fmt.Sprintf("%s pod %s/%s (%s)", ph, pod.Namespace, pod.Name, pod.Status.Phase))
			}
		}
		return out, nil
	}
}

// recordByProvisioner indexes PavVolumes, PavSnapshots and PavGroupSnapshots
// (unstructured, from the dynamic informer) by their provisioner label.
func recordByProvisioner(obj any) ([]string, error) {
	if m, ok := object(obj); ok && m.GetLabels()[v1alpha1.LabelVolumeProvisioner] != "" {
		return []string{m.GetLabels()[v1alpha1.LabelVolumeProvisioner]}, nil
	}
	return nil, nil
}

// recordGuard: the provisioner's records of one kind (PavVolume, PavSnapshot,
// PavGroupSnapshot).
func recordGuard(kind string, records cache.Indexer) guard {
	return func(provisioner string) ([]string, error) {
		objs, err := records.ByIndex(indexByProvisioner, provisioner)
		if err != nil {
			return nil, err
		}
		var out []string
		for _, o := range objs {
			m, ok := object(o)
			if !ok {
				continue
			}
			phase := ""
			if u, ok := o.(*unstructured.Unstructured); ok {
				phase, _, _ = unstructured.NestedString(u.Object, "status", "phase")
			}
			if phase == "" {
				phase = "new"
			}
			out = append(out, fmt.Sprintf("%s %s (%s)", kind, m.GetName(), phase))
		}
		return out, nil
	}
}

// blockers lists, sorted, everything that still needs the provisioner's drivers.
func (c *Controller) blockers(provisioner string) ([]string, error) {
	var all []string
	for _, g := range c.guards {
		b, err := g(provisioner)
		if err != nil {
			return nil, err
		}
		all = append(all, b...)
	}
	sort.Strings(all)
	return all, nil
}

// summarize writes at most max items, then how many more.
func summarize(items []string, max int) string {
	if len(items) <= max {
		return strings.Join(items, ", ")
	}
	return fmt.Sprintf("%s and %d more", strings.Join(items[:max], ", "), len(items)-max)
}
