package deploy_test

import (
	"fmt"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation"
	gatewayv1 "sigs.k8s.io/gateway-api/apis/v1"
	"sigs.k8s.io/kustomize/api/krusty"
	"sigs.k8s.io/kustomize/kyaml/filesys"
	"sigs.k8s.io/yaml"

	"github.com/kvexact/kvexact/ctk"
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
	"policy/v1/PodDisruptionBudget":                func() any { return &policyv1.PodDisruptionBudget{} },
	"monitoring.coreos.com/v1/ServiceMonitor":      func() any { return &serviceMonitor{} },
}

// serviceMonitor is the part of the Prometheus Operator's ServiceMonitor (monitoring.coreos.com/v1)
// the example uses, field names as the CRD spells them: decoded strictly, a field outside this
// subset fails until it is added here (checked against the CRD's reference).
type serviceMonitor struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata"`
	Spec              struct {
		Selector          metav1.LabelSelector `json:"selector"`
		NamespaceSelector *struct {
			Any        bool     `json:"any,omitempty"`
			MatchNames []string `json:"matchNames,omitempty"`
		} `json:"namespaceSelector,omitempty"`
		Endpoints []struct {
			Port     string `json:"port"`
			Path     string `json:"path,omitempty"`
			Scheme   string `json:"scheme,omitempty"`
			Interval string `json:"interval,omitempty"`
		} `json:"endpoints"`
	} `json:"spec"`
}

// overlays are the two ways of running the gateway, each a Kustomize overlay of base/.
var overlays = []string{"standalone", "picker"}

// render builds an overlay with Kustomize (what kubectl apply -k does) and splits the result into
// its documents, keyed "overlay#n".
func render(t *testing.T, overlay string) map[string][]byte {
	t.Helper()
	k := krusty.MakeKustomizer(krusty.MakeDefaultOptions())
	rm, err := k.Run(filesys.MakeFsOnDisk(), overlay)
	if err != nil {
		t.Fatalf("kustomize build %s: %v", overlay, err)
	}
	out := map[string][]byte{}
	for i, r := range rm.Resources() {
		b, err := r.AsYAML()
		if err != nil {
			t.Fatal(err)
		}
		out[fmt.Sprintf("%s#%d", overlay, i)] = b
	}
	return out
}

// decodeOverlay renders an overlay and decodes every document strictly into its real Go type
// (unknown fields refused), checking names and the namespace; it returns the objects by kind/name.
func decodeOverlay(t *testing.T, overlay string) map[string]any {
	t.Helper()
	objs := map[string]any{}
	for where, doc := range render(t, overlay) {
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
	}
	return objs
}

// TestManifestsDecodeStrictly: both overlays render; every document decodes into its real Go type
// with unknown fields refused and carries a valid name and namespace; each is self-contained (every
// volume, Secret, ConfigMap and ServiceAccount the Deployment names is in the same overlay, and no
// volume needs a claim made elsewhere); its gateway.yaml loads with the gateway's own validation;
// its Services select its pods; and it carries a PodDisruptionBudget and resource requests.
func TestManifestsDecodeStrictly(t *testing.T) {
	for _, o := range overlays {
		objs := decodeOverlay(t, o)
		dep, ok := objs["Deployment/kvexact"].(*appsv1.Deployment)
		if !ok {
			t.Fatalf("%s: no Deployment kvexact", o)
		}
		ps := dep.Spec.Template.Spec
		for k, obj := range objs {
			var spec corev1.PodSpec
			switch x := obj.(type) {
			case *appsv1.Deployment:
				spec = x.Spec.Template.Spec
			case *batchv1.Job:
				spec = x.Spec.Template.Spec
			}
			for _, v := range spec.Volumes {
				if v.PersistentVolumeClaim != nil {
					if _, ok := objs["PersistentVolumeClaim/"+v.PersistentVolumeClaim.ClaimName]; !ok {
						t.Fatalf("%s: %s's volume %s names claim %s, which the overlay does not define", o, k, v.Name, v.PersistentVolumeClaim.ClaimName)
					}
				}
			}
		}
		if sa := ps.ServiceAccountName; sa != "" {
			if _, ok := objs["ServiceAccount/"+sa]; !ok {
				t.Fatalf("%s: the pod runs as ServiceAccount %s, which the overlay does not define", o, sa)
			}
		}
		p := materialize(t, ps, objs, nil) // fails on a volume whose Secret or ConfigMap is missing
		c := ps.Containers[0]
		if c.Resources.Requests.Cpu().IsZero() || c.Resources.Requests.Memory().IsZero() || c.Resources.Limits.Memory().IsZero() {
			t.Fatalf("%s: the gateway container lacks cpu/memory requests or a memory limit: %+v", o, c.Resources)
		}
		pdb, ok := objs["PodDisruptionBudget/kvexact"].(*policyv1.PodDisruptionBudget)
		if !ok || pdb.Spec.Selector == nil {
			t.Fatalf("%s: no PodDisruptionBudget kvexact with a selector", o)
		}
		selects(t, o, "PodDisruptionBudget", pdb.Spec.Selector.MatchLabels, dep.Spec.Template.Labels)
		for k, v := range objs {
			if svc, ok := v.(*corev1.Service); ok {
				selects(t, o, k, svc.Spec.Selector, dep.Spec.Template.Labels)
			}
		}
		var cfg string
		for _, a := range c.Args {
			if v, ok := strings.CutPrefix(a, "--config="); ok {
				cfg = p.hostPath(v)
			}
		}
		b, err := os.ReadFile(cfg)
		if err != nil {
			t.Fatalf("%s: the gateway's --config is not a mounted file: %v", o, err)
		}
		// Paths the configuration names inside the pod (token files) are read from the host files
		// the pod would have there.
		y := regexp.MustCompile(`/etc/kvexact/[A-Za-z0-9_./-]+`).ReplaceAllStringFunc(string(b), func(ctr string) string {
			if h := p.hostPath(ctr); h != "" {
				return h
			}
			return ctr
		})
		rc, err := rules.Parse([]byte(y))
		if err != nil {
			t.Fatalf("%s: gateway.yaml: %v", o, err)
		}
		// The container's named ports are the ports the gateway listens on.
		ports := map[string]int32{}
		for _, cp := range c.Ports {
			ports[cp.Name] = cp.ContainerPort
		}
		want := map[string]string{"admin": rc.Admin.Listen, "metrics": rc.Admin.MetricsListen}
		if o == "standalone" {
			want["http"] = rc.Listen
		}
		for _, a := range c.Args {
			if v, ok := strings.CutPrefix(a, "--epp="); ok {
				want["grpc"] = v
			}
		}
		for name, addr := range want {
			_, port, _ := strings.Cut(addr, ":")
			if fmt.Sprint(ports[name]) != port {
				t.Fatalf("%s: container port %s is %d; the gateway listens on %s", o, name, ports[name], addr)
			}
		}
		// Scrapers find the metrics-only port by the pod's annotations and by the Service
		// kvexact-metrics (what deploy/monitoring's ServiceMonitor selects).
		an := dep.Spec.Template.Annotations
		if an["prometheus.io/scrape"] != "true" || an["prometheus.io/port"] != fmt.Sprint(ports["metrics"]) || an["prometheus.io/path"] != "/metrics" {
			t.Fatalf("%s: pod annotations %v; want prometheus.io/scrape \"true\", port %d (metrics), path /metrics", o, an, ports["metrics"])
		}
		ms, ok := objs["Service/kvexact-metrics"].(*corev1.Service)
		if !ok || len(ms.Spec.Ports) != 1 || ms.Spec.Ports[0].Name != "metrics" || ms.Spec.Ports[0].TargetPort.String() != "metrics" {
			t.Fatalf("%s: no Service kvexact-metrics with one port named metrics targeting the container's metrics port", o)
		}
		probes(t, o, c)
		if o == "picker" {
			checkPicker(t, objs, dep)
			checkCertifyJob(t, objs, rc)
		}
	}
}

// selects fails unless every label of sel is on the pod template.
func selects(t *testing.T, overlay, what string, sel, labels map[string]string) {
	t.Helper()
	if len(sel) == 0 {
		t.Fatalf("%s: %s selects nothing", overlay, what)
	}
	for k, v := range sel {
		if labels[k] != v {
			t.Fatalf("%s: %s selects %s=%s; the gateway's pods are labelled %v", overlay, what, k, v, labels)
		}
	}
}

// probes: the standalone gateway is probed on its client listener's /healthz (liveness) and
// /readyz (readiness); the picker by gRPC health on its ext_proc port.
func probes(t *testing.T, overlay string, c corev1.Container) {
	t.Helper()
	lp, rp := c.LivenessProbe, c.ReadinessProbe
	if lp == nil || rp == nil {
		t.Fatalf("%s: liveness %v, readiness %v: both are needed", overlay, lp, rp)
	}
	switch overlay {
	case "standalone":
		if lp.HTTPGet == nil || lp.HTTPGet.Path != "/healthz" || lp.HTTPGet.Port.String() != "http" ||
			rp.HTTPGet == nil || rp.HTTPGet.Path != "/readyz" || rp.HTTPGet.Port.String() != "http" {
			t.Fatalf("standalone probes: liveness %+v, readiness %+v; want /healthz and /readyz on port http", lp.ProbeHandler, rp.ProbeHandler)
		}
	case "picker":
		if lp.GRPC == nil || lp.GRPC.Port != 9002 || rp.GRPC == nil || rp.GRPC.Port != 9002 {
			t.Fatalf("picker probes: liveness %+v, readiness %+v; want gRPC health on 9002", lp.ProbeHandler, rp.ProbeHandler)
		}
	}
}

// checkPicker: the pool names the picker's Service and port; the picker's discovery names the pool;
// the route hands the pool exact API paths only; the model server's pods are what the pool selects.
func checkPicker(t *testing.T, objs map[string]any, dep *appsv1.Deployment) {
	t.Helper()
	pool := objs["InferencePool/llama3"].(*inferencev1.InferencePool)
	ref := pool.Spec.EndpointPickerRef
	svc, ok := objs["Service/"+string(ref.Name)].(*corev1.Service)
	if !ok || svc.Spec.Ports[0].Port != int32(ref.Port.Number) {
		t.Fatalf("endpointPickerRef %s:%d has no matching Service", ref.Name, ref.Port.Number)
	}
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
	args := strings.Join(dep.Spec.Template.Spec.Containers[0].Args, " ")
	for _, want := range []string{"--epp=:9002", "--discover-pool=llm/llama3", "--discover-rule=chat"} {
		if !strings.Contains(args, want) {
			t.Fatalf("picker args %q lack %s", args, want)
		}
	}
	rb := objs["RoleBinding/kvexact"].(*rbacv1.RoleBinding)
	if sa := dep.Spec.Template.Spec.ServiceAccountName; sa == "" || rb.Subjects[0].Name != sa {
		t.Fatalf("the picker runs as ServiceAccount %q; the Role is bound to %q", sa, rb.Subjects[0].Name)
	}
	// The certify Job certifies the pool the picker discovers and writes the Secret it mounts and
	// watches; its Role may update that Secret and no other.
	job := objs["Job/kvexact-certify"].(*batchv1.Job)
	jargs := strings.Join(job.Spec.Template.Spec.Containers[0].Args, " ")
	for _, want := range []string{"--from-inferencepool=" + pool.Name, "--secret=kvexact", "--admit=probe"} {
		if !strings.Contains(jargs, want) {
			t.Fatalf("certify Job args %q lack %s", jargs, want)
		}
	}
	if !strings.Contains(args, "--certificate-watch=") {
		t.Fatalf("picker args %q: the Secret the certify Job writes must be watched", args)
	}
	role := objs["Role/"+job.Spec.Template.Spec.ServiceAccountName].(*rbacv1.Role)
	for _, r := range role.Rules {
		if slices.Contains(r.Resources, "secrets") && !slices.Equal(r.ResourceNames, []string{"kvexact"}) {
			t.Fatalf("the certify Job's Role reaches secrets %v, want only kvexact", r.ResourceNames)
		}
	}
	model := objs["Deployment/llama3"].(*appsv1.Deployment)
	for k, v := range pool.Spec.Selector.MatchLabels {
		if model.Spec.Template.Labels[string(k)] != string(v) {
			t.Fatalf("the pool selects %s=%s; the model server pods are labelled %v", k, v, model.Spec.Template.Labels)
		}
	}
	for k, v := range dep.Spec.Template.Labels {
		if model.Spec.Template.Labels[k] == v {
			t.Fatalf("the model server's pods carry the picker's label %s=%s: its Services would send to them", k, v)
		}
	}
}

// TestServiceMonitor: deploy/monitoring renders and decodes strictly, and its ServiceMonitor
// selects the metrics Service of either overlay by a port that Service names.
func TestServiceMonitor(t *testing.T) {
	mon := decodeOverlay(t, "monitoring")
	sm, ok := mon["ServiceMonitor/kvexact"].(*serviceMonitor)
	if !ok || len(sm.Spec.Endpoints) == 0 {
		t.Fatalf("deploy/monitoring: no ServiceMonitor kvexact with an endpoint: %v", mon)
	}
	for _, o := range overlays {
		objs := decodeOverlay(t, o)
		var hit []string
		for k, v := range objs {
			svc, ok := v.(*corev1.Service)
			if !ok {
				continue
			}
			sel := true
			for lk, lv := range sm.Spec.Selector.MatchLabels {
				sel = sel && svc.Labels[lk] == lv
			}
			if sel {
				hit = append(hit, k)
			}
		}
		if !slices.Equal(hit, []string{"Service/kvexact-metrics"}) {
			t.Fatalf("%s: the ServiceMonitor selects %v; want Service/kvexact-metrics alone", o, hit)
		}
		svc := objs["Service/kvexact-metrics"].(*corev1.Service)
		for _, ep := range sm.Spec.Endpoints {
			if !slices.ContainsFunc(svc.Spec.Ports, func(p corev1.ServicePort) bool { return p.Name == ep.Port }) || ep.Path != "/metrics" {
				t.Fatalf("%s: ServiceMonitor endpoint port %q path %q; the Service names ports %v", o, ep.Port, ep.Path, svc.Spec.Ports)
			}
		}
	}
}

// checkCertifyJob: the certify Job runs from its own volumes (no claim made elsewhere), its
// profile loads with ctk's own validation from the files the pod would have, and it fetches the
// tokenizer from the hub, repository and revision the picker's gateway.yaml names, into a writable
// emptyDir. The signing key is the operator's (ctk keygen) and never shipped: a stand-in takes its
// place here.
func checkCertifyJob(t *testing.T, objs map[string]any, rc *rules.Config) {
	t.Helper()
	job := objs["Job/kvexact-certify"].(*batchv1.Job)
	ps := job.Spec.Template.Spec
	withKey := map[string]any{"Secret/kvexact-certify-key": &corev1.Secret{StringData: map[string]string{"ca.key": "stand-in"}}}
	for k, v := range objs {
		withKey[k] = v
	}
	p := materialize(t, ps, withKey, nil)
	var pool string
	for _, a := range ps.Containers[0].Args {
		if v, ok := strings.CutPrefix(a, "--pool="); ok {
			pool = p.hostPath(v)
		}
	}
	b, err := os.ReadFile(pool)
	if err != nil {
		t.Fatalf("certify Job: --pool is not a mounted file: %v", err)
	}
	y := regexp.MustCompile(`/etc/kvexact-certify/[A-Za-z0-9_./-]+`).ReplaceAllStringFunc(string(b), func(ctr string) string {
		if h := p.hostPath(ctr); h != "" {
			return h
		}
		return ctr
	})
	cp, err := ctk.ParsePool([]byte(y + "endpoints: [{name: e, address: \"http://127.0.0.1:1\", events: {zmq: [\"tcp://127.0.0.1:2\"]}}]\n"))
	if err != nil {
		t.Fatalf("certify Job: profile.yaml: %v", err)
	}
	jh, gh := cp.Tokenizers.Hub, rc.Tokenizers.Hub
	if jh == nil || gh == nil || jh.Endpoint != gh.Endpoint || jh.Models[cp.Model] != gh.Models[cp.Model] {
		t.Fatalf("certify Job: tokenizers.hub %+v; the picker's gateway.yaml fetches %+v", jh, gh)
	}
	cache := p.hostPath(jh.CacheDir)
	if cache == "" {
		t.Fatalf("certify Job: tokenizers.hub.cacheDir %s is not on a mounted volume (the root filesystem is read-only)", jh.CacheDir)
	}
	for _, m := range ps.Containers[0].VolumeMounts {
		if strings.HasPrefix(jh.CacheDir+"/", m.MountPath+"/") && m.ReadOnly {
			t.Fatalf("certify Job: tokenizers.hub.cacheDir %s is on the read-only mount %s", jh.CacheDir, m.MountPath)
		}
	}
}

// TestActivePassiveOverlay: deploy/picker-active-passive is the picker overlay whose replicas
// compete for one Lease: each names itself by its pod, and the picker's service account may hold
// that Lease and no other.
func TestActivePassiveOverlay(t *testing.T) {
	objs := decodeOverlay(t, "picker-active-passive")
	dep := objs["Deployment/kvexact"].(*appsv1.Deployment)
	c := dep.Spec.Template.Spec.Containers[0]
	args := strings.Join(c.Args, " ")
	if !strings.Contains(args, "--epp-leader-lease=llm/kvexact-picker") || !strings.Contains(args, "--epp=") {
		t.Fatalf("active-passive picker args %q lack the Lease or --epp", args)
	}
	if dep.Spec.Replicas == nil || *dep.Spec.Replicas < 2 {
		t.Fatalf("active-passive needs at least 2 replicas, has %v", dep.Spec.Replicas)
	}
	if len(c.Env) == 0 || c.Env[0].Name != "POD_NAME" || c.Env[0].ValueFrom == nil || c.Env[0].ValueFrom.FieldRef == nil || c.Env[0].ValueFrom.FieldRef.FieldPath != "metadata.name" {
		t.Fatalf("the Lease identity must be the pod's name (POD_NAME from metadata.name), env %+v", c.Env)
	}
	rb := objs["RoleBinding/kvexact-leader"].(*rbacv1.RoleBinding)
	if rb.Subjects[0].Name != dep.Spec.Template.Spec.ServiceAccountName || rb.RoleRef.Name != "kvexact-leader" {
		t.Fatalf("the Lease Role is bound to %q, the picker runs as %q", rb.Subjects[0].Name, dep.Spec.Template.Spec.ServiceAccountName)
	}
	role := objs["Role/kvexact-leader"].(*rbacv1.Role)
	for _, r := range role.Rules {
		if !slices.Equal(r.Resources, []string{"leases"}) {
			t.Fatalf("the Lease Role reaches %v", r.Resources)
		}
		if !slices.Contains(r.Verbs, "create") && !slices.Equal(r.ResourceNames, []string{"kvexact-picker"}) {
			t.Fatalf("the Lease Role may %v Leases %v, want only kvexact-picker", r.Verbs, r.ResourceNames)
		}
	}
}
