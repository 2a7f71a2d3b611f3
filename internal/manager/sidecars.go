package manager

import (
	"slices"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/utils/ptr"

	"github.com/pods-as-volumes/pav/api/v1alpha1"
	"github.com/pods-as-volumes/pav/internal/phase"
	pavprov "github.com/pods-as-volumes/pav/internal/provisioner"
)

// sidecars are the names of the controller pod's containers a provisioner gets:
// the driver and external-provisioner always; external-resizer only when the
// driver serves ControllerExpandVolume (spec.volumeExpansion) or
// ControllerModifyVolume (spec.volumeModification: the resizer is also what
// carries a claim's VolumeAttributesClass changes to the driver), and
// external-snapshotter only when it serves CreateSnapshot (spec.snapshotCreation).
// Both stock sidecars exit at start when the driver lacks the capability (the
// resizer when it has neither EXPAND_VOLUME nor MODIFY_VOLUME), so a
// provisioner without the phase would get a crash-looping controller pod.
//
// The features are those of the spec the drivers run with: the spec itself when
// it passes phase.Check, else the last valid one the manager saved (drivers fall
// back to it, see internal/provisioner), else none: an invalid provisioner's
// driver serves nothing, and a sidecar would only crash-loop.
func sidecars(f phase.Features) map[string]bool {
	return map[string]bool{containerPav: true, containerProvision: true, containerLiveness: true,
		containerResizer: f.Expansion || f.Modification, containerSnapshot: f.Snapshots}
}

// capacityTracking turns on storage capacity tracking for a provisioner with
// spec.storageCapacity, and leaves everything as the manifests have it
// otherwise: the CSIDriver's storageCapacity (the scheduler then places a
// WaitForFirstConsumer claim's pod only on a node whose CSIStorageCapacity
// object of the class has room for it), and external-provisioner's capacity
// controller, which calls GetCapacity for each topology segment and class of
// the driver every refresh interval and after each provisioning, and
// publishes the answers as CSIStorageCapacity objects in pav's namespace,
// owned by the controller StatefulSet (--capacity-ownerref-level=1: they go
// with it). It reads NAMESPACE (where the objects go) and POD_NAME (to find
// their owner) and exits without them. storageCapacity may change on a
// live CSIDriver; the features annotation restarts the controller pod when
// the sidecar's flags change.
func capacityTracking(o *Objects, f phase.Features) {
	if !f.Capacity {
		return
	}
	o.CSIDriver.Spec.StorageCapacity = ptr.To(true)
	c := container(&o.Controller.Spec.Template.Spec, containerProvision)
	if c == nil {
		return // Render checks that it is there
	}
	c.Args = setArg(c.Args, "--enable-capacity", "true")
	c.Args = setArg(c.Args, "--capacity-ownerref-level", "1")
	c.Args = setArg(c.Args, "--capacity-poll-interval", f.CapacityRefresh.String())
	// Its own client for the objects, at 1 request a second (burst 5) by
	// default: a StorageClass made or deleted writes one object per node at
	// once, and a volume made or deleted on a node rewrites that node's
	// object of every class: at 1 a second, a busy cluster's writes queue up,
	// and the pods of a new class's claims wait for its objects meanwhile.
	c.Args = setArg(c.Args, "--kube-api-capacity-qps", "5")
	c.Args = setArg(c.Args, "--kube-api-capacity-burst", "10")
	for _, e := range []struct{ name, path string }{{"NAMESPACE", "metadata.namespace"}, {"POD_NAME", "metadata.name"}} {
		c.Env = slices.DeleteFunc(c.Env, func(v corev1.EnvVar) bool { return v.Name == e.name })
		c.Env = append(c.Env, corev1.EnvVar{Name: e.name, ValueFrom: &corev1.EnvVarSource{
			FieldRef: &corev1.ObjectFieldSelector{APIVersion: "v1", FieldPath: e.path}}})
	}
}

// features are those of the spec the drivers run with
// (provisioner.InForce); none for a provisioner without a valid spec.
func features(p *v1alpha1.PavProvisioner) phase.Features {
	q := pavprov.InForce(p)
	if q == nil {
		return phase.Features{}
	}
	f, err := phase.FeaturesOf(&q.Spec)
	if err != nil {
		return phase.Features{}
	}
	return f
}

// AnnotationFeatures, on the drivers' pod templates, names the features the
// drivers advertise (featureSummary). The stock sidecars read the driver's
// capabilities once at start, and kubelet reads NodeGetInfo's topology only when
// the node plugin registers: a spec edit that changes a capability must restart
// both workloads, and a changed pod template annotation rolls them.
const AnnotationFeatures = v1alpha1.GroupName + "/features"

// featureSummary is a stable, readable form of f, e.g.
// "expansion=online,nodeexpansion,snapshots,sources=Snapshot+Volume,topology=kubernetes.io/hostname,
// capacity=1m0s,modification=iops+readAheadKiB,groupsnapshots,snapshotmetadata,maxvolumes=32,ephemeral";
// "none" without any. A feature a spec lacks adds nothing, so that the
// summary of an older spec, and its drivers, stay as they were.
func featureSummary(f phase.Features) string {
	var parts []string
	if f.Expansion {
		mode := "offline"
		if f.OnlineExpansion {
			mode = "online"
		}
		parts = append(parts, "expansion="+mode)
	}
	if f.NodeExpansion {
		parts = append(parts, "nodeexpansion")
	}
	if f.Snapshots {
		parts = append(parts, "snapshots")
	}
	if len(f.ContentSources) > 0 {
		srcs := slices.Clone(f.ContentSources)
		slices.Sort(srcs)
		parts = append(parts, "sources="+strings.Join(srcs, "+"))
	}
	if len(f.TopologyKeys) > 0 {
		parts = append(parts, "topology="+strings.Join(f.TopologyKeys, "+"))
	}
	if f.Capacity {
		parts = append(parts, "capacity="+f.CapacityRefresh.String())
	}
	if f.Modification {
		// Sorted: the order of the list changes nothing. A parameter key
		// may hold any character; escaping the separators keeps two
		// different sets apart.
		keys := make([]string, len(f.MutableParameters))
		for i, k := range f.MutableParameters {
			keys[i] = summaryEscaper.Replace(k)
		}
		slices.Sort(keys)
		parts = append(parts, "modification="+strings.Join(keys, "+"))
	}
	if f.GroupSnapshots {
		parts = append(parts, "groupsnapshots")
	}
	if f.SnapshotMetadata {
		parts = append(parts, "snapshotmetadata")
	}
	if f.MaxVolumesPerNode > 0 {
		parts = append(parts, "maxvolumes="+strconv.FormatInt(f.MaxVolumesPerNode, 10))
	}
	if f.Ephemeral {
		parts = append(parts, "ephemeral")
	}
	if len(parts) == 0 {
		return "none"
	}
	return strings.Join(parts, ",")
}

// summaryEscaper escapes the separators of featureSummary in a value.
var summaryEscaper = strings.NewReplacer("%", "%25", "+", "%2B", ",", "%2C")
