package kvbench

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"text/template"
	"time"

	"github.com/kvexact/kvexact/deploy"
)

// envoyRoundRobin is Envoy alone in front of the upstreams: what a user deploys without a
// picker. One listener, one static round-robin cluster over the same upstreams nginx uses,
// HTTP/1.1 to them (Envoy pools its upstream connections), no retries.
func envoyRoundRobin(admin, listen int, ups []string) string {
	var eps strings.Builder
	for _, a := range ups {
		host, port, _ := strings.Cut(a, ":")
		fmt.Fprintf(&eps, "              - endpoint: {address: {socket_address: {address: %s, port_value: %s}}}\n", host, port)
	}
	return fmt.Sprintf(`admin:
  address: {socket_address: {address: 127.0.0.1, port_value: %d}}
static_resources:
  listeners:
    - name: rr
      address: {socket_address: {address: 127.0.0.1, port_value: %d}}
      filter_chains:
        - filters:
            - name: envoy.filters.network.http_connection_manager
              typed_config:
                "@type": type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager
                stat_prefix: rr
                route_config:
                  virtual_hosts:
                    - name: pool
                      domains: ["*"]
                      routes:
                        - match: {prefix: /}
                          route: {cluster: pool, timeout: 300s}
                http_filters:
                  - name: envoy.filters.http.router
                    typed_config:
                      "@type": type.googleapis.com/envoy.extensions.filters.http.router.v3.Router
  clusters:
    - name: pool
      type: STATIC
      lb_policy: ROUND_ROBIN
      connect_timeout: 2s
      load_assignment:
        cluster_name: pool
        endpoints:
          - lb_endpoints:
%s`, admin, listen, eps.String())
}

// startEnvoyTargets starts the "envoy" and "envoy+picker" targets: the picker is a second gateway
// process serving --epp (rule rr over the same upstreams), in its own process group, so a round's
// CPU time for envoy+picker is Envoy's plus the picker's and nothing of the standalone gateway's.
func startEnvoyTargets(ctx context.Context, o ProxyOptions, ups []string, dir string, targets map[string]proxyTarget, procs map[string]*groupProc, ov *Overhead) error {
	if v, err := exec.Command(o.Envoy, "--version").Output(); err == nil {
		ov.Envoy = strings.TrimSpace(string(v))
	}
	pdir := filepath.Join(dir, "picker")
	if err := os.MkdirAll(pdir, 0o755); err != nil {
		return err
	}
	pport, err := freePort()
	if err != nil {
		return err
	}
	picker, _, err := startGateway(ctx, o.Gateway, ups, pdir, o.Log, "--epp", fmt.Sprintf("127.0.0.1:%d", pport))
	if err != nil {
		return fmt.Errorf("picker: %w", err)
	}
	procs["picker"] = picker
	pickers := map[string]*groupProc{"envoy+picker": picker}
	start := func(name, config string, admin, listen int) error {
		cfg := filepath.Join(dir, strings.ReplaceAll(name, "+", "-")+".yaml")
		if err := os.WriteFile(cfg, []byte(config), 0o644); err != nil {
			return err
		}
		tail := &tailBuffer{max: 4096}
		cmd := exec.Command(o.Envoy, "-c", cfg, "--concurrency", fmt.Sprint(ThisMachine().Cores), "--base-id", fmt.Sprint(admin),
			"-l", "error", "--disable-hot-restart")
		cmd.Stderr = tail
		p, err := startGroup(name, cmd, tail)
		if err != nil {
			return err
		}
		procs[name] = p
		for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(50 * time.Millisecond) {
			if resp, err := http.Get(fmt.Sprintf("http://127.0.0.1:%d/ready", admin)); err == nil {
				resp.Body.Close()
				if resp.StatusCode == http.StatusOK {
					break
				}
			}
			if gone, _ := p.exited(); gone || time.Now().After(deadline) || ctx.Err() != nil {
				return p.explain(fmt.Errorf("%s not ready", name))
			}
		}
		pgids := []int{p.pgid}
		if pk := pickers[name]; pk != nil {
			pgids = append(pgids, pk.pgid)
		}
		targets[name] = proxyTarget{url: fmt.Sprintf("http://127.0.0.1:%d", listen), pgids: pgids, admin: fmt.Sprintf("http://127.0.0.1:%d", admin)}
		return nil
	}
	ports := make([]int, 4)
	for i := range ports {
		if ports[i], err = freePort(); err != nil {
			return err
		}
	}
	if err := start("envoy", envoyRoundRobin(ports[0], ports[1], ups), ports[0], ports[1]); err != nil {
		return err
	}
	tmpl, err := template.New("envoy").Option("missingkey=error").Parse(deploy.EnvoyTemplate)
	if err != nil {
		return err
	}
	var b bytes.Buffer
	if err := tmpl.Execute(&b, map[string]any{"AdminPort": ports[2], "ListenAddress": "127.0.0.1", "ListenPort": ports[3], "PickerAddress": "127.0.0.1", "PickerPort": pport}); err != nil {
		return err
	}
	if err := start("envoy+picker", b.String(), ports[2], ports[3]); err != nil {
		return err
	}
	// The minimal picker behind its own Envoy, the same template.
	mp, err := startMinPicker(ctx, o, ups, dir)
	if err != nil {
		return fmt.Errorf("minimal picker: %w", err)
	}
	procs["minpicker"] = mp.proc
	pickers["envoy+minpicker"] = mp.proc
	var madmin, mlisten int
	if madmin, err = freePort(); err != nil {
		return err
	}
	if mlisten, err = freePort(); err != nil {
		return err
	}
	b.Reset()
	if err := tmpl.Execute(&b, map[string]any{"AdminPort": madmin, "ListenAddress": "127.0.0.1", "ListenPort": mlisten, "PickerAddress": "127.0.0.1", "PickerPort": mp.port}); err != nil {
		return err
	}
	if err := start("envoy+minpicker", b.String(), madmin, mlisten); err != nil || o.Baseline == "" {
		return err
	}
	// With a baseline gateway build, its picker behind its own Envoy joins the same rounds.
	bdir := filepath.Join(dir, "picker-baseline")
	if err := os.MkdirAll(bdir, 0o755); err != nil {
		return err
	}
	bport, err := freePort()
	if err != nil {
		return err
	}
	bpicker, _, err := startGateway(ctx, o.Baseline, ups, bdir, o.Log, "--epp", fmt.Sprintf("127.0.0.1:%d", bport))
	if err != nil {
		return fmt.Errorf("baseline picker: %w", err)
	}
	procs["picker-baseline"] = bpicker
	name := "envoy+" + o.BaselineName
	pickers[name] = bpicker
	var admin, listen int
	if admin, err = freePort(); err != nil {
		return err
	}
	if listen, err = freePort(); err != nil {
		return err
	}
	if o.BaselineEnvoyTemplate != "" {
		src, err := os.ReadFile(o.BaselineEnvoyTemplate)
		if err != nil {
			return err
		}
		if tmpl, err = template.New("envoy-baseline").Option("missingkey=error").Parse(string(src)); err != nil {
			return fmt.Errorf("baseline Envoy template %s: %w", o.BaselineEnvoyTemplate, err)
		}
	}
	b.Reset()
	if err := tmpl.Execute(&b, map[string]any{"AdminPort": admin, "ListenAddress": "127.0.0.1", "ListenPort": listen, "PickerAddress": "127.0.0.1", "PickerPort": bport}); err != nil {
		return err
	}
	return start(name, b.String(), admin, listen)
}

type minPicker struct {
	proc *groupProc
	port int
}

// startMinPicker starts bench/minpicker (built from this module unless ProxyOptions.MinPicker names
// a binary) on a free port, rotating over ups, in its own process group, and waits until it
// accepts connections.
func startMinPicker(ctx context.Context, o ProxyOptions, ups []string, dir string) (minPicker, error) {
	bin := o.MinPicker
	if bin == "" {
		bin = filepath.Join(dir, "minpicker")
		out, err := exec.CommandContext(ctx, "go", "build", "-o", bin, "github.com/kvexact/kvexact/bench/minpicker").CombinedOutput()
		if err != nil {
			return minPicker{}, fmt.Errorf("go build ./bench/minpicker (%v: %s): build it and pass --min-picker PATH", err, strings.TrimSpace(string(out)))
		}
	}
	port, err := freePort()
	if err != nil {
		return minPicker{}, err
	}
	tail := &tailBuffer{max: 4096}
	cmd := exec.Command(bin, "--listen", fmt.Sprintf("127.0.0.1:%d", port), "--upstreams", strings.Join(ups, ","))
	cmd.Stdout, cmd.Stderr = io.Discard, tail
	p, err := startGroup("minpicker", cmd, tail)
	if err != nil {
		return minPicker{}, err
	}
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		if c, err := net.Dial("tcp", fmt.Sprintf("127.0.0.1:%d", port)); err == nil {
			c.Close()
			return minPicker{proc: p, port: port}, nil
		}
		if gone, _ := p.exited(); gone || time.Now().After(deadline) || ctx.Err() != nil {
			p.stop()
			return minPicker{}, p.explain(fmt.Errorf("minpicker %s not listening on 127.0.0.1:%d", bin, port))
		}
	}
}
