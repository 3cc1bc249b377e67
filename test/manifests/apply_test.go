package manifests

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/discovery/cached/memory"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/restmapper"
	"k8s.io/client-go/tools/cache"

	"github.com/lifeboat-vm/lifeboat/test/controlplane"
)

// fieldManager is who applies the manifests, as kubectl apply --server-side would be.
const fieldManager = "lifeboat-manifests-test"

// installed is the outcome of installing manifests/ once for all tests of the package.
var installed struct {
	once    sync.Once
	objects []*unstructured.Unstructured
	err     error
}

// install renders manifests/ with kubectl's kustomize and applies every object with
// server-side apply, once per package run.
func install(t *testing.T) []*unstructured.Unstructured {
	t.Helper()
	installed.once.Do(func() {
		installed.objects, installed.err = render(context.Background(), "")
		if installed.err == nil {
			installed.err = applyAll(context.Background(), installed.objects)
		}
	})
	if installed.err != nil {
		t.Fatalf("installing manifests/: %v", installed.err)
	}
	return installed.objects
}

// render is `kubectl kustomize manifests/<dir>`, decoded.
func render(ctx context.Context, dir string) ([]*unstructured.Unstructured, error) {
	root, err := controlplane.RepoRoot()
	if err != nil {
		return nil, err
	}
	out, err := cluster.Kubectl(ctx, "kustomize", filepath.Join(root, "manifests", dir))
	if err != nil {
		return nil, err
	}
	return decode([]byte(out))
}

func decode(data []byte) ([]*unstructured.Unstructured, error) {
	dec := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(data), 4096)
	var objs []*unstructured.Unstructured
	for {
		obj := &unstructured.Unstructured{}
		if err := dec.Decode(&obj.Object); err != nil {
			if errors.Is(err, io.EOF) {
				return objs, nil
			}
			return nil, err
		}
		if len(obj.Object) > 0 {
			objs = append(objs, obj)
		}
	}
}

// applyAll applies the namespaces and CRDs first and waits until the CRDs are served, as an
// operator applying twice would; then the rest.
func applyAll(ctx context.Context, objs []*unstructured.Unstructured) error {
	var first, rest []*unstructured.Unstructured
	for _, o := range objs {
		if o.GetKind() == "Namespace" || o.GetKind() == "CustomResourceDefinition" {
			first = append(first, o)
		} else {
			rest = append(rest, o)
		}
	}
	a, err := newApplier()
	if err != nil {
		return err
	}
	for _, o := range first {
		if _, err := a.apply(ctx, o); err != nil {
			return err
		}
	}
	if err := waitEstablished(ctx, first); err != nil {
		return err
	}
	a.mapper.Reset()
	for _, o := range rest {
		if _, err := a.apply(ctx, o); err != nil {
			return err
		}
	}
	return nil
}

func waitEstablished(ctx context.Context, objs []*unstructured.Unstructured) error {
	crds := schema.GroupVersionResource{Group: "apiextensions.k8s.io", Version: "v1", Resource: "customresourcedefinitions"}
	client := dynamic.NewForConfigOrDie(cluster.Config).Resource(crds)
	for _, o := range objs {
		if o.GetKind() != "CustomResourceDefinition" {
			continue
		}
		err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
			got, err := client.Get(ctx, o.GetName(), metav1.GetOptions{})
			if err != nil {
				return false, nil
			}
			conds, _, _ := unstructured.NestedSlice(got.Object, "status", "conditions")
			for _, c := range conds {
				c, _ := c.(map[string]any)
				if c["type"] == "Established" && c["status"] == "True" {
					return true, nil
				}
			}
			return false, nil
		})
		if err != nil {
			return fmt.Errorf("CRD %s was not Established: %w", o.GetName(), err)
		}
	}
	return nil
}

type applier struct {
	client dynamic.Interface
	mapper *restmapper.DeferredDiscoveryRESTMapper
}

func newApplier() (*applier, error) {
	client, err := dynamic.NewForConfig(cluster.Config)
	if err != nil {
		return nil, err
	}
	disco := memory.NewMemCacheClient(cluster.Kube.Discovery())
	return &applier{client: client, mapper: restmapper.NewDeferredDiscoveryRESTMapper(disco)}, nil
}

func (a *applier) resource(o *unstructured.Unstructured) (dynamic.ResourceInterface, error) {
	gvk := o.GroupVersionKind()
	mapping, err := a.mapper.RESTMapping(gvk.GroupKind(), gvk.Version)
	if err != nil {
		return nil, err
	}
	if mapping.Scope.Name() == meta.RESTScopeNameNamespace {
		return a.client.Resource(mapping.Resource).Namespace(o.GetNamespace()), nil
	}
	return a.client.Resource(mapping.Resource), nil
}

// apply is server-side apply of one object, without forcing: a conflict is an error.
func (a *applier) apply(ctx context.Context, o *unstructured.Unstructured) (*unstructured.Unstructured, error) {
	r, err := a.resource(o)
	if err != nil {
		return nil, describe(o, err)
	}
	data, err := o.MarshalJSON()
	if err != nil {
		return nil, err
	}
	got, err := r.Patch(ctx, o.GetName(), types.ApplyPatchType, data, metav1.PatchOptions{FieldManager: fieldManager})
	return got, describe(o, err)
}

func (a *applier) get(ctx context.Context, o *unstructured.Unstructured) (*unstructured.Unstructured, error) {
	r, err := a.resource(o)
	if err != nil {
		return nil, describe(o, err)
	}
	got, err := r.Get(ctx, o.GetName(), metav1.GetOptions{})
	return got, describe(o, err)
}

func describe(o *unstructured.Unstructured, err error) error {
	if err == nil {
		return nil
	}
	return fmt.Errorf("%s %s: %w", o.GetKind(), cache.NewObjectName(o.GetNamespace(), o.GetName()), err)
}
