package check

import (
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"testing"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"

	"github.com/lifeboat-vm/lifeboat/api/lifeboat/v1alpha1"
)

// The CRDs shipped in manifests/crds are those of the types: the check finds no difference.
func TestShippedCRDsMatchTheTypes(t *testing.T) {
	for _, crd := range CRDs {
		data, err := os.ReadFile(filepath.Join("..", "..", "manifests", "crds", v1alpha1.GroupName+"_"+crd.Name[:len(crd.Name)-len(v1alpha1.GroupName)-1]+".yaml"))
		if err != nil {
			t.Fatal(err)
		}
		var got apiextensionsv1.CustomResourceDefinition
		if err := yaml.Unmarshal(data, &got); err != nil {
			t.Fatal(err)
		}
		got.Status.Conditions = []apiextensionsv1.CustomResourceDefinitionCondition{{Type: apiextensionsv1.Established, Status: apiextensionsv1.ConditionTrue}}
		if r := CRD(crd.Name, &got, crd.Type); r.Status != OK {
			t.Errorf("%s: %s %s", crd.Name, r.Status, r.Message)
		}
	}
}

type sample struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`
	Spec              sampleSpec `json:"spec"`
}

type sampleSpec struct {
	Memory resource.Quantity `json:"memory"`
	Items  []sampleItem      `json:"items,omitempty"`
	Labels map[string]string `json:"labels,omitempty"`
	Data   []byte            `json:"data,omitempty"`
	Ignore string            `json:"-"`
}

type sampleItem struct {
	Name string       `json:"name"`
	When *metav1.Time `json:"when,omitempty"`
}

func object(props map[string]apiextensionsv1.JSONSchemaProps) apiextensionsv1.JSONSchemaProps {
	return apiextensionsv1.JSONSchemaProps{Type: "object", Properties: props}
}

func TestSchemaDiff(t *testing.T) {
	str := apiextensionsv1.JSONSchemaProps{Type: "string"}
	item := object(map[string]apiextensionsv1.JSONSchemaProps{"name": str, "when": str})
	spec := map[string]apiextensionsv1.JSONSchemaProps{
		"memory": {XIntOrString: true},
		"items":  {Type: "array", Items: &apiextensionsv1.JSONSchemaPropsOrArray{Schema: &item}},
		"labels": {Type: "object", AdditionalProperties: &apiextensionsv1.JSONSchemaPropsOrBool{Schema: &str}},
		"data":   str,
	}
	full := func(spec map[string]apiextensionsv1.JSONSchemaProps) *apiextensionsv1.JSONSchemaProps {
		s := object(map[string]apiextensionsv1.JSONSchemaProps{"apiVersion": str, "kind": str, "metadata": {Type: "object"}, "spec": object(spec)})
		return &s
	}
	without := func(key string) map[string]apiextensionsv1.JSONSchemaProps {
		out := map[string]apiextensionsv1.JSONSchemaProps{}
		for k, v := range spec {
			if k != key {
				out[k] = v
			}
		}
		return out
	}
	nested := without("items")
	old := object(map[string]apiextensionsv1.JSONSchemaProps{"name": str})
	nested["items"] = apiextensionsv1.JSONSchemaProps{Type: "array", Items: &apiextensionsv1.JSONSchemaPropsOrArray{Schema: &old}}
	newer := without("")
	newer["extra"] = str
	preserve := true
	for _, tc := range []struct {
		name           string
		schema         *apiextensionsv1.JSONSchemaProps
		missing, extra []string
	}{
		{"the same", full(spec), nil, nil},
		{"a field missing", full(without("memory")), []string{"spec.memory"}, nil},
		{"a list item's field missing", full(nested), []string{"spec.items[].when"}, nil},
		{"a field the type lacks", full(newer), nil, []string{"spec.extra"}},
		{"unknown fields kept", &apiextensionsv1.JSONSchemaProps{Type: "object", XPreserveUnknownFields: &preserve}, nil, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			missing, extra := SchemaDiff(tc.schema, reflect.TypeFor[sample]())
			if !slices.Equal(missing, tc.missing) || !slices.Equal(extra, tc.extra) {
				t.Errorf("missing %v, extra %v; want %v, %v", missing, extra, tc.missing, tc.extra)
			}
		})
	}
}
