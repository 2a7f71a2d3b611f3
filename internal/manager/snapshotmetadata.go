package manager

// Changed block tracking (spec.snapshotMetadata): backup applications call
// the stock external-snapshot-metadata sidecar, which authenticates them
// (TokenReview with the service's audience), authorizes them (get
// volumesnapshots in the request's namespace), turns VolumeSnapshot names into
// snapshot handles and calls the driver's SnapshotMetadata service over the
// CSI socket. For such a provisioner the manager adds to what it deploys:
//
//   - the csi-snapshot-metadata container in the controller StatefulSet
//     (gRPC on snapshotMetadataPort, health and metrics on
//     snapshotMetadataHTTPPort: the driver has 8080);
//   - a Secret pav-<name>-snapshot-metadata-tls in pav's namespace with a CA
//     and the sidecar's serving certificate (tls.go), of which the sidecar
//     mounts only tls.crt and tls.key;
//   - a Service pav-<name>-snapshot-metadata to the sidecar's port;
//   - the cluster-scoped SnapshotMetadataService named after the driver
//     (cbt.storage.k8s.io/v1beta1), which tells backup applications the
//     Service's address, the CA and the audience.
//
// All are owned by the PavProvisioner (they go with it) and removed when the
// spec drops snapshotMetadata. A cluster without the SnapshotMetadataService
// CRD gets everything else, and condition SnapshotMetadata False (reason
// CRDMissing) until it is installed: the manager looks again every minute.

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"strconv"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/klog/v2"
	"k8s.io/utils/ptr"

	"github.com/pods-as-volumes/pav/api/v1alpha1"
)

const (
	containerSnapshotMetadata = "csi-snapshot-metadata"
	// DefaultSnapshotMetadataImage is the sidecar's image when the settings
	// name none (images.csiSnapshotMetadata).
	DefaultSnapshotMetadataImage = "registry.k8s.io/sig-storage/csi-snapshot-metadata:v1.1.0"
	snapshotMetadataPort         = 50051
	snapshotMetadataServicePort  = 6443
	snapshotMetadataHTTPPort     = 8085
	snapshotMetadataTLSVolume    = "snapshot-metadata-tls"
	snapshotMetadataTLSDir       = "/etc/csi-snapshot-metadata/tls"
	labelComponent               = "app.kubernetes.io/component"
	componentSnapshotMetadata    = "snapshot-metadata"
	// snapshotMetadataRecheck is how often a provisioner whose
	// SnapshotMetadataService could not be applied (no CRD, an API error)
	// is looked at again.
	snapshotMetadataRecheck = time.Minute
	// maxRenewWait bounds the wait for a certificate's renewal, so that a
	// manager's clock change is noticed within a day.
	maxRenewWait = 24 * time.Hour
)

// Reasons of condition SnapshotMetadata.
const (
	reasonServing    = "Serving"
	reasonCRDMissing = "CRDMissing"
)

// SnapshotMetadataServiceGVR is the SnapshotMetadataService resource
// (external-snapshot-metadata's client/config/crd).
var SnapshotMetadataServiceGVR = schema.GroupVersionResource{Group: "cbt.storage.k8s.io", Version: "v1beta1", Resource: "snapshotmetadataservices"}

// SnapshotMetadataServiceName is the name of a provisioner's sidecar Service
// (in pav's namespace).
func SnapshotMetadataServiceName(provisioner string) string {
	return "pav-" + provisioner + "-snapshot-metadata"
}

// SnapshotMetadataSecretName is the name of its TLS Secret.
func SnapshotMetadataSecretName(provisioner string) string {
	return SnapshotMetadataServiceName(provisioner) + "-tls"
}

// SnapshotMetadataAudience is the audience of the tokens a backup
// application sends to a provisioner's sidecar: one per driver, so that a
// token for one is refused by the others.
func SnapshotMetadataAudience(provisioner string) string {
	return v1alpha1.GroupName + "/snapshot-metadata/" + provisioner
}

// SnapshotMetadataAddress is where backup applications reach the sidecar: the
// Service's name in its namespace, which resolves in every cluster's DNS
// (through the pods' search domains) whatever the cluster domain is.
func SnapshotMetadataAddress(provisioner, namespace string) string {
	return SnapshotMetadataServiceName(provisioner) + "." + namespace + ":" + strconv.Itoa(snapshotMetadataServicePort)
}

// snapshotMetadataDNSNames are the names the serving certificate is for.
func snapshotMetadataDNSNames(provisioner, namespace string) []string {
	svc := SnapshotMetadataServiceName(provisioner)
	return []string{svc, svc + "." + namespace, svc + "." + namespace + ".svc", svc + "." + namespace + ".svc.cluster.local"}
}

func snapshotMetadataLabels(provisioner string) map[string]string {
	return map[string]string{"app.kubernetes.io/name": "pav", labelComponent: componentSnapshotMetadata,
		labelInstance: provisioner, labelManagedBy: FieldManager}
}

// addSnapshotMetadataSidecar adds the sidecar and its TLS volume to the
// controller pod.
func addSnapshotMetadataSidecar(spec *corev1.PodSpec, provisioner string) {
	no := false
	spec.Containers = append(spec.Containers, corev1.Container{
		Name:  containerSnapshotMetadata,
		Image: DefaultSnapshotMetadataImage,
		Args: []string{
			"--csi-address=/csi/csi.sock",
			"--tls-cert=" + snapshotMetadataTLSDir + "/" + keyCert,
			"--tls-key=" + snapshotMetadataTLSDir + "/" + keyKey,
			"--port=" + strconv.Itoa(snapshotMetadataPort),
			"--http-endpoint=:" + strconv.Itoa(snapshotMetadataHTTPPort),
			// The audience the SnapshotMetadataService says. v1.1.0
			// still gets that object by name on every request to
			// authenticate the caller (its ClusterRole allows that get).
			"--audience=" + SnapshotMetadataAudience(provisioner),
			"--kube-api-qps=50",
			"--kube-api-burst=100",
			"--v=2",
		},
		Ports: []corev1.ContainerPort{
			{Name: "snapshot-meta", ContainerPort: snapshotMetadataPort},
			{Name: "snapmeta-http", ContainerPort: snapshotMetadataHTTPPort},
		},
		// Ready once it has checked the driver's SNAPSHOT_METADATA_SERVICE:
		// the Service sends nothing before.
		ReadinessProbe: &corev1.Probe{
			ProbeHandler:  corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{Path: "/health", Port: intstr.FromString("snapmeta-http")}},
			PeriodSeconds: 5, TimeoutSeconds: 5,
		},
		Resources: corev1.ResourceRequirements{Requests: corev1.ResourceList{
			corev1.ResourceCPU: resource.MustParse("10m"), corev1.ResourceMemory: resource.MustParse("32Mi")}},
		SecurityContext: &corev1.SecurityContext{
			AllowPrivilegeEscalation: &no,
			ReadOnlyRootFilesystem:   ptr.To(true),
			Capabilities:             &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}},
		},
		VolumeMounts: []corev1.VolumeMount{
			{Name: "socket-dir", MountPath: "/csi"},
			{Name: snapshotMetadataTLSVolume, MountPath: snapshotMetadataTLSDir, ReadOnly: true},
		},
	})
	spec.Volumes = append(spec.Volumes, corev1.Volume{Name: snapshotMetadataTLSVolume, VolumeSource: corev1.VolumeSource{
		Secret: &corev1.SecretVolumeSource{
			SecretName: SnapshotMetadataSecretName(provisioner),
			// Not the CA's key.
			Items: []corev1.KeyToPath{{Key: keyCert, Path: keyCert}, {Key: keyKey, Path: keyKey}},
		}}})
}

// renderSnapshotMetadataService is the sidecar's Service.
func renderSnapshotMetadataService(provisioner, namespace string, owner metav1.OwnerReference) *corev1.Service {
	return &corev1.Service{
		TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "Service"},
		ObjectMeta: metav1.ObjectMeta{Name: SnapshotMetadataServiceName(provisioner), Namespace: namespace,
			Labels: snapshotMetadataLabels(provisioner), OwnerReferences: []metav1.OwnerReference{owner}},
		Spec: corev1.ServiceSpec{
			Selector: map[string]string{"app.kubernetes.io/name": "pav", labelComponent: "controller", labelInstance: provisioner},
			Ports: []corev1.ServicePort{{Name: "snapshot-metadata", Protocol: corev1.ProtocolTCP, Port: snapshotMetadataServicePort,
				TargetPort: intstr.FromString("snapshot-meta")}},
		},
	}
}

// renderSnapshotMetadataSecret is the TLS Secret holding data.
func renderSnapshotMetadataSecret(provisioner, namespace string, owner metav1.OwnerReference, data map[string][]byte) (*corev1.Secret, error) {
	s := &corev1.Secret{
		TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "Secret"},
		ObjectMeta: metav1.ObjectMeta{Name: SnapshotMetadataSecretName(provisioner), Namespace: namespace,
			Labels: snapshotMetadataLabels(provisioner), OwnerReferences: []metav1.OwnerReference{owner}},
		Type: corev1.SecretTypeTLS,
		Data: data,
	}
	return s, stampOne(s)
}

// ownerOf is the owner reference of p's objects.
func ownerOf(p *v1alpha1.PavProvisioner) metav1.OwnerReference {
	return metav1.OwnerReference{APIVersion: v1alpha1.SchemeGroupVersion.String(), Kind: v1alpha1.Kind,
		Name: p.Name, UID: p.UID, Controller: ptr.To(true), BlockOwnerDeletion: ptr.To(true)}
}

// deploySnapshotMetadata applies (or, without spec.snapshotMetadata, removes)
// the Secret, Service and SnapshotMetadataService of p, and returns condition
// SnapshotMetadata (nil without the feature). note is deploy's.
func (c *Controller) deploySnapshotMetadata(ctx context.Context, p *v1alpha1.PavProvisioner, objs *Objects, note func(string, *problem)) *metav1.Condition {
	ns := c.cfg.Namespace
	if objs.SnapshotMetadata == nil {
		removed, _, err := c.removeSnapshotMetadata(ctx, p)
		for _, what := range removed {
			note("deleted "+what, nil)
		}
		if err != nil {
			note("", &problem{reason: reasonApplyFailed, err: err, transient: true})
		}
		return nil
	}
	cond := &metav1.Condition{Type: v1alpha1.ConditionSnapshotMetadata, Status: metav1.ConditionFalse}
	var existing map[string][]byte
	live, err := c.secrets.Get(SnapshotMetadataSecretName(p.Name))
	if apierrors.IsNotFound(err) {
		// Just made, and not cached yet? A new CA would replace the one
		// clients hold: ask the API server.
		live, err = c.cfg.Apps.Secrets(ns).Get(ctx, SnapshotMetadataSecretName(p.Name), metav1.GetOptions{})
	}
	switch {
	case err == nil && ownedBy(live, p) == owned:
		existing = live.Data
	case err != nil && !apierrors.IsNotFound(err):
		note("", &problem{reason: reasonApplyFailed, err: fmt.Errorf("reading Secret %s/%s: %w", ns, SnapshotMetadataSecretName(p.Name), err), transient: true})
		cond.Reason, cond.Message = reasonApplyFailed, err.Error()
		return cond
	}
	data, renewAt, err := certificates(existing, SnapshotMetadataServiceName(p.Name)+"."+ns, snapshotMetadataDNSNames(p.Name, ns), time.Now())
	if err != nil {
		note("", &problem{reason: reasonCannotDeploy, err: err})
		cond.Reason, cond.Message = reasonCannotDeploy, err.Error()
		return cond
	}
	secret, err := renderSnapshotMetadataSecret(p.Name, ns, ownerOf(p), data)
	if err != nil {
		note("", &problem{reason: reasonCannotDeploy, err: err})
		cond.Reason, cond.Message = reasonCannotDeploy, err.Error()
		return cond
	}
	c.queue.AddAfter(p.Name, min(time.Until(renewAt), maxRenewWait))
	_, change, prob := ensure(ctx, c, p, "Secret", secret, c.secrets.Get, c.cfg.Apps.Secrets(ns))
	note(change, prob)
	if prob != nil {
		cond.Reason, cond.Message = prob.reason, prob.err.Error()
		return cond
	}
	_, change, prob = ensure(ctx, c, p, "Service", objs.SnapshotMetadata, c.services.Get, c.cfg.Apps.Services(ns))
	note(change, prob)
	if prob != nil {
		cond.Reason, cond.Message = prob.reason, prob.err.Error()
		return cond
	}
	change, reason, err := c.ensureSnapshotMetadataService(ctx, p, data[keyCACert])
	note(change, nil)
	if err != nil {
		c.queue.AddAfter(p.Name, snapshotMetadataRecheck)
		cond.Reason, cond.Message = reason, err.Error()
		return cond
	}
	cond.Status, cond.Reason = metav1.ConditionTrue, reasonServing
	cond.Message = fmt.Sprintf("backup applications find the csi-snapshot-metadata sidecar through SnapshotMetadataService %s: address %s, audience %s; its certificate is renewed by %s",
		p.Name, SnapshotMetadataAddress(p.Name, ns), SnapshotMetadataAudience(p.Name), renewAt.UTC().Format(time.RFC3339))
	return cond
}

// crdMissing: err is the API server's 404 for a resource it does not serve
// (the CRD is not installed), not for an object of it.
func crdMissing(err error) bool {
	var st apierrors.APIStatus
	if !apierrors.IsNotFound(err) || !errors.As(err, &st) {
		return false
	}
	d := st.Status().Details
	return d == nil || d.Name == ""
}

// crdMissingError says what to install.
func crdMissingError(provisioner string) error {
	return fmt.Errorf("the SnapshotMetadataService CRD (snapshotmetadataservices.cbt.storage.k8s.io, from external-snapshot-metadata's client/config/crd) is not installed, so backup applications cannot find the csi-snapshot-metadata sidecar of %s: install it (docs/install.md); the sidecar serves meanwhile, and the manager looks again every minute", provisioner)
}

// ensureSnapshotMetadataService applies the SnapshotMetadataService named
// after the driver where it is missing or differs. It returns what it did,
// and the reason of condition SnapshotMetadata with an error when it could
// not.
func (c *Controller) ensureSnapshotMetadataService(ctx context.Context, p *v1alpha1.PavProvisioner, caPEM []byte) (string, string, error) {
	res := c.cfg.Dynamic.Resource(SnapshotMetadataServiceGVR)
	what := "SnapshotMetadataService " + p.Name
	owner := ownerOf(p)
	spec := map[string]any{
		"address":  SnapshotMetadataAddress(p.Name, c.cfg.Namespace),
		"caCert":   base64.StdEncoding.EncodeToString(caPEM),
		"audience": SnapshotMetadataAudience(p.Name),
	}
	labels := map[string]any{}
	for k, v := range snapshotMetadataLabels(p.Name) {
		labels[k] = v
	}
	desired := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": SnapshotMetadataServiceGVR.GroupVersion().String(),
		"kind":       "SnapshotMetadataService",
		"metadata": map[string]any{"name": p.Name, "labels": labels, "ownerReferences": []any{map[string]any{
			"apiVersion": owner.APIVersion, "kind": owner.Kind, "name": owner.Name, "uid": string(owner.UID),
			"controller": true, "blockOwnerDeletion": true}}},
		"spec": spec,
	}}
	live, err := res.Get(ctx, p.Name, metav1.GetOptions{})
	existed := err == nil
	switch {
	case crdMissing(err):
		return "", reasonCRDMissing, crdMissingError(p.Name)
	case apierrors.IsNotFound(err):
	case err != nil:
		return "", reasonApplyFailed, fmt.Errorf("reading %s: %w", what, err)
	default:
		switch ownedBy(live, p) {
		case foreign:
			return "", reasonConflict, fmt.Errorf("%s exists and was not made by pav-manager for this PavProvisioner: backup applications would find another service there; delete it to let the manager make its own", what)
		case stale:
			uid := live.GetUID()
			if err := res.Delete(ctx, p.Name, metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &uid}}); err != nil && !apierrors.IsNotFound(err) && !apierrors.IsConflict(err) {
				return "", reasonApplyFailed, fmt.Errorf("deleting %s, left by an earlier PavProvisioner of this name: %w", what, err)
			}
			return "deleted stale " + what, reasonReplacing, fmt.Errorf("replacing %s, left by an earlier PavProvisioner of this name", what)
		}
		if have, err := upToDate(desired.Object, live.Object); err == nil && have {
			return "", "", nil
		}
	}
	if _, err := res.Apply(ctx, p.Name, desired, applyOptions); err != nil {
		if crdMissing(err) {
			return "", reasonCRDMissing, crdMissingError(p.Name)
		}
		return "", reasonApplyFailed, fmt.Errorf("applying %s: %w", what, err)
	}
	klog.V(2).InfoS("applied", "object", what, "provisioner", p.Name, "created", !existed)
	if !existed {
		return "created " + what, "", nil
	}
	return "updated " + what, "", nil
}

// removeSnapshotMetadata deletes p's SnapshotMetadataService first (backup
// applications stop finding the sidecar), then its Service and Secret, those
// that p owns. It returns what it deleted now and what is still there.
func (c *Controller) removeSnapshotMetadata(ctx context.Context, p *v1alpha1.PavProvisioner) (deleted, remaining []string, err error) {
	ns := c.cfg.Namespace
	svc, svcErr := c.services.Get(SnapshotMetadataServiceName(p.Name))
	sec, secErr := c.secrets.Get(SnapshotMetadataSecretName(p.Name))
	haveSvc := svcErr == nil && ownedBy(svc, p) == owned
	haveSec := secErr == nil && ownedBy(sec, p) == owned
	if !haveSvc && !haveSec {
		// The Secret comes first and goes last: without it, nothing of the
		// feature is left (no SnapshotMetadataService to look for).
		return nil, nil, nil
	}
	res := c.cfg.Dynamic.Resource(SnapshotMetadataServiceGVR)
	what := "SnapshotMetadataService " + p.Name
	live, err := res.Get(ctx, p.Name, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err): // gone, or no CRD
	case err != nil:
		return nil, []string{what}, fmt.Errorf("reading %s: %w", what, err)
	case ownedBy(live, p) == owned:
		remaining = append(remaining, what)
		if live.GetDeletionTimestamp() == nil {
			uid := live.GetUID()
			if err := res.Delete(ctx, p.Name, metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &uid}}); err != nil && !apierrors.IsNotFound(err) && !apierrors.IsConflict(err) {
				return nil, remaining, fmt.Errorf("deleting %s: %w", what, err)
			}
			deleted = append(deleted, what)
		}
	}
	type item struct {
		what string
		obj  metav1.Object
		del  func(context.Context, string, metav1.DeleteOptions) error
	}
	var items []item
	if haveSvc {
		items = append(items, item{"Service " + ns + "/" + svc.Name, svc, c.cfg.Apps.Services(ns).Delete})
	}
	if haveSec {
		items = append(items, item{"Secret " + ns + "/" + sec.Name, sec, c.cfg.Apps.Secrets(ns).Delete})
	}
	for _, it := range items {
		remaining = append(remaining, it.what)
		if it.obj.GetDeletionTimestamp() != nil {
			continue
		}
		if err := it.del(ctx, it.obj.GetName(), deleteOptions(it.obj.GetUID())); err != nil && !apierrors.IsNotFound(err) && !apierrors.IsConflict(err) {
			return deleted, remaining, fmt.Errorf("deleting %s: %w", it.what, err)
		}
		deleted = append(deleted, it.what)
	}
	return deleted, remaining, nil
}
