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
//  4. Validating admission: the ValidatingAdmissionPolicy compiled and evaluated by
//     the apiserver's own policy packages (the plugin's compilePolicy, rebuilt here
//     because it is unexported), with the runtime CEL cost budget.

import (
	"bytes"
	"context"
	"fmt"
	"strings"
	"testing"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apiserver/pkg/admission"
	plugincel "k8s.io/apiserver/pkg/admission/plugin/cel"
	"k8s.io/apiserver/pkg/admission/plugin/policy/validating"
	"k8s.io/apiserver/pkg/admission/plugin/webhook/matchconditions"
	celconfig "k8s.io/apiserver/pkg/apis/cel"
	"k8s.io/apiserver/pkg/authentication/user"
	"k8s.io/apiserver/pkg/cel/environment"

	apiextensionsinternal "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	crdvalidation "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/validation"
	structuralschema "k8s.io/apiextensions-apiserver/pkg/apiserver/schema"
	apiextensionscel "k8s.io/apiextensions-apiserver/pkg/apiserver/schema/cel"
	"k8s.io/apiextensions-apiserver/pkg/apiserver/schema/cel/model"
	structuraldefaulting "k8s.io/apiextensions-apiserver/pkg/apiserver/schema/defaulting"
	schemaobjectmeta "k8s.io/apiextensions-apiserver/pkg/apiserver/schema/objectmeta"
	structuralpruning "k8s.io/apiextensions-apiserver/pkg/apiserver/schema/pruning"
	apiservervalidation "k8s.io/apiextensions-apiserver/pkg/apiserver/validation"
	"k8s.io/apiextensions-apiserver/pkg/registry/customresource"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	utiljson "k8s.io/apimachinery/pkg/util/json"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"k8s.io/apimachinery/pkg/util/version"
	"sigs.k8s.io/yaml"
)

// crdValidator validates custom resources of one CRD (first served version) the way
// the apiserver does on create.
type crdValidator struct {
	structural     *structuralschema.Structural
	validate       func(ctx context.Context, obj runtime.Object) field.ErrorList
	validateUpdate func(ctx context.Context, obj, old runtime.Object) field.ErrorList
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
	versionName := internal.Spec.Versions[0].Name
	validation, err := apiextensionsinternal.GetSchemaForVersion(internal, versionName)
	if err != nil || validation == nil || validation.OpenAPIV3Schema == nil {
		return nil, append(errs, field.Required(field.NewPath("spec", "versions").Index(0).Child("schema"), fmt.Sprint(err))), nil
	}
	subresources, err := apiextensionsinternal.GetSubresourcesForVersion(internal, versionName)
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
	gvk := schema.GroupVersionKind{Group: internal.Spec.Group, Version: versionName, Kind: internal.Spec.Names.Kind}
	strategy := customresource.NewStrategy(fixedTyper{gvk}, internal.Spec.Scope == apiextensionsinternal.NamespaceScoped,
		gvk, schemaValidator, statusValidator, ss, status, nil, nil)
	return &crdValidator{structural: ss, validate: strategy.Validate, validateUpdate: strategy.ValidateUpdate}, nil, nil
}

// decodeObject decodes a YAML (or JSON) object as the apiserver decodes a JSON
// request body into unstructured content: integers become int64, other numbers
// float64.
func decodeObject(obj []byte) (map[string]any, error) {
	j, err := yaml.YAMLToJSON(obj)
	if err != nil {
		return nil, fmt.Errorf("not YAML: %w", err)
	}
	m := map[string]any{}
	if err := utiljson.Unmarshal(j, &m); err != nil {
		return nil, fmt.Errorf("not a JSON object: %w", err)
	}
	return m, nil
}

// ValidateObject runs a decoded custom resource (see decodeObject; it is modified)
// through decoding and create validation. Unknown fields are reported as errors, as
// with strict field validation (fieldValidation=Strict, kubectl's default).
func (v *crdValidator) ValidateObject(m map[string]any) field.ErrorList {
	u := &unstructured.Unstructured{Object: m}
	var errs field.ErrorList

	// Decoding (customresource_handler.go, unstructuredSchemaCoercer.apply).
	unknown := structuralpruning.PruneWithOptions(u.Object, v.structural, true,
		structuralschema.UnknownFieldPathOptions{TrackUnknownFieldPaths: true})
	for _, p := range unknown {
		// The apiserver fails the request with `strict decoding error: unknown field "<path>"`.
		errs = append(errs, field.Forbidden(field.NewPath(p), fmt.Sprintf("strict decoding error: unknown field %q", p)))
	}
	structuraldefaulting.PruneNonNullableNullsWithoutDefaults(u.Object, v.structural)
	if err, _ := schemaobjectmeta.CoerceWithOptions(nil, u.Object, v.structural, true, schemaobjectmeta.CoerceOptions{}); err != nil {
		errs = append(errs, err)
	}
	structuraldefaulting.Default(u.Object, v.structural)

	// Create validation (customresource.customResourceStrategy.Validate).
	return append(errs, v.validate(context.Background(), u)...)
}

// ValidateUpdate runs a decoded custom resource (modified) through decoding and
// update validation against the stored old object (transition rules: oldSelf).
func (v *crdValidator) ValidateUpdate(m, old map[string]any) field.ErrorList {
	u := &unstructured.Unstructured{Object: m}
	var errs field.ErrorList
	for _, p := range structuralpruning.PruneWithOptions(u.Object, v.structural, true,
		structuralschema.UnknownFieldPathOptions{TrackUnknownFieldPaths: true}) {
		errs = append(errs, field.Forbidden(field.NewPath(p), fmt.Sprintf("strict decoding error: unknown field %q", p)))
	}
	structuraldefaulting.PruneNonNullableNullsWithoutDefaults(u.Object, v.structural)
	structuraldefaulting.Default(u.Object, v.structural)
	return append(errs, v.validateUpdate(context.Background(), u, &unstructured.Unstructured{Object: old})...)
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

// policyValidator evaluates a ValidatingAdmissionPolicy (without params) as the
// ValidatingAdmissionPolicy admission plugin does.
type policyValidator struct {
	policy    *admissionregistrationv1.ValidatingAdmissionPolicy
	binding   *admissionregistrationv1.ValidatingAdmissionPolicyBinding
	validator validating.Validator
}

// loadPolicy parses a policy and its binding (two YAML documents) strictly and
// compiles every expression, returning the compilation errors the apiserver would
// report when the policy is created (it compiles with the NewExpressions
// environment), then builds the runtime validator (StoredExpressions environment).
func loadPolicy(manifests []byte) (*policyValidator, []error, error) {
	p := &policyValidator{}
	for _, doc := range bytes.Split(manifests, []byte("\n---\n")) {
		var tm metav1.TypeMeta
		if err := yaml.Unmarshal(doc, &tm); err != nil {
			return nil, nil, err
		}
		var err error
		switch tm.Kind {
		case "ValidatingAdmissionPolicy":
			p.policy = &admissionregistrationv1.ValidatingAdmissionPolicy{}
			err = yaml.UnmarshalStrict(doc, p.policy)
		case "ValidatingAdmissionPolicyBinding":
			p.binding = &admissionregistrationv1.ValidatingAdmissionPolicyBinding{}
			err = yaml.UnmarshalStrict(doc, p.binding)
		default:
			err = fmt.Errorf("unexpected kind %q", tm.Kind)
		}
		if err != nil {
			return nil, nil, fmt.Errorf("%s: %w", tm.Kind, err)
		}
	}
	if p.policy == nil || p.binding == nil {
		return nil, nil, fmt.Errorf("want a ValidatingAdmissionPolicy and a ValidatingAdmissionPolicyBinding")
	}
	spec := p.policy.Spec

	// Compilation checks, as on policy creation, with the CEL libraries of the oldest
	// supported Kubernetes version.
	var errs []error
	vars := plugincel.OptionalVariableDeclarations{HasParams: spec.ParamKind != nil, HasAuthorizer: true}
	msgVars := plugincel.OptionalVariableDeclarations{HasParams: spec.ParamKind != nil}
	compiler, err := plugincel.NewCompositedCompiler(environment.MustBaseEnvSet(minKubernetesVersion))
	if err != nil {
		return nil, nil, err
	}
	check := func(what string, r plugincel.CompilationResult) {
		if r.Error != nil {
			errs = append(errs, fmt.Errorf("%s: %v", what, r.Error))
		}
	}
	for i, v := range spec.Variables {
		check(fmt.Sprintf("variables[%d] (%s)", i, v.Name), compiler.CompileAndStoreVariable(&validating.Variable{Name: v.Name, Expression: v.Expression}, vars, environment.NewExpressions))
	}
	for i, m := range spec.MatchConditions {
		check(fmt.Sprintf("matchConditions[%d]", i), compiler.CompileCELExpression((*matchconditions.MatchCondition)(&m), vars, environment.NewExpressions))
	}
	for i, v := range spec.Validations {
		check(fmt.Sprintf("validations[%d].expression", i), compiler.CompileCELExpression(&validating.ValidationCondition{Expression: v.Expression}, vars, environment.NewExpressions))
		if v.MessageExpression != "" {
			check(fmt.Sprintf("validations[%d].messageExpression", i), compiler.CompileCELExpression(&validating.MessageExpressionCondition{MessageExpression: v.MessageExpression}, msgVars, environment.NewExpressions))
		}
	}

	// The runtime validator (validating/plugin.go, compilePolicy).
	compiler, err = plugincel.NewCompositedCompiler(environment.MustBaseEnvSet(environment.DefaultCompatibilityVersion()))
	if err != nil {
		return nil, nil, err
	}
	namedVars := make([]plugincel.NamedExpressionAccessor, len(spec.Variables))
	for i, v := range spec.Variables {
		namedVars[i] = &validating.Variable{Name: v.Name, Expression: v.Expression}
	}
	compiler.CompileAndStoreVariables(namedVars, vars, environment.StoredExpressions)
	var matcher matchconditions.Matcher
	if len(spec.MatchConditions) > 0 {
		acc := make([]plugincel.ExpressionAccessor, len(spec.MatchConditions))
		for i := range spec.MatchConditions {
			acc[i] = (*matchconditions.MatchCondition)(&spec.MatchConditions[i])
		}
		matcher = matchconditions.NewMatcher(compiler.CompileCondition(acc, vars, environment.StoredExpressions), spec.FailurePolicy, "policy", "validate", p.policy.Name)
	}
	validations := make([]plugincel.ExpressionAccessor, len(spec.Validations))
	messages := make([]plugincel.ExpressionAccessor, len(spec.Validations))
	for i, v := range spec.Validations {
		validations[i] = &validating.ValidationCondition{Expression: v.Expression, Message: v.Message, Reason: v.Reason}
		if v.MessageExpression != "" {
			messages[i] = &validating.MessageExpressionCondition{MessageExpression: v.MessageExpression}
		}
	}
	p.validator = validating.NewValidator(
		compiler.CompileCondition(validations, vars, environment.StoredExpressions),
		matcher,
		compiler.CompileCondition(nil, vars, environment.StoredExpressions),
		compiler.CompileCondition(messages, msgVars, environment.StoredExpressions),
		spec.FailurePolicy, nil)
	return p, errs, nil
}

// Validate admits obj (oldObj nil for a create) and returns the decisions that are
// not admissions: denials, and evaluation errors (which deny with failurePolicy Fail).
func (p *policyValidator) Validate(gvr schema.GroupVersionResource, obj, oldObj map[string]any) []validating.PolicyDecision {
	op := admission.Create
	if oldObj != nil {
		op = admission.Update
	}
	return p.ValidateRequest(gvr, op, obj, oldObj, &user.DefaultInfo{Name: "tester"})
}

// ValidateRequest admits a create (oldObj nil), an update or a delete (obj
// nil) by the user who, and returns the decisions that are not admissions.
func (p *policyValidator) ValidateRequest(gvr schema.GroupVersionResource, op admission.Operation, obj, oldObj map[string]any, who user.Info) []validating.PolicyDecision {
	var u, old runtime.Object
	var name, ns string
	var gvk schema.GroupVersionKind
	if obj != nil {
		o := &unstructured.Unstructured{Object: obj}
		u, name, ns, gvk = o, o.GetName(), o.GetNamespace(), o.GroupVersionKind()
	}
	if oldObj != nil {
		o := &unstructured.Unstructured{Object: oldObj}
		old, name, ns, gvk = o, o.GetName(), o.GetNamespace(), o.GroupVersionKind()
	}
	var opts runtime.Object
	switch op {
	case admission.Create:
		opts = &metav1.CreateOptions{}
	case admission.Update:
		opts = &metav1.UpdateOptions{}
	default:
		opts = &metav1.DeleteOptions{}
	}
	attrs := admission.NewAttributesRecord(u, old, gvk, ns, name, gvr, "", op, opts, false, who)
	va := &admission.VersionedAttributes{Attributes: attrs, VersionedKind: gvk, VersionedObject: u, VersionedOldObject: old}
	res := p.validator.Validate(context.Background(), gvr, va, nil, nil, celconfig.RuntimeCELCostBudget, nil)
	var out []validating.PolicyDecision
	for _, d := range res.Decisions {
		if d.Action != validating.ActionAdmit {
			out = append(out, d)
		}
	}
	return out
}

// minKubernetesVersion is the oldest Kubernetes the manifests support (admissionregistration.k8s.io/v1
// ValidatingAdmissionPolicy is GA in 1.30): their CEL must only use the libraries it has.
var minKubernetesVersion = version.MajorMinor(1, 30)

// The apiserver's static CEL cost limits for CRDs.
const (
	staticEstimatedCostLimit    = crdvalidation.StaticEstimatedCostLimit
	staticEstimatedCRDCostLimit = crdvalidation.StaticEstimatedCRDCostLimit
)

type ruleCost struct {
	path string
	cost uint64
}

// celRuleCosts compiles every x-kubernetes-validations rule of a structural schema
// with the apiserver's compiler and cost estimator and returns the estimated cost
// of each rule times the number of times it can run (the product of the maxItems
// and maxProperties of the lists and maps above it, else the compiler's estimate),
// which is what CRD admission compares with the limits.
func celRuleCosts(t *testing.T, root *structuralschema.Structural) []ruleCost {
	t.Helper()
	var out []ruleCost
	var walk func(s *structuralschema.Structural, path *field.Path, isRoot bool, card uint64, bounded bool)
	walk = func(s *structuralschema.Structural, path *field.Path, isRoot bool, card uint64, bounded bool) {
		if s == nil {
			return
		}
		if len(s.XValidations) > 0 {
			results, err := apiextensionscel.Compile(s, model.SchemaDeclType(s, isRoot), celconfig.PerCallLimit,
				environment.MustBaseEnvSet(minKubernetesVersion), apiextensionscel.NewExpressionsEnvLoader())
			if err != nil {
				t.Fatalf("%s: %v", path, err)
			}
			for i, r := range results {
				if r.Error != nil {
					t.Fatalf("%s rule %d: %v", path, i, r.Error)
				}
				c := card
				if !bounded {
					c = r.MaxCardinality
				}
				out = append(out, ruleCost{fmt.Sprintf("%s[%d]", path, i), r.MaxCost * c})
			}
		}
		for name, p := range s.Properties {
			walk(&p, path.Child(name), false, card, bounded)
		}
		bound := func(max *int64) (uint64, bool) {
			if max == nil || !bounded {
				return 0, false
			}
			return card * uint64(*max), true
		}
		if s.Items != nil {
			var max *int64
			if s.ValueValidation != nil {
				max = s.ValueValidation.MaxItems
			}
			c, b := bound(max)
			walk(s.Items, path.Child("items"), s.Items.XEmbeddedResource, c, b)
		}
		if s.AdditionalProperties != nil && s.AdditionalProperties.Structural != nil {
			var max *int64
			if s.ValueValidation != nil {
				max = s.ValueValidation.MaxProperties
			}
			c, b := bound(max)
			walk(s.AdditionalProperties.Structural, path.Child("additionalProperties"), false, c, b)
		}
	}
	walk(root, field.NewPath("openAPIV3Schema"), true, 1, true)
	return out
}
