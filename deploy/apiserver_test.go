package deploy

// This file rebuilds, from the apiextensions-apiserver packages themselves, the
// admission path a PavProvisioner takes in a real kube-apiserver, so that the CRD
// can be tested without a cluster:
//
//  1. CRD admission: v1 defaulting, v1 -> internal conversion,
//     validation.ValidateCustomResourceDefinition (structural schema, CEL compilation
//     and the static cost estimator, both per rule and for the whole schema),
//     plus an explicit structuralschema.NewStructural/ValidateStructural.
//  2. Custom resource decoding as the CRD handler does it: pruning with unknown-field
//     tracking (what strict field validation, kubectl's default, turns into errors),
//     dropping of non-nullable nulls, defaulting.
//  3. Custom resource validation through customresource.NewStrategy(...).Validate:
//     metadata, the OpenAPI schema validator (validation.NewSchemaValidator), list
//     type invariants (listType set/map) and the CEL validator (cel.NewValidator,
//     with the apiserver's per-call limit and runtime cost budget).

import (
	"context"
	"fmt"
	"strings"

	apiextensionsinternal "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	crdvalidation "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/validation"
	structuralschema "k8s.io/apiextensions-apiserver/pkg/apiserver/schema"
	structuraldefaulting "k8s.io/apiextensions-apiserver/pkg/apiserver/schema/defaulting"
	schemaobjectmeta "k8s.io/apiextensions-apiserver/pkg/apiserver/schema/objectmeta"
	structuralpruning "k8s.io/apiextensions-apiserver/pkg/apiserver/schema/pruning"
	apiservervalidation "k8s.io/apiextensions-apiserver/pkg/apiserver/validation"
	"k8s.io/apiextensions-apiserver/pkg/registry/customresource"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"sigs.k8s.io/yaml"
)

// crdValidator validates custom resources of one CRD (first served version) the way
// the apiserver does on create.
type crdValidator struct {
	crd        *apiextensionsv1.CustomResourceDefinition
	internal   *apiextensionsinternal.CustomResourceDefinition
	structural *structuralschema.Structural
	gvk        schema.GroupVersionKind
	validate   func(ctx context.Context, obj runtime.Object) field.ErrorList
}

// loadCRD parses a CRD manifest strictly and runs CRD admission on it. It returns
// an error for a malformed manifest and the CRD admission errors otherwise; the
// validator is nil when there are any.
func loadCRD(manifest []byte) (*crdValidator, field.ErrorList, error) {
	crd := &apiextensionsv1.CustomResourceDefinition{}
	if err := yaml.UnmarshalStrict(manifest, crd); err != nil {
		return nil, nil, fmt.Errorf("strict unmarshal: %w", err)
	}
	apiextensionsv1.SetObjectDefaults_CustomResourceDefinition(crd)
	internal := &apiextensionsinternal.CustomResourceDefinition{}
	if err := apiextensionsv1.Convert_v1_CustomResourceDefinition_To_apiextensions_CustomResourceDefinition(crd, internal, nil); err != nil {
		return nil, nil, fmt.Errorf("convert v1 -> internal: %w", err)
	}

	errs := crdvalidation.ValidateCustomResourceDefinition(context.Background(), internal)
	if len(internal.Spec.Versions) == 0 {
		return nil, append(errs, field.Required(field.NewPath("spec", "versions"), "")), nil
	}
	version := internal.Spec.Versions[0].Name
	validation, err := apiextensionsinternal.GetSchemaForVersion(internal, version)
	if err != nil || validation == nil || validation.OpenAPIV3Schema == nil {
		return nil, append(errs, field.Required(field.NewPath("spec", "versions").Index(0).Child("schema"), fmt.Sprint(err))), nil
	}
	subresources, err := apiextensionsinternal.GetSubresourcesForVersion(internal, version)
	if err != nil {
		return nil, nil, err
	}
	s := validation.OpenAPIV3Schema
	ss, err := structuralschema.NewStructural(s)
	if err != nil {
		return nil, append(errs, field.Invalid(field.NewPath("openAPIV3Schema"), "", err.Error())), nil
	}
	errs = append(errs, structuralschema.ValidateStructural(field.NewPath("openAPIV3Schema"), ss)...)
	if len(errs) > 0 {
		return nil, errs, nil
	}

	schemaValidator, _, err := apiservervalidation.NewSchemaValidator(s)
	if err != nil {
		return nil, nil, err
	}
	var statusValidator apiservervalidation.SchemaValidator
	if st, ok := s.Properties["status"]; ok {
		if statusValidator, _, err = apiservervalidation.NewSchemaValidator(&st); err != nil {
			return nil, nil, err
		}
	}
	var status *apiextensionsinternal.CustomResourceSubresourceStatus
	if subresources != nil {
		status = subresources.Status
	}
	gvk := schema.GroupVersionKind{Group: internal.Spec.Group, Version: version, Kind: internal.Spec.Names.Kind}
	strategy := customresource.NewStrategy(fixedTyper{gvk}, internal.Spec.Scope == apiextensionsinternal.NamespaceScoped,
		gvk, schemaValidator, statusValidator, ss, status, nil, nil)
	return &crdValidator{crd: crd, internal: internal, structural: ss, gvk: gvk, validate: strategy.Validate}, nil, nil
}

// Validate runs a custom resource given as YAML through decoding and create
// validation. Unknown fields are reported as errors, as with strict field
// validation (fieldValidation=Strict, kubectl's default).
func (v *crdValidator) Validate(obj []byte) field.ErrorList {
	m := map[string]any{}
	if err := yaml.Unmarshal(obj, &m); err != nil {
		return field.ErrorList{field.Invalid(nil, string(obj), "not YAML: "+err.Error())}
	}
	return v.ValidateObject(m)
}

// ValidateObject is Validate for an already decoded object (it is modified).
func (v *crdValidator) ValidateObject(m map[string]any) field.ErrorList {
	u := &unstructured.Unstructured{Object: m}
	var errs field.ErrorList

	// Decoding (customresource_handler.go, unstructuredSchemaCoercer.apply).
	unknown := structuralpruning.PruneWithOptions(u.Object, v.structural, true,
		structuralschema.UnknownFieldPathOptions{TrackUnknownFieldPaths: true})
	for _, p := range unknown {
		errs = append(errs, &field.Error{Type: field.ErrorTypeNotSupported, Field: p,
			Detail: fmt.Sprintf("unknown field %q", p)})
	}
	structuraldefaulting.PruneNonNullableNullsWithoutDefaults(u.Object, v.structural)
	if err, _ := schemaobjectmeta.CoerceWithOptions(nil, u.Object, v.structural, true, schemaobjectmeta.CoerceOptions{}); err != nil {
		errs = append(errs, err)
	}
	structuraldefaulting.Default(u.Object, v.structural)

	// Create validation (customresource.customResourceStrategy.Validate).
	return append(errs, v.validate(context.Background(), u)...)
}

// fixedTyper is the runtime.ObjectTyper of a single kind.
type fixedTyper struct{ gvk schema.GroupVersionKind }

func (t fixedTyper) ObjectKinds(runtime.Object) ([]schema.GroupVersionKind, bool, error) {
	return []schema.GroupVersionKind{t.gvk}, false, nil
}
func (t fixedTyper) Recognizes(gvk schema.GroupVersionKind) bool { return gvk == t.gvk }

// errorsString renders errors one a line, for test failure messages.
func errorsString(errs field.ErrorList) string {
	var b strings.Builder
	for _, e := range errs {
		fmt.Fprintf(&b, "\n    %s [%s]", e.Error(), e.Type)
	}
	return b.String()
}
