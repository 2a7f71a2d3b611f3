// Package grpcerr turns the errors of pav's volume operations into the gRPC
// status codes their CSI callers act on. It is the one place that knows which
// error means which code: Table, walked in order, first match wins.
//
// What the callers do with a code decides what the code must be:
//
//   - external-provisioner (CreateVolume, DeleteVolume) treats CANCELED,
//     DEADLINE_EXCEEDED, UNAVAILABLE, RESOURCE_EXHAUSTED and ABORTED as "still
//     in progress": it retries with the same claim, even after the PVC is
//     deleted. Every other code is final: an event on the PVC, and a retry
//     later only while the PVC exists (and DeleteVolume retries with backoff).
//   - kubelet (NodeStage, NodeUnstage, NodePublish, ...) treats the same five
//     codes as "uncertain": a NodeStage that fails so leaves the device marked
//     uncertain, and NodeUnstage will come. After any other code from NodeStage
//     the device counts as not mounted and NodeUnstage is NEVER called, so a
//     final NodeStage error may only be returned once everything it made is
//     cleaned up.
//
// So: an error after which pav still has something to finish or undo (a pod
// running, a revert to retry) must be non-final; an error that needs a human or
// a different request must be final, with a message that says what to fix.
package grpcerr

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"syscall"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	utilnet "k8s.io/apimachinery/pkg/util/net"
	"k8s.io/klog/v2"

	"github.com/pods-as-volumes/pav/api/v1alpha1"
	"github.com/pods-as-volumes/pav/internal/compat"
	"github.com/pods-as-volumes/pav/internal/phase"
	"github.com/pods-as-volumes/pav/internal/records"
	"github.com/pods-as-volumes/pav/internal/templating"
	"github.com/pods-as-volumes/pav/podrunner"
)

// Rule is one row of the table: the errors it matches, their code, and why.
type Rule struct {
	// Name says which errors the row is for.
	Name string
	// Match reports whether err (or an error in its chain) is the row's.
	Match func(err error) bool
	// Code is the row's code; CodeOf, if set, decides it per error instead.
	Code   codes.Code
	CodeOf func(err error) codes.Code
	// Why: the reason for the code, and what the CSI caller then does.
	Why string
}

func (r *Rule) code(err error) codes.Code {
	if r.CodeOf != nil {
		return r.CodeOf(err)
	}
	return r.Code
}

// RevertError is a final failure (Cause) whose revert failed too (Err): the
// creation pod failed and so did the deletion pod that undoes it, or staging
// failed and so did unstaging. The revert must be retried, so the code is
// non-final whatever Cause's would be.
type RevertError struct {
	Cause, Err error
}

func (e *RevertError) Error() string {
	return fmt.Sprintf("%v; undoing it failed too, pav retries: %v", e.Cause, e.Err)
}

func (e *RevertError) Unwrap() []error { return []error{e.Cause, e.Err} }

// Coded is an error the RPC itself classified (a request that contradicts the
// volume's record, a missing object, ...): Code, with the chain kept.
type Coded struct {
	Code codes.Code
	Err  error
}

func (e *Coded) Error() string { return e.Err.Error() }
func (e *Coded) Unwrap() error { return e.Err }

// WithCode classifies err as code.
func WithCode(code codes.Code, err error) error { return &Coded{Code: code, Err: err} }

// Errorf is WithCode of a formatted error (%w wraps as in fmt.Errorf).
func Errorf(code codes.Code, format string, args ...any) error {
	return &Coded{Code: code, Err: fmt.Errorf(format, args...)}
}

// Table is every error → code rule, in the order they are tried.
var Table = []Rule{
	{
		Name:  "a revert that failed (grpcerr.RevertError)",
		Match: func(err error) bool { var r *RevertError; return errors.As(err, &r) },
		Code:  codes.Aborted,
		Why:   "non-final, whatever code its parts would have (first, so that a classified or gRPC error inside it cannot make it final): the caller retries even after the PVC (or client pod) is gone, and the retry runs the revert again until it succeeds; a final code would leave the backend volume or the node's mounts behind",
	},
	{
		Name:  "a gRPC status (the RPC's own argument checks; provisioner.Source: UNAVAILABLE until the PavProvisioner is loaded, FAILED_PRECONDITION while it is invalid, being deleted or missing)",
		Match: func(err error) bool { _, ok := status.FromError(err); return ok },
		CodeOf: func(err error) codes.Code {
			s, _ := status.FromError(err)
			return s.Code()
		},
		Why: "whoever built it chose the code for the caller",
	},
	{
		Name:  "an error the RPC classified (grpcerr.WithCode)",
		Match: func(err error) bool { var c *Coded; return errors.As(err, &c) },
		CodeOf: func(err error) codes.Code {
			var c *Coded
			errors.As(err, &c)
			return c.Code
		},
		Why: "the RPC knows what the error means for its caller (e.g. FAILED_PRECONDITION: the PVC of a volume not yet recorded is gone; ALREADY_EXISTS: the request contradicts the volume's record)",
	},
	{
		Name:  "the CSI call's deadline passed (context.DeadlineExceeded)",
		Match: func(err error) bool { return errors.Is(err, context.DeadlineExceeded) },
		Code:  codes.DeadlineExceeded,
		Why:   "non-final: the pod keeps running; the caller retries and the retry adopts the same pod",
	},
	{
		Name:  "the CSI call was canceled (context.Canceled)",
		Match: func(err error) bool { return errors.Is(err, context.Canceled) },
		Code:  codes.Canceled,
		Why:   "non-final: the caller gave up waiting; its retry adopts the same pod",
	},
	{
		Name: "the driver is stopping or not ready (podrunner.ErrStopped, podrunner.ErrNotStarted, records.ErrNotStarted and the snapshot and group snapshot stores')",
		Match: func(err error) bool {
			return errors.Is(err, podrunner.ErrStopped) || errors.Is(err, podrunner.ErrNotStarted) || errors.Is(err, records.ErrNotStarted) ||
				errors.Is(err, records.ErrSnapshotsNotStarted) || errors.Is(err, records.ErrGroupSnapshotsNotStarted)
		},
		Code: codes.Unavailable,
		Why:  "non-final: a restarted or synced driver picks the operation up where it was",
	},
	{
		Name:  "a pod of ours deleted before it finished (podrunner.ErrPodDeleted)",
		Match: func(err error) bool { return errors.Is(err, podrunner.ErrPodDeleted) },
		Code:  codes.Aborted,
		Why:   "non-final: its outcome is unknown; the retry runs the phase again in a new pod, with a new token",
	},
	{
		Name:  "a record or node state of a format newer than this pav reads (compat.ErrNewerFormat: pav was downgraded)",
		Match: func(err error) bool { return errors.Is(err, compat.ErrNewerFormat) },
		Code:  codes.FailedPrecondition,
		Why:   "final: this pav would misread it; the message names both versions, and a human installs the newer pav again (nothing was changed)",
	},
	{
		Name:  "a pod pav did not create holds the operation's pod name (podrunner.ErrForeignPod)",
		Match: func(err error) bool { return errors.Is(err, podrunner.ErrForeignPod) },
		Code:  codes.FailedPrecondition,
		Why:   "final: a human must delete that pod (it carries a ForeignPod event); nothing of pav's exists for the operation yet, so NodeStage may fail finally, and external-provisioner retries while the PVC exists",
	},
	{
		Name:  "a pod that cannot be created because its namespace is gone or being deleted (podrunner.ErrNamespaceGone)",
		Match: func(err error) bool { return errors.Is(err, podrunner.ErrNamespaceGone) },
		Code:  codes.FailedPrecondition,
		Why:   "final: no retry can create the pod until a namespace of that name exists again, and nothing was made; a deletion so blocked is reported and waits for its way out (spec.volumeDeletion.whenNamespaceGone), and external-provisioner retries DeleteVolume with backoff whatever the code",
	},
	{
		Name:  "a write that lost a race (API 409 Conflict, e.g. a PavVolume changed since it was read)",
		Match: apierrors.IsConflict,
		Code:  codes.Aborted,
		Why:   "non-final: the retry reads afresh and resumes",
	},
	{
		Name:  "the API server is overloaded or unreachable (429, 500, 503, 504, timeouts, connection refused or reset, EOF)",
		Match: transientAPI,
		Code:  codes.Unavailable,
		Why:   "non-final: the operation is retried as it stands once the API server answers",
	},
	{
		Name:  "pav's ServiceAccount may not do what the operation needs (API 403 Forbidden)",
		Match: apierrors.IsForbidden,
		Code:  codes.PermissionDenied,
		Why:   "final: the RBAC of pav (or of the namespace a template chose) needs a fix; the message names the verb and resource",
	},
	{
		Name:  "pav's credentials are refused (API 401 Unauthorized)",
		Match: apierrors.IsUnauthorized,
		Code:  codes.Unauthenticated,
		Why:   "final: the ServiceAccount token is not accepted; a human must look",
	},
	{
		Name: "the provisioner's templates or pod template (phase.FieldError, templating.Error, podrunner.ErrInvalidOperation)",
		Match: func(err error) bool {
			var fe *phase.FieldError
			var te *templating.Error
			return errors.As(err, &fe) || errors.As(err, &te) || errors.Is(err, podrunner.ErrInvalidOperation)
		},
		Code: codes.InvalidArgument,
		Why:  "final: the PavProvisioner (or a claim it reads with get_pvc) needs a fix; the message names the field",
	},
	{
		Name: "a request spec.volumeValidation refuses (phase.RequestError)",
		Match: func(err error) bool {
			var re *phase.RequestError
			return errors.As(err, &re)
		},
		CodeOf: func(err error) codes.Code {
			var re *phase.RequestError
			errors.As(err, &re)
			if re.Capacity {
				return codes.OutOfRange
			}
			return codes.InvalidArgument
		},
		Why: "final: OUT_OF_RANGE for a capacity outside the provisioner's bounds or the request (CSI's code for it), INVALID_ARGUMENT for an unsupported volume or access mode",
	},
	{
		Name: "a pod that failed, could not be scheduled or pull its image, or timed out (podrunner.PodFailure)",
		Match: func(err error) bool {
			_, ok := podrunner.IsPodFailure(err)
			return ok
		},
		CodeOf: func(err error) codes.Code {
			f, _ := podrunner.IsPodFailure(err)
			if f.Phase == string(v1alpha1.PhaseValidation) {
				return codes.InvalidArgument
			}
			return codes.Internal
		},
		Why: "final, and only returned once whatever the phase made is undone (creation reverted by the deletion pod, staging by the unstaging pod): INVALID_ARGUMENT when the validation pod refuses the request; INTERNAL otherwise, with the pod's reason, exit codes and /pav/error or log tail (external-provisioner retries DeleteVolume with backoff)",
	},
	{
		Name:  "an object the operation needs is gone (API 404 Not Found: the PVC or StorageClass of a volume not yet recorded, the Node)",
		Match: apierrors.IsNotFound,
		Code:  codes.FailedPrecondition,
		Why:   "final: nothing was made; the message names the object (RPCs that must answer NOT_FOUND, like ValidateVolumeCapabilities, say so with grpcerr.WithCode)",
	},
	{
		Name:  "the API server refused a write of pav's (API 400, 422: a pav bug)",
		Match: func(err error) bool { return apierrors.IsInvalid(err) || apierrors.IsBadRequest(err) },
		Code:  codes.Internal,
		Why:   "final: a retry would send the same object; report it",
	},
}

// transientAPI: the API server is overloaded or unreachable for now.
func transientAPI(err error) bool {
	if apierrors.IsTooManyRequests(err) || apierrors.IsInternalError(err) || apierrors.IsServiceUnavailable(err) ||
		apierrors.IsServerTimeout(err) || apierrors.IsTimeout(err) || apierrors.IsUnexpectedServerError(err) {
		return true
	}
	if utilnet.IsConnectionRefused(err) || utilnet.IsConnectionReset(err) || utilnet.IsProbableEOF(err) ||
		errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, syscall.EPIPE) {
		return true
	}
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

// Unknown is the rule of an error no row matches: INTERNAL, and logged with
// its type so that the table can learn it.
var Unknown = Rule{
	Name: "anything else",
	Code: codes.Internal,
	Why:  "final: pav does not know the error; it is logged with its type",
}

// Lookup returns the rule of err.
func Lookup(err error) *Rule {
	for i := range Table {
		if Table[i].Match(err) {
			return &Table[i]
		}
	}
	return &Unknown
}

// Code is the gRPC code of err (OK for nil).
func Code(err error) codes.Code {
	if err == nil {
		return codes.OK
	}
	return Lookup(err).code(err)
}

// Status turns an error of a volume operation into the gRPC status its CSI
// caller gets (nil for nil). A gRPC status passes through unchanged, unless
// it is part of a failed revert, which is always retried.
func Status(err error) error {
	if err == nil {
		return nil
	}
	var rev *RevertError
	if _, ok := status.FromError(err); ok && !errors.As(err, &rev) {
		return err
	}
	r := Lookup(err)
	code := r.code(err)
	msg := err.Error()
	switch {
	case r == &Unknown:
		klog.ErrorS(err, "Unclassified error: answering INTERNAL", "types", chainTypes(err))
	case code == codes.DeadlineExceeded || code == codes.Canceled:
		msg = "still in progress, retry: " + msg
	}
	return status.Error(code, msg)
}

// chainTypes lists the types along err's chain, for the log of an unknown error.
func chainTypes(err error) []string {
	var out []string
	for err != nil && len(out) < 16 {
		out = append(out, fmt.Sprintf("%T", err))
		err = errors.Unwrap(err)
	}
	return out
}
