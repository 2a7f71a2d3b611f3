package controllerserver

import (
	"strings"
	"testing"

	"github.com/pods-as-volumes/pav/api/v1alpha1"
	"github.com/pods-as-volumes/pav/internal/grpcerr"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// onlyRecord: none is nil, one is it, several are FAILED_PRECONDITION naming
// every record and the handle (never one picked).
func TestOnlyRecord(t *testing.T) {
	rec := func(name string) *v1alpha1.PavSnapshot {
		return &v1alpha1.PavSnapshot{ObjectMeta: metav1.ObjectMeta{Name: name}}
	}
	for _, tc := range []struct {
		name string
		rs   []*v1alpha1.PavSnapshot
		want string // the record's name; "" none
		err  []string
	}{
		{name: "none"},
		{name: "one", rs: []*v1alpha1.PavSnapshot{rec("a")}, want: "a"},
		{name: "two", rs: []*v1alpha1.PavSnapshot{rec("a"), rec("b")}, err: []string{"PavSnapshots a, b", `handle "h"`, "must be unique"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := onlyRecord("PavSnapshots", "h", tc.rs)
			if tc.err != nil {
				if status.Code(grpcerr.Status(err)) != codes.FailedPrecondition || got != nil {
					t.Fatalf("got %v, %v; want FAILED_PRECONDITION and no record", got, err)
				}
				for _, w := range tc.err {
					if !strings.Contains(err.Error(), w) {
						t.Errorf("error %q lacks %q", err, w)
					}
				}
				return
			}
			if err != nil || (got == nil) != (tc.want == "") || (got != nil && got.Name != tc.want) {
				t.Fatalf("got %v, %v; want %q", got, err, tc.want)
			}
		})
	}
}
