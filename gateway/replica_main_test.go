package gateway_test

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvexact/kvexact/gateway"
	"github.com/kvexact/kvexact/gateway/assemble"
	"github.com/kvexact/kvexact/gateway/rules"
	"github.com/kvexact/kvexact/internal/kubetest"
)

// replicaEnv, set to a config path, makes the test binary run as one gateway process of a replica
// set (TestE2EThreeReplicasBehindNginx kills and restarts such processes): the same assembly
// cmd/gateway runs, without building that binary in the test.
const replicaEnv = "KVEXACT_TEST_REPLICA_CONFIG"

func TestMain(m *testing.M) {
	if path := os.Getenv(replicaEnv); path != "" {
		os.Exit(runReplica(path, os.Getenv("KVEXACT_TEST_REPLICA_CERT")))
	}
	kubetest.Main(m) // runs the tests, then stops the package's API server if one was started
}

func runReplica(path, cert string) int {
	cfg, err := rules.Load(path)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	certs, err := gateway.LoadCertificates([]string{cert}, nil, false)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	gw, err := assemble.New(assemble.Config{Options: gateway.Options{Config: cfg, Certificates: certs, CertificatePaths: []string{cert},
		Registry: prometheus.NewRegistry(), ProbeInterval: -1, ReprobeInterval: -1, EventReplayTimeout: 500 * time.Millisecond}})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := gw.Start(ctx); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	fmt.Printf("gateway ready admin=%s\n", gw.Servers.Admin)
	<-ctx.Done()
	sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	gw.Shutdown(sctx)
	return 0
}
