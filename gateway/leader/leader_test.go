package leader

import (
	"context"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
)

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestTwoPickersOneLeader: two replicas compete for one Lease in client-go's fake clientset;
// exactly one leads, the Lease names it; when it stops (its context ends, the lease released),
// the other takes over, and the first never leads after stopping.
func TestTwoPickersOneLeader(t *testing.T) {
	client := fake.NewClientset()
	cfg := func(id string) Config {
		return Config{Client: client, Namespace: "ns", Name: "kvexact-picker", Identity: id,
			LeaseDuration: time.Second, RenewDeadline: 500 * time.Millisecond, RetryPeriod: 50 * time.Millisecond}
	}
	ctxA, stopA := context.WithCancel(context.Background())
	defer stopA()
	a, err := Start(ctxA, cfg("a"))
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, "a to lead", a.Leading)
	ctxB, stopB := context.WithCancel(context.Background())
	defer stopB()
	b, err := Start(ctxB, cfg("b"))
	if err != nil {
		t.Fatal(err)
	}
	for range 20 { // several retry periods: b stands by
		time.Sleep(25 * time.Millisecond)
		if b.Leading() || !a.Leading() {
			t.Fatalf("a leading %v, b leading %v", a.Leading(), b.Leading())
		}
	}
	lease, err := client.CoordinationV1().Leases("ns").Get(context.Background(), "kvexact-picker", metav1GetOptions())
	if err != nil || lease.Spec.HolderIdentity == nil || *lease.Spec.HolderIdentity != "a" {
		t.Fatalf("lease %+v %v, want held by a", lease, err)
	}
	stopA()
	<-a.Done()
	if a.Leading() {
		t.Fatal("a still leading after it stopped")
	}
	waitFor(t, "b to take over", b.Leading)
	if _, err := Start(context.Background(), Config{Client: client, Namespace: "ns", Name: "x"}); err == nil {
		t.Fatal("no identity accepted")
	}
}

func metav1GetOptions() metav1.GetOptions { return metav1.GetOptions{} }
