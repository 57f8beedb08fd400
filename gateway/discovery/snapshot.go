package discovery

import (
	"context"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"

	"github.com/kvexact/kvexact/contracts"
	"github.com/kvexact/kvexact/gateway/rules"
	inferencev1 "github.com/kvexact/kvexact/third_party/gateway-api-inference-extension/api/v1"
)

// Snapshot lists an InferencePool's endpoints once, exactly as a running discovery derives them
// (Endpoints): what `ctk certify --from-inferencepool` certifies.
func Snapshot(ctx context.Context, kube kubernetes.Interface, dyn dynamic.Interface, namespace, name string, ct *contracts.Contract) ([]rules.Endpoint, error) {
	u, err := dyn.Resource(PoolResource).Namespace(namespace).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return nil, fmt.Errorf("InferencePool %s/%s: %w", namespace, name, err)
	}
	var pool inferencev1.InferencePool
	if err := runtime.DefaultUnstructuredConverter.FromUnstructuredWithValidation(u.Object, &pool, true); err != nil {
		return nil, fmt.Errorf("InferencePool %s/%s: %w", namespace, name, err)
	}
	list, err := kube.CoreV1().Pods(namespace).List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, fmt.Errorf("pods in %s: %w", namespace, err)
	}
	pods := make([]*corev1.Pod, 0, len(list.Items))
	for i := range list.Items {
		pods = append(pods, &list.Items[i])
	}
	eps, err := Endpoints(&pool, pods, ct)
	if err != nil {
		return nil, err
	}
	if len(eps) == 0 {
		return nil, fmt.Errorf("InferencePool %s/%s: no ready pod matches its selector", namespace, name)
	}
	return eps, nil
}
