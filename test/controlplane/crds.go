package controlplane

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"time"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apiextensions "k8s.io/apiextensions-apiserver/pkg/client/clientset/clientset"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
)

var getOptions = metav1.GetOptions{}

// InstallCRDs creates (or updates) every CRD in dir and waits until each is Established.
func (cp *ControlPlane) InstallCRDs(ctx context.Context, dir string) error {
	client, err := apiextensions.NewForConfig(cp.Config)
	if err != nil {
		return err
	}
	crds, err := ReadCRDs(dir)
	if err != nil {
		return err
	}
	for _, crd := range crds {
		_, err := client.ApiextensionsV1().CustomResourceDefinitions().Create(ctx, crd, metav1.CreateOptions{})
		if apierrors.IsAlreadyExists(err) {
			existing, getErr := client.ApiextensionsV1().CustomResourceDefinitions().Get(ctx, crd.Name, getOptions)
			if getErr != nil {
				return getErr
			}
			crd.ResourceVersion = existing.ResourceVersion
			_, err = client.ApiextensionsV1().CustomResourceDefinitions().Update(ctx, crd, metav1.UpdateOptions{})
		}
		if err != nil {
			return fmt.Errorf("installing CRD %s: %w", crd.Name, err)
		}
	}
	for _, crd := range crds {
		err := wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
			got, err := client.ApiextensionsV1().CustomResourceDefinitions().Get(ctx, crd.Name, getOptions)
			if err != nil {
				return false, nil
			}
			return Established(got), nil
		})
		if err != nil {
			return fmt.Errorf("CRD %s did not become Established: %w", crd.Name, err)
		}
	}
	return nil
}

// Established reports whether the API server serves a CRD.
func Established(crd *apiextensionsv1.CustomResourceDefinition) bool {
	for _, c := range crd.Status.Conditions {
		if c.Type == apiextensionsv1.Established && c.Status == apiextensionsv1.ConditionTrue {
			return true
		}
	}
	return false
}

// ReadCRDs decodes every CustomResourceDefinition in the YAML files of dir.
func ReadCRDs(dir string) ([]*apiextensionsv1.CustomResourceDefinition, error) {
	files, err := filepath.Glob(filepath.Join(dir, "*.yaml"))
	if err != nil {
		return nil, err
	}
	if len(files) == 0 {
		return nil, fmt.Errorf("no CRDs in %s (run make generate)", dir)
	}
	var crds []*apiextensionsv1.CustomResourceDefinition
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			return nil, err
		}
		dec := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(b), 4096)
		for {
			crd := &apiextensionsv1.CustomResourceDefinition{}
			if err := dec.Decode(crd); err != nil {
				if errors.Is(err, io.EOF) {
					break
				}
				return nil, fmt.Errorf("decoding %s: %w", f, err)
			}
			if crd.Kind == "" {
				continue
			}
			if crd.Kind != "CustomResourceDefinition" {
				return nil, fmt.Errorf("%s holds a %s, not a CustomResourceDefinition", f, crd.Kind)
			}
			crds = append(crds, crd)
		}
	}
	return crds, nil
}
