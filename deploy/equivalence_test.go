package deploy

import (
	"errors"
	"strings"
	"testing"

	"github.com/pods-as-volumes/pav/internal/phase"
	"github.com/pods-as-volumes/pav/internal/provisioner"
)

// The rules for a PavProvisioner live in three places: the CRD (OpenAPI schema
// and CEL), the admission policy, and the driver's phase.Check. The API
// server's two layers cannot parse templates, so the driver may refuse more;
// it must never accept what the API server refuses. TestDriverAgreesWithTheAPIServer
// holds them together on the whole corpus of this package's tests.

// driverCheck is what the driver does with a PavProvisioner it loads from a
// file (the watch decodes what the API server admitted): strict decoding, then
// phase.Check.
func driverCheck(obj string) error {
	p, err := provisioner.Load([]byte(obj))
	if err != nil {
		return err
	}
	return phase.Check(p)
}

// driverStricter lists the admitted objects the driver refuses on purpose, with
// the reason. (None today: every literal rule the driver applies is in the CRD or
// the policy; template syntax, which CEL cannot parse, has no case in the corpus
// of admitted objects.)
var driverStricter = map[string]string{}

// apiServerOnly lists the refused objects the driver accepts, with the reason.
var apiServerOnly = map[string]string{
	"condition with an unknown status": "status is written by the drivers and never read back; phase.Check checks the spec",
	"duplicate condition type":         "status is written by the drivers and never read back; phase.Check checks the spec",
}

// namesField reports whether the driver's error is about field (a path such as
// spec.volumeValidation.minCapacity) or a field inside it.
func namesField(err error, field string) bool {
	var fe *phase.FieldError
	if errors.As(err, &fe) {
		return fe.Path == field || strings.HasPrefix(fe.Path, field+".") || strings.HasPrefix(fe.Path, field+"[")
	}
	// Strict decoding errors name the field in their text.
	return strings.Contains(err.Error(), field)
}

func TestDriverAgreesWithTheAPIServer(t *testing.T) {
	a := newAdmitter(t)
	for _, c := range validObjects {
		t.Run("admitted/"+c.name, func(t *testing.T) {
			if rs := a.admit(t, c.obj, ""); len(rs) > 0 {
				t.Fatalf("the API server refuses it:%s", rejectionsString(rs))
			}
			err := driverCheck(c.obj)
			reason, stricter := driverStricter[c.name]
			switch {
			case stricter && err == nil:
				t.Fatalf("listed as refused by the driver (%s), but the driver accepts it: take it off the list", reason)
			case stricter:
				t.Logf("refused by the driver only, on purpose (%s): %v", reason, err)
			case err != nil:
				t.Fatalf("the API server admits it, the driver refuses it: %v", err)
			}
		})
	}
	for _, c := range invalidObjects {
		t.Run("refused/"+c.name, func(t *testing.T) {
			rs := a.admit(t, c.obj, "")
			if len(rs) == 0 {
				t.Fatal("the API server admits it")
			}
			err := driverCheck(c.obj)
			if reason, ok := apiServerOnly[c.name]; ok {
				if err != nil {
					t.Fatalf("listed as accepted by the driver (%s), but the driver refuses it: %v; take it off the list", reason, err)
				}
				t.Logf("refused by the API server only (%s)", reason)
				return
			}
			if err == nil {
				t.Fatalf("the API server refuses it (%s: %s), the driver accepts it", rs[0].field, rs[0].msg)
			}
			for _, r := range rs {
				if namesField(err, r.field) {
					return
				}
			}
			t.Fatalf("the driver refuses it, but not for the same field:\n    driver: %v\n    API server:%s", err, rejectionsString(rs))
		})
	}
}
