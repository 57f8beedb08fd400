package deploy_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"

	"github.com/kvexact/kvexact/containers"
	"github.com/kvexact/kvexact/engines/sim"
	"github.com/kvexact/kvexact/gateway"
	"github.com/kvexact/kvexact/gateway/hub/hubtest"
	"github.com/kvexact/kvexact/gateway/tokenize"
)

// TestContainerAsDeployed runs the project's gateway image the way each overlay's Deployment runs
// it: the user, groups, read-only root, dropped capabilities and every mount with the files, owners
// and modes the kubelet would give them (materialize), all read from the rendered manifest. Only
// addresses change: the listeners move to free loopback ports (the container shares the host's
// network) and the hub endpoint to a local server speaking the hub's file API with the llama3
// tokenizer. The gateway must start, read its admin token (a Secret file) and answer the admin API
// with it, fetch the tokenizer into its cache volume and record the commit — the rule is then held
// back only by the shipped placeholder certificate, never by a missing tokenizer. It is then probed
// as its Deployment's probes ask (probeHealth) and scraped as its annotations say (scrape).
func TestContainerAsDeployed(t *testing.T) {
	if os.Geteuid() != 0 {
		missing(t, "root: the test writes the pod's files owned by root as the kubelet does (run the tests as root, as .ci/run does)")
	}
	tok, err := tokenize.NewPool("").Get("llama3")
	if err != nil {
		missing(t, fmt.Sprintf("the llama3 tokenizer (%v): make tokenizers", err))
	}
	files := map[string][]byte{}
	for _, n := range []string{"tokenizer.json", "tokenizer_config.json"} {
		if files[n], err = os.ReadFile(filepath.Join(tok.Dir(), n)); err != nil {
			t.Fatal(err)
		}
	}
	h := image(t)
	for _, o := range overlays {
		t.Run(o, func(t *testing.T) {
			objs := decodeOverlay(t, o)
			dep := objs["Deployment/kvexact"].(*appsv1.Deployment)
			srv := hubtest.NewServer(t, "meta-llama/Meta-Llama-3-8B-Instruct", files)
			if o == "standalone" {
				// The hub refuses at first (a gated repository, a wrong token): the rule reads
				// tokenizer_missing until the files load by themselves.
				srv.SetToken("not-the-token")
			}
			// One engine the rule can reach (a simulator on the loopback, with ZeroMQ events); the
			// manifest's other endpoints stay where they point, unreachable from here.
			eng, err := sim.New(sim.Config{Family: sim.DefaultFamily, Release: sim.DefaultRelease, Model: "llama3", Tokenizer: tok, ServedModelName: "llama3",
				PublishAddr: "tcp://*:0", PrefillPerToken: time.Microsecond, DecodePerToken: time.Microsecond})
			if err != nil {
				t.Fatal(err)
			}
			if err := eng.Start(context.Background()); err != nil {
				t.Fatal(err)
			}
			defer eng.Close()
			engine := "vllm-0"
			p := materialize(t, dep.Spec.Template.Spec, objs, func(kind, name, key string, v []byte) []byte {
				if kind != "ConfigMap" || key != "gateway.yaml" {
					return v
				}
				s := string(v)
				for _, a := range []string{"0.0.0.0:8080", "0.0.0.0:9090", "0.0.0.0:9091", "127.0.0.1:8080"} {
					s = strings.ReplaceAll(s, a, "127.0.0.1:0")
				}
				s = strings.ReplaceAll(s, "http://vllm-0.vllm.llm.svc.cluster.local:8000", eng.URL())
				s = strings.ReplaceAll(s, "tcp://vllm-0.vllm.llm.svc.cluster.local:5557", eng.PublishAddrs()[0])
				if o == "picker" { // its endpoints come from discovery; the placeholder becomes the engine
					engine = "sim"
					s = strings.Replace(s, `{name: pending, address: "http://127.0.0.1:1", adminDown: true}`,
						`{name: sim, address: "`+eng.URL()+`", events: {zmq: ["`+eng.PublishAddrs()[0]+`"]}}`, 1)
				}
				return []byte(strings.ReplaceAll(s, "https://huggingface.co", srv.URL))
			})
			token := secretValue(t, objs, dep, "/etc/kvexact/secret/admin-token")
			c := dep.Spec.Template.Spec.Containers[0]
			var args []string
			for _, a := range c.Args {
				// The picker's ext_proc port moves to a free one too; its discovery needs a cluster.
				if strings.HasPrefix(a, "--discover-") {
					continue
				}
				args = append(args, strings.Replace(a, "--epp=:9002", "--epp=127.0.0.1:0", 1))
			}
			// The one flag added: the tokenizer retry shortened from 30 s, so the recovery fits a test.
			args = append(args, "--tokenizer-retry=1s")
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			ctr, err := h.Start(ctx, containers.Spec{Role: "deployed", Name: o, Image: containers.GatewayImage, Args: args,
				Mounts: p.mounts, Security: p.security, Ready: "gateway ready", ReadyTimeout: 20 * time.Second})
			if err != nil {
				t.Fatalf("the gateway does not start as the %s Deployment runs it: %v", o, err)
			}
			defer ctr.Terminate(context.Background())
			// An https hub (tokenizers.hub) is verified against the image's CA bundle.
			if ca, err := ctr.ReadFile(ctx, containers.CABundle); err != nil || !bytes.Contains(ca, []byte("BEGIN CERTIFICATE")) {
				t.Fatalf("the image has no CA bundle at %s (%d bytes): %v", containers.CABundle, len(ca), err)
			}
			lines, err := ctr.ReadyLines(ctx)
			if err != nil || len(lines) == 0 {
				t.Fatalf("no ready line: %v", err)
			}
			admin := ""
			for _, f := range strings.Fields(lines[len(lines)-1]) {
				admin, _ = strings.CutPrefix(f, "admin=")
				if admin != "" && admin != f {
					break
				}
				admin = ""
			}
			if o == "standalone" {
				tokenizerMissing(t, ctx, lines[len(lines)-1], srv)
			}
			var st gateway.Status
			deadline := time.Now().Add(30 * time.Second)
			for {
				st, err = status(ctx, admin, token)
				if err == nil && len(st.Rules) == 1 && st.Rules[0].Exact.Code != "tokenizer" {
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("the rule's tokenizer never loaded from the hub into the pod's cache volume: %+v, %v", st.Rules, err)
				}
				time.Sleep(200 * time.Millisecond)
			}
			ex := st.Rules[0].Exact
			if ex.Code != "no_certificate" && ex.Code != "no_endpoint_certified" || ex.Tokenizer == nil || ex.Tokenizer.Commit != srv.Commit {
				t.Fatalf("rule state in the pod: %+v (tokenizer %+v); want it held back only by the placeholder certificate, the tokenizer at %s", ex, ex.Tokenizer, srv.Commit)
			}
			client := ""
			if f := strings.Fields(lines[len(lines)-1]); len(f) > 0 {
				client, _ = strings.CutPrefix(f[len(f)-1], "listeners=")
				client, _, _ = strings.Cut(client, ",")
			}
			probeHealth(t, ctx, ctr, o, client, engine, eng)
			scrape(t, ctx, ctr, engine)
		})
	}
}

// probeHealth checks what the Deployment's probes ask, where they ask it: the standalone gateway's
// /healthz and /readyz on its client listener, the picker's gRPC health on its ext_proc port. Ready
// with the engine serving (the tokenizer fetched, its events connected) although the manifest's
// other endpoints are unreachable; not ready, naming no_ready_endpoint, once that engine is gone;
// alive throughout.
func probeHealth(t *testing.T, ctx context.Context, ctr *containers.Container, overlay, client, engine string, eng *sim.Engine) {
	t.Helper()
	var check func(wantReady bool) error
	switch overlay {
	case "standalone":
		check = func(wantReady bool) error {
			code, body, err := get(ctx, "http://"+client+"/healthz")
			if err != nil || code != 200 || !strings.Contains(body, `"ok"`) {
				return fmt.Errorf("GET /healthz: %d %q %v; want 200 ok", code, body, err)
			}
			code, body, err = get(ctx, "http://"+client+"/readyz")
			if err != nil {
				return err
			}
			var rd gateway.Readiness
			if err := json.Unmarshal([]byte(body), &rd); err != nil || len(rd.Rules) != 1 {
				return fmt.Errorf("GET /readyz: %d %q: %v", code, body, err)
			}
			rr := rd.Rules[0]
			eps := map[string]gateway.EndpointReadiness{}
			for _, e := range rr.Endpoints {
				eps[e.Name] = e
			}
			if rr.Tokenizer != "" || slices.Contains(rr.Reasons, gateway.ReasonTokenizerMissing) {
				return fmt.Errorf("GET /readyz: the tokenizer reads missing: %q", body)
			}
			if eps["vllm-1"].Ready || eps["vllm-1"].Reason == "" {
				return fmt.Errorf("GET /readyz: vllm-1 (unreachable) reads %+v", eps["vllm-1"])
			}
			if wantReady && (code != 200 || !rd.Ready || !rr.Ready || !eps[engine].Ready) ||
				!wantReady && (code != 503 || rd.Ready || !slices.Equal(rr.Reasons, []string{gateway.ReasonNoReadyEndpoint}) || eps[engine].Ready) {
				return fmt.Errorf("GET /readyz: %d %s; want ready %v", code, body, wantReady)
			}
			return nil
		}
	case "picker":
		addr := logAddr(t, ctx, ctr, "endpoint picker listening")
		cc, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			t.Fatal(err)
		}
		defer cc.Close()
		hc := healthpb.NewHealthClient(cc)
		check = func(wantReady bool) error {
			want := map[string]healthpb.HealthCheckResponse_ServingStatus{"liveness": healthpb.HealthCheckResponse_SERVING}
			st := healthpb.HealthCheckResponse_NOT_SERVING
			if wantReady {
				st = healthpb.HealthCheckResponse_SERVING
			}
			for _, svc := range []string{"readiness", "envoy.service.ext_proc.v3.ExternalProcessor", ""} {
				want[svc] = st
			}
			for svc, w := range want {
				r, err := hc.Check(ctx, &healthpb.HealthCheckRequest{Service: svc})
				if err != nil || r.Status != w {
					return fmt.Errorf("gRPC health %q: %v %v; want %v", svc, r.GetStatus(), err, w)
				}
			}
			return nil
		}
	}
	for _, ready := range []bool{true, false} {
		if !ready {
			eng.Close() // the one reachable engine goes away
		}
		deadline := time.Now().Add(30 * time.Second)
		for {
			err := check(ready)
			if err == nil {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s (ready %v): %v", overlay, ready, err)
			}
			time.Sleep(200 * time.Millisecond)
		}
	}
}

// tokenizerMissing: while the hub refuses, /readyz answers 503 naming tokenizer_missing with the
// loader's reason; the hub then lets the pod in and the test goes on to the rule's recovery.
func tokenizerMissing(t *testing.T, ctx context.Context, ready string, srv *hubtest.Server) {
	t.Helper()
	f := strings.Fields(ready)
	client, _ := strings.CutPrefix(f[len(f)-1], "listeners=")
	client, _, _ = strings.Cut(client, ",")
	deadline := time.Now().Add(20 * time.Second)
	for {
		code, body, err := get(ctx, "http://"+client+"/readyz")
		var rd gateway.Readiness
		if err == nil && json.Unmarshal([]byte(body), &rd) == nil && len(rd.Rules) == 1 &&
			code == 503 && slices.Contains(rd.Rules[0].Reasons, gateway.ReasonTokenizerMissing) && rd.Rules[0].Tokenizer != "" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("with the hub refusing, GET /readyz: %d %s %v; want 503 naming tokenizer_missing", code, body, err)
		}
		time.Sleep(200 * time.Millisecond)
	}
	srv.SetToken("")
}

// scrape reads /metrics on the metrics-only listener the Deployment enables, without a token, as a
// Prometheus following the pod's annotations does.
func scrape(t *testing.T, ctx context.Context, ctr *containers.Container, engine string) {
	t.Helper()
	addr := logAddr(t, ctx, ctr, "metrics listening (no token)")
	code, body, err := get(ctx, "http://"+addr+"/metrics")
	if err != nil || code != 200 {
		t.Fatalf("GET /metrics without a token: %d %v", code, err)
	}
	for _, want := range []string{"kvexact_build_info{", `kvexact_endpoint_ready{endpoint="` + engine + `",rule="chat"} 0`, "go_goroutines ", "process_"} {
		if !strings.Contains(body, want) {
			t.Fatalf("GET /metrics lacks %q", want)
		}
	}
}

// logAddr waits for the log line carrying msg and returns its addr attribute.
func logAddr(t *testing.T, ctx context.Context, ctr *containers.Container, msg string) string {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		logs, err := ctr.Logs(ctx)
		if err != nil {
			t.Fatal(err)
		}
		for _, l := range strings.Split(logs, "\n") {
			if !strings.Contains(l, msg) {
				continue
			}
			for _, f := range strings.Fields(l) {
				if a, ok := strings.CutPrefix(f, "addr="); ok {
					return a
				}
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("no log line %q with addr=:\n%s", msg, logs)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func get(ctx context.Context, u string) (int, string, error) {
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b), err
}

// secretValue returns the Secret file the container reads at path (the admin token).
func secretValue(t *testing.T, objs map[string]any, dep *appsv1.Deployment, path string) string {
	t.Helper()
	for _, m := range dep.Spec.Template.Spec.Containers[0].VolumeMounts {
		key, ok := strings.CutPrefix(path, m.MountPath+"/")
		if !ok {
			continue
		}
		for _, v := range dep.Spec.Template.Spec.Volumes {
			if v.Name == m.Name && v.Secret != nil {
				s := objs["Secret/"+v.Secret.SecretName].(*corev1.Secret)
				if b, ok := s.Data[key]; ok {
					return strings.TrimSpace(string(b))
				}
				return strings.TrimSpace(s.StringData[key])
			}
		}
	}
	t.Fatalf("%s is not a Secret file of the Deployment", path)
	return ""
}

func status(ctx context.Context, admin, token string) (gateway.Status, error) {
	var st gateway.Status
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+admin+"/admin/status", nil)
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return st, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 {
		return st, fmt.Errorf("GET /admin/status: %s", resp.Status)
	}
	return st, json.NewDecoder(resp.Body).Decode(&st)
}

// image connects to Docker and builds the gateway image from this checkout (what make images
// builds: one static binary FROM scratch).
func image(t *testing.T) *containers.Harness {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	h, err := containers.Connect(ctx, containers.Options{})
	if errors.Is(err, containers.ErrNoDocker) {
		missing(t, err.Error())
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { h.Close() })
	root, err := containers.ModuleRoot()
	if err != nil {
		t.Fatal(err)
	}
	bins, err := containers.BuildBinaries(ctx, root, t.TempDir(), "gateway")
	if err != nil {
		t.Fatal(err)
	}
	if err := h.BuildImage(ctx, containers.GatewayImage, bins["gateway"]); err != nil {
		t.Fatal(err)
	}
	return h
}

// missing skips naming what is missing, or fails under CI (where .ci/run installs everything).
func missing(t *testing.T, what string) {
	t.Helper()
	if os.Getenv("CI") != "" {
		t.Fatalf("missing: %s", what)
	}
	t.Skipf("missing: %s", what)
}
