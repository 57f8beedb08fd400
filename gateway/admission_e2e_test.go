package gateway_test

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvexact/kvexact/ctk"
	"github.com/kvexact/kvexact/ctk/certificate"
	"github.com/kvexact/kvexact/engines/sim"
	"github.com/kvexact/kvexact/gateway"
	"github.com/kvexact/kvexact/gateway/route"
	"github.com/kvexact/kvexact/gateway/rules"
	"github.com/kvexact/kvexact/gateway/tokenize"
	"github.com/kvexact/kvexact/internal/promtest"
)

// admitPolicy makes the test certificate say admit: probe with ctk's default specs.
func admitPolicy(c *certificate.Certificate) {
	a, err := ctk.NewAdmission(certificate.AdmitProbe, nil, 0)
	if err != nil {
		panic(err)
	}
	c.Admission = a
}

// admissionPool is one certified simulator (e0) behind a gateway whose certificate file admits
// endpoints by probe, with short probe timeouts and backoff.
func admissionPool(t *testing.T, policy func(*certificate.Certificate)) *pool {
	return startPool(t, poolSpec{family: "vllm", release: "v0.25.1", n: 1, seed: strp("0"), mode: 3, certify: true, certFile: true,
		certMod: policy, gwMod: func(o *gateway.Options) {
			o.AdmissionBackoff, o.AdmissionEventTimeout = 200*time.Millisecond, 2*time.Second
		}})
}

// extraSim starts a simulator like the pool's, changed by mod.
func extraSim(t *testing.T, name string, mod func(c *sim.Config)) *sim.Engine {
	t.Helper()
	tok, _ := tokenizerPool(t).Get("llama3")
	c := sim.Config{Family: "vllm", Release: "v0.25.1", Model: "llama3", Tokenizer: tok, ServedModelName: "llama3", Endpoint: name, Seed: strp("0"),
		PrefillPerToken: 20 * time.Microsecond, DecodePerToken: 200 * time.Microsecond, PublishAddr: "tcp://*:0"}
	if mod != nil {
		mod(&c)
	}
	e, err := sim.New(c)
	if err != nil {
		t.Fatal(err)
	}
	if err := e.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.Close() })
	return e
}

func ruleEndpoint(name string, e *sim.Engine) rules.Endpoint {
	return rules.Endpoint{Name: name, Address: e.URL(), Events: rules.Events{ZMQ: e.PublishAddrs()}}
}

// putEndpoints replaces the rule's endpoints through the admin API (PUT /admin/rules/pool).
func putEndpoints(t *testing.T, p *pool, eps ...rules.Endpoint) {
	t.Helper()
	r, _ := p.g.Store().Get("pool")
	r = r.Clone()
	r.Endpoints = eps
	body, _ := json.Marshal(r)
	req, _ := http.NewRequest(http.MethodPut, p.admin+"/admin/rules/pool", bytes.NewReader(body))
	req.Header.Set("Authorization", "Bearer "+p.token)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode/100 != 2 {
		t.Fatalf("PUT /admin/rules/pool: %d %s", resp.StatusCode, b)
	}
}

// statusOf is an endpoint's status entry, ok false while the runtime does not list it yet.
func statusOf(p *pool, name string) (gateway.EndpointStatus, bool) {
	for _, e := range p.g.Status().Rules[0].Endpoints {
		if e.Name == name {
			return e, true
		}
	}
	return gateway.EndpointStatus{}, false
}

func waitStatus(t *testing.T, p *pool, name, what string, d time.Duration, ok func(gateway.EndpointStatus) bool) gateway.EndpointStatus {
	t.Helper()
	var last gateway.EndpointStatus
	deadline := time.Now().Add(d)
	for time.Now().Before(deadline) {
		if e, found := statusOf(p, name); found {
			last = e
			if ok(e) {
				return e
			}
		}
		time.Sleep(20 * time.Millisecond)
	}
	b, _ := json.Marshal(last)
	t.Fatalf("%s: %s not reached within %s: %s", name, what, d, b)
	return last
}

func admitted(e gateway.EndpointStatus) bool {
	return strings.Contains(e.Certified, "admitted by probe at") && e.Exact != nil && e.Exact.State == "eligible"
}

// exactRoutedTo warms a document on the engine directly and checks the gateway routes its
// follow-up KV-exact to endpoint ep.
func exactRoutedTo(t *testing.T, p *pool, e *sim.Engine, ep, doc string) {
	t.Helper()
	direct(t, e, doc)
	eventually(t, 10*time.Second, ep+"'s document in the inventory", func() bool { return p.overlap(doc+" Follow-up?", ep) >= 10 })
	c := p.complete(doc+" Follow-up?", false)
	var d route.Decision
	json.Unmarshal([]byte(c.decision), &d)
	if c.status != 200 || c.endpoint != ep || d.Tier != route.TierKVExact || c.cached <= 0 {
		t.Fatalf("%s's prefix went to %s (tier %s, %d cached, status %d): %s", ep, c.endpoint, d.Tier, c.cached, c.status, c.decision)
	}
}

func otherTemplate(t *testing.T) *tokenize.Tokenizer {
	dir, err := tokenize.FindModelDir(tokenize.DefaultRoots(), "llama3")
	if err != nil {
		t.Skip("the llama3 tokenizer is not available: " + err.Error())
	}
	tj, _ := os.ReadFile(filepath.Join(dir, "tokenizer.json"))
	cj, _ := os.ReadFile(filepath.Join(dir, "tokenizer_config.json"))
	var cfg map[string]any
	if err := json.Unmarshal(cj, &cfg); err != nil {
		t.Fatal(err)
	}
	cfg["chat_template"] = "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}assistant:"
	cj, _ = json.Marshal(cfg)
	tok, err := tokenize.FromBytes(tj, cj)
	if err != nil {
		t.Fatal(err)
	}
	return tok
}

// TestE2EAdmissionByProbe: a certificate that says admit: probe lists e0 only. Endpoints added
// through the admin API are probed with ctk's specs by the gateway: a correct one is admitted —
// certified with the probe's time in status, metrics and its own state machine, and routed
// KV-exact — while one whose engine differs in a leg (seed, block size, chat template) is refused
// naming that leg and retried. The same name at another address (a pod with a new IP) is probed
// again; an admitted engine that restarts with another seed loses its admission naming the seed;
// a certificate reloaded without the policy covers its own endpoints only.
func TestE2EAdmissionByProbe(t *testing.T) {
	p := admissionPool(t, admitPolicy)
	good := extraSim(t, "n1", nil)
	seed := extraSim(t, "n2", func(c *sim.Config) { c.Seed = strp("1") })
	block := extraSim(t, "n3", func(c *sim.Config) { c.BlockSize = 32 })
	tmpl := extraSim(t, "n4", func(c *sim.Config) { c.Tokenizer = otherTemplate(t) })
	e0, _ := p.g.Store().Get("pool")
	base := e0.Endpoints[0]

	putEndpoints(t, p, base, ruleEndpoint("n1", good), ruleEndpoint("n2", seed), ruleEndpoint("n3", block), ruleEndpoint("n4", tmpl))
	n1 := waitStatus(t, p, "n1", "admitted", 30*time.Second, admitted)
	if n1.Admission == nil || n1.Admission.State != "admitted" || n1.Admission.Requests == 0 || !n1.Admission.Expires.Equal(p.g.Status().CertificateStatus[0].ExpiresAt) {
		t.Fatalf("n1's admission: %+v", n1.Admission)
	}
	if v := promtest.Value(t, p.reg, "kvexact_endpoint_admitted", map[string]string{"rule": "pool", "endpoint": "n1"}); v != 1 {
		t.Fatalf("kvexact_endpoint_admitted{n1} = %v", v)
	}
	if eligibleMetric(t, p, "n1") != 1 {
		t.Fatal("n1 admitted but not eligible in the metrics")
	}
	if e := endpointStatus(t, p, "e0"); e.Admission != nil || e.Certified != "certified (engine)" {
		t.Fatalf("the certificate's own endpoint must keep its own coverage, not an admission: %q %+v", e.Certified, e.Admission)
	}
	exactRoutedTo(t, p, good, "n1", docs(1)[0])

	for name, leg := range map[string]string{"n2": ctk.LegSeed, "n3": ctk.LegBlockSize, "n4": ctk.LegTemplate} {
		e := waitStatus(t, p, name, "refused naming "+leg, 30*time.Second, func(e gateway.EndpointStatus) bool {
			return e.Admission != nil && e.Admission.Attempts >= 2 && len(e.Admission.FailedLegs) > 0
		})
		if e.Admission.FailedLegs[0] != leg || !strings.Contains(e.Certified, "admission probe refused") || !strings.Contains(e.Certified, "failed legs "+leg) ||
			e.Exact.State != "uncertified" || reasonMetric(t, p, name, "uncertified") != 1 {
			b, _ := json.Marshal(e)
			t.Fatalf("%s must be refused naming the %s leg and retried: %s", name, leg, b)
		}
	}
	if v := promtest.Value(t, p.reg, "kvexact_admission_probes_total", map[string]string{"rule": "pool", "result": "refused"}); v < 6 {
		t.Fatalf("refused probes counted %v, want each of three endpoints retried", v)
	}

	// n1 moves to another address (a replaced pod's new IP): the old admission does not follow
	// the name; the new address is probed and admitted anew.
	moved := extraSim(t, "n1b", nil)
	first := n1.Admission.Admitted
	putEndpoints(t, p, base, ruleEndpoint("n1", moved))
	n1 = waitStatus(t, p, "n1", "admitted at its new address", 30*time.Second, func(e gateway.EndpointStatus) bool {
		return admitted(e) && e.Address == moved.URL() && e.Admission.Admitted.After(first)
	})
	exactRoutedTo(t, p, moved, "n1", docs(2)[1])

	// The engine behind n1 restarts with another seed: the restart is seen on its event stream,
	// the admission is probed again and refused naming the seed.
	restarted, err := sim.Restart(context.Background(), moved, func(c *sim.Config) { c.Seed = strp("7") })
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { restarted.Close() })
	waitStatus(t, p, "n1", "refused after the restart", 30*time.Second, func(e gateway.EndpointStatus) bool {
		return e.Admission != nil && e.Admission.State == "pending" && len(e.Admission.FailedLegs) > 0 && e.Admission.FailedLegs[0] == ctk.LegSeed &&
			e.Exact.State == "uncertified"
	})

	// The certificate's own endpoint keeps its identity binding: e0's name at another engine's
	// address is a named mismatch, never admitted by probe (however correct that engine is).
	putEndpoints(t, p, rules.Endpoint{Name: "e0", Address: good.URL(), Events: rules.Events{ZMQ: good.PublishAddrs()}}, ruleEndpoint("n1", restarted))
	time.Sleep(time.Second)
	if e := endpointStatus(t, p, "e0"); e.Admission != nil || !strings.Contains(e.Certified, "certified for "+base.Address) || e.Exact.State != "uncertified" {
		t.Fatalf("a listed endpoint moved must not be admitted: %q %+v", e.Certified, e.Admission)
	}

	// A certificate without the policy (an older file) covers e0 only: nothing is admitted.
	c, err := certificate.Load(p.certPath, nil)
	if err != nil {
		t.Fatal(err)
	}
	c.Admission = nil
	if err := c.Write(p.certPath); err != nil {
		t.Fatal(err)
	}
	if _, err := p.g.ReloadCertificates(); err != nil {
		t.Fatal(err)
	}
	if e := endpointStatus(t, p, "n1"); e.Admission != nil || !strings.Contains(e.Certified, "not in the certificate") {
		t.Fatalf("the reloaded certificate does not admit by probe: n1's admission must lapse: %q %+v", e.Certified, e.Admission)
	}
	putEndpoints(t, p, base, ruleEndpoint("n5", good))
	n5 := waitStatus(t, p, "n5", "uncertified", 5*time.Second, func(e gateway.EndpointStatus) bool { return e.Exact.State == "uncertified" })
	if !strings.Contains(n5.Certified, "not in the certificate") {
		t.Fatalf("without admit: probe an unlisted endpoint is not in the certificate, got %q", n5.Certified)
	}
	time.Sleep(500 * time.Millisecond)
	if n5 = endpointStatus(t, p, "n5"); n5.Admission != nil || n5.Exact.State != "uncertified" {
		t.Fatalf("admit: probe is off unless the certificate says so: %+v", n5.Admission)
	}
}

// TestE2ECertificateWatchReloads: the certificate file is a Kubernetes Secret volume's (a
// symlink through ..data to a timestamped folder, swapped atomically when the Secret changes);
// with CertificateWatch the gateway re-reads it on change, no SIGHUP: a certificate that no
// longer lists e0 turns KV-exact off on it, the original one turns it back on.
func TestE2ECertificateWatchReloads(t *testing.T) {
	p := startPool(t, poolSpec{family: "vllm", release: "v0.25.1", n: 1, seed: strp("0"), mode: 3, certify: true, certFile: true,
		gwMod: func(o *gateway.Options) {
			o.CertificateWatch = 20 * time.Millisecond
			// The Secret volume layout, made before the gateway starts.
			dir := t.TempDir()
			orig := o.CertificatePaths[0]
			secretSwap(t, dir, "v1", orig)
			o.CertificatePaths = []string{filepath.Join(dir, "certificate.json")}
		}})
	dir := filepath.Dir(p.g.Status().Certificates[0])
	if e := endpointStatus(t, p, "e0"); e.Exact.State != "eligible" {
		t.Fatalf("e0 starts certified: %+v", e.Exact)
	}
	c, err := certificate.Load(p.certPath, nil)
	if err != nil {
		t.Fatal(err)
	}
	none := *c
	none.Endpoints = nil
	emptied := filepath.Join(t.TempDir(), "emptied.json")
	if err := none.Write(emptied); err != nil {
		t.Fatal(err)
	}
	secretSwap(t, dir, "v2", emptied)
	waitStatus(t, p, "e0", "uncertified after the Secret changed", 5*time.Second, func(e gateway.EndpointStatus) bool {
		return e.Exact.State == "uncertified" && strings.Contains(e.Certified, "not in the certificate")
	})
	secretSwap(t, dir, "v3", p.certPath)
	waitStatus(t, p, "e0", "certified again", 5*time.Second, func(e gateway.EndpointStatus) bool { return e.Exact.State == "eligible" })
}

// secretSwap lays src out as a Secret volume does: dir/<version>/certificate.json, dir/..data a
// symlink to the version (replaced by rename, atomically), dir/certificate.json → ..data/.
func secretSwap(t *testing.T, dir, version, src string) {
	t.Helper()
	b, err := os.ReadFile(src)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Join(dir, version), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, version, "certificate.json"), b, 0o644); err != nil {
		t.Fatal(err)
	}
	tmp := filepath.Join(dir, "..data_tmp")
	os.Remove(tmp)
	if err := os.Symlink(version, tmp); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, filepath.Join(dir, "..data")); err != nil {
		t.Fatal(err)
	}
	link := filepath.Join(dir, "certificate.json")
	if _, err := os.Lstat(link); err != nil {
		if err := os.Symlink(filepath.Join("..data", "certificate.json"), link); err != nil {
			t.Fatal(err)
		}
	}
}

// TestE2EAdmissionExpiresAndIsProbedAgain: an admission lasts the policy's window
// (valid_for_seconds); at its instant KV-exact stops on the endpoint as at a certificate's expiry,
// and the endpoint is probed and admitted again.
func TestE2EAdmissionExpiresAndIsProbedAgain(t *testing.T) {
	p := startPool(t, poolSpec{family: "vllm", release: "v0.25.1", n: 1, seed: strp("0"), mode: 3, certify: true,
		certMod: func(c *certificate.Certificate) {
			admitPolicy(c)
			c.Admission.ValidForSeconds = 2
		}, gwMod: func(o *gateway.Options) {
			o.AdmissionBackoff, o.AdmissionEventTimeout, o.ExpiryCheck = 200*time.Millisecond, 2*time.Second, 20*time.Millisecond
		}})
	good := extraSim(t, "n1", nil)
	e0, _ := p.g.Store().Get("pool")
	putEndpoints(t, p, e0.Endpoints[0], ruleEndpoint("n1", good))
	first := waitStatus(t, p, "n1", "admitted", 30*time.Second, admitted)
	if got := first.Admission.Expires.Sub(first.Admission.Admitted); got != 2*time.Second {
		t.Fatalf("admission window %s, want the policy's 2s", got)
	}
	lapsed := waitStatus(t, p, "n1", "uncertified when the window ends", 10*time.Second, func(e gateway.EndpointStatus) bool {
		return e.Exact.State == "uncertified" && strings.Contains(e.Certified, "awaiting its admission probe")
	})
	if lapsed.Exact.Since.Before(first.Admission.Expires) {
		t.Fatalf("KV-exact stopped at %s, before the admission expired at %s", lapsed.Exact.Since, first.Admission.Expires)
	}
	again := waitStatus(t, p, "n1", "admitted again after the window", 30*time.Second, func(e gateway.EndpointStatus) bool {
		return admitted(e) && e.Admission.Admitted.After(first.Admission.Expires.Add(-time.Millisecond))
	})
	if v := promtest.Value(t, p.reg, "kvexact_admission_probes_total", map[string]string{"rule": "pool", "result": "admitted"}); v < 2 {
		t.Fatalf("admitted probes %v, want the second after expiry", v)
	}
	if again.Admission.Expires.Sub(again.Admission.Admitted) != 2*time.Second {
		t.Fatalf("the new admission's window: %+v", again.Admission)
	}
}

// TestE2EAdmissionOnConfigReload: the standalone gateway's configuration re-read (SIGHUP with
// --reload-rules) adds an endpoint the certificate does not list: it is admitted by probe as one
// added through the admin API is. Re-reading an unchanged configuration changes nothing.
func TestE2EAdmissionOnConfigReload(t *testing.T) {
	p := admissionPool(t, admitPolicy)
	good := extraSim(t, "n1", nil)
	r, _ := p.g.Store().Get("pool")
	cfg := &rules.Config{Rules: []rules.Rule{*r}}
	gen := p.g.Store().Generation()
	if err := p.g.ReloadRules(cfg); err != nil || p.g.Store().Generation() != gen {
		t.Fatalf("an unchanged configuration must change nothing: %v, generation %d → %d", err, gen, p.g.Store().Generation())
	}
	cfg.Rules[0].Endpoints = append(cfg.Rules[0].Endpoints, ruleEndpoint("n1", good))
	if err := p.g.ReloadRules(cfg); err != nil {
		t.Fatal(err)
	}
	waitStatus(t, p, "n1", "admitted after the reload", 30*time.Second, admitted)
	exactRoutedTo(t, p, good, "n1", docs(1)[0])
	// The rule's profile moves away from the certificate's (another seed): admission never widens
	// a profile, so n1 is not admitted under it; the reason names the differing field.
	cfg.Rules[0].Seed = strp("1")
	if err := p.g.ReloadRules(cfg); err != nil {
		t.Fatal(err)
	}
	n1 := waitStatus(t, p, "n1", "uncertified under another profile", 10*time.Second, func(e gateway.EndpointStatus) bool { return e.Exact.State == "uncertified" })
	time.Sleep(500 * time.Millisecond)
	if n1 = endpointStatus(t, p, "n1"); n1.Admission != nil || !strings.Contains(n1.Certified, "seed fingerprint") {
		t.Fatalf("another profile must not be admitted: %q %+v", n1.Certified, n1.Admission)
	}
	if err := p.g.ReloadRules(&rules.Config{}); err != nil {
		t.Fatal(err)
	}
	if _, ok := p.g.Store().Get("pool"); ok {
		t.Fatal("a rule the configuration no longer lists must be deleted")
	}
}

// TestE2EAdmissionPolicyTheProbeCannotRunRefused: a certificate whose admission policy lists the
// cache clear, a spec the gateway does not know, or no spec at all is refused on reload naming the
// file and the spec, and the certificate in force stays; the gateway does not start with one.
func TestE2EAdmissionPolicyTheProbeCannotRunRefused(t *testing.T) {
	p := admissionPool(t, admitPolicy)
	good, err := certificate.Load(p.certPath, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		specs []string
		want  string
	}{
		{append(slices.Clone(good.Admission.Specs), "clear"), `admission.specs lists \"clear\"`},
		{append(slices.Clone(good.Admission.Specs), "keyz"), `admission.specs lists \"keyz\"`},
		{nil, "admission.specs is empty"},
	} {
		bad := *good
		bad.Admission = &certificate.Admission{Admit: certificate.AdmitProbe, Specs: c.specs}
		if err := bad.Write(p.certPath); err != nil {
			t.Fatal(err)
		}
		code, body := p.adminDo("POST", "/admin/certificates/reload", p.token, "")
		if code != 422 || !strings.Contains(body, c.want) || !strings.Contains(body, p.certPath) {
			t.Fatalf("reload of a certificate whose policy lists %v: %d %s; want 422 naming the file and %s", c.specs, code, body, c.want)
		}
		if st := p.g.Status(); !st.Rules[0].Exact.Enabled || st.CertificateStatus[0].Admission == nil || !slices.Equal(st.CertificateStatus[0].Admission.Specs, good.Admission.Specs) {
			t.Fatalf("after the refused reload: %+v; want the certificate in force kept", st.CertificateStatus)
		}
		if _, err := gateway.New(gateway.Options{Config: p.opts.Config, Tokenizers: p.opts.Tokenizers, Registry: prometheus.NewRegistry(), Certificates: []*certificate.Certificate{&bad}}); err == nil || !strings.Contains(err.Error(), strings.ReplaceAll(c.want, `\"`, `"`)) {
			t.Fatalf("a gateway started with a policy listing %v: %v; want an error naming %s", c.specs, err, c.want)
		}
	}
}
