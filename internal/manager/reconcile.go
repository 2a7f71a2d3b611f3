package manager

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"

	"github.com/pods-as-volumes/pav/api/v1alpha1"
	"github.com/pods-as-volumes/pav/internal/kube/managerapi"
)

// reconcile brings one PavProvisioner's drivers and status to what its spec,
// the settings and the cluster ask for. An error requeues the name with backoff;
// a problem only a change can fix (a conflicting object, a name too long) is
// reported on the status and waits for that change's event.
func (c *Controller) reconcile(ctx context.Context, name string) error {
	obj, err := c.provisioners.Get(name)
	if apierrors.IsNotFound(err) {
		// Gone: its workloads go with it (owner references), if it had any.
		return nil
	}
	if err != nil {
		return err
	}
	p, err := toProvisioner(obj)
	if err != nil {
		// The API server admitted it, so the CRD and the Go types disagree:
		// nothing to do until the object changes.
		klog.ErrorS(err, "cannot read PavProvisioner", "provisioner", name)
		return nil
	}
	if p.DeletionTimestamp != nil {
		return c.finalize(ctx, p)
	}
	if !slices.Contains(p.Finalizers, v1alpha1.FinalizerVolumes) {
		if err := c.addFinalizer(ctx, p); err != nil {
			return fmt.Errorf("adding finalizer %s: %w", v1alpha1.FinalizerVolumes, err)
		}
	}
	w, prob := c.deploy(ctx, p)
	return c.writeStatus(ctx, p, w, prob, nil)
}

func toProvisioner(obj runtime.Object) (*v1alpha1.PavProvisioner, error) {
	u, ok := obj.(*unstructured.Unstructured)
	if !ok {
		return nil, fmt.Errorf("unexpected %T in the PavProvisioner cache", obj)
	}
	p := &v1alpha1.PavProvisioner{}
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, p); err != nil {
		return nil, err
	}
	// Events need the kind of the object they are about.
	p.APIVersion, p.Kind = v1alpha1.SchemeGroupVersion.String(), v1alpha1.Kind
	return p, nil
}

// problem is why a provisioner's drivers are not (all) deployed as they should
// be: condition Ready=False with this reason. transient ones are retried.
type problem struct {
	reason    string
	err       error
	transient bool
}

// Reasons of condition Ready.
const (
	reasonReady          = "Ready"
	reasonDeploying      = "Deploying"       // applied, not available yet
	reasonConflict       = "Conflict"        // an object of the same name that pav did not make
	reasonReplacing      = "Replacing"       // a leftover of an earlier PavProvisioner of this name is being deleted
	reasonApplyFailed    = "ApplyFailed"     // the API server refused an apply
	reasonCannotDeploy   = "CannotDeploy"    // Render refused (name too long)
	reasonNoNodes        = "NoNodes"         // the DaemonSet schedules no pod
	reasonDriversLeaving = "RemovingDrivers" // deletion: nothing needs them, they are being deleted
)

// workloads are a provisioner's StatefulSet and DaemonSet as the manager last
// saw them (from its apply, or from the cache when nothing needed applying), so
// that condition Ready describes what was just applied.
type workloads struct {
	controller *appsv1.StatefulSet
	node       *appsv1.DaemonSet
	// snapshotMetadata is condition SnapshotMetadata (nil without
	// spec.snapshotMetadata: the condition goes).
	snapshotMetadata *metav1.Condition
}

// deploy applies the provisioner's CSIDriver, StatefulSet and DaemonSet where
// they are not up to date (drift.go).
func (c *Controller) deploy(ctx context.Context, p *v1alpha1.PavProvisioner) (workloads, *problem) {
	var w workloads
	objs, err := Render(p, c.cfg.Namespace, c.cfg.Settings)
	if err != nil {
		return w, &problem{reason: reasonCannotDeploy, err: err}
	}
	ns := c.cfg.Namespace
	apps := c.cfg.Apps
	var changed []string
	var first *problem
	note := func(change string, prob *problem) {
		if change != "" {
			changed = append(changed, change)
		}
		if prob != nil && first == nil {
			first = prob
		}
	}
	_, change, prob := ensure(ctx, c, p, "CSIDriver", objs.CSIDriver, c.csiDrivers.Get, apps.CSIDrivers())
	note(change, prob)
	// Before the StatefulSet, whose sidecar mounts the Secret.
	w.snapshotMetadata = c.deploySnapshotMetadata(ctx, p, objs, note)
	w.controller, change, prob = ensure(ctx, c, p, "StatefulSet", objs.Controller, c.statefulSets.Get, apps.StatefulSets(ns))
	note(change, prob)
	w.node, change, prob = ensure(ctx, c, p, "DaemonSet", objs.Node, c.daemonSets.Get, apps.DaemonSets(ns))
	note(change, prob)
	if len(changed) > 0 {
		c.cfg.Recorder.Eventf(p, corev1.EventTypeNormal, "Applied", "Applied %s", strings.Join(changed, ", "))
	}
	return w, first
}

var applyOptions = metav1.ApplyOptions{FieldManager: FieldManager, Force: true}

// applyPatchOptions are applyOptions for a server-side apply sent as a patch.
var applyPatchOptions = applyOptions.ToPatchOptions()

// deleteOptions deletes exactly the object seen (UID) and, in the foreground, its
// pods first: once the object is gone, so are the drivers.
func deleteOptions(uid types.UID) metav1.DeleteOptions {
	fg := metav1.DeletePropagationForeground
	return metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &uid}, PropagationPolicy: &fg}
}

// ownership of an existing object by a PavProvisioner.
type ownership int

const (
	owned   ownership = iota // controlled by this PavProvisioner
	stale                    // controlled by an earlier PavProvisioner of the same name
	foreign                  // anything else: not pav-manager's to touch
)

func ownedBy(o metav1.Object, p *v1alpha1.PavProvisioner) ownership {
	ref := metav1.GetControllerOfNoCopy(o)
	if ref == nil || ref.Kind != v1alpha1.Kind {
		return foreign
	}
	if gv, err := schema.ParseGroupVersion(ref.APIVersion); err != nil || gv.Group != v1alpha1.GroupName {
		return foreign
	}
	if ref.UID != p.UID {
		return stale
	}
	return owned
}

// ensure makes one object what the manager wants (desired, rendered). It
// returns the object as it now is (nil when it is not the manager's, or
// absent) and what it did ("created X", "updated X" or "").
func ensure[T interface {
	metav1.Object
	runtime.Object
}, L runtime.Object](ctx context.Context, c *Controller, p *v1alpha1.PavProvisioner, kind string,
	desired metav1.Object, get func(string) (T, error), client managerapi.Applied[T, L],
) (T, string, *problem) {
	var none T
	name, namespace := desired.GetName(), desired.GetNamespace()
	what := kind + " " + name
	if namespace != "" {
		what = kind + " " + namespace + "/" + name
	}
	config, err := applyConfig(desired)
	if err != nil {
		return none, "", &problem{reason: reasonCannotDeploy, err: fmt.Errorf("%s: %w", what, err)}
	}
	del := func(ctx context.Context, uid types.UID) error { return client.Delete(ctx, name, deleteOptions(uid)) }
	live, err := get(name)
	exists := err == nil
	if err != nil && !apierrors.IsNotFound(err) {
		return none, "", &problem{reason: reasonApplyFailed, err: err, transient: true}
	}
	if exists {
		if live.GetDeletionTimestamp() != nil {
			// Its deletion event brings the manager back to create it anew.
			return none, "", &problem{reason: reasonReplacing, err: fmt.Errorf("waiting for the deletion of %s to finish", what)}
		}
		switch ownedBy(live, p) {
		case foreign:
			return none, "", &problem{reason: reasonConflict, err: fmt.Errorf(
				"%s exists and was not made by pav-manager for this PavProvisioner (deployed with the deploy/provisioner component, or another driver of that name?): the manager leaves it alone; delete it to let the manager deploy this provisioner", what)}
		case stale:
			if err := del(ctx, live.GetUID()); err != nil && !apierrors.IsNotFound(err) && !apierrors.IsConflict(err) {
				return none, "", &problem{reason: reasonApplyFailed, err: fmt.Errorf("deleting %s, left by an earlier PavProvisioner of this name: %w", what, err), transient: true}
			}
			c.cfg.Recorder.Eventf(p, corev1.EventTypeNormal, "Replacing", "Deleting %s, left by an earlier PavProvisioner of this name", what)
			return none, "", &problem{reason: reasonReplacing, err: fmt.Errorf("waiting for the deletion of %s, left by an earlier PavProvisioner of this name", what)}
		}
		if why := mustReplace(desired, live); why != "" {
			// An update would be refused: delete it, and create it anew
			// once it is gone (its deletion event brings the manager back).
			if err := del(ctx, live.GetUID()); err != nil && !apierrors.IsNotFound(err) && !apierrors.IsConflict(err) {
				return none, "", &problem{reason: reasonApplyFailed, err: fmt.Errorf("deleting %s to replace it (%s): %w", what, why, err), transient: true}
			}
			c.cfg.Recorder.Eventf(p, corev1.EventTypeNormal, "Replacing", "Deleting %s to create it anew: %s", what, why)
			return none, "", &problem{reason: reasonReplacing, err: fmt.Errorf("waiting for the deletion of %s, replaced because %s", what, why)}
		}
		current, err := upToDate(config, live)
		if err != nil {
			return none, "", &problem{reason: reasonApplyFailed, err: fmt.Errorf("comparing %s with what pav-manager applies: %w", what, err), transient: true}
		}
		if current {
			return live, "", nil
		}
	}
	data, err := json.Marshal(config)
	if err != nil {
		return none, "", &problem{reason: reasonCannotDeploy, err: fmt.Errorf("%s: %w", what, err)}
	}
	applied, err := client.Patch(ctx, name, types.ApplyPatchType, data, applyPatchOptions)
	if err != nil {
		return none, "", &problem{reason: reasonApplyFailed, err: fmt.Errorf("applying %s: %w", what, err), transient: true}
	}
	klog.V(2).InfoS("applied", "object", what, "provisioner", p.Name, "created", !exists)
	if exists {
		return applied, "updated " + what, nil
	}
	return applied, "created " + what, nil
}

// mustReplace says why live cannot be updated to desired (a field the API
// server keeps immutable changes), or "". A CSIDriver's volumeLifecycleModes
// (and attachRequired) are immutable (ValidateCSIDriverUpdate): adding or
// removing Ephemeral takes a new CSIDriver. Meanwhile, for the seconds the
// API server takes to delete and create it, the kubelet finds no CSIDriver
// for the driver and mounts nothing of it; pods waiting for a volume then
// retry.
func mustReplace(desired, live any) string {
	d, ok := desired.(*storagev1.CSIDriver)
	l, ok2 := live.(*storagev1.CSIDriver)
	if !ok || !ok2 {
		return ""
	}
	if !slices.Equal(d.Spec.VolumeLifecycleModes, l.Spec.VolumeLifecycleModes) {
		return fmt.Sprintf("its volumeLifecycleModes, which cannot be updated, change from %v to %v", l.Spec.VolumeLifecycleModes, d.Spec.VolumeLifecycleModes)
	}
	if d.Spec.AttachRequired != nil && l.Spec.AttachRequired != nil && *d.Spec.AttachRequired != *l.Spec.AttachRequired {
		return fmt.Sprintf("its attachRequired, which cannot be updated, changes to %v", *d.Spec.AttachRequired)
	}
	return ""
}

// addFinalizer adds the deletion guard's finalizer by server-side apply. The UID
// makes it an update of exactly this object: never a create, never another
// object of the same name.
func (c *Controller) addFinalizer(ctx context.Context, p *v1alpha1.PavProvisioner) error {
	u := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": v1alpha1.SchemeGroupVersion.String(),
		"kind":       v1alpha1.Kind,
		"metadata": map[string]any{
			"name":       p.Name,
			"uid":        string(p.UID),
			"finalizers": []any{v1alpha1.FinalizerVolumes},
		},
	}}
	_, err := c.cfg.Dynamic.Resource(v1alpha1.GroupVersionResource).Apply(ctx, p.Name, u, applyOptions)
	return err
}

// removeFinalizer removes exactly the finalizer seen, from exactly this object.
func (c *Controller) removeFinalizer(ctx context.Context, p *v1alpha1.PavProvisioner) error {
	i := slices.Index(p.Finalizers, v1alpha1.FinalizerVolumes)
	if i < 0 {
		return nil
	}
	patch, err := json.Marshal([]map[string]any{
		{"op": "test", "path": "/metadata/uid", "value": string(p.UID)},
		{"op": "test", "path": fmt.Sprintf("/metadata/finalizers/%d", i), "value": v1alpha1.FinalizerVolumes},
		{"op": "remove", "path": fmt.Sprintf("/metadata/finalizers/%d", i)},
	})
	if err != nil {
		return err
	}
	_, err = c.cfg.Dynamic.Resource(v1alpha1.GroupVersionResource).Patch(ctx, p.Name, types.JSONPatchType, patch,
		metav1.PatchOptions{FieldManager: FieldManager})
	if apierrors.IsNotFound(err) {
		return nil
	}
	return err
}

// finalize is reconcile for a PavProvisioner being deleted: while anything
// needs its drivers they stay (deployed as usual; the drivers themselves refuse
// new volumes and staging); then the manager deletes them, waits until they are
// gone, and removes its finalizer.
func (c *Controller) finalize(ctx context.Context, p *v1alpha1.PavProvisioner) error {
	if !slices.Contains(p.Finalizers, v1alpha1.FinalizerVolumes) {
		return nil
	}
	blockers, err := c.blockers(p.Name)
	if err != nil {
		return err
	}
	if len(blockers) > 0 {
		term := metav1.Condition{Type: v1alpha1.ConditionTerminating, Status: metav1.ConditionTrue, Reason: "WaitingForVolumes",
			Message: fmt.Sprintf("deletion waits for %d: %s; new provisioning and staging are refused, deletion and unstaging go on",
				len(blockers), summarize(blockers, 5))}
		w, prob := c.deploy(ctx, p)
		return c.writeStatus(ctx, p, w, prob, &term)
	}
	remaining, err := c.removeDrivers(ctx, p)
	if err != nil {
		return err
	}
	if len(remaining) > 0 {
		term := metav1.Condition{Type: v1alpha1.ConditionTerminating, Status: metav1.ConditionTrue, Reason: reasonDriversLeaving,
			Message: "nothing needs the drivers any more; waiting until " + strings.Join(remaining, ", ") + " are deleted"}
		return c.writeStatus(ctx, p, workloads{}, &problem{reason: reasonDriversLeaving, err: errors.New("the drivers are being removed")}, &term)
	}
	if err := c.removeFinalizer(ctx, p); err != nil {
		return fmt.Errorf("removing finalizer %s: %w", v1alpha1.FinalizerVolumes, err)
	}
	c.cfg.Recorder.Event(p, corev1.EventTypeNormal, "Deleted", "No volume needs the drivers: removed the CSIDriver, StatefulSet and DaemonSet (and any snapshot metadata service), and the finalizer")
	return nil
}

// removeDrivers deletes the provisioner's CSIDriver and workloads (those it
// controls) and lists those that still exist.
func (c *Controller) removeDrivers(ctx context.Context, p *v1alpha1.PavProvisioner) ([]string, error) {
	ns := c.cfg.Namespace
	type item struct {
		what string
		obj  metav1.Object
		del  func(context.Context, types.UID) error
	}
	var items []item
	if o, err := c.csiDrivers.Get(p.Name); err == nil {
		items = append(items, item{"CSIDriver " + p.Name, o, func(ctx context.Context, uid types.UID) error {
			return c.cfg.Apps.CSIDrivers().Delete(ctx, p.Name, deleteOptions(uid))
		}})
	} else if !apierrors.IsNotFound(err) {
		return nil, err
	}
	if o, err := c.statefulSets.Get(ControllerName(p.Name)); err == nil {
		items = append(items, item{"StatefulSet " + ns + "/" + o.Name, o, func(ctx context.Context, uid types.UID) error {
			return c.cfg.Apps.StatefulSets(ns).Delete(ctx, o.Name, deleteOptions(uid))
		}})
	} else if !apierrors.IsNotFound(err) {
		return nil, err
	}
	if o, err := c.daemonSets.Get(NodeName(p.Name)); err == nil {
		items = append(items, item{"DaemonSet " + ns + "/" + o.Name, o, func(ctx context.Context, uid types.UID) error {
			return c.cfg.Apps.DaemonSets(ns).Delete(ctx, o.Name, deleteOptions(uid))
		}})
	} else if !apierrors.IsNotFound(err) {
		return nil, err
	}
	// The snapshot metadata sidecar's objects first: backup applications
	// stop finding it before it goes.
	_, remaining, err := c.removeSnapshotMetadata(ctx, p)
	if err != nil {
		return nil, err
	}
	for _, it := range items {
		if ownedBy(it.obj, p) != owned {
			continue // not this PavProvisioner's to delete
		}
		remaining = append(remaining, it.what)
		if it.obj.GetDeletionTimestamp() != nil {
			continue
		}
		if err := it.del(ctx, it.obj.GetUID()); err != nil && !apierrors.IsNotFound(err) && !apierrors.IsConflict(err) {
			return nil, fmt.Errorf("deleting %s: %w", it.what, err)
		}
		klog.V(2).InfoS("deleting", "object", it.what, "provisioner", p.Name)
	}
	return remaining, nil
}
