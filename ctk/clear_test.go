package ctk_test

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"sync/atomic"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	"github.com/kvexact/kvexact/ctk"
	"github.com/kvexact/kvexact/engines/sim"
)

// refusingClear is an endpoint clear URL in front of a simulator: its first refuse posts are
// answered with refusal (status, body), later ones are passed to the simulator's own clear path.
// posts counts every post.
type refusingClear struct {
	srv   *httptest.Server
	posts atomic.Int32
}

func newRefusingClear(e *sim.Engine, path string, refuse int, status int, body string) *refusingClear {
	rc := &refusingClear{}
	rc.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if n := rc.posts.Add(1); int(n) <= refuse {
			w.WriteHeader(status)
			_, _ = io.WriteString(w, body)
			return
		}
		resp, err := http.Post(e.URL()+path, "", nil)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadGateway)
			return
		}
		defer resp.Body.Close()
		w.WriteHeader(resp.StatusCode)
		_, _ = io.Copy(w, resp.Body)
	}))
	DeferCleanup(rc.srv.Close)
	return rc
}

var _ = Describe("a cache clear the engine refuses while busy", func() {
	vllmRefusal := func(e *sim.Engine, refuse int) *refusingClear {
		return newRefusingClear(e, "/reset_prefix_cache", refuse, http.StatusOK, `{"success":false}`)
	}

	It("is retried until vLLM accepts it (200 success false is its refusal)", func() {
		e := startSim("vllm", "v0.31.0", named("P0", nil))
		rc := vllmRefusal(e, 3)
		p := poolFor(e, "P0", `seed: "0"`)
		p.Endpoints[0].Clear = rc.srv.URL + "/clear"
		res := certify(p, nil)
		Expect(spec(res, "P0", "cache clear").State).To(Equal(ctk.Pass), failed(res))
		Expect(rc.posts.Load()).To(BeEquivalentTo(4))
	})

	It("is retried until SGLang accepts it (400 is its refusal, read by the family through the clear URL)", func() {
		e := startSim("sglang", "v0.5.23", named("S0", nil))
		rc := newRefusingClear(e, "/flush_cache", 2, http.StatusBadRequest, "Flush cache failed.\n")
		p := poolFor(e, "S0")
		p.Endpoints[0].Clear = rc.srv.URL + "/flush_cache"
		res := certify(p, nil)
		Expect(spec(res, "S0", "cache clear").State).To(Equal(ctk.Pass), failed(res))
		Expect(rc.posts.Load()).To(BeEquivalentTo(3))
	})

	It("fails after a bounded number of refusals, naming the endpoint, the URL and that the engine was busy", func() {
		e := startSim("vllm", "v0.31.0", named("P0", nil))
		rc := vllmRefusal(e, 1000)
		p := poolFor(e, "P0", `seed: "0"`)
		p.Endpoints[0].Clear = rc.srv.URL + "/clear"
		res := certify(p, nil)
		s := spec(res, "P0", "cache clear")
		Expect(s.State).To(Equal(ctk.Fail))
		Expect(s.Leg).To(Equal(ctk.LegClear))
		Expect(s.Message).To(And(ContainSubstring("endpoint P0"), ContainSubstring("POST "+rc.srv.URL+"/clear"),
			ContainSubstring("10 times, 200ms apart"), ContainSubstring("busy"), ContainSubstring(`{"success":false}`)))
		Expect(s.Hint).To(ContainSubstring("no other traffic"))
		Expect(rc.posts.Load()).To(BeEquivalentTo(10))
	})

	It("is not retried when the clear fails for another reason", func() {
		e := startSim("vllm", "v0.31.0", named("P0", nil))
		rc := newRefusingClear(e, "/reset_prefix_cache", 1000, http.StatusInternalServerError, "boom")
		p := poolFor(e, "P0", `seed: "0"`)
		p.Endpoints[0].Clear = rc.srv.URL + "/clear"
		res := certify(p, nil)
		s := spec(res, "P0", "cache clear")
		Expect(s.State).To(Equal(ctk.Fail))
		Expect(s.Message).To(ContainSubstring(fmt.Sprintf("endpoint P0: cache clear: POST %s/clear: HTTP 500: boom", rc.srv.URL)))
		Expect(rc.posts.Load()).To(BeEquivalentTo(1))
	})
})
