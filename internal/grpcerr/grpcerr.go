// Package grpcerr turns the errors of pav's volume operations into the gRPC
// status codes their CSI callers act on. It is the one place that knows which
// error means which code.
package grpcerr

import (
	"context"
	"errors"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/pods-as-volumes/pav/internal/phase"
)

// Status turns an error of a volume operation into the gRPC status the CSI caller
// gets. A status error passes through. A CSI call whose deadline passed while its
// pod runs gets DeadlineExceeded, which external-provisioner and kubelet treat as
// "still in progress" and retry; the retry adopts the same pod. A request that
// spec.volumeValidation refuses (phase.RequestError) gets OutOfRange for its
// capacity, InvalidArgument for its modes. Everything else (a failed pod, a
// template error) gets code, a final error whose message is what the user sees
// in the PVC's or the pod's events.
func Status(err error, code codes.Code) error {
	if err == nil {
		return nil
	}
	if _, ok := status.FromError(err); ok {
		return err
	}
	switch {
	case errors.Is(err, context.DeadlineExceeded):
		return status.Errorf(codes.DeadlineExceeded, "still in progress, retry: %v", err)
	case errors.Is(err, context.Canceled):
		return status.Errorf(codes.Canceled, "canceled while in progress: %v", err)
	}
	var re *phase.RequestError
	if errors.As(err, &re) {
		code = codes.InvalidArgument
		if re.Capacity {
			code = codes.OutOfRange
		}
	}
	return status.Error(code, err.Error())
}
