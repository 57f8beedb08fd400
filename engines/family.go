package engines

// Family is one engine family: everything the gateway and ctk need that differs between engines
// lives behind it, in the family's own package (engines/vllm, engines/sglang, engines/trtllm,
// engines/llamacpp). Code outside engines/ asks engines/registry for a Family by the name a rule or
// contract gives and never names a family itself.
//
// The interface grows by facet: each facet (events, key binding, hit cap, P/D dialect, probes) is declared
// in its own file of this package and embedded here, so a family package implements it in a file
// named after the facet.
type Family interface {
	// Name is the family's config name: the value of `family:` in a rule, a pool file and a
	// contract (vllm, sglang, trtllm, llamacpp).
	Name() string
	// Display is how messages name the engine (vLLM, SGLang, TensorRT-LLM, llama.cpp).
	Display() string
	Probes
	Keys
	Hits
	Hints
	Container
	Events
	PD
	Load
}
