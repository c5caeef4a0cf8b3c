package jsjson

import (
	"encoding"
	"encoding/json"
	"fmt"
	"reflect"
	"sync"
)

// This file bounds the nesting of a Go value before encoding/json writes
// it, so that a payload given as a Go value is refused for the same depth
// as one given as JSON text, and json.Marshal's own recursion stays bounded.

// maxIndirections bounds the pointers and interfaces checkValueDepth follows between
// two arrays or objects: a value can only hold more in a row by pointing to
// itself, which json.Marshal refuses.
const maxIndirections = 100

var (
	mapOfAny          = reflect.TypeFor[map[string]any]()
	sliceOfAny        = reflect.TypeFor[[]any]()
	marshalerType     = reflect.TypeFor[json.Marshaler]()
	textMarshalerType = reflect.TypeFor[encoding.TextMarshaler]()
)

// errPointerLoop reports a value that checkValueDepth gave up on.
var errPointerLoop = fmt.Errorf("more than %d pointers and interfaces in a row (the value points to itself)", maxIndirections)

// CheckValueDepth reports [ErrTooDeep] if json.Marshal would nest x's
// arrays and objects deeper than [MaxDepth], and an error if x points to
// itself through more than maxIndirections pointers and interfaces in a row
// (json.Marshal would refuse it too), without marshalling it. Its cost is
// linear in the size of x where x's type does not bound its depth and
// constant where it does; it is safe for concurrent use.
func CheckValueDepth(x any) error { return checkAnyDepth(x, 0) }

// checkAnyDepth is checkValueDepth for a value held in an interface, with
// the values encoding/json decodes into an any (maps, slices and scalars)
// walked without reflection.
func checkAnyDepth(x any, depth int) error {
	switch x := x.(type) {
	case nil, string, float64, bool, json.Number, int, int64:
		return nil
	case map[string]any:
		if x == nil {
			return nil
		}
		if depth++; depth > MaxDepth {
			return ErrTooDeep
		}
		for _, e := range x {
			if err := checkAnyDepth(e, depth); err != nil {
				return err
			}
		}
		return nil
	case []any:
		if x == nil {
			return nil
		}
		if depth++; depth > MaxDepth {
			return ErrTooDeep
		}
		for _, e := range x {
			if err := checkAnyDepth(e, depth); err != nil {
				return err
			}
		}
		return nil
	}
	return checkValueDepth(reflect.ValueOf(x), depth, 0)
}

// checkValueDepth reports ErrTooDeep if json.Marshal would nest v's arrays
// and objects deeper than MaxDepth, depth being those already open
// around v and hops the pointers and interfaces followed since the
// innermost (errPointerLoop past maxIndirections). It stops at the first
// error, so its own recursion stays bounded; it checks a type once
// (typeDepth) and walks a value only where its type does not bound its
// depth (interfaces, recursive types). A value with a MarshalJSON or
// MarshalText method counts as a scalar: what those write is checked as
// JSON text afterwards.
func checkValueDepth(v reflect.Value, depth, hops int) error {
	if !v.IsValid() {
		return nil
	}
	if d, bounded := typeDepth(v.Type()); bounded {
		if depth+d > MaxDepth {
			return ErrTooDeep
		}
		return nil
	}
	switch v.Kind() {
	case reflect.Interface:
		if v.IsNil() {
			return nil
		}
		if e := v.Elem(); (e.Type() == mapOfAny || e.Type() == sliceOfAny) && e.CanInterface() {
			return checkAnyDepth(e.Interface(), depth)
		}
		fallthrough
	case reflect.Pointer:
		if v.IsNil() {
			return nil
		}
		if hops >= maxIndirections {
			return errPointerLoop
		}
		return checkValueDepth(v.Elem(), depth, hops+1)
	case reflect.Struct:
		if depth++; depth > MaxDepth {
			return ErrTooDeep
		}
		for _, f := range structFields(v.Type()) {
			d := depth
			if f.flat {
				d-- // its fields are members of this object
			}
			if err := checkValueDepth(v.Field(f.index), d, 0); err != nil {
				return err
			}
		}
	case reflect.Map:
		if v.IsNil() {
			return nil
		}
		if depth++; depth > MaxDepth {
			return ErrTooDeep
		}
		for it := v.MapRange(); it.Next(); {
			if err := checkValueDepth(it.Value(), depth, 0); err != nil {
				return err
			}
		}
	case reflect.Slice, reflect.Array:
		if v.Kind() == reflect.Slice && v.IsNil() {
			return nil
		}
		if depth++; depth > MaxDepth {
			return ErrTooDeep
		}
		for i := range v.Len() {
			if err := checkValueDepth(v.Index(i), depth, 0); err != nil {
				return err
			}
		}
	}
	return nil
}

// depthOf is what typeDepth knows of a type.
type depthOf struct {
	depth   int  // the deepest nesting a value of the type encodes to
	bounded bool // whether depth holds for every value of the type
}

// typeDepths caches typeDepth by reflect.Type.
var typeDepths sync.Map

// typeDepth returns the deepest nesting of arrays and objects json.Marshal
// writes for a value of type t, and whether there is such a bound: there is
// none for a type that holds an interface or refers to itself.
func typeDepth(t reflect.Type) (int, bool) {
	if d, ok := typeDepths.Load(t); ok {
		return d.(depthOf).depth, d.(depthOf).bounded
	}
	d := computeTypeDepth(t, map[reflect.Type]bool{})
	typeDepths.Store(t, d)
	return d.depth, d.bounded
}

func computeTypeDepth(t reflect.Type, open map[reflect.Type]bool) depthOf {
	if t.Implements(marshalerType) || t.Implements(textMarshalerType) {
		return depthOf{0, true}
	}
	if open[t] {
		return depthOf{} // recursive
	}
	open[t] = true
	defer delete(open, t)
	switch t.Kind() {
	case reflect.Interface:
		return depthOf{}
	case reflect.Pointer:
		return computeTypeDepth(t.Elem(), open)
	case reflect.Slice:
		if t.Elem().Kind() == reflect.Uint8 && !reflect.PointerTo(t.Elem()).Implements(marshalerType) &&
			!reflect.PointerTo(t.Elem()).Implements(textMarshalerType) {
			return depthOf{0, true} // base64 string
		}
		fallthrough
	case reflect.Array, reflect.Map:
		d := computeTypeDepth(t.Elem(), open)
		return depthOf{d.depth + 1, d.bounded}
	case reflect.Struct:
		most := 0
		for _, f := range structFields(t) {
			d := computeTypeDepth(t.Field(f.index).Type, open)
			if !d.bounded {
				return depthOf{}
			}
			if f.flat {
				d.depth--
			}
			most = max(most, d.depth)
		}
		return depthOf{most + 1, true}
	}
	return depthOf{0, true} // scalars, and what json.Marshal refuses
}

// structField is a field json.Marshal encodes: a member of the struct's
// object, or (flat) an embedded struct whose fields are members of it.
type structField struct {
	index int
	flat  bool
}

// fieldPlans caches structFields by reflect.Type.
var fieldPlans sync.Map

// structFields returns the fields of the struct type t that json.Marshal
// encodes: exported ones and embedded structs, without those tagged "-".
func structFields(t reflect.Type) []structField {
	if fs, ok := fieldPlans.Load(t); ok {
		return fs.([]structField)
	}
	var fs []structField
	for i := range t.NumField() {
		f := t.Field(i)
		tag := f.Tag.Get("json")
		if tag == "-" {
			continue
		}
		ft := f.Type
		if ft.Kind() == reflect.Pointer {
			ft = ft.Elem()
		}
		named := tag != "" && tag[0] != ','
		switch {
		case f.Anonymous && ft.Kind() == reflect.Struct:
			fs = append(fs, structField{i, !named})
		case f.IsExported():
			fs = append(fs, structField{i, false})
		}
	}
	fieldPlans.Store(t, fs)
	return fs
}
