package controllerserver

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"google.golang.org/grpc/codes"
	"k8s.io/apimachinery/pkg/types"

	"github.com/pods-as-volumes/pav/api/v1alpha1"
	"github.com/pods-as-volumes/pav/internal/grpcerr"
	"github.com/pods-as-volumes/pav/podrunner"
)

// podLedger is what running a phase pod needs of a record (PavVolume,
// PavSnapshot or PavGroupSnapshot): its pod entries as last stored, and a way
// to store a change to them. Every entry is written before its pod is asked
// for, so that a restarted plugin adopts the pod instead of making another.
type podLedger struct {
	what    string // the record, for errors: "volume pvc-1"
	entries []v1alpha1.VolumePod
	// update stores mutate's change of the entries in one write; created
	// says that the change records a new pod's UID.
	update func(ctx context.Context, created bool, mutate func(entries *[]v1alpha1.VolumePod)) error
}

// runEntry runs (or adopts) the pod of the phase's pending entry, recording
// its UID as soon as it exists. A pod lost before it finished is recorded
// Lost and given a successor entry (the retry runs it: ABORTED).
func (s *Server) runEntry(ctx context.Context, l podLedger, ph v1alpha1.Phase, op podrunner.Operation) (*podrunner.Result, error) {
	e := unfinished(v1alpha1.LastPod(l.entries, ph))
	if e == nil {
		return nil, fmt.Errorf("%s: no %s pod recorded (a pav bug)", l.what, ph)
	}
	// The pod lives where it was recorded, whatever the template says now.
	op = withIdentity(op, *e)
	token := e.Token
	// The pods of the phase's earlier entries (failed or lost) may still
	// exist: the new pod has their name, and they would be foreign to its
	// token.
	for _, old := range l.entries {
		if old.Phase == ph && old.Name == op.PodName() && old.Token != token && old.Outcome != v1alpha1.PodRunning {
			if err := s.Pods.Delete(ctx, withIdentity(op, old)); err != nil {
				return nil, fmt.Errorf("removing the earlier %s pod %s/%s: %w", ph, old.Namespace, old.Name, err)
			}
		}
	}
	op.Created = func(ctx context.Context, uid types.UID) error {
		return l.update(ctx, true, func(entries *[]v1alpha1.VolumePod) {
			if e := v1alpha1.LastPod(*entries, ph); e != nil && e.Token == token {
				e.UID = uid
			}
		})
	}
	res, err := s.Pods.Run(ctx, op)
	if errors.Is(err, podrunner.ErrPodDeleted) {
		if serr := l.update(ctx, false, func(entries *[]v1alpha1.VolumePod) {
			if e := v1alpha1.LastPod(*entries, ph); e != nil && e.Token == token {
				e.Outcome = v1alpha1.PodLost
			}
			*entries = s.addPodEntry(*entries, ph, op)
		}); serr != nil {
			return nil, serr
		}
	}
	return res, err
}

// removeDonePods removes the pod of every entry whose outcome is recorded
// (opOf names its operation); Delete leaves alone what is gone or not pav's.
func (s *Server) removeDonePods(ctx context.Context, entries []v1alpha1.VolumePod, opOf func(e v1alpha1.VolumePod) podrunner.Operation) error {
	for _, e := range entries {
		if e.Outcome == v1alpha1.PodRunning || e.Outcome == v1alpha1.PodLost {
			continue
		}
		if err := s.Pods.Delete(ctx, withIdentity(opOf(e), e)); err != nil {
			return fmt.Errorf("removing the finished %s pod %s/%s: %w", e.Phase, e.Namespace, e.Name, err)
		}
	}
	return nil
}

// onlyRecord is the one record of a handle, or the zero value when there is
// none: records of one handle that disagree are a human's to sort out, never
// pav's to pick from (kind names them: "PavVolumes").
func onlyRecord[R interface{ GetName() string }](kind, handle string, rs []R) (R, error) {
	var zero R
	switch len(rs) {
	case 0:
		return zero, nil
	case 1:
		return rs[0], nil
	}
	names := make([]string, len(rs))
	for i, r := range rs {
		names[i] = r.GetName()
	}
	return zero, grpcerr.Errorf(codes.FailedPrecondition, "%s %s all have handle %q; a handle must be unique: a human must tell which is right", kind, strings.Join(names, ", "), handle)
}
