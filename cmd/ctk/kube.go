package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/yaml"

	"github.com/kvexact/kvexact/contracts"
	"github.com/kvexact/kvexact/ctk"
	"github.com/kvexact/kvexact/gateway/discovery"
)

// kubeClients connects to the cluster: the kubeconfig file when given, else the in-cluster
// service account (a certify Job). Tests replace it with client-go's fake clientsets.
var kubeClients = func(kubeconfig string) (kubernetes.Interface, dynamic.Interface, error) {
	var rc *rest.Config
	var err error
	if kubeconfig != "" {
		rc, err = clientcmd.BuildConfigFromFlags("", kubeconfig)
	} else {
		rc, err = rest.InClusterConfig()
	}
	if err != nil {
		return nil, nil, err
	}
	kube, err := kubernetes.NewForConfig(rc)
	if err != nil {
		return nil, nil, err
	}
	dyn, err := dynamic.NewForConfig(rc)
	if err != nil {
		return nil, nil, err
	}
	return kube, dyn, nil
}

// inferencePoolEndpoints lists the InferencePool's ready pods as the pool's endpoints, named and
// addressed exactly as the gateway's discovery names them (so the certificate's entries are the
// rule's endpoints).
func inferencePoolEndpoints(ctx context.Context, kube kubernetes.Interface, dyn dynamic.Interface, namespace, name string) func(ctk.EngineRef) ([]ctk.Endpoint, error) {
	return func(eng ctk.EngineRef) ([]ctk.Endpoint, error) {
		ct, err := contracts.Lookup(eng.Family, eng.Release)
		if err != nil {
			return nil, fmt.Errorf("pool: engine: %w", err)
		}
		eps, err := discovery.Snapshot(ctx, kube, dyn, namespace, name, ct)
		if err != nil {
			return nil, err
		}
		out := make([]ctk.Endpoint, 0, len(eps))
		for _, e := range eps {
			out = append(out, ctk.Endpoint{Name: e.Name, Address: e.Address, Role: e.Role,
				Events: ctk.Events{ZMQ: e.Events.ZMQ, Replay: e.Events.Replay, Topic: e.Events.Topic, Drain: e.Events.Drain}})
		}
		return out, nil
	}
}

// writePool writes the pool the run certified (the profile and the pods it found) as YAML.
func writePool(path string, p *ctk.Pool) error {
	b, err := json.Marshal(p)
	if err != nil {
		return err
	}
	y, err := yaml.JSONToYAML(b)
	if err != nil {
		return err
	}
	return os.WriteFile(path, y, 0o644)
}

// writeSecret stores the certificate files of dir in a Secret (created, or its certificate keys
// replaced and the others kept), the volume a
// gateway started with --certificate-watch re-reads on change.
func writeSecret(ctx context.Context, kube kubernetes.Interface, namespace, name, dir string, files []string) error {
	data := map[string][]byte{}
	for _, f := range files {
		b, err := os.ReadFile(filepath.Join(dir, f))
		if err != nil {
			return err
		}
		data[f] = b
	}
	s := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: namespace, Labels: map[string]string{"app.kubernetes.io/managed-by": "ctk-certify"}}, Data: data}
	cur, err := kube.CoreV1().Secrets(namespace).Get(ctx, name, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		_, err = kube.CoreV1().Secrets(namespace).Create(ctx, s, metav1.CreateOptions{})
	case err == nil:
		// Only the certificate keys: the Secret may hold others (the picker's admin token).
		if cur.Data == nil {
			cur.Data = map[string][]byte{}
		}
		for k, v := range data {
			cur.Data[k] = v
		}
		_, err = kube.CoreV1().Secrets(namespace).Update(ctx, cur, metav1.UpdateOptions{})
	}
	if err != nil {
		return fmt.Errorf("secret %s/%s: %w", namespace, name, err)
	}
	return nil
}
