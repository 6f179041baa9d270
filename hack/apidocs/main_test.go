package main

import (
	"bytes"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	apiextv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"k8s.io/utils/ptr"
)

// Paths relative to the repository root, as in the header of the committed reference.
const (
	crdFile = "config/crd/bases/training.zaya.dev_zayatrainingjobs.yaml"
	docFile = "docs/api-reference.md"
)

// repo is the repository root: go test runs in the package directory.
const repo = "../.."

func loadCRD(t *testing.T) *apiextv1.CustomResourceDefinition {
	t.Helper()
	crd, err := readCRD(filepath.Join(repo, crdFile))
	if err != nil {
		t.Fatal(err)
	}
	return crd
}

func TestReferenceIsUpToDate(t *testing.T) {
	var got bytes.Buffer
	if err := render(&got, loadCRD(t), command(crdFile, docFile)); err != nil {
		t.Fatal(err)
	}
	want, err := os.ReadFile(filepath.Join(repo, docFile))
	if err != nil {
		t.Fatalf("%v: run make manifests", err)
	}
	lines := func(s string) []string { return strings.Split(s, "\n") }
	if diff := cmp.Diff(lines(string(want)), lines(got.String())); diff != "" {
		t.Errorf("%s is out of date with %s: run make manifests (%s)\n-committed +generated:\n%s",
			docFile, crdFile, command(crdFile, docFile), diff)
	}
}

// TestEveryFieldIsDescribed keeps `kubectl explain` useful: every field of the job's own
// types needs a doc comment. Kubernetes types are documented upstream.
func TestEveryFieldIsDescribed(t *testing.T) {
	probe := &apiextv1.JSONSchemaProps{Properties: map[string]apiextv1.JSONSchemaProps{
		"a": {Description: "a is fine.", Items: &apiextv1.JSONSchemaPropsOrArray{Schema: &apiextv1.JSONSchemaProps{
			Properties: map[string]apiextv1.JSONSchemaProps{"b": {}},
		}}},
		"metadata": {},
	}}
	if got := undescribed(probe); !slices.Equal(got, []string{".a[].b"}) {
		t.Fatalf("undescribed(probe) = %q, want [.a[].b]", got)
	}

	crd := loadCRD(t)
	var missing []string
	for _, v := range crd.Spec.Versions {
		for _, p := range undescribed(v.Schema.OpenAPIV3Schema) {
			missing = append(missing, v.Name+" "+p)
		}
	}
	if len(missing) > 0 {
		t.Errorf("fields without a description (add a doc comment in api/, then run make manifests):\n  %s",
			strings.Join(missing, "\n  "))
	}
}

// TestExternalPathsExist catches a renamed field that the generator would start expanding.
func TestExternalPathsExist(t *testing.T) {
	for _, v := range loadCRD(t).Spec.Versions {
		for path := range external {
			s := v.Schema.OpenAPIV3Schema
			for _, name := range strings.Split(path, ".")[1:] {
				p, ok := s.Properties[name]
				if !ok {
					t.Errorf("%s: external path %s is not in the schema", v.Name, path)
					break
				}
				s = &p
			}
		}
	}
}

// undescribed lists the properties below s that have no description, sorted, skipping what
// the reference links to upstream.
func undescribed(s *apiextv1.JSONSchemaProps) []string {
	var missing []string
	var walk func(path string, s *apiextv1.JSONSchemaProps)
	walk = func(path string, s *apiextv1.JSONSchemaProps) {
		for name, p := range s.Properties {
			fp := path + "." + name
			// controller-gen writes no description for the embedded ObjectMeta.
			if fp != ".metadata" && strings.TrimSpace(p.Description) == "" {
				missing = append(missing, fp)
			}
			if _, ok := external[fp]; !ok {
				walk(fp, &p)
			}
		}
		if s.Items != nil && s.Items.Schema != nil {
			walk(path+"[]", s.Items.Schema)
		}
		if s.AdditionalProperties != nil && s.AdditionalProperties.Schema != nil {
			walk(path+".*", s.AdditionalProperties.Schema)
		}
	}
	walk("", s)
	slices.Sort(missing)
	return missing
}

func TestRenderTable(t *testing.T) {
	js := func(s string) apiextv1.JSON { return apiextv1.JSON{Raw: []byte(s)} }
	schema := apiextv1.JSONSchemaProps{
		Type:        "object",
		Description: "Widget is a test object.",
		Required:    []string{"spec"},
		Properties: map[string]apiextv1.JSONSchemaProps{
			"metadata": {Type: "object"},
			"spec": {
				Type:        "object",
				Description: "spec is\nthe desired widget.",
				Required:    []string{"size"},
				Properties: map[string]apiextv1.JSONSchemaProps{
					"mode": {
						Type:        "string",
						Description: "mode is a | b.\n\nA second paragraph about <mode> and PET_*.",
						Enum:        []apiextv1.JSON{js(`"A"`), js(`"B"`)},
						Default:     ptr.To(js(`"A"`)),
					},
					"size": {Type: "integer", Format: "int32", Description: "size is big.", Minimum: ptr.To(1.0)},
					"parts": {
						Type:        "array",
						Description: "parts are parts.",
						Items: &apiextv1.JSONSchemaPropsOrArray{Schema: &apiextv1.JSONSchemaProps{
							Type:       "object",
							Properties: map[string]apiextv1.JSONSchemaProps{"name": {Type: "string", Description: "name names it.", Pattern: "^(a|b)$"}},
						}},
						XValidations: apiextv1.ValidationRules{{Rule: "size(self) < 3", Message: "at most 2 parts"}},
					},
				},
				XValidations: apiextv1.ValidationRules{{Rule: "self.size > 0"}},
			},
		},
	}
	crd := &apiextv1.CustomResourceDefinition{Spec: apiextv1.CustomResourceDefinitionSpec{
		Group: "example.dev",
		Names: apiextv1.CustomResourceDefinitionNames{Kind: "Widget"},
		Scope: apiextv1.NamespaceScoped,
		Versions: []apiextv1.CustomResourceDefinitionVersion{
			{Name: "v1", Served: true, Schema: &apiextv1.CustomResourceValidation{OpenAPIV3Schema: &schema}},
			{Name: "v0", Served: false},
		},
	}}
	var out bytes.Buffer
	if err := render(&out, crd, "make docs"); err != nil {
		t.Fatal(err)
	}
	doc := out.String()

	for _, want := range []string{
		"Generated from the CustomResourceDefinition by `make docs`",
		"## example.dev/v1\n",
		// Required first, flagged; a nested object links to its section.
		"| `spec` | [object](#v1.spec) | yes |  | spec is the desired widget. |\n" +
			"| `metadata` | [ObjectMeta](https://kubernetes.io/",
		"<a id=\"v1.spec\"></a>\n\n### `.spec`\n",
		"| `size` | integer (int32) | yes |  | size is big.<br>**Minimum:** 1 |\n",
		// Pipes, tags and emphasis are escaped; paragraphs stay in one cell; enum and default shown.
		"| `mode` | string |  | `A` | mode is a \\| b.<br><br>A second paragraph about &lt;mode&gt; and PET\\_\\*.<br>**Enum:** `A`, `B` |\n",
		"| `parts` | [[]object](#v1.spec.parts) |  |  | parts are parts. |\n",
		"### `.spec.parts[]`",
		"| `name` | string |  |  | name names it.<br>**Pattern:** `^(a\\|b)$` |\n",
		// Rules are listed under the object they sit on, by message or else by rule.
		"Validation rules:\n\n- must satisfy `self.size > 0`\n- `parts`: at most 2 parts\n",
	} {
		if !strings.Contains(doc, want) {
			t.Errorf("output lacks %q; got:\n%s", want, doc)
		}
	}
	if strings.Contains(doc, "v0") {
		t.Error("an unserved version was documented")
	}
	if i, j := strings.Index(doc, "| `size` |"), strings.Index(doc, "| `mode` |"); i < 0 || j < i {
		t.Error("required fields are not listed first")
	}

	// Every table row has exactly five cells: nothing in a cell ends it early.
	for _, line := range strings.Split(doc, "\n") {
		if !strings.HasPrefix(line, "| ") {
			continue
		}
		cells := strings.Split(strings.ReplaceAll(line, `\|`, ""), "|")
		if len(cells) != 7 {
			t.Errorf("row has %d cells, want 5: %s", len(cells)-2, line)
		}
	}

	var again bytes.Buffer
	if err := render(&again, crd, "make docs"); err != nil {
		t.Fatal(err)
	}
	if again.String() != doc {
		t.Error("output is not deterministic")
	}
}
