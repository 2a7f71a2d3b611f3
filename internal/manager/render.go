package manager

import (
	"bytes"
	"fmt"
	"slices"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"
	appsv1ac "k8s.io/client-go/applyconfigurations/apps/v1"
	corev1ac "k8s.io/client-go/applyconfigurations/core/v1"
	metav1ac "k8s.io/client-go/applyconfigurations/meta/v1"
	storagev1ac "k8s.io/client-go/applyconfigurations/storage/v1"
	"sigs.k8s.io/yaml"

	"github.com/pods-as-volumes/pav/api/v1alpha1"
	"github.com/pods-as-volumes/pav/deploy"
	"github.com/pods-as-volumes/pav/internal/kubeconfig"
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
// applied and an owner reference to the PavProvisioner.
type Objects struct {
	CSIDriver  *storagev1ac.CSIDriverApplyConfiguration
	Controller *appsv1ac.StatefulSetApplyConfiguration
	Node       *appsv1ac.DaemonSetApplyConfiguration
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
	owner := metav1ac.OwnerReference().
		WithAPIVersion(v1alpha1.SchemeGroupVersion.String()).WithKind(v1alpha1.Kind).
		WithName(p.Name).WithUID(p.UID).
		WithController(true).WithBlockOwnerDeletion(true)
	o.CSIDriver.WithOwnerReferences(owner).WithLabels(map[string]string{labelManagedBy: FieldManager})
	o.Controller.WithNamespace(namespace).WithOwnerReferences(owner).WithLabels(map[string]string{labelManagedBy: FieldManager})
	o.Node.WithNamespace(namespace).WithOwnerReferences(owner).WithLabels(map[string]string{labelManagedBy: FieldManager})

	if o.Controller.Spec == nil || o.Node.Spec == nil {
		return nil, fmt.Errorf("the embedded workload manifests have no spec")
	}
	ctrl, err := podSpec(o.Controller.Spec.Template, "StatefulSet")
	if err != nil {
		return nil, err
	}
	node, err := podSpec(o.Node.Spec.Template, "DaemonSet")
	if err != nil {
		return nil, err
	}
	for _, name := range []string{containerResizer, containerSnapshot} {
		if container(ctrl, name) == nil {
			return nil, fmt.Errorf("deploy/provisioner has no container %q: the embedded manifests and the manager disagree", name)
		}
	}
	// The manifests carry every sidecar; a provisioner gets only those its driver
	// serves: the stock resizer and snapshotter exit when the driver lacks the
	// capability, and would crash-loop the controller pod.
	f := features(p)
	wanted := sidecars(f)
	for _, t := range []*corev1ac.PodTemplateSpecApplyConfiguration{o.Controller.Spec.Template, o.Node.Spec.Template} {
		t.WithAnnotations(map[string]string{AnnotationFeatures: featureSummary(f)})
	}
	ctrl.Containers = slices.DeleteFunc(ctrl.Containers, func(c corev1ac.ContainerApplyConfiguration) bool {
		return c.Name != nil && !wanted[*c.Name]
	})
	for _, c := range []struct {
		spec      *corev1ac.PodSpecApplyConfiguration
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
		{node, containerPav, s.Images.Pav, s.Resources.Node, true, false},
		{node, containerRegistrar, s.Images.NodeDriverRegistrar, s.Resources.NodeDriverRegistrar, false, false},
	} {
		ct := container(c.spec, c.name)
		if ct == nil && c.optional {
			continue
		}
		if ct == nil {
			return nil, fmt.Errorf("deploy/provisioner has no container %q: the embedded manifests and the manager disagree", c.name)
		}
		if c.image != "" {
			ct.WithImage(c.image)
		}
		if s.ImagePullPolicy != "" {
			ct.WithImagePullPolicy(s.ImagePullPolicy)
		}
		if c.resources != nil {
			ct.Resources = resources(*c.resources)
		}
		if s.LogLevel != nil {
			ct.Args = setArg(ct.Args, "--v", strconv.Itoa(*s.LogLevel))
		}
		if c.driver && s.PodTimeout != nil {
			ct.Args = setArg(ct.Args, "--pod-timeout", s.PodTimeout.Duration.String())
		}
		// The registrar alone makes no API request (and has no such flag).
		if a := s.KubeAPI; a != nil && c.name != containerRegistrar {
			ct.Args = setArg(ct.Args, "--"+kubeconfig.FlagQPS, strconv.FormatFloat(a.QPS, 'f', -1, 64))
			ct.Args = setArg(ct.Args, "--"+kubeconfig.FlagBurst, strconv.Itoa(a.Burst))
		}
	}
	if sel := s.NodePlugin.NodeSelector; sel != nil {
		node.NodeSelector = nil
		if len(sel) > 0 {
			node.WithNodeSelector(sel)
		}
	}
	if tol := s.NodePlugin.Tolerations; tol != nil {
		node.Tolerations = nil
		for _, t := range tol {
			ta := corev1ac.Toleration()
			if t.Key != "" {
				ta.WithKey(t.Key)
			}
			if t.Operator != "" {
				ta.WithOperator(t.Operator)
			}
			if t.Value != "" {
				ta.WithValue(t.Value)
			}
			if t.Effect != "" {
				ta.WithEffect(t.Effect)
			}
			if t.TolerationSeconds != nil {
				ta.WithTolerationSeconds(*t.TolerationSeconds)
			}
			node.WithTolerations(ta)
		}
	}
	if err := stamp(o); err != nil {
		return nil, err
	}
	return o, nil
}

// stamp annotates each object with the digest of its configuration
// (AnnotationApplied).
func stamp(o *Objects) error {
	for _, s := range []struct {
		config   any
		annotate func(map[string]string)
	}{
		{o.CSIDriver, func(a map[string]string) { o.CSIDriver.WithAnnotations(a) }},
		{o.Controller, func(a map[string]string) { o.Controller.WithAnnotations(a) }},
		{o.Node, func(a map[string]string) { o.Node.WithAnnotations(a) }},
	} {
		d, err := digest(s.config)
		if err != nil {
			return err
		}
		s.annotate(map[string]string{AnnotationApplied: d})
	}
	return nil
}

// decode substitutes the name into one manifest and reads it strictly into an
// apply configuration, which holds exactly the fields the manifest sets: that is
// what the manager owns in server-side apply, no zero values besides.
func decode[T any](manifest []byte, name string, into **T) error {
	doc := bytes.ReplaceAll(manifest, []byte(deploy.ProvisionerPlaceholder), []byte(name))
	var v T
	if err := yaml.UnmarshalStrict(doc, &v); err != nil {
		return fmt.Errorf("embedded manifest of deploy/provisioner: %w", err)
	}
	*into = &v
	return nil
}

func podSpec(t *corev1ac.PodTemplateSpecApplyConfiguration, kind string) (*corev1ac.PodSpecApplyConfiguration, error) {
	if t == nil || t.Spec == nil {
		return nil, fmt.Errorf("the embedded %s manifest has no spec.template.spec", kind)
	}
	return t.Spec, nil
}

func container(spec *corev1ac.PodSpecApplyConfiguration, name string) *corev1ac.ContainerApplyConfiguration {
	for i := range spec.Containers {
		if c := &spec.Containers[i]; c.Name != nil && *c.Name == name {
			return c
		}
	}
	return nil
}

// resources turns settings into an apply configuration; empty maps stay unset,
// so that what is applied is what the API server stores (and reads back equal).
func resources(r corev1.ResourceRequirements) *corev1ac.ResourceRequirementsApplyConfiguration {
	if len(r.Requests) == 0 && len(r.Limits) == 0 {
		return nil
	}
	ra := corev1ac.ResourceRequirements()
	if len(r.Requests) > 0 {
		ra.WithRequests(r.Requests)
	}
	if len(r.Limits) > 0 {
		ra.WithLimits(r.Limits)
	}
	return ra
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
