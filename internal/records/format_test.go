package records_test

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/pods-as-volumes/pav/api/v1alpha1"
	"github.com/pods-as-volumes/pav/internal/compat"
	"github.com/pods-as-volumes/pav/internal/records"
	"github.com/pods-as-volumes/pav/internal/records/recordstest"
)

// fixture reads testdata/NAME.json, a record as the pav of its format wrote
// it, with its handle label filled in.
func fixture(t *testing.T, name, handle string) *unstructured.Unstructured {
	t.Helper()
	b, err := os.ReadFile("testdata/" + name + ".json")
	if err != nil {
		t.Fatal(err)
	}
	b = []byte(strings.ReplaceAll(string(b), "HANDLE_LABEL", v1alpha1.HandleLabel(handle)))
	u := &unstructured.Unstructured{}
	if err := json.Unmarshal(b, &u.Object); err != nil {
		t.Fatal(err)
	}
	u.SetResourceVersion("7")
	return u
}

// TestVolumeFormats reads a PavVolume of every format: an older one is
// migrated (and written in the current format by the next write), a newer one
// is refused by every read, naming both versions, never misread.
func TestVolumeFormats(t *testing.T) {
	const name = "pvc-0f7c1b7e-5b8e-4d3a-9e2b-1c2d3e4f5a6b"
	for _, tc := range []struct {
		fixture string
		wantErr string // "": read, as the current format
	}{
		{fixture: "pavvolume-0"},
		{fixture: "pavvolume-1"},
		{fixture: "pavvolume-2", wantErr: "PavVolume " + name + " has format version 2 (written by a pav newer than v9.9.9-test), newer than version 1, the newest this pav (v9.9.9-test) reads"},
	} {
		t.Run(tc.fixture, func(t *testing.T) {
			defer setRelease("v9.9.9-test")()
			ctx := context.Background()
			s := start(t, recordstest.NewClient(fixture(t, tc.fixture, "h-0")), "hello")
			v, err := s.Get(ctx, name)
			vs, herr := s.ByHandle(ctx, "h-0", false)
			lvs, lerr := s.ByHandle(ctx, "h-0", true)
			if tc.wantErr != "" {
				for what, err := range map[string]error{"Get": err, "ByHandle": herr, "live ByHandle": lerr} {
					if !errors.Is(err, compat.ErrNewerFormat) || !strings.Contains(err.Error(), tc.wantErr) {
						t.Errorf("%s: %v, want an error containing %q", what, err, tc.wantErr)
					}
				}
				if v != nil || len(vs) > 0 || len(lvs) > 0 {
					t.Errorf("a newer record was returned: %v %v %v", v, vs, lvs)
				}
				return
			}
			if err != nil || herr != nil || lerr != nil || len(vs) != 1 || len(lvs) != 1 {
				t.Fatalf("Get: %v; ByHandle: %v %v; live: %v %v", err, vs, herr, lvs, lerr)
			}
			for _, got := range []*v1alpha1.PavVolume{v, vs[0], lvs[0]} {
				if got.Spec.FormatVersion != records.VolumeFormat.Current {
					t.Errorf("format version %d, want %d", got.Spec.FormatVersion, records.VolumeFormat.Current)
				}
				// Every field as written.
				if got.Spec.Claim != "team-a/data" || got.Spec.Params["color"] != "blue" || got.Spec.PVC == nil ||
					got.Status.Phase != v1alpha1.VolumeCreated || got.Status.Capacity != 1<<20 || len(got.Status.Pods) != 1 || got.Status.Pods[0].UID != "u0" {
					t.Errorf("read %+v", got)
				}
			}
			// The next write is of the current format.
			v.Status.Message = "touched"
			upd, err := s.Update(ctx, v)
			if err != nil {
				t.Fatal(err)
			}
			if upd.Spec.FormatVersion != records.VolumeFormat.Current {
				t.Errorf("written with format version %d", upd.Spec.FormatVersion)
			}
		})
	}
}

// TestSnapshotFormats is TestVolumeFormats for PavSnapshots, through List too
// (ListSnapshots), which must fail rather than leave a newer record out.
func TestSnapshotFormats(t *testing.T) {
	const name = "snapshot-5c1d2e3f-4a5b-4c6d-8e9f-0a1b2c3d4e5f"
	for _, tc := range []struct {
		fixture string
		wantErr string
	}{
		{fixture: "pavsnapshot-0"},
		{fixture: "pavsnapshot-1"},
		{fixture: "pavsnapshot-2", wantErr: "PavSnapshot " + name + " has format version 2"},
	} {
		t.Run(tc.fixture, func(t *testing.T) {
			ctx := context.Background()
			c := recordstest.NewClient(fixture(t, tc.fixture, "s-0"))
			s := records.NewSnapshots(c, "hello")
			sctx, cancel := context.WithCancel(ctx)
			defer cancel()
			if err := s.Start(sctx); err != nil {
				t.Fatal(err)
			}
			v, err := s.Get(ctx, name)
			l, lerr := s.List()
			if tc.wantErr != "" {
				for what, err := range map[string]error{"Get": err, "List": lerr} {
					if !errors.Is(err, compat.ErrNewerFormat) || !strings.Contains(err.Error(), tc.wantErr) {
						t.Errorf("%s: %v, want an error containing %q", what, err, tc.wantErr)
					}
				}
				return
			}
			if err != nil || lerr != nil || len(l) != 1 {
				t.Fatalf("Get: %v; List: %v %v", err, l, lerr)
			}
			for _, got := range []*v1alpha1.PavSnapshot{v, l[0]} {
				if got.Spec.FormatVersion != records.SnapshotFormat.Current || got.Status.Handle != "s-0" || got.Spec.Volume.Handle != "h-0" {
					t.Errorf("read %+v", got)
				}
			}
		})
	}
}

// TestCreateWritesFormat: a new record carries the current format.
func TestCreateWritesFormat(t *testing.T) {
	s := start(t, recordstest.NewClient(), "hello")
	v, err := s.Create(context.Background(), newVolume("pvc-new"))
	if err != nil {
		t.Fatal(err)
	}
	if v.Spec.FormatVersion != records.VolumeFormat.Current {
		t.Errorf("format version %d", v.Spec.FormatVersion)
	}
}

func setRelease(r string) func() {
	old := compat.Release
	compat.Release = r
	return func() { compat.Release = old }
}
