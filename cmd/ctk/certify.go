package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"

	"github.com/kvexact/kvexact/ctk"
	"github.com/kvexact/kvexact/ctk/certificate"
)

func init() {
	register("certify", "certify a live engine pool (pool.yaml) and write certificate.json, report.txt, junit.xml",
		func(args []string) int {
			ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			return certify(ctx, args, os.Stdout, os.Stderr)
		})
	register("keygen", "write an ed25519 key pair for signing certificates (PREFIX.key, PREFIX.pub)",
		func(args []string) int { return keygen(args, os.Stdout, os.Stderr) })
}

var certifyUsage = `usage: ctk certify --pool pool.yaml [--out DIR] [--valid-for 168h] [--sign-key FILE]
                   [--event-timeout 15s] [--lenient-auto] [-v]
                   [--admit none|probe] [--admit-specs ID,...] [--admit-valid-for DURATION]
                   [--from-inferencepool NAME [--namespace NS] [--kubeconfig FILE]
                    [--write-pool FILE] [--secret NAME]]

Runs the certification specs against every endpoint of the pool — identity, tokenizer parity,
chat-template parity, geometry and hash parity end to end (a probe completion's own KV events),
event-stream semantics — and writes into DIR (default .): certificate.json (the profile digest the
gateway enforces, bound to the endpoints that proved it), report.txt (one line per spec, with the
leg that differs and a fix for each failure), junit.xml and report.json.

The engines must be otherwise idle: the probe clears caches where the family allows it, and a
` + drainedEngines + ` drain must have no other consumer while ctk reads it.

Exit status: 0 every endpoint is certified for what the pool asks of it, 1 otherwise, 2 unusable
input (the message names the field). With binding auto an endpoint must get a binding with no
failing leg: one covered for the router binding while its engine-binding keys failed (a wrong seed)
is reported with the binding it got and the failing legs, and the run exits 1; --lenient-auto
exits 0 for it as before.

--admit probe writes the admission policy for endpoints that join later (a new pod, a moved
one): the gateway runs the same specs on an endpoint of the rule the certificate does not list
and covers it once they pass for the certified profile. --admit-specs lists the spec ids a probe
runs, written into the certificate in full (default: every spec but the cache clear, which an
admission never runs: it would empty a serving engine's cache; the binding specs are always
listed); a gateway refuses a certificate listing a spec its probe cannot run. --admit-valid-for
bounds each admission (default: until the certificate expires). Without --admit the certificate
says admit none: only its own endpoints are covered.

--from-inferencepool NAME certifies the ready pods of that InferencePool (in --namespace,
default "default"; the cluster from --kubeconfig, else the in-cluster service account) instead
of the endpoints the pool file lists: the pool file then gives the staged profile only (model,
tokenizer, engine, seed, …), and each pod × target port is named as the gateway's discovery
names it. --write-pool FILE writes the pool that was certified; --secret NAME stores the
certificate files in that Secret of the namespace (created or replaced), which a gateway that
mounts it with --certificate-watch re-reads.
`

func certify(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("ctk certify", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	poolPath := fs.String("pool", "", "pool file (YAML)")
	out := fs.String("out", ".", "output folder")
	validFor := fs.Duration("valid-for", 7*24*time.Hour, "certificate lifetime")
	signKey := fs.String("sign-key", "", "ed25519 private key (PEM, from ctk keygen) to sign the certificate")
	eventTimeout := fs.Duration("event-timeout", 15*time.Second, "how long to wait for the probe's own events")
	verbose := fs.Bool("v", false, "log progress to stderr")
	lenient := fs.Bool("lenient-auto", false, "binding auto: exit 0 for an endpoint covered for one binding even when a leg of the other failed")
	admit := fs.String("admit", certificate.AdmitNone, "admission policy for endpoints that join later: none or probe")
	admitSpecs := fs.String("admit-specs", "", "comma-separated spec ids an admission probe runs, written out in full with the binding specs (default: every spec but clear, which an admission never runs)")
	admitValid := fs.Duration("admit-valid-for", 0, "how long an admission lasts (0: until the certificate expires)")
	fromPool := fs.String("from-inferencepool", "", "certify the ready pods of this InferencePool instead of the pool file's endpoints")
	namespace := fs.String("namespace", "default", "the InferencePool's namespace (and the Secret's)")
	kubeconfig := fs.String("kubeconfig", "", "kubeconfig file (default: in-cluster service account)")
	writePoolPath := fs.String("write-pool", "", "write the pool that was certified (with --from-inferencepool)")
	secret := fs.String("secret", "", "store the certificate files in this Secret (with --from-inferencepool)")
	bad := func(format string, a ...any) int {
		fmt.Fprintf(stderr, "ctk certify: "+format+"\n\n%s", append(a, certifyUsage)...)
		return 2
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			fmt.Fprint(stderr, certifyUsage)
			return 2
		}
		return bad("%v", err)
	}
	switch {
	case fs.NArg() > 0:
		return bad("unexpected argument %q", fs.Arg(0))
	case *poolPath == "":
		return bad("--pool is required")
	case *validFor <= 0:
		return bad("--valid-for: %s must be positive", *validFor)
	case *eventTimeout <= 0:
		return bad("--event-timeout: %s must be positive", *eventTimeout)
	}
	var specs []string
	if *admitSpecs != "" {
		specs = strings.Split(*admitSpecs, ",")
	}
	adm, err := ctk.NewAdmission(*admit, specs, *admitValid)
	if err != nil {
		return bad("--%v", err)
	}
	if *fromPool == "" && (*secret != "" || *writePoolPath != "") {
		return bad("--secret and --write-pool need --from-inferencepool")
	}
	var pool *ctk.Pool
	var kube kubernetes.Interface
	if *fromPool != "" {
		var dyn dynamic.Interface
		if kube, dyn, err = kubeClients(*kubeconfig); err != nil {
			fmt.Fprintf(stderr, "ctk certify: --from-inferencepool: the cluster: %v\n", err)
			return 2
		}
		pool, err = ctk.LoadPoolWithEndpoints(*poolPath, inferencePoolEndpoints(ctx, kube, dyn, *namespace, *fromPool))
		if err == nil && *writePoolPath != "" {
			err = writePool(*writePoolPath, pool)
		}
	} else {
		pool, err = ctk.LoadPool(*poolPath)
	}
	if err != nil {
		fmt.Fprintf(stderr, "ctk certify: %s: %v\n", *poolPath, err)
		return 2
	}
	opts := ctk.Options{ValidFor: *validFor, EventTimeout: *eventTimeout, LenientAuto: *lenient}
	if *admit == certificate.AdmitProbe {
		opts.Admission = adm
	}
	if *signKey != "" {
		if opts.SignKey, err = certificate.LoadPrivateKey(*signKey); err != nil {
			fmt.Fprintf(stderr, "ctk certify: --sign-key: %v\n", err)
			return 2
		}
	}
	if *verbose {
		opts.Logger = slog.New(slog.NewTextHandler(stderr, nil))
	}
	res, err := ctk.Certify(ctx, pool, opts)
	if err != nil {
		fmt.Fprintf(stderr, "ctk certify: %v\n", err)
		return 2
	}
	if err := res.WriteFiles(*out); err != nil {
		fmt.Fprintf(stderr, "ctk certify: --out: %v\n", err)
		return 2
	}
	if *secret != "" && res.ExitCode != 0 {
		fmt.Fprintf(stderr, "ctk certify: --secret: not written: the pool is not certified (the certificate in force stays)\n")
	}
	if *secret != "" && res.ExitCode == 0 {
		var files []string
		for _, c := range res.Certificates {
			name := ctk.CertificateFile
			if len(res.Certificates) > 1 {
				name = "certificate-" + c.Profile.Family + ".json"
			}
			files = append(files, name)
		}
		if err := writeSecret(ctx, kube, *namespace, *secret, *out, files); err != nil {
			fmt.Fprintf(stderr, "ctk certify: --secret: %v\n", err)
			return 2
		}
		fmt.Fprintf(stdout, "# wrote secret %s/%s\n", *namespace, *secret)
	}
	_ = res.WriteText(stdout)
	fmt.Fprintf(stdout, "# wrote %s\n", filepath.Join(*out, ctk.ReportFile))
	return res.ExitCode
}

const keygenUsage = `usage: ctk keygen --out PREFIX

Writes a new ed25519 key pair: PREFIX.key (PKCS #8 PEM, mode 0600; give it to ctk certify
--sign-key) and PREFIX.pub (PKIX PEM; give it to the gateway to verify certificates).
`

func keygen(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("ctk keygen", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	out := fs.String("out", "", "path prefix of the key files")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			fmt.Fprint(stderr, keygenUsage)
			return 2
		}
		fmt.Fprintf(stderr, "ctk keygen: %v\n\n%s", err, keygenUsage)
		return 2
	}
	if *out == "" || fs.NArg() > 0 {
		fmt.Fprintf(stderr, "ctk keygen: --out PREFIX is required\n\n%s", keygenUsage)
		return 2
	}
	priv, pub := *out+".key", *out+".pub"
	for _, p := range []string{priv, pub} {
		if _, err := os.Stat(p); err == nil {
			fmt.Fprintf(stderr, "ctk keygen: --out: %s exists; refusing to overwrite a key\n", p)
			return 2
		}
	}
	if err := certificate.GenerateKeyFiles(priv, pub); err != nil {
		fmt.Fprintf(stderr, "ctk keygen: %v\n", err)
		return 1
	}
	fmt.Fprintf(stdout, "wrote %s and %s\n", priv, pub)
	return 0
}
