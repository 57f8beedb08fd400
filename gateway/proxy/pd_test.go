package proxy

import (
	"encoding/json"
	"io"
	"net/http"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kvexact/kvexact/contracts"
	"github.com/kvexact/kvexact/engines/registry"
	"github.com/kvexact/kvexact/gateway/rules"
)

// ---- vLLM (vllm-nixl-v1) ----

// vllmPrefill answers like a vLLM prefill engine with the NIXL connector: a one-token completion
// whose kv_transfer_params tell the decode engine where to pull the KV from.
func vllmPrefill(u *upstream, w http.ResponseWriter, r *http.Request, body []byte) {
	w.Header().Set("Content-Type", "application/json")
	_, _ = io.WriteString(w, `{"id":"cmpl-p","object":"text_completion","created":1,"model":"m","choices":[{"index":0,"text":"x","finish_reason":"length"}],`+
		`"kv_transfer_params":{"do_remote_prefill":true,"do_remote_decode":false,"remote_engine_id":"`+u.name+`","remote_block_ids":[1,2,3],"remote_host":"10.1.2.3","remote_port":5600,"tp_size":1}}`)
}

// vllmDecode streams (or answers) naming which prefill engine's KV it used.
func vllmDecode(u *upstream, w http.ResponseWriter, r *http.Request, body []byte) {
	var v struct {
		Stream bool `json:"stream"`
		KV     *struct {
			RemoteEngineID string `json:"remote_engine_id"`
		} `json:"kv_transfer_params"`
	}
	_ = json.Unmarshal(body, &v)
	from := "recomputed"
	if v.KV != nil {
		from = "pulled from " + v.KV.RemoteEngineID
	}
	if !v.Stream {
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, `{"id":"cmpl-d","choices":[{"index":0,"text":"`+u.name+` `+from+`","finish_reason":"stop"}]}`)
		return
	}
	w.Header().Set("Content-Type", "text/event-stream")
	_, _ = io.WriteString(w, `data: {"choices":[{"index":0,"text":"`+u.name+` `+from+`"}]}`+"\n\ndata: [DONE]\n\n")
}

func pdPool(t *testing.T, family string, prefill, decode []*upstream, mod func(*rules.Rule), cfgMod func(*Config)) *pool {
	var specs []epSpec
	for _, u := range prefill {
		specs = append(specs, epSpec{name: u.name, addr: u.srv.URL, role: "prefill", bootstrapPort: 9123})
	}
	for _, u := range decode {
		specs = append(specs, epSpec{name: u.name, addr: u.srv.URL, role: "decode"})
	}
	return newPool(t, family, 0, specs, nil, mod, cfgMod)
}

func TestVLLMDialect(t *testing.T) {
	P, D := newUpstream(t, "P", vllmPrefill), newUpstream(t, "D", vllmDecode)
	p := pdPool(t, "vllm", []*upstream{P}, []*upstream{D}, nil, nil)
	in := `{"model":"m","prompt":"hello","stream":true,"stream_options":{"include_usage":true},"max_tokens":50,"min_tokens":5,"temperature":0.5}`
	resp, out := p.post(t, "/v1/completions", in, map[string]string{HeaderRequestID: "pd-1"})
	if resp.StatusCode != 200 || !strings.Contains(string(out), "D pulled from P") || !isSSE(resp.Header) {
		t.Fatalf("%d %s", resp.StatusCode, out)
	}
	if resp.Header.Get(HeaderPrefill) != "P" || resp.Header.Get(HeaderEndpoint) != "D" {
		t.Fatalf("receipts %v", resp.Header)
	}
	pre, dec := P.requests(), D.requests()
	if len(pre) != 1 || len(dec) != 1 {
		t.Fatalf("legs: %d prefill, %d decode", len(pre), len(dec))
	}
	pb := jsonMap(t, pre[0].Body)
	wantKV := map[string]any{"do_remote_decode": true, "do_remote_prefill": false, "remote_engine_id": nil, "remote_block_ids": nil, "remote_host": nil, "remote_port": nil}
	if !reflect.DeepEqual(pb["kv_transfer_params"], wantKV) {
		t.Fatalf("prefill kv_transfer_params %v", pb["kv_transfer_params"])
	}
	if pb["stream"] != false || pb["max_tokens"] != json.Number("1") || pb["prompt"] != "hello" || pb["model"] != "m" || pb["temperature"] != json.Number("0.5") {
		t.Fatalf("prefill body %s", pre[0].Body)
	}
	for _, k := range []string{"stream_options", "min_tokens", "min_completion_tokens", "max_completion_tokens"} {
		if _, ok := pb[k]; ok {
			t.Fatalf("prefill body keeps %s: %s", k, pre[0].Body)
		}
	}
	db := jsonMap(t, dec[0].Body)
	orig := jsonMap(t, []byte(in))
	params := jsonMap(t, []byte(`{"do_remote_prefill":true,"do_remote_decode":false,"remote_engine_id":"P","remote_block_ids":[1,2,3],"remote_host":"10.1.2.3","remote_port":5600,"tp_size":1}`))
	if !reflect.DeepEqual(db["kv_transfer_params"], params) {
		t.Fatalf("decode kv_transfer_params %v", db["kv_transfer_params"])
	}
	delete(db, "kv_transfer_params")
	if !reflect.DeepEqual(db, orig) {
		t.Fatalf("decode body is not the client's body plus the params:\n%v\n%v", db, orig)
	}
	if pre[0].Header.Get(HeaderRequestID) != "pd-1" || dec[0].Header.Get(HeaderRequestID) != "pd-1" {
		t.Fatal("the legs do not share the request id")
	}
	if got := p.metric(t, "kvexact_proxy_pd_params_total", map[string]string{"dialect": "vllm-nixl-v1", "result": "found"}); got != 1 {
		t.Fatalf("params found %v", got)
	}
	p.allReleased(t)

	// Chat: max_completion_tokens is capped too, min_completion_tokens removed.
	in = `{"model":"m","messages":[{"role":"user","content":"hi"}],"max_completion_tokens":64,"min_completion_tokens":3}`
	resp, out = p.post(t, "/v1/chat/completions", in, nil)
	if resp.StatusCode != 200 || !strings.Contains(string(out), "pulled from P") {
		t.Fatalf("%d %s", resp.StatusCode, out)
	}
	pb = jsonMap(t, P.requests()[1].Body)
	if pb["max_completion_tokens"] != json.Number("1") || pb["max_tokens"] != json.Number("1") || pb["min_completion_tokens"] != nil {
		t.Fatalf("chat prefill body %s", P.requests()[1].Body)
	}
	if db = jsonMap(t, D.requests()[1].Body); db["max_completion_tokens"] != json.Number("64") || db["min_completion_tokens"] != json.Number("3") {
		t.Fatalf("chat decode body %s", D.requests()[1].Body)
	}
}

func TestVLLMDegradesToRecompute(t *testing.T) {
	for _, tc := range []struct {
		name    string
		prefill handleFunc
	}{
		{"prefill 5xx", func(u *upstream, w http.ResponseWriter, r *http.Request, body []byte) {
			http.Error(w, `{"error":{"message":"oom"}}`, 500)
		}},
		{"no params (vLLM without NIXL)", completion},
		{"params over 64 KB", func(u *upstream, w http.ResponseWriter, r *http.Request, body []byte) {
			w.Header().Set("Content-Type", "application/json")
			_, _ = io.WriteString(w, `{"choices":[],"kv_transfer_params":{"remote_host":"`+strings.Repeat("h", 70<<10)+`"}}`)
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			P, D := newUpstream(t, "P", tc.prefill), newUpstream(t, "D", vllmDecode)
			p := pdPool(t, "vllm", []*upstream{P}, []*upstream{D}, nil, nil)
			resp, out := p.post(t, "/v1/completions", `{"model":"m","prompt":"hello"}`, nil)
			if resp.StatusCode != 200 || !strings.Contains(string(out), "D recomputed") {
				t.Fatalf("%d %s", resp.StatusCode, out)
			}
			if string(D.requests()[0].Body) != `{"model":"m","prompt":"hello"}` {
				t.Fatalf("decode body %s", D.requests()[0].Body)
			}
			if resp.Header.Get(HeaderPrefill) != "" || resp.Header.Get(HeaderEndpoint) != "D" {
				t.Fatalf("receipts %v", resp.Header)
			}
			if got := p.metric(t, "kvexact_proxy_pd_params_total", map[string]string{"result": "missing"}); got != 1 {
				t.Fatalf("params missing %v", got)
			}
			p.allReleased(t)
		})
	}
}

func TestVLLMPrefill4xxRelayed(t *testing.T) {
	P := newUpstream(t, "P", func(u *upstream, w http.ResponseWriter, r *http.Request, body []byte) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(400)
		_, _ = io.WriteString(w, `{"error":{"message":"This model's maximum context length is 4096 tokens","type":"BadRequestError","param":null,"code":400}}`)
	})
	D := newUpstream(t, "D", vllmDecode)
	p := pdPool(t, "vllm", []*upstream{P}, []*upstream{D}, nil, nil)
	resp, out := p.post(t, "/v1/completions", `{"model":"m","prompt":"hello"}`, nil)
	if resp.StatusCode != 400 || !strings.Contains(string(out), "maximum context length") || D.count() != 0 {
		t.Fatalf("%d %s (decode called %d)", resp.StatusCode, out, D.count())
	}
	p.allReleased(t)
}

func TestVLLMDecodeReselectedAfterPrefill(t *testing.T) {
	var p *pool
	P := newUpstream(t, "P", func(u *upstream, w http.ResponseWriter, r *http.Request, body []byte) {
		p.ep("D1").Health.SetAdminDown(true) // the chosen decode dies during a long prefill
		vllmPrefill(u, w, r, body)
	})
	D1, D2 := newUpstream(t, "D1", vllmDecode), newUpstream(t, "D2", vllmDecode)
	p = pdPool(t, "vllm", []*upstream{P}, []*upstream{D1, D2}, nil, func(c *Config) { c.DebugHeader = true })
	resp, out := p.post(t, "/v1/completions", `{"model":"m","prompt":"hello"}`, nil)
	if resp.StatusCode != 200 || !strings.Contains(string(out), "D2 pulled from P") || D1.count() != 0 {
		t.Fatalf("%d %s (D1 called %d)", resp.StatusCode, out, D1.count())
	}
	var dec struct {
		Target string `json:"target"`
		Decode string `json:"decode"`
	}
	_ = json.Unmarshal([]byte(resp.Header.Get(HeaderDecision)), &dec)
	if resp.Header.Get(HeaderEndpoint) != "D2" || dec.Decode != "D2" || dec.Target != "P" {
		t.Fatalf("receipt %s decision %s", resp.Header.Get(HeaderEndpoint), resp.Header.Get(HeaderDecision))
	}
	p.allReleased(t)
}

func TestPDConnectFailureNeverPicksDecodeAsPrefill(t *testing.T) {
	P2, D := newUpstream(t, "P2", vllmPrefill), newUpstream(t, "D", vllmDecode)
	specs := []epSpec{{name: "P1", addr: closedAddr(t), role: "prefill"}, {name: "P2", addr: P2.srv.URL, role: "prefill"}, {name: "D", addr: D.srv.URL, role: "decode"}}
	p := newPool(t, "vllm", 0, specs, nil, nil, nil)
	resp, out := p.post(t, "/v1/completions", `{"model":"m","prompt":"hello"}`, nil)
	if resp.StatusCode != 200 || resp.Header.Get(HeaderPrefill) != "P2" || resp.Header.Get(HeaderEndpoint) != "D" || !strings.Contains(string(out), "pulled from P2") {
		t.Fatalf("%d %v %s", resp.StatusCode, resp.Header, out)
	}
	for _, r := range D.requests() {
		if strings.Contains(string(r.Body), `"do_remote_decode":true`) {
			t.Fatal("the decode endpoint got a prefill leg")
		}
	}
	// With every prefill unreachable the request fails with 503; the decode endpoint is never used
	// as a prefill target.
	specs = []epSpec{{name: "P1", addr: closedAddr(t), role: "prefill"}, {name: "D", addr: D.srv.URL, role: "decode"}}
	p2 := newPool(t, "vllm", 0, specs, nil, nil, nil)
	n := D.count()
	resp, out = p2.post(t, "/v1/completions", `{"model":"m","prompt":"hello"}`, nil)
	if resp.StatusCode != 503 || D.count() != n {
		t.Fatalf("%d %s", resp.StatusCode, out)
	}
	p.allReleased(t)
	p2.allReleased(t)
}

// ---- SGLang (sglang-bootstrap-v1) ----

// sgRooms is the rendezvous an SGLang prefill engine's bootstrap server provides: prefill answers
// only once decode has joined its room; decode starts only once prefill holds the room.
type sgRooms struct {
	mu    sync.Mutex
	rooms map[string]*sgRoom
}

type sgRoom struct {
	joined, held chan struct{}
	j, h         sync.Once
}

func (s *sgRooms) room(b []byte) *sgRoom {
	var v struct {
		Room json.RawMessage `json:"bootstrap_room"`
	}
	_ = json.Unmarshal(b, &v)
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.rooms == nil {
		s.rooms = map[string]*sgRoom{}
	}
	rm := s.rooms[string(v.Room)]
	if rm == nil {
		rm = &sgRoom{joined: make(chan struct{}), held: make(chan struct{})}
		s.rooms[string(v.Room)] = rm
	}
	return rm
}

func (s *sgRooms) prefill(fail int) handleFunc {
	return func(u *upstream, w http.ResponseWriter, r *http.Request, body []byte) {
		rm := s.room(body)
		rm.h.Do(func() { close(rm.held) })
		select {
		case <-rm.joined:
		case <-r.Context().Done():
			return
		case <-time.After(10 * time.Second):
			http.Error(w, "decode never joined the room: the proxy is sequential", 500)
			return
		}
		switch fail {
		case 0:
			w.Header().Set("Content-Type", "application/json")
			_, _ = io.WriteString(w, `{"id":"p","choices":[{"index":0,"text":"","finish_reason":"length"}]}`)
		case 400:
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(400)
			_, _ = io.WriteString(w, `{"object":"error","message":"bad sampling params","type":"BadRequestError","param":null,"code":400}`)
		default:
			w.WriteHeader(fail)
		}
	}
}

func (s *sgRooms) decode(canceled chan<- struct{}) handleFunc {
	return func(u *upstream, w http.ResponseWriter, r *http.Request, body []byte) {
		rm := s.room(body)
		rm.j.Do(func() { close(rm.joined) })
		select {
		case <-rm.held:
		case <-r.Context().Done():
			// Cancelled before this handler saw the prefill arrive (a fast prefill failure can
			// beat it): the decode leg was aborted all the same.
			if canceled != nil {
				close(canceled)
			}
			return
		}
		if canceled != nil { // the KV never arrives: wait to be cancelled
			<-r.Context().Done()
			close(canceled)
			return
		}
		w.Header().Set("Content-Type", "text/event-stream")
		_, _ = io.WriteString(w, `data: {"choices":[{"index":0,"text":"`+u.name+` decoded"}]}`+"\n\ndata: [DONE]\n\n")
	}
}

func TestSGLangDialectConcurrent(t *testing.T) {
	rooms := &sgRooms{}
	P, D := newUpstream(t, "P", rooms.prefill(0)), newUpstream(t, "D", rooms.decode(nil))
	p := pdPool(t, "sglang", []*upstream{P}, []*upstream{D}, nil, nil)
	in := `{"model":"m","prompt":"hello","stream":true,"max_tokens":50,"temperature":0}`
	for i := range 2 {
		resp, out := p.post(t, "/v1/completions", in, map[string]string{HeaderRequestID: "sg-1"})
		if resp.StatusCode != 200 || !strings.Contains(string(out), "D decoded") {
			t.Fatalf("%d %s", resp.StatusCode, out)
		}
		if resp.Header.Get(HeaderPrefill) != "P" || resp.Header.Get(HeaderEndpoint) != "D" {
			t.Fatalf("receipts %v", resp.Header)
		}
		pre, dec := P.requests()[i], D.requests()[i]
		if string(pre.Body) != string(dec.Body) {
			t.Fatalf("the legs differ:\n%s\n%s", pre.Body, dec.Body)
		}
		if pre.Header.Get(HeaderRequestID) != "sg-1" || dec.Header.Get(HeaderRequestID) != "sg-1" {
			t.Fatal("the legs do not share the request id")
		}
		b := jsonMap(t, pre.Body)
		room, err := b["bootstrap_room"].(json.Number).Int64()
		if err != nil || room < 0 || b["bootstrap_host"] != "127.0.0.1" || b["bootstrap_port"] != json.Number("9123") {
			t.Fatalf("bootstrap triple: %s", pre.Body)
		}
		for _, k := range []string{"bootstrap_room", "bootstrap_host", "bootstrap_port"} {
			delete(b, k)
		}
		if !reflect.DeepEqual(b, jsonMap(t, []byte(in))) {
			t.Fatalf("the body changed beyond the bootstrap triple: %s", pre.Body)
		}
	}
	if r0, r1 := jsonMap(t, P.requests()[0].Body)["bootstrap_room"], jsonMap(t, P.requests()[1].Body)["bootstrap_room"]; r0 == r1 {
		t.Fatalf("the room was reused: %v", r0)
	}
	p.allReleased(t)
}

func TestSGLangBatchGetsPerItemLists(t *testing.T) {
	var got []byte
	var mu sync.Mutex
	rec := func(u *upstream, w http.ResponseWriter, r *http.Request, body []byte) {
		mu.Lock()
		got = body
		mu.Unlock()
		completion(u, w, r, body)
	}
	P, D := newUpstream(t, "P", rec), newUpstream(t, "D", rec)
	p := pdPool(t, "sglang", []*upstream{P}, []*upstream{D}, nil, nil)
	resp, out := p.post(t, "/v1/completions", `{"model":"m","prompt":["a","b","c"]}`, nil)
	if resp.StatusCode != 200 {
		t.Fatalf("%d %s", resp.StatusCode, out)
	}
	var v struct {
		Host  []string `json:"bootstrap_host"`
		Port  []int    `json:"bootstrap_port"`
		Rooms []int64  `json:"bootstrap_room"`
	}
	mu.Lock()
	defer mu.Unlock()
	if err := json.Unmarshal(got, &v); err != nil || len(v.Host) != 3 || len(v.Port) != 3 || len(v.Rooms) != 3 || v.Port[2] != 9123 || v.Rooms[0] == v.Rooms[1] {
		t.Fatalf("%v %s", err, got)
	}
}

func TestSGLangPrefillFailureAbortsDecode(t *testing.T) {
	for _, tc := range []struct {
		fail   int
		status int
		code   string
	}{{503, 502, "pd_sg_prefill_failed"}, {500, 502, "pd_sg_prefill_failed"}, {400, 400, ""}} {
		t.Run(http.StatusText(tc.fail), func(t *testing.T) {
			rooms := &sgRooms{}
			canceled := make(chan struct{})
			P, D := newUpstream(t, "P", rooms.prefill(tc.fail)), newUpstream(t, "D", rooms.decode(canceled))
			p := pdPool(t, "sglang", []*upstream{P}, []*upstream{D}, nil, nil)
			resp, out := p.post(t, "/v1/completions", `{"model":"m","prompt":"hello","stream":true}`, nil)
			if resp.StatusCode != tc.status {
				t.Fatalf("%d %s", resp.StatusCode, out)
			}
			if tc.code != "" {
				if _, _, _, code := oaiError(t, out); *code != tc.code {
					t.Fatalf("%s", out)
				}
			} else if !strings.Contains(string(out), "bad sampling params") || resp.Header.Get(HeaderEndpoint) != "P" {
				t.Fatalf("the prefill 4xx was not relayed verbatim: %s", out)
			}
			select {
			case <-canceled:
			case <-time.After(10 * time.Second):
				t.Fatal("the decode leg was not aborted")
			}
			p.allReleased(t)
		})
	}
}

func TestSGLangDecodeUnreachableRetriesPair(t *testing.T) {
	rooms := &sgRooms{}
	P, D2 := newUpstream(t, "P", rooms.prefill(0)), newUpstream(t, "D2", rooms.decode(nil))
	specs := []epSpec{{name: "P", addr: P.srv.URL, role: "prefill"}, {name: "D1", addr: closedAddr(t), role: "decode"}, {name: "D2", addr: D2.srv.URL, role: "decode"}}
	p := newPool(t, "sglang", 0, specs, nil, nil, nil)
	resp, out := p.post(t, "/v1/completions", `{"model":"m","prompt":"hello"}`, nil)
	if resp.StatusCode != 200 || resp.Header.Get(HeaderEndpoint) != "D2" || !strings.Contains(string(out), "D2 decoded") {
		t.Fatalf("%d %v %s", resp.StatusCode, resp.Header, out)
	}
	p.allReleased(t)
}

// ---- TensorRT-LLM (trtllm-ctx-first-v1) ----

const trtParams = `{"request_type":"context_only","first_gen_tokens":[42],"ctx_request_id":77,"encoded_opaque_state":"b3BhcXVl","draft_tokens":null}`

// trtContext answers a context_only request like trtllm-serve: one choice carrying the params.
func trtContext(finish string, chat bool) handleFunc {
	return func(u *upstream, w http.ResponseWriter, r *http.Request, body []byte) {
		w.Header().Set("Content-Type", "application/json")
		choice := `{"index":0,"text":"Hel","finish_reason":"` + finish + `","disaggregated_params":` + trtParams + `}`
		obj := "text_completion"
		if chat {
			choice = `{"index":0,"message":{"role":"assistant","content":"Hel"},"finish_reason":"` + finish + `","disaggregated_params":` + trtParams + `}`
			obj = "chat.completion"
		}
		_, _ = io.WriteString(w, `{"id":"cmpl-ctx","object":"`+obj+`","created":5,"model":"m","choices":[`+choice+`],"prompt_token_ids":[1,2,3],"usage":{"prompt_tokens":3,"completion_tokens":1,"total_tokens":4}}`)
	}
}

func trtGeneration(u *upstream, w http.ResponseWriter, r *http.Request, body []byte) {
	var v struct {
		DP struct {
			RequestType  string `json:"request_type"`
			CtxRequestID int    `json:"ctx_request_id"`
		} `json:"disaggregated_params"`
	}
	if json.Unmarshal(body, &v) != nil || v.DP.RequestType != "generation_only" || v.DP.CtxRequestID != 77 {
		http.Error(w, `{"error":"generation_only needs ctx_request_id"}`, 400)
		return
	}
	w.Header().Set("Content-Type", "text/event-stream")
	_, _ = io.WriteString(w, `data: {"choices":[{"index":0,"text":"`+u.name+` generated"}]}`+"\n\ndata: [DONE]\n\n")
}

func TestTRTLLMDialect(t *testing.T) {
	C, G := newUpstream(t, "C", trtContext("length", false)), newUpstream(t, "G", trtGeneration)
	p := pdPool(t, "trtllm", []*upstream{C}, []*upstream{G}, nil, nil)
	in := `{"model":"m","prompt":"hello","stream":true,"stream_options":{"include_usage":true},"max_tokens":50}`
	resp, out := p.post(t, "/v1/completions", in, map[string]string{HeaderRequestID: "trt-1"})
	if resp.StatusCode != 200 || !strings.Contains(string(out), "G generated") {
		t.Fatalf("%d %s", resp.StatusCode, out)
	}
	if resp.Header.Get(HeaderPrefill) != "C" || resp.Header.Get(HeaderEndpoint) != "G" {
		t.Fatalf("receipts %v", resp.Header)
	}
	cb := jsonMap(t, C.requests()[0].Body)
	if !reflect.DeepEqual(cb["disaggregated_params"], map[string]any{"request_type": "context_only"}) {
		t.Fatalf("context disaggregated_params %v", cb["disaggregated_params"])
	}
	if so, ok := cb["stream_options"]; !ok || so != nil || cb["stream"] != false {
		t.Fatalf("context leg must send stream false and stream_options null: %s", C.requests()[0].Body)
	}
	if cb["max_tokens"] != json.Number("50") || cb["prompt"] != "hello" {
		t.Fatalf("context leg rewrote more than the dialect says: %s", C.requests()[0].Body)
	}
	gb := jsonMap(t, G.requests()[0].Body)
	want := jsonMap(t, []byte(trtParams))
	want["request_type"] = "generation_only"
	if !reflect.DeepEqual(gb["disaggregated_params"], want) {
		t.Fatalf("generation disaggregated_params %v", gb["disaggregated_params"])
	}
	delete(gb, "disaggregated_params")
	if !reflect.DeepEqual(gb, jsonMap(t, []byte(in))) {
		t.Fatalf("generation body is not the client's body plus the params: %s", G.requests()[0].Body)
	}
	if C.requests()[0].Header.Get(HeaderRequestID) != "trt-1" || G.requests()[0].Header.Get(HeaderRequestID) != "trt-1" {
		t.Fatal("the legs do not share the request id")
	}
	p.allReleased(t)
}

func TestTRTLLMEarlyExit(t *testing.T) {
	for _, tc := range []struct {
		name   string
		chat   bool
		stream bool
	}{{"completions stream", false, true}, {"chat stream", true, true}, {"chat json", true, false}} {
		t.Run(tc.name, func(t *testing.T) {
			C, G := newUpstream(t, "C", trtContext("stop", tc.chat)), newUpstream(t, "G", trtGeneration)
			p := pdPool(t, "trtllm", []*upstream{C}, []*upstream{G}, nil, nil)
			path, in := "/v1/completions", `{"model":"m","prompt":"hello"`
			if tc.chat {
				path, in = "/v1/chat/completions", `{"model":"m","messages":[{"role":"user","content":"hi"}]`
			}
			if tc.stream {
				in += `,"stream":true`
			}
			resp, out := p.post(t, path, in+"}", nil)
			if resp.StatusCode != 200 || G.count() != 0 || resp.Header.Get(HeaderEndpoint) != "C" {
				t.Fatalf("%d %s (generation called %d)", resp.StatusCode, out, G.count())
			}
			if !tc.stream {
				if !strings.Contains(string(out), `"ctx_request_id":77`) || !strings.Contains(string(out), `"content":"Hel"`) {
					t.Fatalf("%s", out)
				}
				return
			}
			data := sseData(out)
			if !isSSE(resp.Header) || len(data) != 2 || data[1] != "[DONE]" {
				t.Fatalf("%q", out)
			}
			var chunk struct {
				ID      string `json:"id"`
				Object  string `json:"object"`
				Choices []struct {
					Text         *string                   `json:"text"`
					Delta        *struct{ Content string } `json:"delta"`
					FinishReason string                    `json:"finish_reason"`
				} `json:"choices"`
				Usage *struct {
					TotalTokens int `json:"total_tokens"`
				} `json:"usage"`
			}
			if err := json.Unmarshal([]byte(data[0]), &chunk); err != nil || chunk.ID != "cmpl-ctx" || len(chunk.Choices) != 1 || chunk.Choices[0].FinishReason != "stop" || chunk.Usage == nil || chunk.Usage.TotalTokens != 4 {
				t.Fatalf("%v %s", err, data[0])
			}
			if tc.chat && (chunk.Object != "chat.completion.chunk" || chunk.Choices[0].Delta == nil || chunk.Choices[0].Delta.Content != "Hel") ||
				!tc.chat && (chunk.Object != "text_completion" || chunk.Choices[0].Text == nil || *chunk.Choices[0].Text != "Hel") {
				t.Fatalf("%s", data[0])
			}
			p.allReleased(t)
		})
	}
}

func TestTRTLLMBadContextDegrades(t *testing.T) {
	C := newUpstream(t, "C", completion) // no disaggregated_params
	G := newUpstream(t, "G", func(u *upstream, w http.ResponseWriter, r *http.Request, body []byte) {
		if strings.Contains(string(body), "disaggregated_params") {
			http.Error(w, "unexpected params", 400)
			return
		}
		completion(u, w, r, body)
	})
	p := pdPool(t, "trtllm", []*upstream{C}, []*upstream{G}, nil, nil)
	resp, out := p.post(t, "/v1/completions", `{"model":"m","prompt":"hello"}`, nil)
	if resp.StatusCode != 200 || !strings.Contains(string(out), "served by G") || resp.Header.Get(HeaderPrefill) != "" {
		t.Fatalf("%d %s", resp.StatusCode, out)
	}
	if got := p.metric(t, "kvexact_proxy_pd_params_total", map[string]string{"dialect": "trtllm-ctx-first-v1", "result": "missing"}); got != 1 {
		t.Fatalf("missing %v", got)
	}
}

// TestDialectsMatchContracts: the dialect every contract names is its own family's, under that
// name (the metric label); a contract saying none belongs to a family without one.
func TestDialectsMatchContracts(t *testing.T) {
	for _, ct := range contracts.All() {
		f, err := registry.Lookup(ct.Family)
		if err != nil {
			t.Fatalf("%s: %v", ct.ID, err)
		}
		d := f.PDDialect()
		switch {
		case ct.PD == "none" && d != nil:
			t.Errorf("%s: contract says pd none, family %s has dialect %s", ct.ID, ct.Family, d.Name())
		case ct.PD != "none" && (d == nil || d.Name() != ct.PD || dialects[ct.PD] != d):
			t.Errorf("%s: contract names %s, family %s has %v", ct.ID, ct.PD, ct.Family, d)
		}
	}
}
