package grpcerr

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/pods-as-volumes/pav/internal/phase"
)

func TestStatus(t *testing.T) {
	for _, tc := range []struct {
		name     string
		err      error
		wantCode codes.Code
		wantMsg  string
	}{
		{"status passes through", status.Error(codes.Aborted, "busy"), codes.Aborted, "busy"},
		{"deadline: still in progress", fmt.Errorf("waiting for pod: %w", context.DeadlineExceeded), codes.DeadlineExceeded, "still in progress, retry: waiting for pod: context deadline exceeded"},
		{"canceled", context.Canceled, codes.Canceled, "canceled while in progress: context canceled"},
		{"unsupported mode", &phase.RequestError{Msg: "volume mode Block is not supported"}, codes.InvalidArgument, "volume mode Block is not supported"},
		{"capacity out of range", &phase.RequestError{Msg: "requested capacity 2Gi is above", Capacity: true}, codes.OutOfRange, "requested capacity 2Gi is above"},
		{"anything else: the caller's code", errors.New("creation pod failed"), codes.Internal, "creation pod failed"},
	} {
		st, _ := status.FromError(Status(tc.err, codes.Internal))
		if st.Code() != tc.wantCode || st.Message() != tc.wantMsg {
			t.Errorf("%s: %v %q, want %v %q", tc.name, st.Code(), st.Message(), tc.wantCode, tc.wantMsg)
		}
	}
	if Status(nil, codes.Internal) != nil {
		t.Error("Status(nil) is not nil")
	}
}
