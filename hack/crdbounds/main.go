// Command crdbounds bounds, in generated CRDs, the values inside embedded Kubernetes types that
// controller-gen's markers cannot reach: every int-or-string (ports, quantities). The API
// server would store an integer beyond int32 there, or a quantity such as 1e-999999999 that
// resource.ParseQuantity takes hours over; Go decoding of either fails. `make manifests` runs
// it after controller-gen and `make verify` checks the output.
//
// Usage: crdbounds FILE...  (rewrites each CRD in place)
package main

import (
	"bytes"
	"fmt"
	"os"

	"sigs.k8s.io/yaml"
)

// quantityPattern is what controller-gen writes for resource.Quantity.
const quantityPattern = `^(\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))(([KMGTPE]i)|[numkMGTPE]|([eE](\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))))?$`

// boundedQuantityPattern is quantityPattern with a decimal exponent of at most two digits and
// no fraction: no real quantity needs more, and parsing cost grows with the exponent.
const boundedQuantityPattern = `^(\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))(([KMGTPE]i)|[numkMGTPE]|([eE](\+|-)?[0-9]{1,2}))?$`

// Bounds of an int-or-string: the integer must fit the int32 of intstr.IntOrString, or for a
// quantity an int64 well inside its range; the string must be short.
const (
	maxLength   = 64
	maxInt32    = 2147483647
	maxQuantity = 1_000_000_000_000_000_000 // 1e18: an exabyte
)

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: crdbounds FILE...")
		os.Exit(2)
	}
	for _, path := range os.Args[1:] {
		if err := rewrite(path); err != nil {
			fmt.Fprintf(os.Stderr, "crdbounds: %s: %v\n", path, err)
			os.Exit(1)
		}
	}
}

func rewrite(path string) error {
	in, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	var crd map[string]any
	if err := yaml.Unmarshal(in, &crd); err != nil {
		return err
	}
	n := bound(crd)
	out, err := yaml.Marshal(crd)
	if err != nil {
		return err
	}
	out = append([]byte("---\n"), out...)
	if bytes.Equal(in, out) {
		return nil
	}
	fmt.Printf("crdbounds: %s: bounded %d int-or-string fields\n", path, n)
	return os.WriteFile(path, out, 0o644)
}

// bound walks a schema and bounds every int-or-string node in it, returning how many.
func bound(v any) int {
	n := 0
	switch v := v.(type) {
	case map[string]any:
		if v["x-kubernetes-int-or-string"] == true {
			limit := maxInt32
			if v["pattern"] == quantityPattern || v["pattern"] == boundedQuantityPattern {
				v["pattern"] = boundedQuantityPattern
				limit = maxQuantity
			}
			v["maxLength"] = maxLength
			v["minimum"] = -limit
			v["maximum"] = limit
			n++
		}
		for _, child := range v {
			n += bound(child)
		}
	case []any:
		for _, child := range v {
			n += bound(child)
		}
	}
	return n
}
