package attribution

import (
	_ "embed"
	"errors"
	"fmt"
	"regexp"
	"strings"

	"sigs.k8s.io/yaml"
)

// Pattern is one rule of a table: a line of a failed rank's evidence that matches Regexp
// (RE2 syntax) names its Category.
type Pattern struct {
	// Name says which rule matched, in status and events: a DNS label.
	Name string `json:"name"`
	// Category is what a match means.
	Category Category `json:"category"`
	// Regexp is matched against each line of the evidence (RE2: linear time, no
	// backreferences).
	Regexp string `json:"regexp"`
}

// Bounds of a table: it is read on every failure of every job.
const (
	MaxPatterns      = 512
	MaxRegexpLength  = 1024
	maxEvidenceBytes = 16 << 10
	maxLineBytes     = 2048
)

// Table is a compiled list of patterns. The zero value matches nothing.
type Table struct {
	patterns []Pattern
	compiled []*regexp.Regexp
	// byCategory is one alternation per category, in Categories order: a line is tested once
	// per category, not once per pattern.
	byCategory []categoryRegexp
}

type categoryRegexp struct {
	category Category
	re       *regexp.Regexp
}

//go:embed defaults.yaml
var defaultsYAML []byte

// Default is the shipped table: lines that ROCm, RCCL, PyTorch, the kernel and the reference
// worker print (the sources are in defaults.yaml).
func Default() *Table {
	t, err := Parse(defaultsYAML)
	if err != nil {
		panic(fmt.Sprintf("attribution: the shipped table is broken: %v", err)) // a test keeps it whole
	}
	return t
}

// Parse reads a table (a YAML list of patterns) and refuses it whole, naming the rule and
// what is wrong, when any rule is bad.
func Parse(data []byte) (*Table, error) {
	var ps []Pattern
	if err := yaml.UnmarshalStrict(data, &ps); err != nil {
		return nil, fmt.Errorf("not a list of {name, category, regexp}: %w", err)
	}
	return Compile(ps)
}

// Compile checks and compiles patterns, at most MaxPatterns.
func Compile(ps []Pattern) (*Table, error) {
	if len(ps) > MaxPatterns {
		return nil, fmt.Errorf("%d patterns: at most %d", len(ps), MaxPatterns)
	}
	return compile(ps)
}

// compile checks and compiles patterns of any number.
func compile(ps []Pattern) (*Table, error) {
	t := &Table{patterns: ps, compiled: make([]*regexp.Regexp, len(ps))}
	var errs []error
	seen := map[string]bool{}
	alternatives := map[Category][]string{}
	for i, p := range ps {
		at := fmt.Sprintf("[%d] %q", i, p.Name)
		switch {
		case !dnsLabel.MatchString(p.Name):
			errs = append(errs, fmt.Errorf("%s: name must be a DNS label (lower-case letters, digits, '-', at most 63)", at))
		case seen[p.Name]:
			errs = append(errs, fmt.Errorf("%s: name used twice", at))
		}
		seen[p.Name] = true
		if !Valid(p.Category) {
			errs = append(errs, fmt.Errorf("%s: category %q is not one of %v", at, p.Category, Categories))
		}
		if p.Regexp == "" || len(p.Regexp) > MaxRegexpLength {
			errs = append(errs, fmt.Errorf("%s: regexp must be 1 to %d bytes", at, MaxRegexpLength))
			continue
		}
		re, err := regexp.Compile(p.Regexp)
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: regexp: %w", at, err))
			continue
		}
		if re.MatchString("") {
			errs = append(errs, fmt.Errorf("%s: regexp %q matches every line", at, p.Regexp))
			continue
		}
		t.compiled[i] = re
		alternatives[p.Category] = append(alternatives[p.Category], "(?:"+p.Regexp+")")
	}
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	for _, c := range Categories {
		if alts := alternatives[c]; len(alts) > 0 {
			t.byCategory = append(t.byCategory, categoryRegexp{c, regexp.MustCompile(strings.Join(alts, "|"))})
		}
	}
	return t, nil
}

var dnsLabel = regexp.MustCompile(`^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$`)

// Merge is t's patterns followed by more's (a user's table added to the shipped one); a
// name in both is more's.
func (t *Table) Merge(more *Table) *Table {
	if more == nil || len(more.patterns) == 0 {
		return t
	}
	var ps []Pattern
	for _, p := range t.patterns {
		if !more.has(p.Name) {
			ps = append(ps, p)
		}
	}
	out, err := compile(append(ps, more.patterns...))
	if err != nil {
		panic(fmt.Sprintf("attribution: rules that compiled alone do not compile together: %v", err)) // names are unique by construction
	}
	return out
}

func (t *Table) has(name string) bool {
	for _, p := range t.patterns {
		if p.Name == name {
			return true
		}
	}
	return false
}

// Len is the number of patterns.
func (t *Table) Len() int {
	if t == nil {
		return 0
	}
	return len(t.patterns)
}

// Match is what a table found in some evidence.
type Match struct {
	Category Category
	// Pattern is the matching rule's name.
	Pattern string
	// Line is the evidence line that matched, trimmed.
	Line string
}

// Match finds the most specific category among text's lines (the last 16 KiB; lines cut at
// 2 KiB) and the first line, from the end, that shows it: a failure's cause is printed last.
func (t *Table) Match(text string) (Match, bool) {
	if t == nil || len(t.byCategory) == 0 {
		return Match{}, false
	}
	if len(text) > maxEvidenceBytes {
		text = text[len(text)-maxEvidenceBytes:]
	}
	lines := strings.Split(text, "\n")
	for _, c := range t.byCategory {
		for i := len(lines) - 1; i >= 0; i-- {
			line := strings.TrimSpace(lines[i])
			if len(line) > maxLineBytes {
				line = line[:maxLineBytes]
			}
			if line == "" || !c.re.MatchString(line) {
				continue
			}
			return Match{Category: c.category, Pattern: t.which(c.category, line), Line: line}, true
		}
	}
	return Match{}, false
}

// which names the first rule of category c that matches line.
func (t *Table) which(c Category, line string) string {
	for i, p := range t.patterns {
		if p.Category == c && t.compiled[i].MatchString(line) {
			return p.Name
		}
	}
	return ""
}
