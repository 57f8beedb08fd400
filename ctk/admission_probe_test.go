package ctk_test

import (
	"context"
	"net/http"
	"sync"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	"github.com/kvexact/kvexact/ctk"
	"github.com/kvexact/kvexact/ctk/certificate"
	"github.com/kvexact/kvexact/engines/sim"
)

// pathCounter counts the requests a run sends, by URL path.
type pathCounter struct {
	mu sync.Mutex
	n  map[string]int
}

func (c *pathCounter) RoundTrip(r *http.Request) (*http.Response, error) {
	c.mu.Lock()
	c.n[r.URL.Path]++
	c.mu.Unlock()
	return http.DefaultTransport.RoundTrip(r)
}

func (c *pathCounter) total() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	t := 0
	for _, n := range c.n {
		t += n
	}
	return t
}

var _ = Describe("an admission probe", func() {
	// admitted certifies good with admit: probe, then admits e by probe under that certificate
	// (counting e's requests), and certifies e alone with ctk certify (counting them again).
	admitted := func(good, e *sim.Engine) (adm *ctk.Result, admReqs, certReqs *pathCounter) {
		policy, err := ctk.NewAdmission(certificate.AdmitProbe, nil, 0)
		Expect(err).NotTo(HaveOccurred())
		res := certifyWith(poolOf([]string{`seed: "0"`}, nil, good), ctk.Options{Admission: policy})
		Expect(res.ExitCode).To(Equal(0), failed(res))
		admReqs, certReqs = &pathCounter{n: map[string]int{}}, &pathCounter{n: map[string]int{}}
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		defer cancel()
		adm, err = ctk.Admit(ctx, poolOf([]string{`seed: "0"`}, nil, e), res.Certificate, ctk.Options{Tokenizer: tokenizer("llama3"),
			HTTPClient: &http.Client{Transport: admReqs}, EventTimeout: 2 * time.Second, SubscribeTimeout: 3 * time.Second})
		Expect(err).NotTo(HaveOccurred())
		certifyWith(poolOf([]string{`seed: "0"`}, nil, e), ctk.Options{HTTPClient: &http.Client{Transport: certReqs}})
		return adm, admReqs, certReqs
	}

	It("joins the added-token probes into a few tokenize calls and admits a correct engine", func() {
		good := startSim("vllm", "v0.25.1", named("good", nil))
		e := startSim("vllm", "v0.25.1", named("new", nil))
		res, admReqs, certReqs := admitted(good, e)
		Expect(res.ExitCode).To(Equal(0), failed(res))
		Expect(res.Endpoints[0].OK).To(BeTrue(), failed(res))
		// Llama 3: 2 × 527 corpus probes in 2 × 23 calls; the 19 chat-template calls stay.
		Expect(spec(res, "new", "add_special_tokens=true").Message).To(ContainSubstring("527 probes in 23 tokenize calls"))
		Expect(admReqs.n["/tokenize"]).To(BeNumerically("<", certReqs.n["/tokenize"]/10), "admission %v, ctk certify %v", admReqs.n, certReqs.n)
		GinkgoWriter.Printf("requests: admission %d %v, ctk certify %d %v\n", admReqs.total(), admReqs.n, certReqs.total(), certReqs.n)
	})

	// An added-token difference the joined texts must still catch, naming the leg and the token.
	for name, edit := range map[string]func(map[string]any){
		"renames one added token": func(m map[string]any) {
			for _, a := range m["added_tokens"].([]any) {
				if t := a.(map[string]any); t["content"] == "<|reserved_special_token_200|>" {
					t["content"] = "<|reserved_special_token_200_renamed|>"
				}
			}
		},
		"numbers two added tokens the other way round": func(m map[string]any) {
			for _, a := range m["added_tokens"].([]any) {
				switch t := a.(map[string]any); t["content"] {
				case "<|reserved_special_token_200|>":
					t["content"] = "<|reserved_special_token_201|>"
				case "<|reserved_special_token_201|>":
					t["content"] = "<|reserved_special_token_200|>"
				}
			}
		},
	} {
		It("refuses an engine whose tokenizer "+name+", naming the tokenizer leg and the token", func() {
			bad := llama3With(edit, nil)
			good := startSim("vllm", "v0.25.1", named("good", nil))
			e := startSim("vllm", "v0.25.1", named("new", func(c *sim.Config) { c.Tokenizer = bad }))
			res, _, _ := admitted(good, e)
			Expect(res.ExitCode).To(Equal(1), failed(res))
			Expect(res.Endpoints[0].OK).To(BeFalse(), failed(res))
			for _, frag := range []string{"add_special_tokens=true", "add_special_tokens=false"} {
				s := spec(res, "new", frag)
				Expect(s.State).To(Equal(ctk.Fail), failed(res))
				Expect(s.Leg).To(Equal(ctk.LegTokenizer))
				Expect(s.Message).To(ContainSubstring("reserved_special_token_200"))
			}
		})
	}
})
