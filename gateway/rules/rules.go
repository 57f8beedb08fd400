// Package rules owns the gateway's configuration: the YAML file and the live rule set the admin API
// edits. A rule says which models a listener serves, which endpoints serve them, and how requests are
// routed (selector, KV-exact mode, key binding, load law, breaker, session, admission). Every field is
// validated with a message that names the field and the allowed values; a rejected change mutates
// nothing.
package rules

import (
	"bytes"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net/url"
	"os"
	"slices"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/kvexact/kvexact/contracts"
	"github.com/kvexact/kvexact/gateway/hub"
)

// Config is the whole gateway.yaml.
type Config struct {
	// Listen is the default client listener, e.g. "127.0.0.1:8080". Rules may name their own.
	Listen string `yaml:"listen" json:"listen"`
	// Admin configures the admin and metrics listener.
	Admin Admin `yaml:"admin" json:"admin"`
	// Server bounds what a client connection may cost (timeouts, header limits) and sets the
	// client listeners' TLS and protocols. Its timeouts apply to the admin listener too.
	Server Server `yaml:"server" json:"server"`
	// Tokenizers says where model tokenizer folders are staged.
	Tokenizers Tokenizers `yaml:"tokenizers" json:"tokenizers"`
	// MaxBodyBytes caps request bodies (413 above it). Default 16 MiB.
	MaxBodyBytes int64 `yaml:"maxBodyBytes" json:"maxBodyBytes"`
	// DebugHeader adds the routing decision to responses (X-Kvexact-Decision) when true.
	DebugHeader bool `yaml:"debugHeader" json:"debugHeader"`
	// Rules are the routing rules, matched by listener then model.
	Rules []Rule `yaml:"rules" json:"rules"`
}

// Admin configures the admin listener (/admin/*, /metrics).
type Admin struct {
	// Listen defaults to 127.0.0.1:9090: the admin API is not exposed unless asked.
	Listen string `yaml:"listen" json:"listen"`
	// Token is the bearer token every admin request must carry; TokenFile, when set, is read instead.
	// Without a token the admin API answers 401 to every request.
	Token     string `yaml:"token" json:"-"`
	TokenFile string `yaml:"tokenFile" json:"tokenFile,omitempty"`
	// TLS serves the admin listener over HTTPS; TLS.ClientCAFile additionally requires a client
	// certificate chaining to it.
	TLS TLS `yaml:"tls" json:"tls,omitempty"`
	// MetricsListen, when set, serves GET /metrics alone on this address without the token (plain
	// HTTP), so that Prometheus can scrape; nothing else is served there. Empty (the default): the
	// metrics stay behind the admin token.
	MetricsListen string `yaml:"metricsListen" json:"metricsListen,omitempty"`
}

// Server configures the HTTP servers of the client listeners. Zero fields take the defaults shown.
type Server struct {
	// ReadHeaderTimeout bounds the time from a connection's (or a keep-alive request's) first byte
	// to the end of the request's header block (default 10s).
	ReadHeaderTimeout Duration `yaml:"readHeaderTimeout" json:"readHeaderTimeout,omitempty"`
	// IdleTimeout closes a keep-alive connection that sends no next request in time (default 120s).
	IdleTimeout Duration `yaml:"idleTimeout" json:"idleTimeout,omitempty"`
	// BodyTimeout bounds the time from the end of the headers to the last body byte (default 60s);
	// past it the request fails with 408 and the connection is closed.
	BodyTimeout Duration `yaml:"bodyTimeout" json:"bodyTimeout,omitempty"`
	// WriteTimeout bounds each write of a response to the client, renewed after every write that
	// succeeds (default 60s, nginx's send_timeout): a client that stops reading a stream is cut.
	WriteTimeout Duration `yaml:"writeTimeout" json:"writeTimeout,omitempty"`
	// LingerTimeout and LingerBytes bound the lingering close of every connection of the client
	// and admin listeners (internal/linger): after the last answer the gateway reads and discards
	// what the client still sends, so that a refused upload (413, 415, 408, 401) reads its status
	// instead of a reset (defaults 5s and 4 MiB).
	LingerTimeout Duration `yaml:"lingerTimeout" json:"lingerTimeout,omitempty"`
	LingerBytes   int64    `yaml:"lingerBytes" json:"lingerBytes,omitempty"`
	// MaxHeaderBytes caps the request line and header block (default 64 KiB; 431 above it).
	MaxHeaderBytes int `yaml:"maxHeaderBytes" json:"maxHeaderBytes,omitempty"`
	// MaxHeaderFields caps the number of header field lines of a request (default 100; 431 above it).
	MaxHeaderFields int `yaml:"maxHeaderFields" json:"maxHeaderFields,omitempty"`
	// H2C accepts HTTP/2 without TLS (prior knowledge or Upgrade), for a trusted front proxy that
	// speaks it. Off by default; with TLS, HTTP/2 is always offered (ALPN h2).
	H2C bool `yaml:"h2c" json:"h2c,omitempty"`
	// TLS serves the client listeners over HTTPS. ClientCAFile is not accepted here.
	TLS TLS `yaml:"tls" json:"tls,omitempty"`
}

// TLS names a listener's certificate and key, PEM files re-read when they change (a renewed
// certificate is served from the next handshake on, without a restart).
type TLS struct {
	CertFile string `yaml:"certFile" json:"certFile,omitempty"`
	KeyFile  string `yaml:"keyFile" json:"keyFile,omitempty"`
	// ClientCAFile (admin only) is a PEM bundle client certificates must chain to.
	ClientCAFile string `yaml:"clientCAFile" json:"clientCAFile,omitempty"`
}

// Enabled reports whether TLS is configured.
func (t TLS) Enabled() bool { return t.CertFile != "" }

func (t *TLS) validate(clientCA bool) error {
	switch {
	case t.CertFile == "" && t.KeyFile == "" && t.ClientCAFile == "":
		return nil
	case t.CertFile == "":
		return fieldErr("certFile", "required with keyFile or clientCAFile")
	case t.KeyFile == "":
		return fieldErr("keyFile", "required with certFile")
	case t.ClientCAFile != "" && !clientCA:
		return fieldErr("clientCAFile", "client certificates are asked for on the admin listener only (admin.tls.clientCAFile)")
	}
	if _, err := tls.LoadX509KeyPair(t.CertFile, t.KeyFile); err != nil {
		return fieldErr("certFile", "%v", err)
	}
	if t.ClientCAFile != "" {
		pem, err := os.ReadFile(t.ClientCAFile)
		if err != nil {
			return fieldErr("clientCAFile", "%v", err)
		}
		if !x509.NewCertPool().AppendCertsFromPEM(pem) {
			return fieldErr("clientCAFile", "%s holds no PEM certificate", t.ClientCAFile)
		}
	}
	return nil
}

// WithDefaults returns s with its zero fields at their defaults.
func (s Server) WithDefaults() Server {
	if s.ReadHeaderTimeout == 0 {
		s.ReadHeaderTimeout = Duration(10 * time.Second)
	}
	if s.IdleTimeout == 0 {
		s.IdleTimeout = Duration(120 * time.Second)
	}
	if s.BodyTimeout == 0 {
		s.BodyTimeout = Duration(60 * time.Second)
	}
	if s.WriteTimeout == 0 {
		s.WriteTimeout = Duration(60 * time.Second)
	}
	if s.LingerTimeout == 0 {
		s.LingerTimeout = Duration(5 * time.Second)
	}
	if s.LingerBytes == 0 {
		s.LingerBytes = 4 << 20
	}
	if s.MaxHeaderBytes == 0 {
		s.MaxHeaderBytes = 64 << 10
	}
	if s.MaxHeaderFields == 0 {
		s.MaxHeaderFields = 100
	}
	return s
}

func (s *Server) normalize() error {
	*s = s.WithDefaults()
	switch {
	case s.ReadHeaderTimeout < 0:
		return fieldErr("readHeaderTimeout", "must be positive")
	case s.IdleTimeout < 0:
		return fieldErr("idleTimeout", "must be positive")
	case s.BodyTimeout < 0:
		return fieldErr("bodyTimeout", "must be positive")
	case s.WriteTimeout < 0:
		return fieldErr("writeTimeout", "must be positive")
	case s.LingerTimeout < 0 || s.LingerTimeout > Duration(time.Minute):
		return fieldErr("lingerTimeout", "%s is outside 0..1m", time.Duration(s.LingerTimeout))
	case s.LingerBytes < 0 || s.LingerBytes > 1<<30:
		return fieldErr("lingerBytes", "%d is outside 0..1073741824", s.LingerBytes)
	case s.MaxHeaderBytes < 4<<10 || s.MaxHeaderBytes > 16<<20:
		return fieldErr("maxHeaderBytes", "%d is outside 4096..16777216", s.MaxHeaderBytes)
	case s.MaxHeaderFields < 16 || s.MaxHeaderFields > 10000:
		return fieldErr("maxHeaderFields", "%d is outside 16..10000", s.MaxHeaderFields)
	}
	if err := s.TLS.validate(false); err != nil {
		return prefix("tls", err)
	}
	return nil
}

// Tokenizers says where tokenizer folders live.
type Tokenizers struct {
	// Root holds one folder per model slug (model name with "/" → "__").
	Root string `yaml:"root" json:"root"`
	// Folders maps a model name to a folder, overriding the slug rule.
	Folders map[string]string `yaml:"folders" json:"folders,omitempty"`
	// SegmentCacheBytes bounds the exact cache of tokenized prompt segments the tokenizers share
	// (docs/tokenizer.md, "Segment cache"); unset means tokenize.DefaultSegmentCacheBytes (64 MiB),
	// 0 turns it off.
	SegmentCacheBytes *int64 `yaml:"segmentCacheBytes" json:"segmentCacheBytes,omitempty"`
	// KeyCacheBytes bounds the exact cache of recently keyed prompts' block keys, from which a
	// prompt whose token ids extend one of them reuses the keys of the common blocks (docs/routing.md,
	// "Key cache"); unset means route.DefaultKeyCacheBytes (64 MiB), 0 turns it off.
	KeyCacheBytes *int64 `yaml:"keyCacheBytes" json:"keyCacheBytes,omitempty"`
	// Hub fetches the listed models' tokenizer files from a Hugging Face–compatible hub instead
	// (docs/tokenizer.md, "Where the files come from").
	Hub *TokenizerHub `yaml:"hub" json:"hub,omitempty"`
}

// TokenizerHub names a hub, where its files are cached, and each model's repository and revision.
type TokenizerHub struct {
	// Endpoint is the hub's base URL (default https://huggingface.co).
	Endpoint string `yaml:"endpoint" json:"endpoint,omitempty"`
	// TokenFile holds a bearer token for gated or private repositories (read at load, like
	// admin.tokenFile); Token is what it held.
	TokenFile string `yaml:"tokenFile" json:"tokenFile,omitempty"`
	Token     string `yaml:"-" json:"-"`
	// CacheDir holds the fetched snapshots (required; a writable volume in a container).
	CacheDir string `yaml:"cacheDir" json:"cacheDir"`
	// Models maps a served model name to its repository and revision.
	Models map[string]HubModel `yaml:"models" json:"models"`
}

// HubModel is one model's place on the hub.
type HubModel struct {
	// Repo is the repository id, e.g. meta-llama/Meta-Llama-3-8B-Instruct.
	Repo string `yaml:"repo" json:"repo"`
	// Revision is a branch, tag or commit (default main). A commit pins the files: once cached
	// they are used without asking the hub again.
	Revision string `yaml:"revision" json:"revision,omitempty"`
}

// Source is m's hub.Source on h.
func (h *TokenizerHub) Source(m HubModel) hub.Source {
	return hub.Source{Endpoint: h.Endpoint, Repo: m.Repo, Revision: m.Revision, Token: h.Token}
}

// Normalize fills the endpoint default, reads the token file and validates every model's source;
// ctk's pool file runs it on the same section.
func (h *TokenizerHub) Normalize() error {
	if h.Endpoint == "" {
		h.Endpoint = "https://huggingface.co"
	}
	if h.CacheDir == "" {
		return fieldErr("cacheDir", "is required (a folder the gateway may write)")
	}
	if len(h.Models) == 0 {
		return fieldErr("models", "lists no model")
	}
	if h.TokenFile != "" {
		b, err := os.ReadFile(h.TokenFile)
		if err != nil {
			return fieldErr("tokenFile", "%v", err)
		}
		h.Token = strings.TrimSpace(string(b))
	}
	for name, m := range h.Models {
		if err := h.Source(m).Validate(); err != nil {
			return fieldErr("models."+name, "%v", err)
		}
	}
	return nil
}

// Rule is one routing rule.
type Rule struct {
	// Name identifies the rule in the admin API, metrics and certificates.
	Name string `yaml:"name" json:"name"`
	// Listener is the address this rule serves on; "" means Config.Listen.
	Listener string `yaml:"listener" json:"listener,omitempty"`
	// Models are the model names served; empty serves any model (a wildcard pool).
	Models []string `yaml:"models" json:"models,omitempty"`
	// Adapters are the LoRA adapters the endpoints serve on top of the models (vLLM
	// --lora-modules): requests naming one are tokenized as its base model and hashed with its LoRA
	// name, as the engine does.
	Adapters []Adapter `yaml:"adapters" json:"adapters,omitempty"`
	// DiscoverAdapters also serves the LoRA adapters the endpoints list in /v1/models (vLLM lists
	// each with its base model as parent), read at start and on every re-probe: an adapter whose
	// parent is one of models (any parent for a wildcard rule) is served as a declared one with
	// loraName = its id and loraPath = its root; one no endpoint lists any more is 404 again.
	// Declared adapters win.
	DiscoverAdapters bool `yaml:"discoverAdapters" json:"discoverAdapters,omitempty"`
	// Engine names the engine family and release of every endpoint (one contract per rule).
	Engine EngineRef `yaml:"engine" json:"engine"`
	// Selector is the fallback (and mode-3 default) policy: rr, wrr, least-load or chwbl.
	Selector string `yaml:"selector" json:"selector"`
	// KVExactMode: 0 off, 1 KV-exact inside the P/D ladder, 3 single pool (modes.go).
	KVExactMode int `yaml:"kvExactMode" json:"kvExactMode"`
	// BlockSize is the engine's block size in tokens; 0 takes the contract's default.
	BlockSize int `yaml:"blockSize" json:"blockSize,omitempty"`
	// HashAlgorithm is the engine's configured algorithm; "" takes the contract's default.
	HashAlgorithm string `yaml:"hashAlgorithm" json:"hashAlgorithm,omitempty"`
	// Binding is auto (default), engine or router (DESIGN.md, Key bindings).
	Binding string `yaml:"binding" json:"binding,omitempty"`
	// Seed is vLLM's PYTHONHASHSEED string; "" is a valid seed; absent means unset on the engines (the
	// release's default seed where its contract has one for the algorithm, else no engine binding).
	Seed *string `yaml:"seed" json:"seed,omitempty"`
	// MinMatchTokens is the shallow guard (default 16, 0 disables, at most 4096).
	MinMatchTokens *int `yaml:"minMatchTokens" json:"minMatchTokens,omitempty"`
	// Scoring chooses what drives KV-exact selection: overlap (the reference) or prefix (contiguous).
	Scoring string `yaml:"scoring" json:"scoring,omitempty"`
	// LoadLaw bounds KV-exact selection by load.
	LoadLaw LoadLaw `yaml:"loadLaw" json:"loadLaw"`
	// Breaker configures the per-endpoint circuit breaker.
	Breaker Breaker `yaml:"breaker" json:"breaker"`
	// Session configures mode-1 session stickiness.
	Session Session `yaml:"session" json:"session"`
	// Trie configures the mode-1 prefix trie tier.
	Trie Trie `yaml:"trie" json:"trie"`
	// Admission configures the mode-1 admission gate (off by default).
	Admission Admission `yaml:"admission" json:"admission"`
	// CHWBL configures the chwbl selector.
	CHWBL CHWBL `yaml:"chwbl" json:"chwbl"`
	// PredictOnRoute is the TTL of predict-on-route (at most 60s; 0: off): the blocks of each routed
	// prompt count for KV-exact on its endpoint until the engine's events confirm them or the TTL
	// ends, so a burst of one new prefix, or a conversation's next turn, sticks before the events
	// arrive. Unset, a single-pool KV-exact rule (mode 3) gets DefaultPredictOnRoute and every other
	// rule 0: only single-pool decisions record predictions. Read it with PredictTTL.
	PredictOnRoute *OffDuration `yaml:"predictOnRoute" json:"predictOnRoute,omitempty"`
	// InventoryCapacity caps resident blocks per endpoint (FIFO retirement); default 1,000,000.
	InventoryCapacity int `yaml:"inventoryCapacity" json:"inventoryCapacity,omitempty"`
	// LowerTiers indexes the blocks engines offload to lower tiers (host memory, storage, a shared
	// store) and scores a hit there at its cost (docs/routing.md, Lower tiers); default true.
	// false: the GPU's blocks alone, every other medium skipped.
	LowerTiers *bool `yaml:"lowerTiers" json:"lowerTiers,omitempty"`
	// Passthrough lists further paths the rule's endpoints may be sent (e.g. /tokenize, /v1/rerank;
	// "/v1/responses/*" for every path below /v1/responses). Otherwise only the OpenAI API surface
	// the engine family serves (its contract's api list) is forwarded; engine admin routes can never
	// be listed.
	Passthrough []string `yaml:"passthrough" json:"passthrough,omitempty"`
	// Upstream tunes the rule's connections to its endpoints (one HTTP transport per rule).
	Upstream Upstream `yaml:"upstream" json:"upstream"`
	// Endpoints serve the rule's models.
	Endpoints []Endpoint `yaml:"endpoints" json:"endpoints"`
}

// Upstream configures a rule's HTTP client to its endpoints. Zero fields take the defaults shown.
type Upstream struct {
	// MaxConnsPerHost caps connections (idle and busy) to one endpoint; a request past it waits
	// for a connection. Default 0: no cap (an engine's own admission decides).
	MaxConnsPerHost int `yaml:"maxConnsPerHost" json:"maxConnsPerHost,omitempty"`
	// MaxIdleConnsPerHost is how many idle keep-alive connections to one endpoint are kept
	// (default 1024: engines serve hundreds of concurrent streams).
	MaxIdleConnsPerHost int `yaml:"maxIdleConnsPerHost" json:"maxIdleConnsPerHost,omitempty"`
	// DialTimeout bounds a TCP connect and a TLS handshake (default 5s).
	DialTimeout Duration `yaml:"dialTimeout" json:"dialTimeout,omitempty"`
	// ResponseHeaderTimeout bounds the wait for an endpoint's response headers after the request
	// was sent (default 10m: a non-streaming completion answers only when it is complete).
	ResponseHeaderTimeout Duration `yaml:"responseHeaderTimeout" json:"responseHeaderTimeout,omitempty"`
	// IdleConnTimeout closes a keep-alive connection idle that long (default 90s).
	IdleConnTimeout Duration `yaml:"idleConnTimeout" json:"idleConnTimeout,omitempty"`
	// IdleTimeout bounds the silence between two reads of an endpoint's response body (default
	// 60s, nginx's proxy_read_timeout): an engine that stalls mid-stream is dropped, and the client
	// gets an error event and a cut connection, never an answer that looks complete.
	IdleTimeout Duration `yaml:"idleTimeout" json:"idleTimeout,omitempty"`
	// CAFile is a PEM bundle that https:// endpoints' certificates must chain to (default: the
	// system roots).
	CAFile string `yaml:"caFile" json:"caFile,omitempty"`
}

// WithDefaults returns u with its zero fields at their defaults.
func (u Upstream) WithDefaults() Upstream {
	if u.MaxIdleConnsPerHost == 0 {
		u.MaxIdleConnsPerHost = 1024
	}
	if u.DialTimeout == 0 {
		u.DialTimeout = Duration(5 * time.Second)
	}
	if u.ResponseHeaderTimeout == 0 {
		u.ResponseHeaderTimeout = Duration(10 * time.Minute)
	}
	if u.IdleConnTimeout == 0 {
		u.IdleConnTimeout = Duration(90 * time.Second)
	}
	if u.IdleTimeout == 0 {
		u.IdleTimeout = Duration(60 * time.Second)
	}
	return u
}

func (u *Upstream) validate() error {
	switch {
	case u.MaxConnsPerHost < 0 || u.MaxConnsPerHost > 1_000_000:
		return fieldErr("maxConnsPerHost", "%d is outside 0..1000000 (0: no cap)", u.MaxConnsPerHost)
	case u.MaxIdleConnsPerHost < 0 || u.MaxIdleConnsPerHost > 1_000_000:
		return fieldErr("maxIdleConnsPerHost", "%d is outside 1..1000000", u.MaxIdleConnsPerHost)
	case u.DialTimeout < 0:
		return fieldErr("dialTimeout", "must be positive")
	case u.ResponseHeaderTimeout < 0:
		return fieldErr("responseHeaderTimeout", "must be positive")
	case u.IdleConnTimeout < 0:
		return fieldErr("idleConnTimeout", "must be positive")
	case u.IdleTimeout < 0:
		return fieldErr("idleTimeout", "must be positive")
	}
	if u.CAFile != "" {
		pem, err := os.ReadFile(u.CAFile)
		if err != nil {
			return fieldErr("caFile", "%v", err)
		}
		if !x509.NewCertPool().AppendCertsFromPEM(pem) {
			return fieldErr("caFile", "%s holds no PEM certificate", u.CAFile)
		}
	}
	return nil
}

// Adapter is one LoRA adapter a rule serves.
type Adapter struct {
	// Name is the model name clients request for the adapter (its id in the engine's /v1/models).
	Name string `yaml:"name" json:"name"`
	// Base is the model the adapter was trained on: its tokenizer and chat template are used.
	// Default: the rule's only model (required when the rule lists several or none).
	Base string `yaml:"base" json:"base,omitempty"`
	// LoRAName is the name the engine hashes into every block key (vLLM: lora_request.lora_name,
	// which is the served adapter name). Default: Name.
	LoRAName string `yaml:"loraName" json:"loraName,omitempty"`
	// LoRAPath is the adapter's path as the engine was given it (vLLM --lora-modules name=path; its
	// /v1/models lists it as the adapter's root). vLLM v0.31.0+ hashes it beside the LoRA name, so
	// on those releases an adapter without a path is routed with miss lora. Discovered adapters
	// take it from the endpoint's listing.
	LoRAPath string `yaml:"loraPath" json:"loraPath,omitempty"`
}

// EngineRef names a contract.
type EngineRef struct {
	Family  string `yaml:"family" json:"family"`
	Release string `yaml:"release" json:"release"`
}

// LoadLaw is the bounded-load law of KV-exact selection.
type LoadLaw struct {
	// Kind: hard (default), soft, adaptive, off or ttft (lowest predicted time to first token).
	Kind string `yaml:"kind" json:"kind"`
	// Epsilon: hard law headroom over the mean, default 0.75 (cap = (1+ε)·mean share).
	Epsilon *float64 `yaml:"epsilon" json:"epsilon,omitempty"`
	// CapFloor: the hard laws' least cap, in requests in flight, of an endpoint holding at least
	// half the prompt's blocks, default 8 (such a holder below it is never over its cap: an engine
	// batches several sequences, and waiting behind a few mostly cached requests costs less than
	// the prefill a spill repeats; docs/routing.md). 1 is the law before the floor.
	CapFloor *int `yaml:"capFloor" json:"capFloor,omitempty"`
	// Lambda: soft law load penalty, default 32.
	Lambda int `yaml:"lambda" json:"lambda,omitempty"`
	// SpillRelief lets an over-cap winner spill to the least-loaded endpoint of the whole pool;
	// default on in mode 3, off in mode 1.
	SpillRelief *bool `yaml:"spillRelief" json:"spillRelief,omitempty"`
	// ColdStartSeedN diverts every Nth hit to a cold endpoint (default 16, 0 disables).
	ColdStartSeedN *int `yaml:"coldStartSeedN" json:"coldStartSeedN,omitempty"`
	// ColdStartMinBlocks: an endpoint with fewer resident blocks is cold (default 16).
	ColdStartMinBlocks int `yaml:"coldStartMinBlocks" json:"coldStartMinBlocks,omitempty"`
	// MissPlacement is where KV-exact sends a prompt no eligible endpoint holds (or holds below
	// minMatchTokens): "headroom" picks the least-loaded endpoint, and among equally loaded
	// ones the one whose KV cache is least full (resident + predicted blocks over capacity);
	// "home" sends it to the prompt's home endpoint — the highest rendezvous hash of the key of
	// its first minMatchTokens' blocks over the eligible endpoints — unless the home is at or
	// over the hard law's load cap (⌈(1+epsilon)·(in flight + 1)·capacity share⌉, without the
	// holder's capFloor), then it places by headroom; "last" sends it to the endpoint the
	// prompt (the same key) was last routed to, remembered in a bounded LRU, unless that
	// endpoint is not eligible or at or over the same cap, then to the rule's selector;
	// "selector" leaves it to the rule's selector; "fewest-blocks" leaves it to the rule's
	// selector too, and a least-load selector then breaks its load ties by the blocks each
	// endpoint's GPU tier holds (the inventory), fewest first, before its round robin.
	// Default DefaultMissPlacement.
	MissPlacement string `yaml:"missPlacement" json:"missPlacement,omitempty"`
}

// Breaker configures the per-endpoint circuit breaker.
type Breaker struct {
	// Enabled defaults to true (P/D rules always have one).
	Enabled *bool `yaml:"enabled" json:"enabled,omitempty"`
	// FailureThreshold: consecutive failures that open it (default 5, 3 for P/D).
	FailureThreshold int `yaml:"failureThreshold" json:"failureThreshold,omitempty"`
	// OpenFor: how long it stays open before half-open trials (default 30s).
	OpenFor Duration `yaml:"openFor" json:"openFor,omitempty"`
	// HalfOpenRequests: trial requests admitted while half-open (default 3).
	HalfOpenRequests int `yaml:"halfOpenRequests" json:"halfOpenRequests,omitempty"`
	// OriginErrorThreshold: consecutive origin 5xx that open it (default 3, 0 disables).
	OriginErrorThreshold *int `yaml:"originErrorThreshold" json:"originErrorThreshold,omitempty"`
}

// Session configures mode-1 stickiness (X-Conversation-Id, then the body's user).
type Session struct {
	TTL Duration `yaml:"ttl" json:"ttl,omitempty"` // default 300s
}

// Trie configures the mode-1 prefix trie.
type Trie struct {
	Enabled bool `yaml:"enabled" json:"enabled"`
	// ThresholdPct is the minimum match rate in percent (default 20).
	ThresholdPct int `yaml:"thresholdPct" json:"thresholdPct,omitempty"`
	// BalanceAbs bypasses the trie when max(active) − min(active) exceeds it (default 3).
	BalanceAbs int `yaml:"balanceAbs" json:"balanceAbs,omitempty"`
}

// Admission configures the mode-1 admission gate.
type Admission struct {
	Enabled bool `yaml:"enabled" json:"enabled"`
	// MaxInflightPerEndpoint caps in-flight requests per prefill endpoint.
	MaxInflightPerEndpoint int `yaml:"maxInflightPerEndpoint" json:"maxInflightPerEndpoint,omitempty"`
	// Mode: park (hold, then 504 after MaxPark) or shed (429).
	Mode string `yaml:"mode" json:"mode,omitempty"`
	// QueueDepth per endpoint for park (default 64, at most 64).
	QueueDepth int `yaml:"queueDepth" json:"queueDepth,omitempty"`
	// MaxPark is the park deadline (default 30s).
	MaxPark Duration `yaml:"maxPark" json:"maxPark,omitempty"`
}

// CHWBL configures consistent hashing with bounded loads.
type CHWBL struct {
	// Replication: virtual nodes per endpoint (default 256).
	Replication int `yaml:"replication" json:"replication,omitempty"`
	// LoadFactor: an endpoint may carry at most LoadFactor × mean load (default 1.25).
	LoadFactor float64 `yaml:"loadFactor" json:"loadFactor,omitempty"`
	// PrefixChars: how many leading characters of the rendered prompt form the key (default 256).
	PrefixChars int `yaml:"prefixChars" json:"prefixChars,omitempty"`
}

// Endpoint is one engine server.
type Endpoint struct {
	// Name identifies the endpoint in receipts, metrics and certificates (default: Address).
	Name string `yaml:"name" json:"name"`
	// Address is the engine's base URL, e.g. http://127.0.0.1:8000.
	Address string `yaml:"address" json:"address"`
	// Role: normal (default), prefill or decode.
	Role string `yaml:"role" json:"role,omitempty"`
	// Weight for wrr and capacity shares (default 1).
	Weight int `yaml:"weight" json:"weight,omitempty"`
	// Events says where the endpoint publishes KV events.
	Events Events `yaml:"events" json:"events"`
	// BootstrapPort is the SGLang prefill bootstrap port (P/D).
	BootstrapPort int `yaml:"bootstrapPort" json:"bootstrapPort,omitempty"`
	// CapacityBlocks is the endpoint's KV capacity in blocks for the load law (default 1).
	CapacityBlocks int `yaml:"capacityBlocks" json:"capacityBlocks,omitempty"`
	// MaxRunning is how many requests the engine runs at once (vLLM --max-num-seqs, SGLang
	// --max-running-requests); past it a new request waits for a running one to finish, a wait
	// the ttft law adds to its prediction. 0 (the default): unknown, learned from the engine's
	// load reports when they are scraped (the most requests seen running while some waited).
	MaxRunning int `yaml:"maxRunning" json:"maxRunning,omitempty"`
	// AdminDown takes the endpoint out of every tier.
	AdminDown bool `yaml:"adminDown" json:"adminDown,omitempty"`
}

// Events lists an endpoint's event sources, one entry per data-parallel rank in rank order.
type Events struct {
	ZMQ    []string `yaml:"zmq" json:"zmq,omitempty"`
	Replay []string `yaml:"replay" json:"replay,omitempty"`
	Topic  string   `yaml:"topic" json:"topic,omitempty"`
	// Drain is the TensorRT-LLM server base URL polled at /kv_cache_events (default: Address).
	Drain string `yaml:"drain" json:"drain,omitempty"`
	// QueueLimit bounds each ZeroMQ rank's queue between its socket and the event pipeline, in
	// messages (0: ingest.DefaultQueueLimit, 10000); a message arriving at a full queue is dropped
	// and counted (kvexact_ingest_queue_full_total).
	QueueLimit int `yaml:"queueLimit" json:"queueLimit,omitempty"`
}

// MaxMaxRunning is the largest maxRunning accepted (an engine's running-request limit).
const MaxMaxRunning = 1_000_000

// MaxQueueLimit is the largest events.queueLimit accepted.
const MaxQueueLimit = 1_000_000

// Duration is a time.Duration written as "30s" in YAML and JSON.
type Duration time.Duration

// UnmarshalYAML reads Go duration syntax.
func (d *Duration) UnmarshalYAML(n *yaml.Node) error {
	v, err := time.ParseDuration(n.Value)
	if err != nil {
		return &valueError{line: n.Line, column: n.Column, msg: fmt.Sprintf("%q is not a duration (e.g. 30s, 5m)", n.Value)}
	}
	*d = Duration(v)
	return nil
}

// MarshalText writes Go duration syntax.
func (d Duration) MarshalText() ([]byte, error) { return []byte(time.Duration(d).String()), nil }

// UnmarshalText reads Go duration syntax.
func (d *Duration) UnmarshalText(b []byte) error {
	v, err := time.ParseDuration(string(b))
	if err != nil {
		return fmt.Errorf("%q is not a duration (e.g. 30s, 5m)", b)
	}
	*d = Duration(v)
	return nil
}

// DefaultPredictOnRoute is a single-pool KV-exact rule's predictOnRoute when the field is unset:
// longer than an engine's event latency under load, short enough that a prediction the engine
// never confirms stops counting soon (docs/benchmarks/peers.md, the predict-on-route default).
const DefaultPredictOnRoute = 2 * time.Second

// DefaultMissPlacement is loadLaw.missPlacement's default (docs/routing.md, Miss placement).
const DefaultMissPlacement = "selector"

// MissFewestBlocks is the loadLaw.missPlacement that leaves a miss to the rule's selector and has
// a least-load selector break its load ties by the blocks each endpoint holds.
const MissFewestBlocks = "fewest-blocks"

// PredictTTL is the rule's predict-on-route TTL, 0 when off (or before Normalize).
func (r *Rule) PredictTTL() time.Duration {
	if r.PredictOnRoute == nil {
		return 0
	}
	return time.Duration(*r.PredictOnRoute)
}

// OffDuration is a Duration that also reads "off" (as 0), for a field whose unset default is on.
type OffDuration Duration

// UnmarshalYAML reads "off" or Go duration syntax.
func (d *OffDuration) UnmarshalYAML(n *yaml.Node) error {
	if n.Value == "off" {
		*d = 0
		return nil
	}
	return (*Duration)(d).UnmarshalYAML(n)
}

// MarshalText writes Go duration syntax (0s when off).
func (d OffDuration) MarshalText() ([]byte, error) { return Duration(d).MarshalText() }

// UnmarshalText reads "off" or Go duration syntax.
func (d *OffDuration) UnmarshalText(b []byte) error {
	if string(b) == "off" {
		*d = 0
		return nil
	}
	return (*Duration)(d).UnmarshalText(b)
}

// Vocabularies.
var (
	Selectors = []string{"rr", "wrr", "least-load", "chwbl"}
	Roles     = []string{"normal", "prefill", "decode"}
	Bindings  = []string{"auto", "engine", "router"}
	Scorings  = []string{"overlap", "prefix"}
	LoadLaws  = []string{"hard", "soft", "adaptive", "off", "ttft"}
	// MissPlacements are loadLaw.missPlacement's values.
	MissPlacements = []string{"fewest-blocks", "headroom", "home", "last", "selector"}
	Modes          = []int{KVExactOff, KVExactPD, KVExactPool}
)

// Load reads and validates a gateway.yaml. Unknown keys are errors.
func Load(path string) (*Config, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	return Parse(b)
}

// Parse decodes and validates a gateway.yaml document, filling defaults.
func Parse(b []byte) (*Config, error) {
	dec := yaml.NewDecoder(bytes.NewReader(b))
	dec.KnownFields(true)
	var c Config
	if err := dec.Decode(&c); err != nil && !errors.Is(err, io.EOF) {
		return nil, fmt.Errorf("gateway config: %w", fieldPaths(b, err))
	}
	if err := c.Normalize(); err != nil {
		return nil, err
	}
	return &c, nil
}

// Normalize fills defaults and validates the whole configuration.
func (c *Config) Normalize() error {
	if c.Listen == "" {
		c.Listen = "127.0.0.1:8080"
	}
	if c.Admin.Listen == "" {
		c.Admin.Listen = "127.0.0.1:9090"
	}
	if c.MaxBodyBytes == 0 {
		c.MaxBodyBytes = 16 << 20
	}
	if c.MaxBodyBytes < 0 {
		return fieldErr("maxBodyBytes", "%d must be positive", c.MaxBodyBytes)
	}
	if n := c.Tokenizers.SegmentCacheBytes; n != nil && *n < 0 {
		return fieldErr("tokenizers.segmentCacheBytes", "%d must be 0 (off) or positive", *n)
	}
	if n := c.Tokenizers.KeyCacheBytes; n != nil && *n < 0 {
		return fieldErr("tokenizers.keyCacheBytes", "%d must be 0 (off) or positive", *n)
	}
	if h := c.Tokenizers.Hub; h != nil {
		if err := h.Normalize(); err != nil {
			return prefix("tokenizers.hub", err)
		}
	}
	if err := c.Server.normalize(); err != nil {
		return prefix("server", err)
	}
	if err := c.Admin.TLS.validate(true); err != nil {
		return prefix("admin.tls", err)
	}
	if c.Admin.TokenFile != "" {
		b, err := os.ReadFile(c.Admin.TokenFile)
		if err != nil {
			return fieldErr("admin.tokenFile", "%v", err)
		}
		c.Admin.Token = strings.TrimSpace(string(b))
	}
	names := map[string]bool{}
	for i := range c.Rules {
		r := &c.Rules[i]
		if err := r.Normalize(); err != nil {
			return prefix(fmt.Sprintf("rules[%d]", i), err)
		}
		if names[r.Name] {
			return fieldErr(fmt.Sprintf("rules[%d].name", i), "%q is used by another rule", r.Name)
		}
		names[r.Name] = true
	}
	return CheckOverlap(c.Listen, c.Rules)
}

// CheckOverlap rejects two rules that would both serve the same model on the same listener.
func CheckOverlap(defaultListen string, rs []Rule) error {
	type key struct{ listen, model string }
	seen := map[key]string{}
	for i, r := range rs {
		l := r.Listener
		if l == "" {
			l = defaultListen
		}
		models := r.Models
		if len(models) == 0 {
			models = []string{""}
		}
		for _, a := range r.Adapters {
			models = append(slices.Clip(models), a.Name)
		}
		for _, m := range models {
			k := key{l, m}
			if other, dup := seen[k]; dup {
				what := fmt.Sprintf("model %q", m)
				if m == "" {
					what = "the wildcard pool"
				}
				return fieldErr(fmt.Sprintf("rules[%d].models", i), "%s on %s is already served by rule %q", what, l, other)
			}
			seen[k] = r.Name
		}
	}
	return nil
}

// FieldError is a validation failure naming the field.
type FieldError struct {
	Field string
	Msg   string
}

func (e *FieldError) Error() string { return e.Field + ": " + e.Msg }

func fieldErr(field, format string, args ...any) error {
	return &FieldError{Field: field, Msg: fmt.Sprintf(format, args...)}
}

func prefix(p string, err error) error {
	var fe *FieldError
	if errors.As(err, &fe) {
		return &FieldError{Field: p + "." + fe.Field, Msg: fe.Msg}
	}
	return fmt.Errorf("%s: %w", p, err)
}

func oneOf(field, v string, allowed []string) error {
	if slices.Contains(allowed, v) {
		return nil
	}
	return fieldErr(field, "%q is not one of %s", v, strings.Join(allowed, ", "))
}

// Contract returns the contract the rule's engine names (Normalize has checked it exists).
func (r *Rule) Contract() *contracts.Contract {
	c, _ := contracts.Lookup(r.Engine.Family, r.Engine.Release)
	return c
}

// Normalize fills the rule's defaults and validates it; on error the rule may be half-filled, so
// callers validate a copy (see Store).
func (r *Rule) Normalize() error {
	if err := checkName("name", r.Name); err != nil {
		return err
	}
	if r.Engine.Family == "" {
		return fieldErr("engine.family", "required, one of %s", strings.Join(contracts.Families, ", "))
	}
	if r.Engine.Release == "" {
		return fieldErr("engine.release", "required (the engine's release tag, e.g. v0.25.1)")
	}
	ct, err := contracts.Lookup(r.Engine.Family, r.Engine.Release)
	if err != nil {
		return fieldErr("engine", "%v", err)
	}
	if r.Selector == "" {
		r.Selector = "rr"
	}
	if err := oneOf("selector", r.Selector, Selectors); err != nil {
		return err
	}
	if !slices.Contains(Modes, r.KVExactMode) {
		hint := ""
		if r.KVExactMode == kvExactReserved {
			hint = " (2 is reserved)"
		}
		return fieldErr("kvExactMode", "%d is not one of 0 (off), 1 (P/D ladder), 3 (single pool)%s", r.KVExactMode, hint)
	}
	for i, m := range r.Models {
		if m == "" {
			return fieldErr(fmt.Sprintf("models[%d]", i), "empty model name (omit models for a wildcard pool)")
		}
		if err := checkName(fmt.Sprintf("models[%d]", i), m); err != nil {
			return err
		}
	}
	if err := r.normalizeAdapters(); err != nil {
		return err
	}
	if len(r.Endpoints) == 0 {
		return fieldErr("endpoints", "at least one endpoint is required")
	}
	roles := map[string]int{}
	epNames := map[string]bool{}
	for i := range r.Endpoints {
		ep := &r.Endpoints[i]
		f := fmt.Sprintf("endpoints[%d]", i)
		if err := ep.normalize(ct); err != nil {
			return prefix(f, err)
		}
		if epNames[ep.Name] {
			return fieldErr(f+".name", "%q is used by another endpoint of this rule", ep.Name)
		}
		epNames[ep.Name] = true
		roles[ep.Role]++
	}
	if len(r.Endpoints) > 256 {
		return fieldErr("endpoints", "%d endpoints; at most 256 per rule", len(r.Endpoints))
	}
	pd := roles["prefill"] > 0 || roles["decode"] > 0
	switch r.KVExactMode {
	case KVExactPD:
		if roles["prefill"] == 0 || roles["decode"] == 0 {
			return fieldErr("kvExactMode", "1 (P/D ladder) needs at least one prefill and one decode endpoint (use 3 for a single pool)")
		}
	case KVExactPool:
		if pd {
			return fieldErr("kvExactMode", "3 (single pool) needs role-less endpoints; this rule has prefill/decode roles (use 1 for P/D)")
		}
	case KVExactOff:
		if pd && (roles["prefill"] == 0 || roles["decode"] == 0) {
			return fieldErr("endpoints", "a P/D rule needs at least one prefill and one decode endpoint")
		}
	}
	if pd && ct.PD == "none" {
		return fieldErr("endpoints", "%s has no prefill/decode dialect; roles prefill/decode are not available", ct.Family)
	}
	if !ct.HasEvents() {
		// llama.cpp: every KV control is refused, with the contract's reason.
		switch {
		case r.KVExactMode != KVExactOff:
			return fieldErr("kvExactMode", "%d refused for %s: %s", r.KVExactMode, ct.Family, ct.Hash.NoneReason)
		case r.BlockSize != 0:
			return fieldErr("blockSize", "refused for %s: %s", ct.Family, ct.Hash.NoneReason)
		case r.HashAlgorithm != "":
			return fieldErr("hashAlgorithm", "refused for %s: %s", ct.Family, ct.Hash.NoneReason)
		case r.Binding != "" && r.Binding != "auto":
			return fieldErr("binding", "refused for %s: %s", ct.Family, ct.Hash.NoneReason)
		case r.Seed != nil:
			return fieldErr("seed", "refused for %s: %s", ct.Family, ct.Hash.NoneReason)
		case pd:
			return fieldErr("endpoints", "prefill/decode roles refused for %s", ct.Family)
		}
		r.Binding = "none"
	} else {
		if r.BlockSize == 0 {
			r.BlockSize = ct.BlockSize.Default
		}
		if r.BlockSize < 1 || r.BlockSize > 4096 {
			return fieldErr("blockSize", "%d is outside 1..4096", r.BlockSize)
		}
		if r.HashAlgorithm == "" {
			r.HashAlgorithm = ct.Hash.DefaultAlgorithm
		}
		if !ct.SupportsAlgorithm(r.HashAlgorithm) {
			return fieldErr("hashAlgorithm", "%q does not fit %s %s; it offers %s", r.HashAlgorithm, ct.Family, ct.Pin.Release, strings.Join(ct.Hash.Algorithms, ", "))
		}
		if r.Binding == "" {
			r.Binding = "auto"
		}
		if err := oneOf("binding", r.Binding, Bindings); err != nil {
			return err
		}
		if r.Binding != "auto" && !ct.SupportsBinding(r.Binding) {
			return fieldErr("binding", "%q is not offered by %s %s (offers %s)", r.Binding, ct.Family, ct.Pin.Release, strings.Join(ct.Hash.Bindings, ", "))
		}
		switch ct.Hash.Seed {
		case "pythonhashseed":
			if _, err := ct.EngineSeed(r.HashAlgorithm, r.Seed); r.Binding == "engine" && err != nil {
				return fieldErr("seed", "required for the engine binding: %v", err)
			}
		case "none":
			if r.Seed != nil {
				return fieldErr("seed", "%s takes no seed; remove the field", ct.Family)
			}
		}
	}
	if r.MinMatchTokens == nil {
		v := 16
		r.MinMatchTokens = &v
	}
	if *r.MinMatchTokens < 0 || *r.MinMatchTokens > 4096 {
		return fieldErr("minMatchTokens", "%d is outside 0..4096", *r.MinMatchTokens)
	}
	if r.Scoring == "" {
		r.Scoring = "overlap"
	}
	if err := oneOf("scoring", r.Scoring, Scorings); err != nil {
		return err
	}
	if err := r.LoadLaw.normalize(r.KVExactMode); err != nil {
		return prefix("loadLaw", err)
	}
	if err := r.Breaker.normalize(pd); err != nil {
		return prefix("breaker", err)
	}
	if r.Session.TTL == 0 {
		r.Session.TTL = Duration(300 * time.Second)
	}
	if r.Session.TTL < 0 {
		return fieldErr("session.ttl", "must be positive")
	}
	if r.PredictOnRoute == nil {
		v := OffDuration(0)
		if r.KVExactMode == KVExactPool {
			v = OffDuration(DefaultPredictOnRoute)
		}
		r.PredictOnRoute = &v
	}
	if *r.PredictOnRoute < 0 || *r.PredictOnRoute > OffDuration(60*time.Second) {
		return fieldErr("predictOnRoute", "%s is outside 0 (off) .. 60s", time.Duration(*r.PredictOnRoute))
	}
	if r.Trie.Enabled && !pd {
		return fieldErr("trie.enabled", "the prefix trie is a P/D-ladder tier; this rule has no prefill/decode endpoints")
	}
	if r.Trie.ThresholdPct == 0 {
		r.Trie.ThresholdPct = 20
	}
	if r.Trie.ThresholdPct < 0 || r.Trie.ThresholdPct > 100 {
		return fieldErr("trie.thresholdPct", "%d is outside 0..100", r.Trie.ThresholdPct)
	}
	if r.Trie.BalanceAbs == 0 {
		r.Trie.BalanceAbs = 3
	}
	if r.Trie.BalanceAbs < 0 {
		return fieldErr("trie.balanceAbs", "%d must be ≥ 0", r.Trie.BalanceAbs)
	}
	if err := r.Admission.normalize(pd); err != nil {
		return prefix("admission", err)
	}
	if r.CHWBL.Replication == 0 {
		r.CHWBL.Replication = 256
	}
	if r.CHWBL.Replication < 1 || r.CHWBL.Replication > 1024 {
		return fieldErr("chwbl.replication", "%d is outside 1..1024", r.CHWBL.Replication)
	}
	if r.CHWBL.LoadFactor == 0 {
		r.CHWBL.LoadFactor = 1.25
	}
	if r.CHWBL.LoadFactor < 1 || r.CHWBL.LoadFactor > 3 {
		return fieldErr("chwbl.loadFactor", "%g is outside 1..3", r.CHWBL.LoadFactor)
	}
	if r.CHWBL.PrefixChars == 0 {
		r.CHWBL.PrefixChars = 256
	}
	if r.CHWBL.PrefixChars < 1 {
		return fieldErr("chwbl.prefixChars", "%d must be positive", r.CHWBL.PrefixChars)
	}
	if err := checkPassthrough(r.Passthrough); err != nil {
		return err
	}
	if err := r.Upstream.validate(); err != nil {
		return prefix("upstream", err)
	}
	if r.InventoryCapacity == 0 {
		r.InventoryCapacity = 1_000_000
	}
	if r.InventoryCapacity < 1000 || r.InventoryCapacity > 100_000_000 {
		return fieldErr("inventoryCapacity", "%d is outside 1000..100000000", r.InventoryCapacity)
	}
	return nil
}

func (ep *Endpoint) normalize(ct *contracts.Contract) error {
	if ep.Address == "" {
		return fieldErr("address", "required (the engine's base URL, e.g. http://127.0.0.1:8000)")
	}
	if !strings.HasPrefix(ep.Address, "http://") && !strings.HasPrefix(ep.Address, "https://") {
		return fieldErr("address", "%q must start with http:// or https://", ep.Address)
	}
	ep.Address = strings.TrimRight(ep.Address, "/")
	if u, err := url.Parse(ep.Address); err != nil || u.Host == "" || u.User != nil || u.RawQuery != "" || u.Fragment != "" {
		return fieldErr("address", "%q is not a base URL (scheme://host[:port][/path], no credentials, query or fragment)", ep.Address)
	}
	if ep.Name == "" {
		ep.Name = ep.Address
	}
	if err := checkName("name", ep.Name); err != nil {
		return err
	}
	if ep.Role == "" {
		ep.Role = "normal"
	}
	if err := oneOf("role", ep.Role, Roles); err != nil {
		return err
	}
	if ep.Weight == 0 {
		ep.Weight = 1
	}
	if ep.Weight < 0 || ep.Weight > 1000 {
		return fieldErr("weight", "%d is outside 1..1000", ep.Weight)
	}
	if ep.CapacityBlocks < 0 {
		return fieldErr("capacityBlocks", "%d must be ≥ 0", ep.CapacityBlocks)
	}
	if ep.MaxRunning < 0 || ep.MaxRunning > MaxMaxRunning {
		return fieldErr("maxRunning", "%d is outside 0..%d", ep.MaxRunning, MaxMaxRunning)
	}
	ev := &ep.Events
	switch ct.Transport {
	case "none":
		if len(ev.ZMQ) > 0 || len(ev.Replay) > 0 || ev.Drain != "" || ev.QueueLimit != 0 {
			return fieldErr("events", "%s publishes no KV events: %s", ct.Family, ct.Hash.NoneReason)
		}
	case "zmq-multipart-v1":
		if ev.Drain != "" {
			return fieldErr("events.drain", "%s publishes over ZeroMQ, not an HTTP drain", ct.Family)
		}
		if len(ev.ZMQ) > 8 {
			return fieldErr("events.zmq", "%d ranks; at most 8", len(ev.ZMQ))
		}
		if ev.QueueLimit < 0 || ev.QueueLimit > MaxQueueLimit {
			return fieldErr("events.queueLimit", "%d is outside 1..%d messages (0: the default, 10000)", ev.QueueLimit, MaxQueueLimit)
		}
		for i, a := range ev.ZMQ {
			if !strings.HasPrefix(a, "tcp://") && !strings.HasPrefix(a, "ipc://") {
				return fieldErr(fmt.Sprintf("events.zmq[%d]", i), "%q must be a tcp:// or ipc:// address", a)
			}
		}
		if len(ev.Replay) > 0 {
			if ct.Events.Replay != "optional" {
				return fieldErr("events.replay", "%s serves no replay", ct.Family)
			}
			if len(ev.Replay) != len(ev.ZMQ) {
				return fieldErr("events.replay", "%d addresses for %d ranks: give one replay address per rank, in rank order", len(ev.Replay), len(ev.ZMQ))
			}
		}
	case "http-drain-v1":
		if len(ev.ZMQ) > 0 || len(ev.Replay) > 0 {
			return fieldErr("events.zmq", "%s drains events over HTTP (events.drain), not ZeroMQ", ct.Family)
		}
		if ev.QueueLimit != 0 {
			return fieldErr("events.queueLimit", "%s drains events over HTTP: there is no ZeroMQ reader queue to bound", ct.Family)
		}
		if ev.Drain == "" {
			ev.Drain = ep.Address
		}
	}
	return nil
}

func (l *LoadLaw) normalize(mode int) error {
	if l.Kind == "" {
		l.Kind = "hard"
	}
	if err := oneOf("kind", l.Kind, LoadLaws); err != nil {
		return err
	}
	if l.Epsilon == nil {
		e := 0.75
		l.Epsilon = &e
	}
	if *l.Epsilon < 0 || *l.Epsilon > 9 {
		return fieldErr("epsilon", "%g is outside 0..9", *l.Epsilon)
	}
	if l.CapFloor == nil {
		f := 8 // the pool-scale sweeps' choice (docs/routing.md)
		l.CapFloor = &f
	}
	if *l.CapFloor < 1 || *l.CapFloor > 100000 {
		return fieldErr("capFloor", "%d is outside 1..100000", *l.CapFloor)
	}
	if l.Lambda == 0 {
		l.Lambda = 32
	}
	if l.Lambda < 1 || l.Lambda > 100000 {
		return fieldErr("lambda", "%d is outside 1..100000", l.Lambda)
	}
	if l.SpillRelief == nil {
		on := mode == KVExactPool
		l.SpillRelief = &on
	}
	if l.ColdStartSeedN == nil {
		n := 16
		l.ColdStartSeedN = &n
	}
	if *l.ColdStartSeedN < 0 {
		return fieldErr("coldStartSeedN", "%d must be ≥ 0 (0 disables)", *l.ColdStartSeedN)
	}
	if l.ColdStartMinBlocks == 0 {
		l.ColdStartMinBlocks = 16
	}
	if l.ColdStartMinBlocks < 0 {
		return fieldErr("coldStartMinBlocks", "%d must be ≥ 0", l.ColdStartMinBlocks)
	}
	if l.MissPlacement == "" {
		l.MissPlacement = DefaultMissPlacement
	}
	return oneOf("missPlacement", l.MissPlacement, MissPlacements)
}

func (b *Breaker) normalize(pd bool) error {
	if b.Enabled == nil {
		on := true
		b.Enabled = &on
	}
	if pd && !*b.Enabled {
		return fieldErr("enabled", "P/D rules always run a breaker")
	}
	if b.FailureThreshold == 0 {
		b.FailureThreshold = 5
		if pd {
			b.FailureThreshold = 3
		}
	}
	if b.FailureThreshold < 1 || b.FailureThreshold > 1000 {
		return fieldErr("failureThreshold", "%d is outside 1..1000", b.FailureThreshold)
	}
	if b.OpenFor == 0 {
		b.OpenFor = Duration(30 * time.Second)
	}
	if b.OpenFor < 0 {
		return fieldErr("openFor", "must be positive")
	}
	if b.HalfOpenRequests == 0 {
		b.HalfOpenRequests = 3
	}
	if b.HalfOpenRequests < 1 {
		return fieldErr("halfOpenRequests", "%d must be ≥ 1", b.HalfOpenRequests)
	}
	if b.OriginErrorThreshold == nil {
		n := 3
		b.OriginErrorThreshold = &n
	}
	if *b.OriginErrorThreshold < 0 {
		return fieldErr("originErrorThreshold", "%d must be ≥ 0 (0 disables)", *b.OriginErrorThreshold)
	}
	return nil
}

func (a *Admission) normalize(pd bool) error {
	if !a.Enabled {
		return nil
	}
	if !pd {
		return fieldErr("enabled", "the admission gate is a P/D-ladder tier; this rule has no prefill/decode endpoints")
	}
	if a.MaxInflightPerEndpoint < 1 {
		return fieldErr("maxInflightPerEndpoint", "%d must be ≥ 1 when admission is enabled", a.MaxInflightPerEndpoint)
	}
	if a.Mode == "" {
		a.Mode = "park"
	}
	if err := oneOf("mode", a.Mode, []string{"park", "shed"}); err != nil {
		return err
	}
	if a.QueueDepth == 0 {
		a.QueueDepth = 64
	}
	if a.QueueDepth < 1 || a.QueueDepth > 64 {
		return fieldErr("queueDepth", "%d is outside 1..64", a.QueueDepth)
	}
	if a.MaxPark == 0 {
		a.MaxPark = Duration(30 * time.Second)
	}
	return nil
}

// IndexesLowerTiers reports whether the rule indexes lower tiers (LowerTiers, default true).
func (r *Rule) IndexesLowerTiers() bool { return r.LowerTiers == nil || *r.LowerTiers }
