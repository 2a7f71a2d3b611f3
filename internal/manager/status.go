package manager

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"strings"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/pods-as-volumes/pav/api/v1alpha1"
	"github.com/pods-as-volumes/pav/internal/phase"
)

// writeStatus computes the provisioner's status from its spec, the outcome of
// deploy (w, prob) and the deletion state (term: nil when not being deleted), and
// applies it if it differs from what the object holds. It returns prob's error
// when prob is transient, so that the name is retried.
func (c *Controller) writeStatus(ctx context.Context, p *v1alpha1.PavProvisioner, w workloads, prob *problem, term *metav1.Condition) error {
	old := p.Status
	st := v1alpha1.PavProvisionerStatus{
		ObservedGeneration:  p.Generation,
		Conditions:          append([]metav1.Condition(nil), old.Conditions...),
		LastValidGeneration: old.LastValidGeneration,
		LastValidSpec:       old.LastValidSpec,
	}
	valid := metav1.Condition{Type: v1alpha1.ConditionValid, Status: metav1.ConditionTrue, Reason: "Valid",
		Message: "the literal values and the template syntax of the spec are valid"}
	if err := phase.Check(p); err != nil {
		valid.Status, valid.Reason, valid.Message = metav1.ConditionFalse, "Invalid", err.Error()
	} else {
		// The copy the drivers fall back to when a later edit is invalid.
		spec := p.Spec
		st.LastValidSpec, st.LastValidGeneration = &spec, p.Generation
	}
	if term == nil {
		term = &metav1.Condition{Type: v1alpha1.ConditionTerminating, Status: metav1.ConditionFalse, Reason: "NotDeleting",
			Message: "the PavProvisioner is not being deleted"}
	}
	for _, cond := range []metav1.Condition{valid, ready(w, prob), *term} {
		cond.ObservedGeneration = p.Generation
		meta.SetStatusCondition(&st.Conditions, cond)
	}
	if sm := w.snapshotMetadata; sm != nil {
		cond := *sm
		cond.ObservedGeneration = p.Generation
		meta.SetStatusCondition(&st.Conditions, cond)
	} else {
		meta.RemoveStatusCondition(&st.Conditions, v1alpha1.ConditionSnapshotMetadata)
	}
	volumes, err := c.pvs.ByIndex(indexByDriver, p.Name)
	if err != nil {
		return err
	}
	n := int32(len(volumes))
	st.Volumes = &n

	c.conditionEvents(p, old.Conditions, st.Conditions)
	if same, err := sameJSON(st, old); err != nil || !same {
		if err := c.applyStatus(ctx, p.Name, st); err != nil {
			return fmt.Errorf("writing status: %w", err)
		}
	}
	if prob != nil && prob.transient {
		return prob.err
	}
	return nil
}

func (c *Controller) applyStatus(ctx context.Context, name string, st v1alpha1.PavProvisionerStatus) error {
	raw, err := json.Marshal(st)
	if err != nil {
		return err
	}
	var m map[string]any
	if err := json.Unmarshal(raw, &m); err != nil {
		return err
	}
	u := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": v1alpha1.SchemeGroupVersion.String(),
		"kind":       v1alpha1.Kind,
		"metadata":   map[string]any{"name": name},
		"status":     m,
	}}
	_, err = c.cfg.Dynamic.Resource(v1alpha1.GroupVersionResource).ApplyStatus(ctx, name, u, applyOptions)
	if apierrors.IsNotFound(err) {
		return nil // deleted meanwhile
	}
	return err
}

// ready is condition Ready: the controller StatefulSet has an available,
// up-to-date replica and every node the DaemonSet schedules on runs an
// available, up-to-date node plugin.
func ready(w workloads, prob *problem) metav1.Condition {
	cond := metav1.Condition{Type: v1alpha1.ConditionReady, Status: metav1.ConditionFalse}
	if prob != nil {
		cond.Reason, cond.Message = prob.reason, prob.err.Error()
		return cond
	}
	sts, ds := w.controller, w.node
	if sts == nil || ds == nil {
		cond.Reason, cond.Message = reasonDeploying, "the controller StatefulSet and the node DaemonSet are being created"
		return cond
	}
	var waits []string
	// An observedGeneration of 0: the workload controller has not reported yet.
	if s := sts.Status; s.ObservedGeneration == 0 || s.ObservedGeneration < sts.Generation || s.AvailableReplicas < 1 || s.UpdatedReplicas < 1 {
		waits = append(waits, fmt.Sprintf("the controller plugin (StatefulSet %s/%s: %d available, %d up to date)",
			sts.Namespace, sts.Name, s.AvailableReplicas, s.UpdatedReplicas))
	}
	d := ds.Status
	switch {
	case d.ObservedGeneration == 0 || d.ObservedGeneration < ds.Generation:
		waits = append(waits, fmt.Sprintf("the node plugins (DaemonSet %s/%s: update not yet seen by its controller)", ds.Namespace, ds.Name))
	case d.DesiredNumberScheduled == 0:
		cond.Reason = reasonNoNodes
		cond.Message = fmt.Sprintf("no node runs the node plugin (DaemonSet %s/%s schedules no pod): check nodePlugin.nodeSelector and tolerations in the manager's settings (ConfigMap pav-manager)", ds.Namespace, ds.Name)
		return cond
	case d.NumberAvailable < d.DesiredNumberScheduled || d.UpdatedNumberScheduled < d.DesiredNumberScheduled:
		waits = append(waits, fmt.Sprintf("the node plugins (DaemonSet %s/%s: %d of %d available, %d up to date)",
			ds.Namespace, ds.Name, d.NumberAvailable, d.DesiredNumberScheduled, d.UpdatedNumberScheduled))
	}
	if len(waits) > 0 {
		cond.Reason, cond.Message = reasonDeploying, "waiting for "+strings.Join(waits, " and ")
		return cond
	}
	cond.Status, cond.Reason = metav1.ConditionTrue, reasonReady
	cond.Message = fmt.Sprintf("the controller plugin is ready and the node plugin is available on %d node(s)", d.DesiredNumberScheduled)
	return cond
}

// conditionEvents records an event for each condition change a user should
// hear about (not for every step of a rollout).
func (c *Controller) conditionEvents(p *v1alpha1.PavProvisioner, before, after []metav1.Condition) {
	for _, t := range []string{v1alpha1.ConditionValid, v1alpha1.ConditionReady, v1alpha1.ConditionTerminating, v1alpha1.ConditionSnapshotMetadata} {
		o, n := meta.FindStatusCondition(before, t), meta.FindStatusCondition(after, t)
		if n == nil || o != nil && o.Status == n.Status && o.Reason == n.Reason && (t != v1alpha1.ConditionTerminating || o.Message == n.Message) {
			continue
		}
		switch {
		case t == v1alpha1.ConditionValid && n.Status == metav1.ConditionFalse:
			msg := n.Message + ": new volumes and staging are refused until it is fixed"
			if p.Status.LastValidSpec != nil {
				msg += fmt.Sprintf("; existing volumes are deleted and unstaged with generation %d", p.Status.LastValidGeneration)
			}
			c.cfg.Recorder.Event(p, corev1.EventTypeWarning, "InvalidSpec", msg)
		case t == v1alpha1.ConditionValid && o != nil:
			c.cfg.Recorder.Event(p, corev1.EventTypeNormal, "ValidSpec", n.Message)
		case t == v1alpha1.ConditionReady && n.Status == metav1.ConditionTrue:
			c.cfg.Recorder.Event(p, corev1.EventTypeNormal, "Ready", n.Message)
		case t == v1alpha1.ConditionReady && (n.Reason == reasonConflict || n.Reason == reasonApplyFailed || n.Reason == reasonCannotDeploy || n.Reason == reasonNoNodes):
			c.cfg.Recorder.Event(p, corev1.EventTypeWarning, n.Reason, n.Message)
		case t == v1alpha1.ConditionTerminating && n.Status == metav1.ConditionTrue:
			c.cfg.Recorder.Event(p, corev1.EventTypeNormal, n.Reason, n.Message)
		case t == v1alpha1.ConditionSnapshotMetadata && n.Status == metav1.ConditionFalse:
			c.cfg.Recorder.Event(p, corev1.EventTypeWarning, "SnapshotMetadata"+n.Reason, n.Message)
		case t == v1alpha1.ConditionSnapshotMetadata:
			c.cfg.Recorder.Event(p, corev1.EventTypeNormal, "SnapshotMetadataServing", n.Message)
		}
	}
}

// sameJSON compares two values as the API would see them (empty lists and maps
// left out, quantities canonical).
func sameJSON(a, b any) (bool, error) {
	ja, err := json.Marshal(a)
	if err != nil {
		return false, err
	}
	jb, err := json.Marshal(b)
	if err != nil {
		return false, err
	}
	return bytes.Equal(ja, jb), nil
}
