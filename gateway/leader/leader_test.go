package leader

import (
	"context"
	"errors"
	"net/http"
	"sync/atomic"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/rest"
	k8stesting "k8s.io/client-go/testing"

	"github.com/kvexact/kvexact/internal/kubetest"
)

// TestMain stops the package's API server (kubetest) after the tests.
func TestMain(m *testing.M) { kubetest.Main(m) }

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

// TestTwoPickersOneLeader: two replicas compete for one Lease, in client-go's fake clientset and
// on a real API server; exactly one leads, the Lease names it; when it stops (its context ends,
// the lease released), the other takes over, and the first never leads after stopping.
func TestTwoPickersOneLeader(t *testing.T) {
	kubetest.Each(t, "ns", testTwoPickersOneLeader)
}

func testTwoPickersOneLeader(t *testing.T, c kubetest.Cluster) {
	client := c.Kube
	cfg := func(id string) Config {
		return Config{Client: client, Namespace: c.Namespace, Name: "kvexact-picker", Identity: id,
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
	lease, err := client.CoordinationV1().Leases(c.Namespace).Get(context.Background(), "kvexact-picker", metav1GetOptions())
	if err != nil || lease.Spec.HolderIdentity == nil || *lease.Spec.HolderIdentity != "a" {
		t.Fatalf("lease %+v %v, want held by a", lease, err)
	}
	stopA()
	<-a.Done()
	if a.Leading() {
		t.Fatal("a still leading after it stopped")
	}
	waitFor(t, "b to take over", b.Leading)
	if _, err := Start(context.Background(), Config{Client: client, Namespace: c.Namespace, Name: "x"}); err == nil {
		t.Fatal("no identity accepted")
	}
}

func metav1GetOptions() metav1.GetOptions { return metav1.GetOptions{} }

// TestLeaderKilled: the leader is cut off from the API server without releasing the Lease (what a
// killed pod or a partitioned node looks like). It steps down by itself once it cannot renew
// within the renew deadline; the standby takes the Lease over only once it has expired, a lease
// duration after the last renewal, and then within a few retry periods.
func TestLeaderKilled(t *testing.T) {
	kubetest.Each(t, "ns", testLeaderKilled)
}

func testLeaderKilled(t *testing.T, c kubetest.Cluster) {
	const (
		leaseDuration = 3 * time.Second
		renewDeadline = time.Second
		retryPeriod   = 100 * time.Millisecond
	)
	clientA, cutA := partitioned(t, c, "a")
	cfg := func(client kubernetes.Interface, id string) Config {
		return Config{Client: client, Namespace: c.Namespace, Name: "kvexact-picker", Identity: id,
			LeaseDuration: leaseDuration, RenewDeadline: renewDeadline, RetryPeriod: retryPeriod}
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	a, err := Start(ctx, cfg(clientA, "a"))
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, "a to lead", a.Leading)
	b, err := Start(ctx, cfg(c.Kube, "b"))
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(5 * retryPeriod)
	if b.Leading() || !a.Leading() {
		t.Fatalf("before the cut: a leading %v, b leading %v", a.Leading(), b.Leading())
	}
	cutA()
	cut := time.Now()
	var aStepped, bLeads time.Duration
	for deadline := cut.Add(leaseDuration + 10*time.Second); aStepped == 0 || bLeads == 0; time.Sleep(5 * time.Millisecond) {
		since := time.Since(cut)
		if aStepped == 0 && !a.Leading() {
			aStepped = since
		}
		if bLeads == 0 && b.Leading() {
			bLeads = since
			if aStepped == 0 {
				t.Fatalf("b leads %s after the cut while a still leads", bLeads)
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s after the cut: a stepped down after %s, b leads after %s (0: not yet)", time.Since(cut), aStepped, bLeads)
		}
	}
	// a renewed at most a retry period (with client-go's jitter, up to 2.2×) before the cut, and
	// the standby sees a renewal only when the record changes, which it compares at one-second
	// resolution (metav1.Time): so the Lease is valid, in b's eyes, until at least a lease
	// duration less one second after that renewal, and b must not take it before.
	if earliest := leaseDuration - time.Second - retryPeriod*22/10; bLeads < earliest {
		t.Fatalf("b took the lease %s after the cut, before it expired (%s at the earliest)", bLeads, earliest)
	}
	if latest := leaseDuration + 5*retryPeriod + time.Second; bLeads > latest {
		t.Fatalf("b took the lease %s after the cut, later than its expiry and a few retry periods (%s)", bLeads, latest)
	}
	lease, err := c.Kube.CoordinationV1().Leases(c.Namespace).Get(ctx, "kvexact-picker", metav1.GetOptions{})
	if err != nil || lease.Spec.HolderIdentity == nil || *lease.Spec.HolderIdentity != "b" || lease.Spec.LeaseTransitions == nil || *lease.Spec.LeaseTransitions < 1 {
		t.Fatalf("lease %+v %v, want held by b after a transition", lease.Spec, err)
	}
	t.Logf("%s: a stepped down %s after the cut, b leads %s after it", c.Name, aStepped, bLeads)
}

// partitioned is a client for replica id that can be cut off from the cluster: on the real API
// server every request through it fails from then on; with the fake clientset (one object store
// for both replicas) every Lease write naming id as the holder, or releasing the Lease, does.
func partitioned(t *testing.T, c kubetest.Cluster, id string) (kubernetes.Interface, func()) {
	var cut atomic.Bool
	if c.Config == nil {
		f := c.Kube.(*fake.Clientset)
		f.PrependReactor("*", "leases", func(action k8stesting.Action) (bool, runtime.Object, error) {
			var obj runtime.Object
			switch a := action.(type) {
			case k8stesting.UpdateAction:
				obj = a.GetObject()
			case k8stesting.CreateAction:
				obj = a.GetObject()
			}
			// a's writes: its renewals (holder a) and its release when it steps down (no holder).
			if l, ok := obj.(*coordinationv1.Lease); ok && cut.Load() && l.Spec.HolderIdentity != nil && (*l.Spec.HolderIdentity == id || *l.Spec.HolderIdentity == "") {
				return true, nil, errors.New("partitioned")
			}
			return false, nil, nil
		})
		return f, func() { cut.Store(true) }
	}
	cfg := rest.CopyConfig(c.Config)
	cfg.WrapTransport = func(rt http.RoundTripper) http.RoundTripper {
		return roundTripper(func(r *http.Request) (*http.Response, error) {
			if cut.Load() {
				return nil, errors.New("partitioned")
			}
			return rt.RoundTrip(r)
		})
	}
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return client, func() { cut.Store(true) }
}

type roundTripper func(*http.Request) (*http.Response, error)

func (f roundTripper) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }
