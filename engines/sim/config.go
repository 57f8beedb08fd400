// Package sim is a contract-faithful engine simulator: it behaves like a vLLM, SGLang, TensorRT-LLM
// or llama.cpp server of a pinned release on the wire (OpenAI HTTP surface, the family's own info,
// tokenize and metrics endpoints, KV events over ZeroMQ or the HTTP drain, P/D dialects), with a
// real block prefix cache, simulated prefill and decode time, and fault switches. It shares the
// project's hash core and tokenizer, so it proves wiring and semantics, never parity.
package sim

import (
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/kvexact/kvexact/contracts"
	"github.com/kvexact/kvexact/gateway/hashcore"
	"github.com/kvexact/kvexact/gateway/tokenize"
)

// Role is the engine's place in a prefill/decode disaggregated pool.
type Role string

// The roles.
const (
	RoleNormal  Role = "normal"
	RolePrefill Role = "prefill"
	RoleDecode  Role = "decode"
)

// DefaultFamily and DefaultRelease are the engine a harness simulates when it names none.
const (
	DefaultFamily  = "vllm"
	DefaultRelease = "v0.25.1"
)

// Config describes one simulated engine. Zero values take the defaults documented per field.
type Config struct {
	// Family is vllm, sglang, trtllm or llamacpp; Release a tag of that family ("v0.25.1", "v0.5.18",
	// "1.2", "b10573"). Together they select the contract (wire layout, hash binding, block size).
	Family  string
	Release string

	// Model is the tokenizer folder (tokenizer.json + tokenizer_config.json) or a model slug
	// (llama3, qwen3, …) looked up under the tokenizer roots. Tokenizer, when set, is used instead
	// (tests share one across simulators).
	Model     string
	Tokenizer *tokenize.Tokenizer
	// ServedModelName is the model id the API answers to (default: Model as given; the folder's
	// base name for trtllm and llamacpp, as those servers report it).
	ServedModelName string
	// ServeChatTemplate, when set, is the Jinja chat template chats are rendered with instead of the
	// tokenizer folder's (an engine started with another --chat-template than was certified).
	ServeChatTemplate string
	// LoRAModules are the LoRA adapters served on top of the model, as vLLM's --lora-modules
	// ("name=path"; the path is only reported): vLLM family only.
	LoRAModules []string
	// Endpoint names this simulator in receipts (header and response id); default "sim".
	Endpoint string

	// HTTPAddr is the API listen address (default 127.0.0.1:0). AdminAddr, when set, serves the
	// /sim/ admin API on its own listener too, so it stays reachable while the API refuses
	// connections.
	HTTPAddr  string
	AdminAddr string

	// PublishAddr is the ZeroMQ PUB endpoint of rank 0 (default: the contract's, tcp://*:5557). As
	// in vLLM and SGLang, the socket binds when the host is * or :: (or ipc://, inproc://) and
	// dials out to a listening subscriber otherwise. Port 0 (binding only) picks free ports.
	// ReplayAddr is the ROUTER replay endpoint of rank 0 ("" = no replay, the engines' default).
	// Rank r uses port + r for both.
	PublishAddr string
	ReplayAddr  string
	// DPRanks is the number of data-parallel ranks, each its own KV cache, scheduler and event
	// stream (default 1).
	DPRanks int
	// Topic is the ZeroMQ topic frame (default "").
	Topic string
	// ReplayBuffer is the number of batches kept for replay (buffer_steps, default 10000).
	ReplayBuffer int
	// HWM is the PUB socket's send high-water mark in messages (the engines' hwm, default 100000);
	// past it messages are dropped, which a stalled subscriber sees as a sequence gap.
	HWM int

	// BlockSize is the KV block (page) size in tokens (default: the contract's).
	BlockSize int
	// Algorithm is the vLLM --prefix-caching-hash-algo (default: the contract's, sha256).
	Algorithm string
	// Seed is PYTHONHASHSEED as the engine process would see it: nil = unset, so vLLM's root is
	// random per process; "" is a valid seed. Only vLLM reads it.
	Seed *string
	// CapacityBlocks is the number of KV blocks per rank (default 4096). A vLLM engine keeps one of
	// them out of use (its null block), as --num-gpu-blocks-override counts it.
	CapacityBlocks int
	// SlidingWindow, when > 0, makes a vLLM simulator a hybrid model: a sliding-window KV-cache
	// group of that many tokens (group 1, events with group_idx, kv_cache_spec_kind and the window)
	// beside full attention (group 0), with its own eviction, and vLLM's hit rule over both
	// (window.go). SlidingWindowBlocks is that group's pool (default CapacityBlocks).
	SlidingWindow       int
	SlidingWindowBlocks int
	// ReportMode is vLLM's kv_cache_report_mode as every request asks for it: "incremental" (the
	// default) or "full", which re-emits BlockStored for blocks reused from the prefix cache. Only
	// releases whose contract has the mode (events.residency: presence) accept "full".
	ReportMode string
	// OffloadBlocks, when > 0, gives a vLLM simulator the CPU tier of vLLM's offloading connector
	// with that many blocks (offload.go: write-through, least recently used eviction, events with
	// medium CPU); OffloadPerToken is the time to load one token's KV from it (default a tenth of
	// PrefillPerToken).
	OffloadBlocks   int
	OffloadPerToken time.Duration
	// MaxModelLen is the context length (default 8192).
	MaxModelLen int

	// PrefillPerToken is the time to prefill one uncached prompt token (default 200µs), and
	// DecodePerToken the time per output token (default 10ms). PrefillChunk is the chunked-prefill
	// step in tokens (default 2048): blocks are announced per chunk, as the engines schedule them.
	PrefillPerToken time.Duration
	DecodePerToken  time.Duration
	PrefillChunk    int
	// MaxConcurrency is the number of requests a rank runs at once (vLLM max_num_seqs, llama.cpp
	// slots); others wait in a FIFO queue (default 8).
	MaxConcurrency int
	// DefaultMaxTokens is the output length when a request gives none (default 16).
	DefaultMaxTokens int

	// Role is normal, prefill or decode (P/D disaggregation, in the family's dialect).
	Role Role
	// BootstrapAddr is where an SGLang prefill engine serves its bootstrap rendezvous
	// (default 127.0.0.1:0 for the prefill role); BootstrapTimeout bounds the rendezvous (default 30s).
	BootstrapAddr    string
	BootstrapTimeout time.Duration
	// KVHost and KVPort are what a vLLM prefill engine advertises in kv_transfer_params
	// (remote_host / remote_port; defaults 127.0.0.1 and 5600).
	KVHost string
	KVPort int

	// DrainWait is how long POST /kv_cache_events waits for events when none are queued (TensorRT-LLM
	// waits about 2s; default 2s). DrainBuffer is event_buffer_max_size (default 16384); past it the
	// oldest events are dropped and event_id shows the gap.
	DrainWait   time.Duration
	DrainBuffer int
	// TRTPartialBlocks stores a finished request's trailing partial block, as TensorRT-LLM with
	// partial reuse does (default on; set NoTRTPartialBlocks to turn it off).
	NoTRTPartialBlocks bool

	// Faults are the fault switches at start.
	Faults Faults

	// NoEvents runs the engine with KV events off (vLLM and SGLang without --kv-events-config,
	// TensorRT-LLM with event_buffer_max_size 0): no publisher, an always-empty drain.
	NoEvents bool
	// ReportVersion is the version string the engine reports (/version, /server_info), default
	// the release's; any string, so an unknown or malformed release can be staged.
	ReportVersion string
	// DevMode is vLLM's VLLM_SERVER_DEV_MODE=1: only then is POST /reset_prefix_cache mounted.
	DevMode bool

	Logger *slog.Logger

	contract *contracts.Contract
}

// Defaults.
const (
	DefaultCapacityBlocks   = 4096
	DefaultMaxModelLen      = 8192
	DefaultPrefillPerToken  = 200 * time.Microsecond
	DefaultDecodePerToken   = 10 * time.Millisecond
	DefaultPrefillChunk     = 2048
	DefaultMaxConcurrency   = 8
	DefaultMaxTokens        = 16
	DefaultReplayBuffer     = 10000
	DefaultHWM              = 100000
	DefaultDrainWait        = 2 * time.Second
	DefaultDrainBuffer      = 16384
	DefaultBootstrapTimeout = 30 * time.Second
)

// resolve fills defaults and validates; every message names the field.
func (c *Config) resolve() error {
	if c.Family == "" {
		return errors.New("sim: family: required (vllm, sglang, trtllm, llamacpp)")
	}
	if c.Release == "" {
		return errors.New("sim: release: required (e.g. v0.25.1, v0.5.18, 1.2, b10573)")
	}
	ct, err := contracts.Lookup(c.Family, c.Release)
	if err != nil {
		return fmt.Errorf("sim: family %q release %q: %w", c.Family, c.Release, err)
	}
	c.contract = ct
	if c.Endpoint == "" {
		c.Endpoint = "sim"
	}
	if strings.ContainsAny(c.Endpoint, " \r\n\t") {
		return fmt.Errorf("sim: endpoint: %q must not contain spaces", c.Endpoint)
	}
	if c.HTTPAddr == "" {
		c.HTTPAddr = "127.0.0.1:0"
	}
	if c.DPRanks == 0 {
		c.DPRanks = 1
	}
	if c.DPRanks < 1 || c.DPRanks > 64 {
		return fmt.Errorf("sim: dp ranks: %d out of range 1..64", c.DPRanks)
	}
	if c.NoEvents {
		c.PublishAddr, c.ReplayAddr = "", ""
	} else if ct.Transport == "zmq-multipart-v1" && c.PublishAddr == "" {
		c.PublishAddr = ct.Events.DefaultEndpoint
	}
	if c.HWM == 0 {
		c.HWM = DefaultHWM
	}
	if c.HWM < 0 {
		return errors.New("sim: hwm: must be positive")
	}
	if c.ReplayBuffer == 0 {
		c.ReplayBuffer = DefaultReplayBuffer
	}
	if c.BlockSize == 0 {
		c.BlockSize = ct.BlockSize.Default
	}
	if c.Family == "llamacpp" {
		c.BlockSize = 0
	} else if c.BlockSize < 1 || c.BlockSize > hashcore.MaxBlockSize {
		return fmt.Errorf("sim: block size: %d out of range 1..%d", c.BlockSize, hashcore.MaxBlockSize)
	}
	if c.Algorithm == "" {
		c.Algorithm = ct.Hash.DefaultAlgorithm
	}
	if c.Family == "vllm" && !ct.SupportsAlgorithm(c.Algorithm) {
		return fmt.Errorf("sim: algorithm: %q is not one of %s", c.Algorithm, strings.Join(ct.Hash.Algorithms, ", "))
	}
	if err := c.resolveReportMode(); err != nil {
		return err
	}
	if c.Family != "vllm" && c.Seed != nil {
		// Only vLLM reads PYTHONHASHSEED for its block hashes; others ignore it, as the engines do.
		c.Seed = nil
	}
	def := func(p *int, v int) {
		if *p == 0 {
			*p = v
		}
	}
	def(&c.CapacityBlocks, DefaultCapacityBlocks)
	if c.SlidingWindow < 0 || (c.SlidingWindow > 0 && c.Family != "vllm") {
		return fmt.Errorf("sim: sliding window: %d (a positive window, vllm only)", c.SlidingWindow)
	}
	def(&c.SlidingWindowBlocks, c.CapacityBlocks)
	def(&c.MaxModelLen, DefaultMaxModelLen)
	def(&c.PrefillChunk, DefaultPrefillChunk)
	def(&c.MaxConcurrency, DefaultMaxConcurrency)
	def(&c.DefaultMaxTokens, DefaultMaxTokens)
	def(&c.DrainBuffer, DefaultDrainBuffer)
	def(&c.KVPort, 5600)
	for _, f := range []struct {
		name string
		v    int
	}{{"capacity blocks", c.CapacityBlocks}, {"max model len", c.MaxModelLen}, {"prefill chunk", c.PrefillChunk},
		{"max concurrency", c.MaxConcurrency}, {"default max tokens", c.DefaultMaxTokens}, {"drain buffer", c.DrainBuffer}} {
		if f.v < 1 {
			return fmt.Errorf("sim: %s: %d must be positive", f.name, f.v)
		}
	}
	if c.PrefillPerToken == 0 {
		c.PrefillPerToken = DefaultPrefillPerToken
	}
	if c.DecodePerToken == 0 {
		c.DecodePerToken = DefaultDecodePerToken
	}
	if c.PrefillPerToken < 0 || c.DecodePerToken < 0 {
		return errors.New("sim: prefill/decode time per token must not be negative")
	}
	if c.OffloadBlocks < 0 || c.OffloadBlocks > 0 && (c.Family != "vllm" || c.SlidingWindow > 0) {
		return fmt.Errorf("sim: offload blocks: %d (a positive count, vllm with full attention only)", c.OffloadBlocks)
	}
	if c.OffloadPerToken < 0 {
		return fmt.Errorf("sim: offload per token: %s must not be negative", c.OffloadPerToken)
	}
	if c.OffloadPerToken == 0 {
		c.OffloadPerToken = c.PrefillPerToken / 10
	}
	if c.DrainWait == 0 {
		c.DrainWait = DefaultDrainWait
	}
	if c.BootstrapTimeout == 0 {
		c.BootstrapTimeout = DefaultBootstrapTimeout
	}
	if c.KVHost == "" {
		c.KVHost = "127.0.0.1"
	}
	switch c.Role {
	case "":
		c.Role = RoleNormal
	case RoleNormal, RolePrefill, RoleDecode:
	default:
		return fmt.Errorf("sim: role: %q is not one of normal, prefill, decode", c.Role)
	}
	if c.Role != RoleNormal && c.Family == "llamacpp" {
		return errors.New("sim: role: llama.cpp has no prefill/decode disaggregation")
	}
	if c.Role == RolePrefill && c.Family == "sglang" && c.BootstrapAddr == "" {
		c.BootstrapAddr = "127.0.0.1:0"
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	return c.Faults.validate()
}

// Contract returns the contract the engine follows.
func (c *Config) Contract() *contracts.Contract { return c.contract }
