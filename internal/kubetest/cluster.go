package kubetest

import (
	"context"
	"encoding/json"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic"
	dynfake "k8s.io/client-go/dynamic/fake"
	"k8s.io/client-go/kubernetes"
	kubefake "k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/util/retry"

	inferencev1 "github.com/kvexact/kvexact/third_party/gateway-api-inference-extension/api/v1"
)

// Cluster is what a test body talks to: client-go's fake clientsets or the real API server, and
// a namespace of the test's own. The methods write objects the way both accept (status through
// the status subresource, changes as patches), so one body runs against either.
type Cluster struct {
	Name      string       // "fake" or "apiserver"
	Config    *rest.Config // the API server's (nil for the fake clientsets)
	Kube      kubernetes.Interface
	Dynamic   dynamic.Interface
	Namespace string
}

// InferencePoolResource is the InferencePool's API resource (its CRD is installed in the server).
var InferencePoolResource = schema.GroupVersionResource{Group: inferencev1.GroupName, Version: "v1", Resource: "inferencepools"}

// Fake is a cluster of client-go's fake clientsets that also serve InferencePools (kept
// unstructured, as a real API server's answers are).
func Fake(namespace string) Cluster {
	dyn := dynfake.NewSimpleDynamicClientWithCustomListKinds(runtime.NewScheme(), map[schema.GroupVersionResource]string{InferencePoolResource: "InferencePoolList"})
	return Cluster{Name: "fake", Kube: kubefake.NewClientset(), Dynamic: dyn, Namespace: namespace}
}

// Real is a cluster on the package's API server (Shared), in a namespace of t's own.
func Real(t testing.TB) Cluster {
	t.Helper()
	s := Shared(t)
	return Cluster{Name: "apiserver", Config: s.Config, Kube: s.Kube, Dynamic: s.Dynamic, Namespace: s.Namespace(t)}
}

// Each runs body as a subtest against the fake clientsets (in namespace fakeNamespace) and
// against the real API server (skipped, or failed under CI=true, when it is not built).
func Each(t *testing.T, fakeNamespace string, body func(t *testing.T, c Cluster)) {
	t.Run("fake", func(t *testing.T) { body(t, Fake(fakeNamespace)) })
	t.Run("apiserver", func(t *testing.T) { body(t, Real(t)) })
}

// CreatePod creates the pod in the cluster's namespace and then writes its status, as the
// kubelet would (a real API server ignores the status of a created object).
func (c Cluster) CreatePod(ctx context.Context, p *corev1.Pod) (*corev1.Pod, error) {
	p = p.DeepCopy()
	p.Namespace = c.Namespace
	if len(p.Spec.Containers) == 0 {
		p.Spec.Containers = []corev1.Container{{Name: "engine", Image: "engine.invalid/engine:test"}}
	}
	status := p.Status
	created, err := c.Kube.CoreV1().Pods(c.Namespace).Create(ctx, p, metav1.CreateOptions{})
	if err != nil {
		return nil, err
	}
	created.Status = status
	return c.Kube.CoreV1().Pods(c.Namespace).UpdateStatus(ctx, created, metav1.UpdateOptions{})
}

// SetPodStatus changes a pod's status through the status subresource (read, change, write; again
// on a conflict).
func (c Cluster) SetPodStatus(ctx context.Context, name string, change func(*corev1.PodStatus)) error {
	return retry.RetryOnConflict(retry.DefaultRetry, func() error {
		p, err := c.Kube.CoreV1().Pods(c.Namespace).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		change(&p.Status)
		_, err = c.Kube.CoreV1().Pods(c.Namespace).UpdateStatus(ctx, p, metav1.UpdateOptions{})
		return err
	})
}

// SetPodLabels replaces a pod's labels.
func (c Cluster) SetPodLabels(ctx context.Context, name string, labels map[string]string) error {
	patch, _ := json.Marshal(map[string]any{"metadata": map[string]any{"labels": labels}})
	_, err := c.Kube.CoreV1().Pods(c.Namespace).Patch(ctx, name, types.MergePatchType, patch, metav1.PatchOptions{})
	return err
}

// DeletePod deletes a pod at once (no kubelet would finish a graceful deletion).
func (c Cluster) DeletePod(ctx context.Context, name string) error {
	zero := int64(0)
	return c.Kube.CoreV1().Pods(c.Namespace).Delete(ctx, name, metav1.DeleteOptions{GracePeriodSeconds: &zero})
}

// CreateInferencePool creates the pool in the cluster's namespace.
func (c Cluster) CreateInferencePool(ctx context.Context, p *inferencev1.InferencePool) error {
	p = p.DeepCopy()
	p.Namespace = c.Namespace
	p.TypeMeta = metav1.TypeMeta{APIVersion: inferencev1.GroupName + "/v1", Kind: "InferencePool"}
	u, err := runtime.DefaultUnstructuredConverter.ToUnstructured(p)
	if err != nil {
		return err
	}
	_, err = c.Dynamic.Resource(InferencePoolResource).Namespace(c.Namespace).Create(ctx, &unstructured.Unstructured{Object: u}, metav1.CreateOptions{})
	return err
}

// SetInferencePoolPorts replaces the pool's target ports.
func (c Cluster) SetInferencePoolPorts(ctx context.Context, name string, ports []inferencev1.Port) error {
	patch, _ := json.Marshal(map[string]any{"spec": map[string]any{"targetPorts": ports}})
	_, err := c.Dynamic.Resource(InferencePoolResource).Namespace(c.Namespace).Patch(ctx, name, types.MergePatchType, patch, metav1.PatchOptions{})
	return err
}
