package check

import (
	"encoding/json"
	"reflect"
	"slices"
	"strings"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// SchemaDiff compares a served CRD version's schema with the Go type this binary reads and
// writes: missing are the fields the type has and the schema lacks (the API server prunes them,
// so the CRD is older than the binary), extra the fields the schema has and the type lacks (the
// CRD is newer). Paths are JSON paths such as "spec.migrations.allowPause". The objects' metadata
// and the parts of the schema that keep unknown fields are not compared.
func SchemaDiff(schema *apiextensionsv1.JSONSchemaProps, t reflect.Type) (missing, extra []string) {
	var walk func(s *apiextensionsv1.JSONSchemaProps, t reflect.Type, path string)
	walk = func(s *apiextensionsv1.JSONSchemaProps, t reflect.Type, path string) {
		for t.Kind() == reflect.Pointer {
			t = t.Elem()
		}
		if s == nil || leaf(t) || (s.XPreserveUnknownFields != nil && *s.XPreserveUnknownFields) {
			return
		}
		switch t.Kind() {
		case reflect.Slice, reflect.Array:
			if s.Items != nil {
				walk(s.Items.Schema, t.Elem(), path+"[]")
			}
		case reflect.Map:
			if s.AdditionalProperties != nil {
				walk(s.AdditionalProperties.Schema, t.Elem(), path+"{}")
			}
		case reflect.Struct:
			seen := map[string]bool{}
			for name, ft := range fields(t) {
				seen[name] = true
				p, ok := s.Properties[name]
				if !ok {
					missing = append(missing, join(path, name))
					continue
				}
				walk(&p, ft, join(path, name))
			}
			for name := range s.Properties {
				if !seen[name] && !(path == "" && topLevel[name]) {
					extra = append(extra, join(path, name))
				}
			}
		}
	}
	walk(schema, t, "")
	slices.Sort(missing)
	slices.Sort(extra)
	return missing, extra
}

// topLevel are an object's fields the API server owns.
var topLevel = map[string]bool{"apiVersion": true, "kind": true, "metadata": true}

var (
	marshaler = reflect.TypeFor[json.Marshaler]()
	typeMeta  = reflect.TypeFor[metav1.TypeMeta]()
	objMeta   = reflect.TypeFor[metav1.ObjectMeta]()
	listMeta  = reflect.TypeFor[metav1.ListMeta]()
)

// leaf types are scalars in a schema, however Go holds them (a Quantity, a Time, a Duration).
func leaf(t reflect.Type) bool {
	if t.Implements(marshaler) || reflect.PointerTo(t).Implements(marshaler) {
		return true
	}
	switch t.Kind() {
	case reflect.Struct, reflect.Slice, reflect.Array, reflect.Map:
		return t.Kind() == reflect.Slice && t.Elem().Kind() == reflect.Uint8 // []byte is a string
	}
	return true
}

// fields are a struct's JSON fields by name, inlined structs flattened; the API server's
// metadata is left out.
func fields(t reflect.Type) map[string]reflect.Type {
	out := map[string]reflect.Type{}
	for i := range t.NumField() {
		f := t.Field(i)
		if !f.IsExported() || f.Type == typeMeta || f.Type == objMeta || f.Type == listMeta {
			continue
		}
		name, opts, _ := strings.Cut(f.Tag.Get("json"), ",")
		if name == "-" {
			continue
		}
		if name == "" && (f.Anonymous || strings.Contains(opts, "inline")) && f.Type.Kind() == reflect.Struct {
			for n, ft := range fields(f.Type) {
				out[n] = ft
			}
			continue
		}
		if name == "" {
			name = f.Name
		}
		out[name] = f.Type
	}
	return out
}

func join(path, name string) string {
	if path == "" {
		return name
	}
	return path + "." + name
}
