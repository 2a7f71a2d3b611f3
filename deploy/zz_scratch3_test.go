package deploy

import "testing"

func TestScratch3(t *testing.T) {
	v, errs, err := loadCRD(CRDYAML)
	if err != nil || len(errs) > 0 {
		t.Fatalf("%v %s", err, errorsString(errs))
	}
	for _, o := range []string{
		`{provisioningModes: [Static], volumeStaging: {podTemplate: {spec: {containers: []}}}}`,
		`{provisioningModes: [Static], volumeStaging: hello}`,
		`{provisioningModes: [Static], volumeStaging: {}, volumeCreation: {}}`,
		`{provisioningModes: [Dynamic], volumeStaging: "{% set yaml = true %}"}`,
		`{provisioningModes: [Dynamic, Dynamic], volumeStaging: "{% set yaml = true %}", volumeCreation: {capacity: 0, handle: 42}}`,
		`{provisioningModes: [Dynamic], volumeStaging: "{% set yaml = true %}", volumeCreation: {capacity: 1}, volumeValidation: {volumeModes: [Foo, "{{ x }}"], accessModes: [], minCapacity: "abc"}}`,
	} {
		t.Logf("%s => %s", o, errorsString(v.Validate([]byte("apiVersion: pav.albertofaria.github.io/v1alpha1\nkind: PavProvisioner\nmetadata: {name: Bad}\nspec: "+o))))
	}
}
