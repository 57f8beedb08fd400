// Package jinja implements a Jinja template engine purpose-built for LLM
// chat templates.
package jinja

import (
	"encoding/json"
	"fmt"
	"math"
	"math/big"
	"reflect"
	"slices"
	"sort"
	"strings"
	"unicode"
)

// =============================================================================

// Kind represents the type of a template value.
type Kind int

const (
	KindUndefined Kind = iota
	KindNone
	KindBool
	KindInt
	KindFloat
	KindString
	KindList
	KindDict
	KindCallable
	// KindBigInt (kvexact addition) is a Python int outside int64 (*big.Int). It prints, serializes,
	// tests, compares for equality and is truthy as Python's; arithmetic, ordering and numeric filters
	// on it are render errors, never a rounded result.
	KindBigInt
)

// =============================================================================

// Value is a tagged union over JSON-like types used throughout the template
// engine. The v field holds one of: bool, int64, float64, string, *List,
// *Dict, or Callable.
type Value struct {
	kind Kind
	v    any
}

// Undefined returns an undefined value.
func Undefined() Value {
	return Value{kind: KindUndefined}
}

// None returns a none value.
func None() Value {
	return Value{kind: KindNone}
}

// NewBool returns a boolean value.
func NewBool(b bool) Value {
	return Value{kind: KindBool, v: b}
}

// NewInt returns an integer value.
func NewInt(n int64) Value {
	return Value{kind: KindInt, v: n}
}

// NewBigInt returns an integer value beyond int64 (kvexact addition).
func NewBigInt(n *big.Int) Value {
	return Value{kind: KindBigInt, v: new(big.Int).Set(n)}
}

// IsBigInt reports an integer beyond int64.
func (v Value) IsBigInt() bool { return v.kind == KindBigInt }

// NewFloat returns a floating-point value.
func NewFloat(f float64) Value {
	return Value{kind: KindFloat, v: f}
}

// NewString returns a string value.
func NewString(s string) Value {
	return Value{kind: KindString, v: s}
}

// NewList returns a list value containing the provided items.
func NewList(items []Value) Value {
	return Value{kind: KindList, v: &List{Items: items}}
}

// NewDict returns an empty dict value.
func NewDict() Value {
	return Value{kind: KindDict, v: &Dict{Data: make(map[string]Value)}}
}

// NewCallable returns a callable value.
func NewCallable(name string, fn func(args []Value, kwargs map[string]Value) (Value, error)) Value {
	return Value{kind: KindCallable, v: Callable{Name: name, Fn: fn}}
}

// =============================================================================

// IsUndefined reports whether v is undefined.
func (v Value) IsUndefined() bool { return v.kind == KindUndefined }

// IsNone reports whether v is none.
func (v Value) IsNone() bool { return v.kind == KindNone }

// IsBool reports whether v is a boolean.
func (v Value) IsBool() bool { return v.kind == KindBool }

// IsInt reports whether v is an integer.
func (v Value) IsInt() bool { return v.kind == KindInt }

// IsFloat reports whether v is a float.
func (v Value) IsFloat() bool { return v.kind == KindFloat }

// IsNumber reports whether v is an integer or float.
func (v Value) IsNumber() bool { return v.kind == KindInt || v.kind == KindFloat }

// IsString reports whether v is a string.
func (v Value) IsString() bool { return v.kind == KindString }

// IsList reports whether v is a list.
func (v Value) IsList() bool { return v.kind == KindList }

// IsDict reports whether v is a dict.
func (v Value) IsDict() bool { return v.kind == KindDict }

// IsCallable reports whether v is callable.
func (v Value) IsCallable() bool { return v.kind == KindCallable }

// IsTruthy returns the Python-style truthiness of the value.
func (v Value) IsTruthy() bool {
	switch v.kind {
	case KindUndefined:
		return false
	case KindNone:
		return false
	case KindBool:
		return v.v.(bool)
	case KindInt:
		return v.v.(int64) != 0
	case KindFloat:
		return v.v.(float64) != 0.0
	case KindString:
		return len(v.v.(string)) > 0
	case KindList:
		return v.v.(*List).Len() > 0
	case KindDict:
		return v.v.(*Dict).Len() > 0
	case KindCallable:
		return true
	case KindBigInt:
		return v.v.(*big.Int).Sign() != 0
	}

	return false
}

// =============================================================================

// AsBool returns the bool held by v. It panics if v is not a bool.
func (v Value) AsBool() bool { return v.v.(bool) }

// AsInt returns the int64 held by v. It panics if v is not an int.
func (v Value) AsInt() int64 { return v.v.(int64) }

// AsFloat returns the float64 held by v. It panics if v is not a float.
func (v Value) AsFloat() float64 { return v.v.(float64) }

// AsString returns the string held by v. It panics if v is not a string.
func (v Value) AsString() string { return v.v.(string) }

// AsList returns the *List held by v. It panics if v is not a list.
func (v Value) AsList() *List { return v.v.(*List) }

// AsDict returns the *Dict held by v. It panics if v is not a dict.
func (v Value) AsDict() *Dict { return v.v.(*Dict) }

// AsCallable returns the *Callable held by v. It panics if v is not callable.
func (v Value) AsCallable() *Callable {
	c := v.v.(Callable)
	return &c
}

// =============================================================================

// String returns a Python-style string representation of the value.
func (v Value) String() string {
	return v.string(nil)
}

// Track ancestors, not all visited containers: shared references are not cycles.
func (v Value) string(ancestors []any) string {
	switch v.kind {
	case KindUndefined:
		return "Undefined"

	case KindNone:
		return "None"

	case KindBool:
		if v.v.(bool) {
			return "True"
		}
		return "False"

	case KindInt:
		return fmt.Sprintf("%d", v.v.(int64))

	case KindFloat:
		return printValue(v)

	case KindBigInt:
		return v.v.(*big.Int).String()

	case KindString:
		return reprString(v.v.(string))

	case KindList:
		list := v.v.(*List)
		if slices.Contains(ancestors, any(list)) {
			return "[...]"
		}
		ancestors = append(ancestors, list)
		var b strings.Builder
		if list.tuple {
			b.WriteByte('(')
		} else {
			b.WriteByte('[')
		}
		for i, item := range list.Items {
			if i > 0 {
				b.WriteString(", ")
			}
			b.WriteString(item.string(ancestors))
		}
		if list.tuple {
			if list.Len() == 1 {
				b.WriteByte(',')
			}
			b.WriteByte(')')
		} else {
			b.WriteByte(']')
		}
		return b.String()

	case KindDict:
		d := v.v.(*Dict)
		if slices.Contains(ancestors, any(d)) {
			return "{...}"
		}
		ancestors = append(ancestors, d)
		var b strings.Builder
		b.WriteByte('{')
		for i, key := range d.Keys {
			if i > 0 {
				b.WriteString(", ")
			}
			fmt.Fprintf(&b, "%s: %s", reprString(key), d.Data[key].string(ancestors))
		}
		b.WriteByte('}')
		return b.String()

	case KindCallable:
		c := v.v.(Callable)
		return fmt.Sprintf("<callable %s>", c.Name)
	}

	return "Undefined"
}

func reprString(s string) string {
	quote := '\''
	if strings.ContainsRune(s, '\'') && !strings.ContainsRune(s, '"') {
		quote = '"'
	}
	var b strings.Builder
	b.WriteRune(quote)
	for _, r := range s {
		switch {
		case r == quote || r == '\\':
			b.WriteByte('\\')
			b.WriteRune(r)
		case r == '\n':
			b.WriteString(`\n`)
		case r == '\r':
			b.WriteString(`\r`)
		case r == '\t':
			b.WriteString(`\t`)
		case r < 0x100 && !pyPrintable(r):
			fmt.Fprintf(&b, `\x%02x`, r)
		case r < 0x10000 && !pyPrintable(r): // kvexact: Python's repr escapes every non-printable
			fmt.Fprintf(&b, `\u%04x`, r)
		case !pyPrintable(r):
			fmt.Fprintf(&b, `\U%08x`, r)
		default:
			b.WriteRune(r)
		}
	}
	b.WriteRune(quote)
	return b.String()
}

// pyPrintable is str.isprintable for one code point: not in Cc, Cf, Cs, Co, Cn, Zl, Zp, or Zs
// other than the space (kvexact addition).
func pyPrintable(r rune) bool {
	if r == ' ' {
		return true
	}
	if !unicode.In(r, unicode.L, unicode.M, unicode.N, unicode.P, unicode.S, unicode.Z, unicode.C) {
		return false // unassigned (Cn)
	}
	return !unicode.In(r, unicode.Cc, unicode.Cf, unicode.Cs, unicode.Co, unicode.Zl, unicode.Zp, unicode.Zs)
}

// Equals reports whether v and other hold the same value. Numeric values
// compare across integer, float, and boolean types without rounding integers.
func (v Value) Equals(other Value) bool {
	if v.kind == KindBigInt || other.kind == KindBigInt {
		return bigEquals(v, other)
	}
	if v.kind != other.kind {
		if !(v.IsNumber() || v.IsBool()) || !(other.IsNumber() || other.IsBool()) {
			return false
		}

		// Put a mixed comparison's float on the right.
		if v.IsFloat() {
			v, other = other, v
		}
		if other.IsFloat() {
			f := other.AsFloat()
			// Convert only integral floats in the int64 range. These bounds
			// also reject infinities and NaN without converting them.
			return f >= -0x1p63 && f < 0x1p63 && math.Trunc(f) == f && toInt64(v) == int64(f)
		}

		return toInt64(v) == toInt64(other)
	}

	switch v.kind {
	case KindUndefined, KindNone:
		return true

	case KindBool:
		return v.v.(bool) == other.v.(bool)

	case KindInt:
		return v.v.(int64) == other.v.(int64)

	case KindFloat:
		return v.v.(float64) == other.v.(float64)

	case KindString:
		return v.v.(string) == other.v.(string)

	case KindList:
		a := v.v.(*List)
		b := other.v.(*List)
		if a.tuple != b.tuple {
			return false
		}
		if a == b {
			return true
		}
		if a.Len() != b.Len() {
			return false
		}
		for i := range a.Items {
			if !a.Items[i].Equals(b.Items[i]) {
				return false
			}
		}
		return true

	case KindDict:
		a := v.v.(*Dict)
		b := other.v.(*Dict)
		if a == b {
			return true
		}
		if a.Len() != b.Len() {
			return false
		}
		for _, key := range a.Keys {
			bv, ok := b.Get(key)
			if !ok {
				return false
			}
			if !a.Data[key].Equals(bv) {
				return false
			}
		}
		return true

	case KindCallable:
		return false
	}

	return false
}

// =============================================================================

// List holds an ordered sequence of values.
type List struct {
	Items []Value
	tuple bool
}

// Len returns the number of items in the list.
func (l *List) Len() int { return len(l.Items) }

// Get returns the item at position i. It panics if i is out of range.
func (l *List) Get(i int) Value { return l.Items[i] }

// Append adds a value to the end of the list.
func (l *List) Append(v Value) { l.Items = append(l.Items, v) }

// =============================================================================

// Dict is an ordered map of string keys to values. Insertion order is
// preserved via the Keys slice.
type Dict struct {
	Keys []string
	Data map[string]Value
}

// Get returns the value for key and reports whether it was found.
func (d *Dict) Get(key string) (Value, bool) {
	v, ok := d.Data[key]
	return v, ok
}

// Set inserts or updates a key-value pair. New keys are appended to the
// insertion-order list.
func (d *Dict) Set(key string, val Value) {
	if _, ok := d.Data[key]; !ok {
		d.Keys = append(d.Keys, key)
	}
	d.Data[key] = val
}

// Has reports whether key exists in the dict.
func (d *Dict) Has(key string) bool {
	_, ok := d.Data[key]
	return ok
}

// Len returns the number of entries in the dict.
func (d *Dict) Len() int { return len(d.Keys) }

// OrderedKeys returns the keys in insertion order.
func (d *Dict) OrderedKeys() []string {
	out := make([]string, len(d.Keys))
	copy(out, d.Keys)
	return out
}

// =============================================================================

// Callable represents a named callable function within the template engine.
type Callable struct {
	Name string
	Fn   func(args []Value, kwargs map[string]Value) (Value, error)
}

// =============================================================================

// FromGoValue converts a plain Go value to a Value. Supported source types
// are nil, bool, int, int64, float64, string, []any, map[string]any, and
// []Value. For map[string]any the keys are sorted for deterministic order.
// Unrecognized types produce Undefined.
func FromGoValue(v any) Value {
	switch val := v.(type) {
	case nil:
		return None()

	case bool:
		return NewBool(val)

	case int:
		return NewInt(int64(val))

	case int64:
		return NewInt(val)

	case float64:
		return NewFloat(val)

	case json.Number:
		// json.Number preserves whether the source JSON used a decimal
		// point or exponent. Integers (no '.', 'e', 'E') become Int so
		// that downstream tojson emits them as integers — matching
		// Python json.dumps, which keeps int and float distinct. Without
		// this, a value like 9007199254740991 round-trips as
		// 9.007199254740991e+15 and breaks chat-template tokenization.
		s := string(val)
		if !strings.ContainsAny(s, ".eE") {
			if i, err := val.Int64(); err == nil {
				return NewInt(i)
			}
		}
		if f, err := val.Float64(); err == nil {
			return NewFloat(f)
		}
		return NewString(s)

	case string:
		return NewString(val)

	case []Value:
		items := make([]Value, len(val))
		copy(items, val)
		return NewList(items)

	case []any:
		items := make([]Value, len(val))
		for i, item := range val {
			items[i] = FromGoValue(item)
		}
		return NewList(items)

	case map[string]any:
		d := NewDict()
		dict := d.AsDict()

		keys := make([]string, 0, len(val))
		for k := range val {
			keys = append(keys, k)
		}
		sort.Strings(keys)

		for _, k := range keys {
			dict.Set(k, FromGoValue(val[k]))
		}
		return d
	}

	// Reflection fallback for named types (e.g., []model.D where D is
	// map[string]any). Go's type switch won't match named types against
	// their underlying type, so we use reflect to handle slices and maps
	// whose elements are convertible to any or map[string]any.
	rv := reflect.ValueOf(v)
	switch rv.Kind() {
	case reflect.Slice:
		items := make([]Value, rv.Len())
		for i := range rv.Len() {
			items[i] = FromGoValue(rv.Index(i).Interface())
		}
		return NewList(items)

	case reflect.Map:
		if rv.Type().Key().Kind() == reflect.String {
			d := NewDict()
			dict := d.AsDict()
			iter := rv.MapRange()
			keys := make([]string, 0, rv.Len())
			vals := make(map[string]any, rv.Len())
			for iter.Next() {
				k := iter.Key().String()
				keys = append(keys, k)
				vals[k] = iter.Value().Interface()
			}
			sort.Strings(keys)
			for _, k := range keys {
				dict.Set(k, FromGoValue(vals[k]))
			}
			return d
		}
	}

	return Undefined()
}

// bigEquals compares an integer beyond int64 with another value as Python's == does: equal only to
// the same integer, or to a float of exactly that value.
func bigEquals(a, b Value) bool {
	if a.kind != KindBigInt {
		a, b = b, a
	}
	x := a.v.(*big.Int)
	switch b.kind {
	case KindBigInt:
		return x.Cmp(b.v.(*big.Int)) == 0
	case KindFloat:
		f := b.AsFloat()
		if math.IsInf(f, 0) || math.IsNaN(f) || math.Trunc(f) != f {
			return false
		}
		y, _ := new(big.Float).SetFloat64(f).Int(nil)
		return x.Cmp(y) == 0
	}
	return false // never equal to an int64, a bool or anything else
}

// containsBigInt reports an integer beyond int64 anywhere in v.
func containsBigInt(v Value) bool {
	switch v.kind {
	case KindBigInt:
		return true
	case KindList:
		for _, it := range v.AsList().Items {
			if containsBigInt(it) {
				return true
			}
		}
	case KindDict:
		d := v.AsDict()
		for _, k := range d.Keys {
			if it, _ := d.Get(k); containsBigInt(it) {
				return true
			}
		}
	}
	return false
}
