// Command gateway is kvexact's certified KV-cache-aware gateway:
//
//	gateway --config gateway.yaml --certificate cert.json
//	gateway status --admin http://127.0.0.1:9090 --token-file token   (a running gateway's rules and endpoints)
//	gateway --version
//
// Exact routing is enabled per rule only where a certificate covers the rule's staged profile;
// everywhere else the rule's selector routes and /admin/status says why.
//
// The command owns its flags, the files they name, signals, the ready line and the shutdown grace;
// gateway/assemble builds and runs the gateway itself (docs/assembly.md).
package main

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/kvexact/kvexact/ctk/certificate"
	"github.com/kvexact/kvexact/gateway"
	"github.com/kvexact/kvexact/gateway/assemble"
	"github.com/kvexact/kvexact/gateway/rules"
	"github.com/kvexact/kvexact/gateway/tracing"
	"github.com/kvexact/kvexact/gateway/watch"
	"github.com/kvexact/kvexact/internal/buildinfo"
)

type listFlag []string

func (l *listFlag) String() string     { return strings.Join(*l, ",") }
func (l *listFlag) Set(v string) error { *l = append(*l, v); return nil }

func main() {
	reexec = keepMonitorAwake
	os.Exit(run(os.Args[1:]))
}

// reexec, when set, replaces the process before run starts anything (--sysmon-awake); only main
// sets it, so a test calling run keeps its own process.
var reexec func() error

func run(args []string) int {
	if buildinfo.Flag("gateway", args, os.Stdout) {
		return 0
	}
	if len(args) > 0 && args[0] == "status" {
		return runStatus(args[1:], os.Stdout, os.Stderr)
	}
	fs := flag.NewFlagSet("gateway", flag.ContinueOnError)
	config := fs.String("config", "gateway.yaml", "gateway configuration file")
	var certs listFlag
	fs.Var(&certs, "certificate", "certificate written by ctk certify (repeatable)")
	certKey := fs.String("certificate-key", "", "ed25519 public key (PEM) that certificates must be signed with")
	certWatch := fs.Duration("certificate-watch", 0, "check the certificate files this often and reload them when their content changes (a Kubernetes Secret volume; 0: only on SIGHUP or POST /admin/certificates/reload)")
	reloadRules := fs.Bool("reload-rules", false, "SIGHUP also re-reads --config and applies its rules (added, changed and removed rules and endpoints; listeners need a restart). Leave off where discovery owns a rule's endpoints")
	requireSigned := fs.Bool("require-signed", false, "refuse certificates whose signature was not verified with --certificate-key (at start and on reload)")
	logLevel := fs.String("log-level", "info", "debug, info, warn or error")
	logFormat := fs.String("log-format", "text", "text (logfmt) or json: the format of every log line on stderr, the access log's included")
	accessLog := fs.Bool("access-log", true, "write one log line per client request (id, rule, endpoint, tier, predicted and realized cached tokens, status, TTFB, duration)")
	grace := fs.Duration("shutdown-grace", 30*time.Second, "how long in-flight requests and streams may finish on shutdown")
	probe := fs.Duration("probe-interval", 5*time.Second, "active health probe interval (0 disables)")
	tokRetry := fs.Duration("tokenizer-retry", gateway.DefaultTokenizerRetry, "how often a rule whose tokenizer could not be loaded (missing files, a hub that refused or is still fetching) tries again")
	reprobe := fs.Duration("reprobe-interval", time.Minute, "re-check each certified endpoint's version, model and tokenizer; a failure fences KV-exact for it (0 disables)")
	parityFirst := fs.Int("parity-check-first", watch.DefaultCheckFirst, "live parity watch: check every stored-block event for this many events after each (re)connect, restart or clear")
	paritySample := fs.Int("parity-sample-every", watch.DefaultSampleEvery, "live parity watch: after those, check one event in this many (1: all)")
	resumeAfter := fs.Int("resume-after-blocks", gateway.DefaultResumeAfterBlocks, "matching blocks the live parity watch must see before KV-exact resumes on a restarted endpoint")
	shortfall := fs.Int("shortfall-hits", gateway.DefaultShortfallHits, "consecutive KV-exact hits predicting at least a block with 0 cached tokens reported that suspend the endpoint")
	otlpEndpoint := fs.String("otlp-endpoint", "", "send OpenTelemetry traces over OTLP/gRPC to this host:port (default: off unless OTEL_EXPORTER_OTLP_ENDPOINT is set; the other OTEL_* variables apply)")
	otlpInsecure := fs.Bool("otlp-insecure", false, "send the traces without TLS (a collector beside the gateway)")
	metricsListen := fs.String("metrics-listen", "", "serve GET /metrics alone, without the admin token, on this address (overrides admin.metricsListen; default off)")
	engineLoad := fs.Duration("engine-load-interval", 0, "scrape each engine's own running/waiting request gauges this often and add what they count beyond this gateway's share (other replicas') to its load (0: off; minimum 50ms; use with several replicas)")
	replayTimeout := fs.Duration("event-replay-timeout", 15*time.Second, "bound on one replay exchange with an engine's replay socket; a failed first replay redials and asks again, and the endpoint holds the gateway unready meanwhile")
	peerSnap := fs.String("peer-snapshot", "", "at start, seed each endpoint's inventory from this peer replica's admin API (http(s)://host:port) where the engine's replay proves the snapshot current; anything else rebuilds from replay (default off)")
	peerSnapToken := fs.String("peer-snapshot-token-file", "", "file holding the peer's admin token (required with --peer-snapshot)")
	peerSnapMax := fs.Int64("peer-snapshot-max-bytes", gateway.DefaultPeerSnapshotMaxBytes, "largest snapshot of one endpoint accepted from the peer")
	peerSnapTimeout := fs.Duration("peer-snapshot-timeout", gateway.DefaultPeerSnapshotTimeout, "bound on fetching one endpoint's snapshot from the peer")
	monitorAwake := fs.Bool("sysmon-awake", true, "keep the Go runtime's system monitor awake (the gateway re-executes itself once with GODEBUG=schedtrace set): less CPU per request at moderate rates; see sysmon.go")
	gcFloor := fs.Int("gc-floor-mib", 16, "heap size below which the garbage collector does not run, in MiB (0 disables): see gcfloor.go")
	var eppf eppFlags
	eppf.register(fs)
	if err := fs.Parse(args); err != nil {
		return 2
	}
	for name, v := range map[string]int{"parity-check-first": *parityFirst, "parity-sample-every": *paritySample, "resume-after-blocks": *resumeAfter, "shortfall-hits": *shortfall} {
		if v < 1 {
			fmt.Fprintf(os.Stderr, "gateway: --%s: %d must be at least 1\n", name, v)
			return 2
		}
	}
	if *gcFloor < 0 {
		fmt.Fprintf(os.Stderr, "gateway: --gc-floor-mib: %d is negative\n", *gcFloor)
		return 2
	}
	if *monitorAwake && reexec != nil {
		if err := reexec(); err != nil {
			fmt.Fprintf(os.Stderr, "gateway: --sysmon-awake: not applied, the gateway runs without it: %v\n", err)
		}
	}
	defer keepGCFloor(setGCFloor(*gcFloor << 20))
	var level slog.Level
	if err := level.UnmarshalText([]byte(*logLevel)); err != nil {
		fmt.Fprintf(os.Stderr, "gateway: --log-level: %v\n", err)
		return 2
	}
	var handler slog.Handler
	switch hopts := (&slog.HandlerOptions{Level: level}); *logFormat {
	case "text":
		handler = slog.NewTextHandler(os.Stderr, hopts)
	case "json":
		handler = slog.NewJSONHandler(os.Stderr, hopts)
	default:
		fmt.Fprintf(os.Stderr, "gateway: --log-format: %q is neither text nor json\n", *logFormat)
		return 2
	}
	log := slog.New(handler)

	cfg, err := rules.Load(*config)
	if err != nil {
		fmt.Fprintf(os.Stderr, "gateway: %s: %v\n", *config, err)
		return 2
	}
	if *metricsListen != "" {
		cfg.Admin.MetricsListen = *metricsListen
	}
	opts := gateway.Options{Config: cfg, Log: log, CertificatePaths: certs, ProbeInterval: *probe, CertificateWatch: *certWatch}
	if *probe == 0 {
		opts.ProbeInterval = -1
	}
	opts.ReprobeInterval = *reprobe
	opts.TokenizerRetry = *tokRetry
	opts.EngineLoadInterval = *engineLoad
	opts.EventReplayTimeout = *replayTimeout
	if *peerSnap != "" {
		if *peerSnapToken == "" {
			fmt.Fprintln(os.Stderr, "gateway: --peer-snapshot needs --peer-snapshot-token-file (the peer's admin token)")
			return 2
		}
		tok, err := os.ReadFile(*peerSnapToken)
		if err != nil {
			fmt.Fprintf(os.Stderr, "gateway: --peer-snapshot-token-file: %v\n", err)
			return 2
		}
		opts.PeerSnapshot = &gateway.PeerSnapshot{URL: *peerSnap, Token: strings.TrimSpace(string(tok)), MaxBytes: *peerSnapMax, Timeout: *peerSnapTimeout}
	}
	opts.ParityCheckFirst, opts.ParitySampleEvery, opts.ResumeAfterBlocks, opts.ShortfallHits = *parityFirst, *paritySample, *resumeAfter, *shortfall
	if *reprobe == 0 {
		opts.ReprobeInterval = -1
	}
	if *certKey != "" {
		if opts.CertificateKey, err = certificate.LoadPublicKey(*certKey); err != nil {
			fmt.Fprintf(os.Stderr, "gateway: --certificate-key: %v\n", err)
			return 2
		}
	}
	if *requireSigned && *certKey == "" {
		fmt.Fprintln(os.Stderr, "gateway: --require-signed needs --certificate-key (the public key certificates must verify with)")
		return 2
	}
	opts.RequireSigned = *requireSigned
	if opts.Certificates, err = gateway.LoadCertificates(certs, opts.CertificateKey, *requireSigned); err != nil {
		fmt.Fprintf(os.Stderr, "gateway: --certificate %v\n", err)
		return 2
	}
	for i, c := range opts.Certificates {
		if ok, why := c.Valid(time.Now()); !ok {
			log.Warn("certificate not in force; KV-exact stays off where it alone would cover", "file", certs[i], "reason", why)
		}
		if v := c.Verification(); v != certificate.Verified {
			log.Warn("certificate origin not verified: anyone who could write the file could have edited it", "file", certs[i], "verification", v)
		}
	}
	acfg := assemble.Config{Options: opts}
	if *accessLog {
		acfg.AccessLog = log.With("log", "access")
	}
	tp, err := tracing.Start(context.Background(), tracing.Config{Endpoint: *otlpEndpoint, Insecure: *otlpInsecure})
	if err != nil {
		fmt.Fprintf(os.Stderr, "gateway: traces: %v\n", err)
		return 2
	}
	if tp != nil {
		acfg.Tracer = tp.Tracer()
		defer func() {
			// What is buffered goes out before the process ends, within a bound of its own.
			fctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			if err := tp.Shutdown(fctx); err != nil {
				log.Warn("traces: flushing at shutdown failed", "err", err)
			}
		}()
		log.Info("traces on: OTLP/gRPC exporter")
	}
	gw, err := assemble.New(acfg)
	if err != nil {
		fmt.Fprintf(os.Stderr, "gateway: %v\n", err)
		return 1
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := gw.Start(ctx); err != nil {
		gw.Shutdown(context.Background())
		fmt.Fprintf(os.Stderr, "gateway: %v\n", err)
		return 1
	}
	if err := eppf.start(ctx, gw, log); err != nil {
		gw.Shutdown(context.Background())
		fmt.Fprintf(os.Stderr, "gateway: %v\n", err)
		return 2
	}
	// SIGHUP re-reads the certificate files (and, with --reload-rules, the configuration's rules); a
	// file that fails leaves what is in force.
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)
	go func() {
		for range hup {
			if _, err := gw.Runtime.ReloadCertificates(); err != nil {
				log.Error("SIGHUP: certificate reload failed", "err", err)
			}
			if !*reloadRules {
				continue
			}
			if nc, err := rules.Load(*config); err != nil {
				log.Error("SIGHUP: configuration not reloaded: the rules in force stay", "file", *config, "err", err)
			} else if err := gw.Runtime.ReloadRules(nc); err != nil {
				log.Error("SIGHUP: configuration reload refused", "file", *config, "err", err)
			} else {
				log.Info("SIGHUP: rules reloaded", "file", *config, "rules", len(nc.Rules))
			}
		}
	}()
	// One line a harness can wait for.
	fmt.Printf("gateway ready admin=%s listeners=%s\n", gw.Servers.Admin, strings.Join(boundList(gw.Servers), ","))
	if gw.Servers.Metrics != "" {
		log.Info("metrics listening (no token)", "addr", gw.Servers.Metrics)
	}
	select {
	case <-ctx.Done():
	case err := <-gw.Err():
		log.Error("server failed", "err", err)
	}
	log.Info("shutting down: finishing in-flight requests", "grace", *grace)
	sctx, cancel := context.WithTimeout(context.Background(), *grace)
	defer cancel()
	if err := gw.Shutdown(sctx); err != nil {
		log.Warn("shutdown grace ran out", "err", err)
	}
	return 0
}

func boundList(s *gateway.Servers) []string {
	var out []string
	for _, b := range s.Client {
		out = append(out, b)
	}
	return out
}
