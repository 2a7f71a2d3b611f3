package grpcerr

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/url"
	"strings"
	"syscall"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/pods-as-volumes/pav/internal/phase"
	"github.com/pods-as-volumes/pav/internal/records"
	"github.com/pods-as-volumes/pav/internal/templating"
	"github.com/pods-as-volumes/pav/podrunner"
)

// externalProvisionerFinal is external-provisioner's isFinalError
// (https://github.com/kubernetes-csi/external-provisioner/blob/master/pkg/controller/controller.go):
// a final CreateVolume error ends the attempt (an event on the PVC; retried
// only while the PVC exists); a non-final one means "maybe still in progress",
// and it retries with the same claim even after the PVC is deleted.
func externalProvisionerFinal(err error) bool { return finalUnlessInProgress(err) }

// kubeletFinal is kubelet's isFinalError
// (https://github.com/kubernetes/kubernetes/blob/master/pkg/volume/csi/csi_client.go):
// after a final NodeStageVolume error the device counts as not mounted and
// NodeUnstageVolume is never called; after a non-final one it is "uncertain",
// and NodeUnstageVolume will come.
func kubeletFinal(err error) bool { return finalUnlessInProgress(err) }

// finalUnlessInProgress is the rule both callers' sources write out, each in
// its own words: these five codes mean "maybe still in progress", every other
// gRPC status is final. (Should one of them change, its function above gets
// its own body again.)
func finalUnlessInProgress(err error) bool {
	st, ok := status.FromError(err)
	if !ok {
		return false
	}
	switch st.Code() {
	case codes.Canceled, codes.DeadlineExceeded, codes.Unavailable, codes.ResourceExhausted, codes.Aborted:
		return false
	}
	return true
}

var podsGR = schema.GroupResource{Resource: "pods"}

func TestTable(t *testing.T) {
	podFailure := &podrunner.PodFailure{Phase: "creation", Namespace: "pav", Pod: "p", PodPhase: "Failed", Reason: "Error"}
	cases := []struct {
		name  string
		err   error
		code  codes.Code
		final bool
	}{
		{"status passes through", status.Error(codes.Aborted, "busy"), codes.Aborted, false},
		{"provisioner not loaded", status.Error(codes.Unavailable, "PavProvisioner not loaded yet"), codes.Unavailable, false},
		{"provisioner being deleted", status.Error(codes.FailedPrecondition, "the PavProvisioner is being deleted"), codes.FailedPrecondition, true},
		{"classified by the RPC", fmt.Errorf("CreateVolume: %w", Errorf(codes.FailedPrecondition, "PersistentVolumeClaim ns/c no longer exists")), codes.FailedPrecondition, true},
		{"classified NotFound", WithCode(codes.NotFound, errors.New("volume x does not exist")), codes.NotFound, true},
		{"creation failed and so did its revert", &RevertError{Cause: podFailure, Err: podFailure}, codes.Aborted, false},
		{"staging failed, unstaging hit a deadline", &RevertError{Cause: podFailure, Err: context.DeadlineExceeded}, codes.Aborted, false},
		{"creation failed, its revert refused with a final code", &RevertError{Cause: podFailure, Err: Errorf(codes.FailedPrecondition, "its deletion pod's namespace is gone")}, codes.Aborted, false},
		{"a revert's failure that is a gRPC status", &RevertError{Cause: podFailure, Err: status.Error(codes.InvalidArgument, "bad")}, codes.Aborted, false},
		{"deadline while the pod runs", fmt.Errorf("waiting: %w", context.DeadlineExceeded), codes.DeadlineExceeded, false},
		{"canceled", context.Canceled, codes.Canceled, false},
		{"runner stopped (shutdown)", fmt.Errorf("x: %w", podrunner.ErrStopped), codes.Unavailable, false},
		{"runner not started", podrunner.ErrNotStarted, codes.Unavailable, false},
		{"records not synced", records.ErrNotStarted, codes.Unavailable, false},
		{"pod deleted underneath", fmt.Errorf("%w: creation pod pav/p", podrunner.ErrPodDeleted), codes.Aborted, false},
		{"foreign pod", fmt.Errorf("%w: pod ns/p", podrunner.ErrForeignPod), codes.FailedPrecondition, true},
		{"pod's namespace being deleted", &podrunner.NamespaceGoneError{Phase: "deletion", Namespace: "team-a", Terminating: true,
			Err: apierrors.NewForbidden(podsGR, "p", errors.New("unable to create new content in namespace team-a because it is being terminated"))}, codes.FailedPrecondition, true},
		{"pod's namespace gone", fmt.Errorf("deleting: %w", &podrunner.NamespaceGoneError{Phase: "deletion", Namespace: "team-a",
			Err: apierrors.NewNotFound(schema.GroupResource{Resource: "namespaces"}, "team-a")}), codes.FailedPrecondition, true},
		{"record of a newer pav (downgrade)", fmt.Errorf("reading PavVolume pvc-1: %w", records.VolumeFormat.Check("pvc-1", records.VolumeFormat.Current+1)), codes.FailedPrecondition, true},
		{"record changed since read", fmt.Errorf("updating PavVolume x: %w", apierrors.NewConflict(podsGR, "x", errors.New("modified"))), codes.Aborted, false},
		{"429", apierrors.NewTooManyRequests("slow down", 1), codes.Unavailable, false},
		{"500", apierrors.NewInternalError(errors.New("etcd")), codes.Unavailable, false},
		{"503", apierrors.NewServiceUnavailable("down"), codes.Unavailable, false},
		{"504 / server timeout", apierrors.NewServerTimeout(podsGR, "get", 1), codes.Unavailable, false},
		{"request timeout", apierrors.NewTimeoutError("timeout", 1), codes.Unavailable, false},
		{"connection refused", &url.Error{Op: "Get", URL: "https://api", Err: &net.OpError{Op: "dial", Err: syscall.ECONNREFUSED}}, codes.Unavailable, false},
		{"connection reset", &url.Error{Op: "Get", URL: "https://api", Err: &net.OpError{Op: "read", Err: syscall.ECONNRESET}}, codes.Unavailable, false},
		{"EOF", fmt.Errorf("watch: %w", io.EOF), codes.Unavailable, false},
		{"unexpected EOF", io.ErrUnexpectedEOF, codes.Unavailable, false},
		{"dial timeout", &net.OpError{Op: "dial", Err: timeoutErr{}}, codes.Unavailable, false},
		{"403", apierrors.NewForbidden(podsGR, "p", errors.New("cannot create pods in namespace x")), codes.PermissionDenied, true},
		{"401", apierrors.NewUnauthorized("token expired"), codes.Unauthenticated, true},
		{"template error", &templating.Error{Path: "spec.volumeCreation.capacity", Err: errors.New("'nope' is undefined")}, codes.InvalidArgument, true},
		{"field error", &phase.FieldError{Path: "spec.volumeStaging.podTemplate", Msg: "is not a valid pod template"}, codes.InvalidArgument, true},
		{"invalid pod operation", fmt.Errorf("%w: container named pav-report", podrunner.ErrInvalidOperation), codes.InvalidArgument, true},
		{"get_pvc hit an overloaded API server", &templating.Error{Path: "x", Err: apierrors.NewTooManyRequests("slow", 1)}, codes.Unavailable, false},
		{"unsupported mode", &phase.RequestError{Msg: "volume mode Block is not supported"}, codes.InvalidArgument, true},
		{"capacity out of range", &phase.RequestError{Msg: "capacity above", Capacity: true}, codes.OutOfRange, true},
		{"validation pod refused", &podrunner.PodFailure{Phase: "validation", Reason: "Error"}, codes.InvalidArgument, true},
		{"creation pod failed (reverted)", fmt.Errorf("volume creation failed: %w", podFailure), codes.Internal, true},
		{"deletion pod failed", &podrunner.PodFailure{Phase: "deletion", Reason: "Error"}, codes.Internal, true},
		{"staging pod failed (reverted)", &podrunner.PodFailure{Phase: "staging", Reason: "Timeout"}, codes.Internal, true},
		{"PVC gone", fmt.Errorf("reading PersistentVolumeClaim ns/c: %w", apierrors.NewNotFound(schema.GroupResource{Resource: "persistentvolumeclaims"}, "c")), codes.FailedPrecondition, true},
		{"a write of ours refused", apierrors.NewBadRequest("bad"), codes.Internal, true},
		{"unknown", errors.New("something odd"), codes.Internal, true},
	}
	used := map[string]bool{}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			used[Lookup(tc.err).Name] = true
			got := Status(tc.err)
			st, _ := status.FromError(got)
			if st.Code() != tc.code {
				t.Fatalf("code %v, want %v (row %q)", st.Code(), tc.code, Lookup(tc.err).Name)
			}
			if Code(tc.err) != tc.code {
				t.Errorf("Code = %v, Status says %v", Code(tc.err), st.Code())
			}
			if externalProvisionerFinal(got) != tc.final || kubeletFinal(got) != tc.final {
				t.Errorf("final for external-provisioner %v, for kubelet %v; want %v", externalProvisionerFinal(got), kubeletFinal(got), tc.final)
			}
			want := tc.err.Error()
			if s, ok := status.FromError(tc.err); ok {
				want = s.Message()
			}
			if !strings.Contains(st.Message(), want) {
				t.Errorf("message %q lost the error %q", st.Message(), tc.err)
			}
		})
	}
	// Every row is exercised, and every row whose code is fixed says in its
	// first word whether the callers take it as final, truthfully.
	for _, r := range Table {
		if !used[r.Name] {
			t.Errorf("row %q has no test case", r.Name)
		}
		if r.CodeOf == nil {
			final := externalProvisionerFinal(status.Error(r.Code, ""))
			if says := strings.HasPrefix(r.Why, "final"); says != final {
				t.Errorf("row %q: code %v is final=%v, but its Why says %q", r.Name, r.Code, final, r.Why)
			}
		}
	}
	if !used[Unknown.Name] {
		t.Error("no case for unknown errors")
	}
	if Status(nil) != nil || Code(nil) != codes.OK {
		t.Error("nil is not OK")
	}
	if st, _ := status.FromError(Status(context.DeadlineExceeded)); !strings.HasPrefix(st.Message(), "still in progress, retry: ") {
		t.Errorf("deadline message %q", st.Message())
	}
}

type timeoutErr struct{}

func (timeoutErr) Error() string   { return "i/o timeout" }
func (timeoutErr) Timeout() bool   { return true }
func (timeoutErr) Temporary() bool { return true }
