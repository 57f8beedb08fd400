package gateway_test

import (
	"testing"

	"github.com/kvexact/kvexact/internal/kubetest"
	"github.com/kvexact/kvexact/internal/replicatest"
)

func TestMain(m *testing.M) {
	replicatest.RunIfReplica() // TestE2EThreeReplicasBehindNginx runs this binary as its gateway processes
	kubetest.Main(m)           // runs the tests, then stops the package's API server if one was started
}
