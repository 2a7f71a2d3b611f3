package manager

import (
	"bytes"
	"encoding/json"
	"fmt"
	"slices"
	"strconv"
	"strings"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/yaml"

	"github.com/pods-as-volumes/pav/api/v1alpha1"
	"github.com/pods-as-volumes/pav/deploy"
	"github.com/pods-as-volumes/pav/internal/kubeconfig"
	"github.com/pods-as-volumes/pav/internal/phase"
)

// FieldManager owns, in server-side apply, every field the manager sets.
const FieldManager = "pav-manager"

// Container names in deploy/provisioner that settings apply to.
const (
	containerPav       = "pav"
	containerProvision = "csi-provisioner"
	containerRegistrar = "node-driver-registrar"
	containerResizer   = "csi-resizer"
	containerSnapshot  = "csi-snapshotter"
	containerLiveness  = "liveness-probe"
)

// Labels of the objects the manager deploys (the manifests add the others).
const (
	labelInstance  = "app.kubernetes.io/instance"
	labelManagedBy = "app.kubernetes.io/managed-by"
)

// maxNameLength is the longest PavProvisioner name the manager can deploy: the
// StatefulSet controller labels pods with controller-revision-hash =
// "<StatefulSet name>-<up to 10 characters>", a label value of at most 63
// characters, and the StatefulSet is "pav-<name>-controller".
const maxNameLength = 63 - len("pav-") - len("-controller") - 1 - 10

// Objects are what the manager applies for one PavProvisioner: the three
// documents of deploy/provisioner with the name substituted, the settings
// applied and an owner reference to the PavProvisioner. What is applied of
// each is its applyConfig.
type Objects struct {
	CSIDriver  *storagev1.CSIDriver
	Controller *appsv1.StatefulSet
	Node       *appsv1.DaemonSet
	// SnapshotMetadata is the csi-snapshot-metadata sidecar's Service, for
	// a provisioner with spec.snapshotMetadata (nil otherwise); its TLS
	// Secret and SnapshotMetadataService depend on what the cluster holds
	// (snapshotmetadata.go).
	SnapshotMetadata *corev1.Service
}

// ControllerName and NodeName are the names of a provisioner's workloads.
func ControllerName(provisioner string) string { return "pav-" + provisioner + "-controller" }
func NodeName(provisioner string) string       { return "pav-" + provisioner + "-node" }

// Render builds a provisioner's objects; the workloads go to namespace (the
// manager's own, where the drivers' ServiceAccounts live).
func Render(p *v1alpha1.PavProvisioner, namespace string, s Settings) (*Objects, error) {
	if len(p.Name) > maxNameLength {
		return nil, fmt.Errorf("metadata.name %q is %d characters long; the manager deploys names of at most %d (its StatefulSet %s needs room for the pods' controller-revision-hash label): recreate the PavProvisioner under a shorter name",
			p.Name, len(p.Name), maxNameLength, ControllerName(p.Name))
	}
	o := &Objects{}
	if err := decode(deploy.CSIDriverYAML, p.Name, &o.CSIDriver); err != nil {
		return nil, err
	}
	if err := decode(deploy.ControllerYAML, p.Name, &o.Controller); err != nil {
		return nil, err
	}
	if err := decode(deploy.NodeYAML, p.Name, &o.Node); err != nil {
		return nil, err
	}
	owner := metav1.OwnerReference{APIVersion: v1alpha1.SchemeGroupVersion.String(), Kind: v1alpha1.Kind,
		Name: p.Name, UID: p.UID, Controller: ptr.To(true), BlockOwnerDeletion: ptr.To(true)}
	for _, m := range []*metav1.ObjectMeta{&o.CSIDriver.ObjectMeta, &o.Controller.ObjectMeta, &o.Node.ObjectMeta} {
		m.OwnerReferences = []metav1.OwnerReference{owner}
		if m.Labels == nil {
			m.Labels = map[string]string{}
		}
		m.Labels[labelManagedBy] = FieldManager
	}
	o.Controller.Namespace, o.Node.Namespace = namespace, namespace
	ctrl, node := &o.Controller.Spec.Template.Spec, &o.Node.Spec.Template.Spec
	for _, name := range []string{containerResizer, containerSnapshot} {
		if container(ctrl, name) == nil {
			return nil, fmt.Errorf("deploy/provisioner has no container %q: the embedded manifests and the manager disagree", name)
		}
	}
	// The manifests carry every sidecar; a provisioner gets only those its driver
	// serves: the stock resizer and snapshotter exit when the driver lacks the
	// capability, and would crash-loop the controller pod.
	f := features(p)
	csiDriver(&o.CSIDriver.Spec, f)
	wanted := sidecars(f)
	for _, t := range []*metav1.ObjectMeta{&o.Controller.Spec.Template.ObjectMeta, &o.Node.Spec.Template.ObjectMeta} {
		if t.Annotations == nil {
			t.Annotations = map[string]string{}
		}
		t.Annotations[AnnotationFeatures] = featureSummary(f)
	}
	ctrl.Containers = slices.DeleteFunc(ctrl.Containers, func(c corev1.Container) bool { return !wanted[c.Name] })
	capacityTracking(o, f)
	if f.SnapshotMetadata {
		// Not in deploy/provisioner: it needs the TLS Secret only the
		// manager makes.
		addSnapshotMetadataSidecar(ctrl, p.Name)
		o.SnapshotMetadata = renderSnapshotMetadataService(p.Name, namespace, owner)
	}
	for _, c := range []struct {
		spec      *corev1.PodSpec
		name      string
		image     string
		resources *corev1.ResourceRequirements
		driver    bool // pav driver flags (--pod-timeout) apply
		optional  bool // absent when the provisioner does not need it (sidecars)
	}{
		{ctrl, containerPav, s.Images.Pav, s.Resources.Controller, true, false},
		{ctrl, containerProvision, s.Images.CSIProvisioner, s.Resources.CSIProvisioner, false, false},
		{ctrl, containerResizer, s.Images.CSIResizer, s.Resources.CSIResizer, false, true},
		{ctrl, containerSnapshot, s.Images.CSISnapshotter, s.Resources.CSISnapshotter, false, true},
		{ctrl, containerSnapshotMetadata, s.Images.CSISnapshotMetadata, s.Resources.CSISnapshotMetadata, false, true},
		{node, containerPav, s.Images.Pav, s.Resources.Node, true, false},
		{node, containerRegistrar, s.Images.NodeDriverRegistrar, s.Resources.NodeDriverRegistrar, false, false},
		{ctrl, containerLiveness, s.Images.LivenessProbe, s.Resources.LivenessProbe, false, false},
		{node, containerLiveness, s.Images.LivenessProbe, s.Resources.LivenessProbe, false, false},
	} {
		ct := container(c.spec, c.name)
		if ct == nil && c.optional {
			continue
		}
		if ct == nil {
			return nil, fmt.Errorf("deploy/provisioner has no container %q: the embedded manifests and the manager disagree", c.name)
		}
		if c.image != "" {
			ct.Image = c.image
		}
		if s.ImagePullPolicy != "" {
			ct.ImagePullPolicy = s.ImagePullPolicy
		}
		if c.resources != nil {
			ct.Resources = *c.resources
		}
		if s.LogLevel != nil {
			ct.Args = setArg(ct.Args, "--v", strconv.Itoa(*s.LogLevel))
		}
		if c.driver && s.PodTimeout != nil {
			ct.Args = setArg(ct.Args, "--pod-timeout", s.PodTimeout.Duration.String())
		}
		if c.driver && s.PodReport != "" {
			ct.Args = setArg(ct.Args, "--pod-report", s.PodReport)
		}
		if g := s.NodePlugin.UnstageForgottenAfter; g != nil && c.driver && c.spec == node {
			ct.Args = setArg(ct.Args, "--unstage-forgotten-after", g.Duration.String())
		}
		if a := s.NodePlugin.StageAhead; a != nil && c.driver && c.spec == node {
			ct.Args = setArg(ct.Args, "--stage-ahead", strconv.FormatBool(*a))
		}
		// The registrar and livenessprobe make no API request (and have no such flag).
		if a := s.KubeAPI; a != nil && c.name != containerRegistrar && c.name != containerLiveness {
			ct.Args = setArg(ct.Args, "--"+kubeconfig.FlagQPS, strconv.FormatFloat(a.QPS, 'f', -1, 64))
			ct.Args = setArg(ct.Args, "--"+kubeconfig.FlagBurst, strconv.Itoa(a.Burst))
		}
	}
	if sel := s.NodePlugin.NodeSelector; sel != nil {
		node.NodeSelector = nil
		if len(sel) > 0 {
			node.NodeSelector = sel
		}
	}
	if tol := s.NodePlugin.Tolerations; tol != nil {
		node.Tolerations = nil
		if len(tol) > 0 {
			node.Tolerations = tol
		}
	}
	if err := stamp(o); err != nil {
		return nil, err
	}
	return o, nil
}

// csiDriver sets what a provisioner's CSIDriver says of its features. With
// Ephemeral (CSI inline ephemeral volumes), volumeLifecycleModes gains
// Ephemeral (the kubelet mounts a pod's csi volume of the driver only then;
// Persistent stays, so that PersistentVolumes of the driver keep working
// whatever the spec says) and podInfoOnMount is true: the kubelet then tells
// NodePublishVolume the pod (csi.storage.k8s.io/pod.*) and whether the volume
// is inline (csi.storage.k8s.io/ephemeral), which an inline volume needs.
// volumeLifecycleModes is immutable: ensure replaces a CSIDriver whose modes
// change (mustReplace).
func csiDriver(spec *storagev1.CSIDriverSpec, f phase.Features) {
	if f.Ephemeral {
		spec.VolumeLifecycleModes = []storagev1.VolumeLifecycleMode{storagev1.VolumeLifecyclePersistent, storagev1.VolumeLifecycleEphemeral}
		spec.PodInfoOnMount = ptr.To(true)
	}
}

// stamp annotates each object with the digest of its configuration
// (AnnotationApplied).
func stamp(o *Objects) error {
	objs := []metav1.Object{o.CSIDriver, o.Controller, o.Node}
	if o.SnapshotMetadata != nil {
		objs = append(objs, o.SnapshotMetadata)
	}
	for _, obj := range objs {
		if err := stampOne(obj); err != nil {
			return err
		}
	}
	return nil
}

// stampOne annotates obj with the digest of its configuration.
func stampOne(obj metav1.Object) error {
	config, err := applyConfig(obj)
	if err != nil {
		return err
	}
	d, err := digest(config)
	if err != nil {
		return err
	}
	a := obj.GetAnnotations()
	if a == nil {
		a = map[string]string{}
	}
	a[AnnotationApplied] = d
	obj.SetAnnotations(a)
	return nil
}

// applyConfig is what server-side apply sends of a rendered object: its fields
// as JSON, without its status (the API server's to write). A zero value that
// the types always marshal (a StatefulSet's empty updateStrategy) is applied
// as such, and compared as absent (covers).
func applyConfig(obj any) (map[string]any, error) {
	j, err := json.Marshal(obj)
	if err != nil {
		return nil, err
	}
	var m map[string]any
	if err := json.Unmarshal(j, &m); err != nil {
		return nil, err
	}
	delete(m, "status")
	return m, nil
}

// decode substitutes the name into one manifest and reads it strictly.
func decode[T any](manifest []byte, name string, into **T) error {
	doc := bytes.ReplaceAll(manifest, []byte(deploy.ProvisionerPlaceholder), []byte(name))
	var v T
	if err := yaml.UnmarshalStrict(doc, &v); err != nil {
		return fmt.Errorf("embedded manifest of deploy/provisioner: %w", err)
	}
	*into = &v
	return nil
}

func container(spec *corev1.PodSpec, name string) *corev1.Container {
	for i := range spec.Containers {
		if c := &spec.Containers[i]; c.Name == name {
			return c
		}
	}
	return nil
}

// setArg replaces flag's value in args (--flag=value form) or appends it.
func setArg(args []string, flag, value string) []string {
	out := make([]string, 0, len(args)+1)
	found := false
	for _, a := range args {
		if a == flag || strings.HasPrefix(a, flag+"=") {
			if !found {
				out = append(out, flag+"="+value)
				found = true
			}
			continue
		}
		out = append(out, a)
	}
	if !found {
		out = append(out, flag+"="+value)
	}
	return out
}
