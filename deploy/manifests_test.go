package deploy_test

import (
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation"
	gatewayv1 "sigs.k8s.io/gateway-api/apis/v1"
	"sigs.k8s.io/yaml"

	"github.com/kvexact/kvexact/gateway/rules"
	inferencev1 "github.com/kvexact/kvexact/third_party/gateway-api-inference-extension/api/v1"
)

// kinds maps apiVersion/kind to the Go type a manifest must decode into.
var kinds = map[string]func() any{
	"v1/ConfigMap":                                 func() any { return &corev1.ConfigMap{} },
	"v1/Secret":                                    func() any { return &corev1.Secret{} },
	"v1/Service":                                   func() any { return &corev1.Service{} },
	"v1/ServiceAccount":                            func() any { return &corev1.ServiceAccount{} },
	"v1/PersistentVolumeClaim":                     func() any { return &corev1.PersistentVolumeClaim{} },
	"apps/v1/Deployment":                           func() any { return &appsv1.Deployment{} },
	"batch/v1/Job":                                 func() any { return &batchv1.Job{} },
	"rbac.authorization.k8s.io/v1/Role":            func() any { return &rbacv1.Role{} },
	"rbac.authorization.k8s.io/v1/RoleBinding":     func() any { return &rbacv1.RoleBinding{} },
	"gateway.networking.k8s.io/v1/HTTPRoute":       func() any { return &gatewayv1.HTTPRoute{} },
	"gateway.networking.k8s.io/v1/Gateway":         func() any { return &gatewayv1.Gateway{} },
	"inference.networking.k8s.io/v1/InferencePool": func() any { return &inferencev1.InferencePool{} },
}

// documents splits every YAML file under dir into its documents.
func documents(t *testing.T) map[string][]byte {
	t.Helper()
	files, err := filepath.Glob("*/*.yaml")
	if err != nil || len(files) == 0 {
		t.Fatalf("no manifests found (%v)", err)
	}
	out := map[string][]byte{}
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for i, doc := range regexp.MustCompile(`(?m)^---\s*$`).Split(string(b), -1) {
			if strings.TrimSpace(regexp.MustCompile(`(?m)^#.*$`).ReplaceAllString(doc, "")) == "" {
				continue
			}
			out[f+"#"+string(rune('0'+i))] = []byte(doc)
		}
	}
	return out
}

// TestManifestsDecodeStrictly: every document decodes into its real Go type with unknown fields
// refused, carries a valid name and namespace, and every gateway.yaml inside a ConfigMap loads
// with the gateway's own validation.
func TestManifestsDecodeStrictly(t *testing.T) {
	objs := map[string]any{} // kind/name → object, for the cross-checks below
	for where, doc := range documents(t) {
		var tm metav1.TypeMeta
		if err := yaml.Unmarshal(doc, &tm); err != nil {
			t.Fatalf("%s: %v", where, err)
		}
		mk, ok := kinds[tm.APIVersion+"/"+tm.Kind]
		if !ok {
			t.Fatalf("%s: %s %s is not a kind this test knows (add its Go type)", where, tm.APIVersion, tm.Kind)
		}
		obj := mk()
		if err := yaml.UnmarshalStrict(doc, obj); err != nil {
			t.Fatalf("%s (%s): %v", where, tm.Kind, err)
		}
		var meta struct {
			Metadata metav1.ObjectMeta `json:"metadata"`
		}
		yaml.Unmarshal(doc, &meta)
		if errs := validation.IsDNS1123Subdomain(meta.Metadata.Name); len(errs) > 0 {
			t.Fatalf("%s: metadata.name %q: %v", where, meta.Metadata.Name, errs)
		}
		if meta.Metadata.Namespace != "llm" {
			t.Fatalf("%s: metadata.namespace %q, want llm (every manifest lives in one namespace)", where, meta.Metadata.Namespace)
		}
		objs[tm.Kind+"/"+meta.Metadata.Name] = obj
		if cm, ok := obj.(*corev1.ConfigMap); ok {
			checkGatewayConfig(t, where, cm)
		}
	}
	// The pool names the picker's Service and port; the picker's discovery names the pool.
	pool := objs["InferencePool/llama3"].(*inferencev1.InferencePool)
	ref := pool.Spec.EndpointPickerRef
	svc, ok := objs["Service/"+string(ref.Name)].(*corev1.Service)
	if !ok || svc.Spec.Ports[0].Port != int32(ref.Port.Number) {
		t.Fatalf("endpointPickerRef %s:%d has no matching Service", ref.Name, ref.Port.Number)
	}
	// The route hands the pool exact API paths only (a prefix would pass any path under it).
	for _, r := range objs["HTTPRoute/llama3"].(*gatewayv1.HTTPRoute).Spec.Rules {
		for _, m := range r.Matches {
			if m.Path == nil || m.Path.Type == nil || *m.Path.Type != gatewayv1.PathMatchExact {
				t.Fatalf("HTTPRoute llama3: match %+v is not an Exact path", m.Path)
			}
			if v := *m.Path.Value; v != "/v1/completions" && v != "/v1/chat/completions" && v != "/v1/models" {
				t.Fatalf("HTTPRoute llama3: %s is not a path of the API surface", v)
			}
		}
	}
	dep := objs["Deployment/kvexact-epp"].(*appsv1.Deployment)
	args := strings.Join(dep.Spec.Template.Spec.Containers[0].Args, " ")
	for _, want := range []string{"--epp=:9002", "--discover-pool=llm/llama3", "--discover-rule=chat"} {
		if !strings.Contains(args, want) {
			t.Fatalf("picker args %q lack %s", args, want)
		}
	}
	if dep.Spec.Template.Spec.ServiceAccountName != "kvexact-epp" {
		t.Fatal("the picker must run as the ServiceAccount the Role is bound to")
	}
	// The certify Job certifies the pool the picker discovers and writes the Secret it mounts and
	// watches; its Role may update that Secret and no other.
	job := objs["Job/kvexact-certify"].(*batchv1.Job)
	jargs := strings.Join(job.Spec.Template.Spec.Containers[0].Args, " ")
	for _, want := range []string{"--from-inferencepool=" + pool.Name, "--secret=kvexact-epp", "--admit=probe"} {
		if !strings.Contains(jargs, want) {
			t.Fatalf("certify Job args %q lack %s", jargs, want)
		}
	}
	if !strings.Contains(args, "--certificate-watch=") {
		t.Fatalf("picker args %q: the Secret the certify Job writes must be watched", args)
	}
	role := objs["Role/"+job.Spec.Template.Spec.ServiceAccountName].(*rbacv1.Role)
	for _, r := range role.Rules {
		if slices.Contains(r.Resources, "secrets") && !slices.Equal(r.ResourceNames, []string{"kvexact-epp"}) {
			t.Fatalf("the certify Job's Role reaches secrets %v, want only kvexact-epp", r.ResourceNames)
		}
	}
	model := objs["Deployment/llama3"].(*appsv1.Deployment)
	for k, v := range pool.Spec.Selector.MatchLabels {
		if model.Spec.Template.Labels[string(k)] != string(v) {
			t.Fatalf("the pool selects %s=%s; the model server pods are labelled %v", k, v, model.Spec.Template.Labels)
		}
	}
}

func checkGatewayConfig(t *testing.T, where string, cm *corev1.ConfigMap) {
	t.Helper()
	y, ok := cm.Data["gateway.yaml"]
	if !ok {
		return
	}
	// The admin token file is the Secret's, mounted in the pod; here a temporary one stands in.
	tok := filepath.Join(t.TempDir(), "token")
	os.WriteFile(tok, []byte("test-token\n"), 0o600)
	y = strings.ReplaceAll(y, "/etc/kvexact/admin/token", tok)
	if _, err := rules.Parse([]byte(y)); err != nil {
		t.Fatalf("%s: gateway.yaml: %v", where, err)
	}
}

// TestDashboardMetricsExist: the dashboard is valid JSON and every kvexact metric it queries is
// defined by the code (a renamed metric fails here).
func TestDashboardMetricsExist(t *testing.T) {
	b, err := os.ReadFile("grafana/kvexact-dashboard.json")
	if err != nil {
		t.Fatal(err)
	}
	var d struct {
		UID    string `json:"uid"`
		Panels []struct {
			Title   string `json:"title"`
			Targets []struct {
				Expr string `json:"expr"`
			} `json:"targets"`
		} `json:"panels"`
	}
	if err := json.Unmarshal(b, &d); err != nil || d.UID == "" || len(d.Panels) == 0 {
		t.Fatalf("dashboard: %v (uid %q, %d panels)", err, d.UID, len(d.Panels))
	}
	defined := definedMetrics(t)
	re := regexp.MustCompile(`kvexact_[a-z0-9_]+`)
	for _, p := range d.Panels {
		if len(p.Targets) == 0 {
			t.Fatalf("panel %q queries nothing", p.Title)
		}
		for _, tg := range p.Targets {
			for _, m := range re.FindAllString(tg.Expr, -1) {
				base := strings.TrimSuffix(strings.TrimSuffix(strings.TrimSuffix(m, "_bucket"), "_sum"), "_count")
				if !defined[base] {
					t.Fatalf("panel %q queries %s, which no code defines", p.Title, m)
				}
			}
		}
	}
}

// definedMetrics collects the metric names the module's Go code registers (Name: "kvexact_…").
func definedMetrics(t *testing.T) map[string]bool {
	t.Helper()
	re := regexp.MustCompile(`Name:\s*"(kvexact_[a-z0-9_]+)"`)
	out := map[string]bool{}
	filepath.WalkDir("..", func(path string, e os.DirEntry, err error) error {
		if err != nil || e.IsDir() || !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		b, _ := os.ReadFile(path)
		for _, m := range re.FindAllSubmatch(b, -1) {
			out[string(m[1])] = true
		}
		return nil
	})
	if len(out) < 10 {
		t.Fatalf("found only %d metric definitions: the source walk is broken", len(out))
	}
	return out
}
