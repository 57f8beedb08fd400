package deploy_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"

	"github.com/kvexact/kvexact/containers"
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
// back only by the shipped placeholder certificate, never by a missing tokenizer.
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
			p := materialize(t, dep.Spec.Template.Spec, objs, func(kind, name, key string, v []byte) []byte {
				if kind != "ConfigMap" || key != "gateway.yaml" {
					return v
				}
				s := string(v)
				for _, a := range []string{"0.0.0.0:8080", "0.0.0.0:9090", "127.0.0.1:8080"} {
					s = strings.ReplaceAll(s, a, "127.0.0.1:0")
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
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			ctr, err := h.Start(ctx, containers.Spec{Role: "deployed", Name: o, Image: containers.GatewayImage, Args: args,
				Mounts: p.mounts, Security: p.security, Ready: "gateway ready", ReadyTimeout: 20 * time.Second})
			if err != nil {
				t.Fatalf("the gateway does not start as the %s Deployment runs it: %v", o, err)
			}
			defer ctr.Terminate(context.Background())
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
		})
	}
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
