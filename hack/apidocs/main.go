// Command apidocs writes the Markdown API reference of a CustomResourceDefinition from the
// OpenAPI schema of its served versions, so the reference states exactly what the API server
// validates and defaults:
//
//	go run ./hack/apidocs -crd config/crd/bases/training.zaya.dev_zayatrainingjobs.yaml -out docs/api-reference.md
package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"unicode"

	apiextv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"sigs.k8s.io/yaml"
)

// k8sType is a Kubernetes type embedded in the schema.
type k8sType struct{ name, url string }

// external maps schema paths to the Kubernetes types they hold. These are linked to the
// upstream reference instead of expanded: the pod template alone is thousands of lines
// and would bury the job's own fields.
var external = map[string]k8sType{
	".metadata":                    {"ObjectMeta", "https://kubernetes.io/docs/reference/kubernetes-api/common-definitions/object-meta/#ObjectMeta"},
	".spec.template":               {"PodTemplateSpec", "https://kubernetes.io/docs/reference/kubernetes-api/workload-resources/pod-template-v1/#PodTemplateSpec"},
	".spec.network.env":            {"EnvVar", "https://kubernetes.io/docs/reference/kubernetes-api/workload-resources/pod-v1/#environment-variables"},
	".spec.checkpoint.volume.size": {"Quantity", "https://kubernetes.io/docs/reference/kubernetes-api/common-definitions/quantity/"},
	".status.conditions":           {"Condition", "https://pkg.go.dev/k8s.io/apimachinery/pkg/apis/meta/v1#Condition"},
}

func main() {
	crdPath := flag.String("crd", "", "CustomResourceDefinition manifest to document (required)")
	out := flag.String("out", "", "Markdown file to write (default: standard output)")
	flag.Parse()
	if *crdPath == "" || flag.NArg() > 0 {
		flag.Usage()
		os.Exit(2)
	}
	if err := run(*crdPath, *out); err != nil {
		fmt.Fprintln(os.Stderr, "apidocs:", err)
		os.Exit(1)
	}
}

func run(crdPath, out string) error {
	crd, err := readCRD(crdPath)
	if err != nil {
		return err
	}
	var buf bytes.Buffer
	if err := render(&buf, crd, command(crdPath, out)); err != nil {
		return err
	}
	if out == "" {
		_, err = os.Stdout.Write(buf.Bytes())
		return err
	}
	return os.WriteFile(out, buf.Bytes(), 0o644)
}

// command is the command line that regenerates the reference, quoted in its header.
func command(crdPath, out string) string {
	c := "go run ./hack/apidocs -crd " + filepath.ToSlash(crdPath)
	if out != "" {
		c += " -out " + filepath.ToSlash(out)
	}
	return c
}

func readCRD(path string) (*apiextv1.CustomResourceDefinition, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	crd := &apiextv1.CustomResourceDefinition{}
	if err := yaml.Unmarshal(data, crd); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	if crd.Kind != "CustomResourceDefinition" {
		return nil, fmt.Errorf("%s: kind is %q, not CustomResourceDefinition", path, crd.Kind)
	}
	return crd, nil
}

// render writes the reference of every served version of crd.
func render(w io.Writer, crd *apiextv1.CustomResourceDefinition, cmd string) error {
	names := crd.Spec.Names
	var b strings.Builder
	fmt.Fprintf(&b, "# %s API reference\n\n", names.Kind)
	fmt.Fprintf(&b, "Generated from the CustomResourceDefinition by `%s` (part of `make manifests`); do not edit by hand.\n", cmd)
	b.WriteString("Field descriptions are the API's Go doc comments, the same text `kubectl explain` prints.\n")
	served := 0
	for i := range crd.Spec.Versions {
		v := &crd.Spec.Versions[i]
		if !v.Served {
			continue
		}
		if v.Schema == nil || v.Schema.OpenAPIV3Schema == nil {
			return fmt.Errorf("version %s has no openAPIV3Schema", v.Name)
		}
		served++
		apiVersion := crd.Spec.Group + "/" + v.Name
		fmt.Fprintf(&b, "\n## %s\n\n", apiVersion)
		fmt.Fprintf(&b, "`apiVersion: %s`, `kind: %s`; %s", apiVersion, names.Kind, strings.ToLower(string(crd.Spec.Scope)))
		if len(names.ShortNames) > 0 {
			fmt.Fprintf(&b, "; short names %s", codes(names.ShortNames))
		}
		if len(names.Categories) > 0 {
			fmt.Fprintf(&b, "; categories %s", codes(names.Categories))
		}
		b.WriteString(".\n")
		if v.Deprecated {
			b.WriteString("\n**Deprecated.**")
			if v.DeprecationWarning != nil {
				b.WriteString(" " + text(*v.DeprecationWarning))
			}
			b.WriteString("\n")
		}
		g := &gen{b: &b, version: v.Name}
		g.object("", names.Kind, v.Schema.OpenAPIV3Schema)
	}
	if served == 0 {
		return errors.New("no served version")
	}
	_, err := io.WriteString(w, b.String())
	return err
}

// gen writes the sections of one version.
type gen struct {
	b       *strings.Builder
	version string
}

// object writes the section of the object at path (.spec.checkpoint, "" for the root,
// array items end in []) and then, depth first in table order, those of its nested objects.
func (g *gen) object(path, title string, s *apiextv1.JSONSchemaProps) {
	b := g.b
	fmt.Fprintf(b, "\n<a id=%q></a>\n\n### %s\n\n", g.anchor(path), title)
	if s.Description != "" {
		b.WriteString(text(s.Description) + "\n\n")
	}
	b.WriteString("| Field | Type | Required | Default | Description |\n")
	b.WriteString("|---|---|---|---|---|\n")
	rules := ruleLines("", s.XValidations)
	type child struct {
		path string
		s    *apiextv1.JSONSchemaProps
	}
	var children []child
	for _, name := range fieldOrder(s) {
		f := s.Properties[name]
		fp := path + "." + name
		req := ""
		if slices.Contains(s.Required, name) {
			req = "yes"
		}
		desc := []string{text(f.Description)}
		if t, ok := external[fp]; ok && f.Description == "" {
			desc[0] = "See the Kubernetes " + t.name + " reference."
		}
		for _, c := range constraints(&f) {
			desc = append(desc, "**"+c.label+":** "+c.value)
		}
		fmt.Fprintf(b, "| %s | %s | %s | %s | %s |\n",
			code(name), g.typeOf(fp, &f), req, defaultOf(&f), strings.Join(desc, "<br>"))

		// A nested object's rules go in its own section; the rest are listed here.
		switch cp, cs := nested(fp, &f); {
		case cs == nil:
			rules = append(rules, ruleLines(name, f.XValidations)...)
			if f.Items != nil && f.Items.Schema != nil {
				rules = append(rules, ruleLines(name+"[]", f.Items.Schema.XValidations)...)
			}
		case cp == fp:
			children = append(children, child{cp, cs})
		default:
			rules = append(rules, ruleLines(name, f.XValidations)...)
			children = append(children, child{cp, cs})
		}
	}
	if len(rules) > 0 {
		b.WriteString("\nValidation rules:\n\n")
		for _, r := range rules {
			b.WriteString("- " + r + "\n")
		}
	}
	for _, c := range children {
		g.object(c.path, code(c.path), c.s)
	}
}

// nested returns the object schema at or below the field at path that gets its own section
// (the field itself, the items of an array or the values of a map) and its path, or nil.
func nested(path string, s *apiextv1.JSONSchemaProps) (string, *apiextv1.JSONSchemaProps) {
	if _, ok := external[path]; ok {
		return "", nil
	}
	switch {
	case len(s.Properties) > 0:
		return path, s
	case s.Items != nil && s.Items.Schema != nil && len(s.Items.Schema.Properties) > 0:
		return path + "[]", s.Items.Schema
	case s.AdditionalProperties != nil && s.AdditionalProperties.Schema != nil && len(s.AdditionalProperties.Schema.Properties) > 0:
		return path + ".*", s.AdditionalProperties.Schema
	}
	return "", nil
}

// anchor is the HTML id of the section of path. Ids are explicit because heading slugs
// differ between Markdown renderers.
func (g *gen) anchor(path string) string {
	return g.version + strings.ReplaceAll(path, "[]", "")
}

// typeOf is the type column: the schema type, linked to a nested section or to the
// Kubernetes reference.
func (g *gen) typeOf(path string, s *apiextv1.JSONSchemaProps) string {
	name, target := g.typeName(path, s)
	if target == "" {
		return name
	}
	// The brackets of [] are balanced inside link text, so they need no escaping there.
	return "[" + name + "](" + target + ")"
}

func (g *gen) typeName(path string, s *apiextv1.JSONSchemaProps) (name, target string) {
	if t, ok := external[path]; ok {
		if s.Type == "array" {
			return "[]" + t.name, t.url
		}
		return t.name, t.url
	}
	switch {
	case s.XIntOrString:
		return "int-or-string", ""
	case s.Type == "array" && s.Items != nil && s.Items.Schema != nil:
		name, target = g.typeName(path+"[]", s.Items.Schema)
		return "[]" + name, target
	case len(s.Properties) > 0:
		return "object", "#" + g.anchor(path)
	case s.Type == "object" && s.AdditionalProperties != nil && s.AdditionalProperties.Schema != nil:
		name, target = g.typeName(path+".*", s.AdditionalProperties.Schema)
		return "map[string]" + name, target
	case s.Type == "":
		return "any", ""
	case s.Format != "":
		return s.Type + " (" + s.Format + ")", ""
	}
	return s.Type, ""
}

// fieldOrder lists required fields first, then the optional ones, each alphabetically:
// properties are a JSON map, so the schema has no order of its own.
func fieldOrder(s *apiextv1.JSONSchemaProps) []string {
	names := make([]string, 0, len(s.Properties))
	for n := range s.Properties {
		names = append(names, n)
	}
	slices.Sort(names)
	slices.SortStableFunc(names, func(a, b string) int {
		ra, rb := slices.Contains(s.Required, a), slices.Contains(s.Required, b)
		switch {
		case ra == rb:
			return 0
		case ra:
			return -1
		}
		return 1
	})
	return names
}

func defaultOf(s *apiextv1.JSONSchemaProps) string {
	if s.Default == nil {
		return ""
	}
	return code(jsonValue(s.Default.Raw))
}

// jsonValue shows a string bare and anything else as compact JSON.
func jsonValue(raw []byte) string {
	var str string
	if json.Unmarshal(raw, &str) == nil && str != "" {
		return str
	}
	var buf bytes.Buffer
	if json.Compact(&buf, raw) != nil {
		return string(raw)
	}
	return buf.String()
}

type constraint struct{ label, value string }

// constraints lists what the schema enforces on a value besides its type.
func constraints(s *apiextv1.JSONSchemaProps) []constraint {
	var cs []constraint
	add := func(label, value string) { cs = append(cs, constraint{label, value}) }
	addInt := func(label string, v *int64) {
		if v != nil {
			add(label, strconv.FormatInt(*v, 10))
		}
	}
	if len(s.Enum) > 0 {
		vals := make([]string, len(s.Enum))
		for i, e := range s.Enum {
			vals[i] = code(jsonValue(e.Raw))
		}
		add("Enum", strings.Join(vals, ", "))
	}
	if s.Minimum != nil {
		label := "Minimum"
		if s.ExclusiveMinimum {
			label = "Exclusive minimum"
		}
		add(label, strconv.FormatFloat(*s.Minimum, 'f', -1, 64))
	}
	if s.Maximum != nil {
		label := "Maximum"
		if s.ExclusiveMaximum {
			label = "Exclusive maximum"
		}
		add(label, strconv.FormatFloat(*s.Maximum, 'f', -1, 64))
	}
	if s.MultipleOf != nil {
		add("Multiple of", strconv.FormatFloat(*s.MultipleOf, 'f', -1, 64))
	}
	addInt("Min length", s.MinLength)
	addInt("Max length", s.MaxLength)
	if s.Pattern != "" {
		add("Pattern", code(s.Pattern))
	}
	addInt("Min items", s.MinItems)
	addInt("Max items", s.MaxItems)
	addInt("Min properties", s.MinProperties)
	addInt("Max properties", s.MaxProperties)
	if s.XListType != nil {
		switch *s.XListType {
		case "set":
			add("List type", "set (items are unique)")
		case "map":
			add("List type", "map keyed by "+codes(s.XListMapKeys))
		}
	}
	if s.Items != nil && s.Items.Schema != nil && len(s.Items.Schema.Properties) == 0 {
		var item []string
		for _, c := range constraints(s.Items.Schema) {
			item = append(item, strings.ToLower(c.label)+" "+c.value)
		}
		if len(item) > 0 {
			add("Items", strings.Join(item, "; "))
		}
	}
	return cs
}

// ruleLines lists the CEL rules of the value of field ("" for the object itself) by their
// messages, which is what the API server answers when a rule fails.
func ruleLines(field string, rules apiextv1.ValidationRules) []string {
	lines := make([]string, 0, len(rules))
	for _, r := range rules {
		line := text(r.Message)
		if r.Message == "" {
			line = "must satisfy " + code(r.Rule)
		}
		if field != "" {
			line = code(field) + ": " + line
		}
		lines = append(lines, line)
	}
	return lines
}

// text renders a description on one line of a table cell: line breaks of the doc comment
// become spaces, paragraph breaks become <br><br>.
func text(s string) string {
	paras := strings.Split(strings.TrimSpace(s), "\n\n")
	for i, p := range paras {
		paras[i] = escape(strings.Join(strings.Fields(p), " "))
	}
	return strings.Join(paras, "<br><br>")
}

// escape keeps prose from turning into Markdown or HTML: a pipe would end the table
// cell, <name> would vanish as a tag, and MASTER_* or PET_* would start emphasis.
func escape(s string) string {
	var b strings.Builder
	r := []rune(s)
	for i, c := range r {
		switch c {
		case '\\', '`', '*', '[', ']', '|':
			b.WriteRune('\\')
			b.WriteRune(c)
		case '_':
			// An underscore inside a word (NCCL_IB_HCA) never starts emphasis.
			if i > 0 && i+1 < len(r) && isWord(r[i-1]) && isWord(r[i+1]) {
				b.WriteRune(c)
			} else {
				b.WriteString(`\_`)
			}
		case '<':
			b.WriteString("&lt;")
		case '>':
			b.WriteString("&gt;")
		case '&':
			b.WriteString("&amp;")
		default:
			b.WriteRune(c)
		}
	}
	return b.String()
}

func isWord(r rune) bool { return unicode.IsLetter(r) || unicode.IsDigit(r) }

// code is a code span that survives a table cell: pipes are escaped (GFM unescapes them
// inside code spans in tables) and the fence is longer than any backtick run inside.
func code(s string) string {
	s = strings.ReplaceAll(strings.ReplaceAll(s, "\n", " "), "|", `\|`)
	fence := "`"
	for strings.Contains(s, fence) {
		fence += "`"
	}
	if strings.HasPrefix(s, "`") || strings.HasSuffix(s, "`") {
		s = " " + s + " "
	}
	return fence + s + fence
}

func codes(ss []string) string {
	cs := make([]string, len(ss))
	for i, s := range ss {
		cs[i] = code(s)
	}
	return strings.Join(cs, ", ")
}
