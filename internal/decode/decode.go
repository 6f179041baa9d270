// Package decode turns objects the API server stored (JSON as maps) into Go API types at a
// bounded cost, naming the first fields Go cannot hold.
//
// A CRD schema admits values that Go decoding refuses or takes unbounded time over: a
// duration beyond time.Duration, an integer beyond int32 in an int-or-string field, a
// quantity such as 1e-999999999 whose parse grows without bound. Decoding one such object in
// a typed list would fail the whole list, and with it every job's watch. Reading objects as
// maps and decoding each one here keeps the failure with the object.
package decode

import (
	"encoding/base64"
	"encoding/json"
	"fmt"
	"math"
	"reflect"
	"strconv"
	"strings"
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apimachinery/pkg/util/validation/field"
)

// MaxErrors bounds the fields one object reports.
const MaxErrors = 8

// Quantity bounds. No resource needs more: the API server's own quantities fit in an int64
// of milli-units, that is 19 digits and an exponent far below 100.
const (
	maxQuantityLen      = 64
	maxQuantityExponent = 99
)

// Into checks obj against out's Go type and then converts it into out, which must be a
// pointer to a struct. The values Go cannot hold are reported by their JSON paths; out is
// left unset then.
func Into(obj map[string]any, out any) field.ErrorList {
	t := reflect.TypeOf(out)
	if t == nil || t.Kind() != reflect.Pointer || t.Elem().Kind() != reflect.Struct {
		return field.ErrorList{field.InternalError(nil, fmt.Errorf("decode: want a pointer to a struct, got %T", out))}
	}
	if errs := Check(obj, t.Elem()); len(errs) > 0 {
		return errs
	}
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(obj, out); err != nil {
		return field.ErrorList{field.Invalid(nil, "(object)", err.Error())}
	}
	return nil
}

// Check reports the values of obj that decoding into t would refuse, or that would cost
// more than a bounded amount to decode. Its cost is linear in the size of obj.
func Check(obj map[string]any, t reflect.Type) field.ErrorList {
	w := &walker{}
	w.value(nil, obj, t)
	return w.errs
}

type walker struct {
	errs field.ErrorList
}

func (w *walker) fail(path *field.Path, v any, msg string) {
	if len(w.errs) < MaxErrors {
		w.errs = append(w.errs, field.Invalid(path, shown(v), msg))
	}
}

// shown keeps a refused value short enough for a condition message.
func shown(v any) any {
	s, ok := v.(string)
	if !ok {
		switch v.(type) {
		case map[string]any, []any:
			return fmt.Sprintf("%T", v)
		}
		return v
	}
	if len(s) > 64 {
		return s[:64] + "…"
	}
	return s
}

var (
	timeType      = reflect.TypeFor[metav1.Time]()
	microTimeType = reflect.TypeFor[metav1.MicroTime]()
	durationType  = reflect.TypeFor[metav1.Duration]()
	quantityType  = reflect.TypeFor[resource.Quantity]()
	intOrStrType  = reflect.TypeFor[intstr.IntOrString]()
	rawExtType    = reflect.TypeFor[runtime.RawExtension]()
	rawJSONType   = reflect.TypeFor[json.RawMessage]()
)

func (w *walker) value(path *field.Path, v any, t reflect.Type) {
	if len(w.errs) >= MaxErrors || v == nil {
		return // null decodes to the zero value
	}
	switch t {
	case timeType:
		w.timestamp(path, v, time.RFC3339)
		return
	case microTimeType:
		w.timestamp(path, v, metav1.RFC3339Micro)
		return
	case durationType:
		w.duration(path, v)
		return
	case quantityType:
		w.quantity(path, v)
		return
	case intOrStrType:
		w.intOrString(path, v)
		return
	case rawExtType, rawJSONType:
		return // kept as raw JSON
	}
	switch t.Kind() {
	case reflect.Pointer:
		w.value(path, v, t.Elem())
	case reflect.Struct:
		m, ok := v.(map[string]any)
		if !ok {
			w.fail(path, v, "must be an object")
			return
		}
		w.object(path, m, t)
	case reflect.Slice:
		if t.Elem().Kind() == reflect.Uint8 {
			s, ok := v.(string)
			if !ok {
				w.fail(path, v, "must be a base64 string")
			} else if _, err := base64.StdEncoding.DecodeString(s); err != nil {
				w.fail(path, v, "must be base64")
			}
			return
		}
		list, ok := v.([]any)
		if !ok {
			w.fail(path, v, "must be a list")
			return
		}
		for i, item := range list {
			w.value(path.Index(i), item, t.Elem())
		}
	case reflect.Map:
		m, ok := v.(map[string]any)
		if !ok {
			w.fail(path, v, "must be an object")
			return
		}
		for k, item := range m {
			w.value(path.Key(k), item, t.Elem())
		}
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		bits := t.Bits()
		w.integer(path, v, -1<<(bits-1), 1<<(bits-1)-1)
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		w.integer(path, v, 0, math.MaxInt64) // unstructured integers are int64
	case reflect.Float32, reflect.Float64:
		switch v.(type) {
		case int64, float64:
		default:
			w.fail(path, v, "must be a number")
		}
	case reflect.String:
		if _, ok := v.(string); !ok {
			w.fail(path, v, "must be a string")
		}
	case reflect.Bool:
		if _, ok := v.(bool); !ok {
			w.fail(path, v, "must be true or false")
		}
	}
}

// object walks the fields of struct type t that m holds; unknown keys are ignored, as the
// converter ignores them.
func (w *walker) object(path *field.Path, m map[string]any, t reflect.Type) {
	for _, f := range fieldsOf(t) {
		if f.inline {
			w.object(path, m, f.typ)
			continue
		}
		if v, ok := m[f.name]; ok {
			w.value(path.Child(f.name), v, f.typ)
		}
	}
}

func (w *walker) integer(path *field.Path, v any, lo, hi int64) {
	switch n := v.(type) {
	case int64:
		if n < lo || n > hi {
			w.fail(path, v, fmt.Sprintf("must be between %d and %d", lo, hi))
		}
	case float64:
		if n != math.Trunc(n) || n < float64(lo) || n > float64(hi) {
			w.fail(path, v, fmt.Sprintf("must be a whole number between %d and %d", lo, hi))
		}
	default:
		w.fail(path, v, "must be a whole number")
	}
}

func (w *walker) timestamp(path *field.Path, v any, layout string) {
	s, ok := v.(string)
	if !ok {
		w.fail(path, v, "must be a time such as 2026-01-02T15:04:05Z")
		return
	}
	if _, err := time.Parse(layout, s); err != nil {
		w.fail(path, v, "must be a time such as 2026-01-02T15:04:05Z")
	}
}

func (w *walker) duration(path *field.Path, v any) {
	s, ok := v.(string)
	if !ok {
		w.fail(path, v, "must be a duration such as 30m")
		return
	}
	if _, err := time.ParseDuration(s); err != nil {
		w.fail(path, v, "must be a duration such as 30m, at most 2562047h")
	}
}

func (w *walker) intOrString(path *field.Path, v any) {
	if _, ok := v.(string); ok {
		return
	}
	w.integer(path, v, math.MinInt32, math.MaxInt32)
}

// quantity refuses what resource.ParseQuantity would refuse, after bounding what makes it
// slow: the length and the decimal exponent.
func (w *walker) quantity(path *field.Path, v any) {
	var s string
	switch n := v.(type) {
	case string:
		s = n
	case int64:
		s = strconv.FormatInt(n, 10)
	case float64:
		s = strconv.FormatFloat(n, 'g', -1, 64)
	default:
		w.fail(path, v, "must be a quantity such as 500m, 64Gi or 1e3")
		return
	}
	if len(s) > maxQuantityLen {
		w.fail(path, v, fmt.Sprintf("must be a quantity of at most %d characters", maxQuantityLen))
		return
	}
	if i := strings.IndexAny(s, "eE"); i >= 0 && i+1 < len(s) && strings.ContainsRune("+-0123456789", rune(s[i+1])) {
		// A decimal exponent (1e3), not the suffix E or Ei (exa, exbi).
		e, err := strconv.Atoi(strings.TrimPrefix(s[i+1:], "+"))
		if err != nil || e > maxQuantityExponent || e < -maxQuantityExponent {
			w.fail(path, v, fmt.Sprintf("must be a quantity with an exponent between -%d and %d", maxQuantityExponent, maxQuantityExponent))
			return
		}
	}
	if _, err := resource.ParseQuantity(s); err != nil {
		w.fail(path, v, "must be a quantity such as 500m, 64Gi or 1e3")
	}
}

type structField struct {
	name   string
	typ    reflect.Type
	inline bool
}

var fieldCache sync.Map // reflect.Type → []structField

// fieldsOf lists the JSON fields of struct type t as encoding/json names them.
func fieldsOf(t reflect.Type) []structField {
	if f, ok := fieldCache.Load(t); ok {
		return f.([]structField)
	}
	var out []structField
	for i := range t.NumField() {
		f := t.Field(i)
		if !f.IsExported() {
			continue
		}
		tag := f.Tag.Get("json")
		if tag == "-" {
			continue
		}
		name, opts, _ := strings.Cut(tag, ",")
		ft := f.Type
		if (f.Anonymous && name == "") || strings.Contains(","+opts+",", ",inline,") {
			for ft.Kind() == reflect.Pointer {
				ft = ft.Elem()
			}
			if ft.Kind() == reflect.Struct {
				out = append(out, structField{typ: ft, inline: true})
				continue
			}
		}
		if name == "" {
			name = f.Name
		}
		out = append(out, structField{name: name, typ: f.Type})
	}
	fieldCache.Store(t, out)
	return out
}
