// Package crdschema checks an object against a CustomResourceDefinition's schema as the API
// server does on a write: the OpenAPI rules (types, bounds, enums, sizes) and the CEL rules.
// Tests use it to prove the operator never computes what its own CRD refuses.
package crdschema

import (
	"context"
	"fmt"
	"os"

	"k8s.io/apiextensions-apiserver/pkg/apis/apiextensions"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	structuralschema "k8s.io/apiextensions-apiserver/pkg/apiserver/schema"
	"k8s.io/apiextensions-apiserver/pkg/apiserver/schema/cel"
	"k8s.io/apiextensions-apiserver/pkg/apiserver/validation"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/validation/field"
	celconfig "k8s.io/apiserver/pkg/apis/cel"
	"sigs.k8s.io/yaml"
)

// Validator checks objects against one version of a CRD.
type Validator struct {
	schema     validation.SchemaValidator
	structural *structuralschema.Structural
	cel        *cel.Validator
}

// Load reads the CRD at path and builds the validator of its version.
func Load(path, version string) (*Validator, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var v1 apiextensionsv1.CustomResourceDefinition
	if err := yaml.UnmarshalStrict(b, &v1); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	var crd apiextensions.CustomResourceDefinition
	if err := apiextensionsv1.Convert_v1_CustomResourceDefinition_To_apiextensions_CustomResourceDefinition(&v1, &crd, nil); err != nil {
		return nil, err
	}
	for _, ver := range crd.Spec.Versions {
		// The internal form keeps a schema shared by every version at the top.
		val := ver.Schema
		if val == nil {
			val = crd.Spec.Validation
		}
		if ver.Name != version || val == nil {
			continue
		}
		props := val.OpenAPIV3Schema
		sv, _, err := validation.NewSchemaValidator(props)
		if err != nil {
			return nil, err
		}
		s, err := structuralschema.NewStructural(props)
		if err != nil {
			return nil, err
		}
		return &Validator{schema: sv, structural: s, cel: cel.NewValidator(s, true, celconfig.PerCallLimit)}, nil
	}
	return nil, fmt.Errorf("%s has no version %s with a schema", path, version)
}

// Validate returns what the API server would refuse in obj (nil: nothing).
func (v *Validator) Validate(obj runtime.Object) field.ErrorList {
	u, err := runtime.DefaultUnstructuredConverter.ToUnstructured(obj)
	if err != nil {
		return field.ErrorList{field.InternalError(nil, err)}
	}
	errs := validation.ValidateCustomResource(nil, u, v.schema)
	if v.cel != nil {
		celErrs, _ := v.cel.Validate(context.Background(), nil, v.structural, u, nil, celconfig.RuntimeCELCostBudget)
		errs = append(errs, celErrs...)
	}
	return errs
}
