// Package probes picks an engine family's HTTP prober: the one place that maps a family name to its
// client, used by certification and by the gateway's periodic re-probe.
package probes

import (
	"fmt"
	"net/http"

	"github.com/kvexact/kvexact/engines"
	"github.com/kvexact/kvexact/engines/llamacpp"
	"github.com/kvexact/kvexact/engines/sglang"
	"github.com/kvexact/kvexact/engines/trtllm"
	"github.com/kvexact/kvexact/engines/vllm"
)

// New returns the prober of family for the server at address. hc may be nil.
func New(family, address string, hc *http.Client) (engines.Prober, error) {
	switch family {
	case "vllm":
		return vllm.NewProber(address, hc), nil
	case "sglang":
		return sglang.NewProber(address, hc), nil
	case "trtllm":
		return trtllm.NewProber(address, hc), nil
	case "llamacpp":
		return llamacpp.NewProber(address, hc), nil
	}
	return nil, fmt.Errorf("no prober for engine family %q (known: vllm, sglang, trtllm, llamacpp)", family)
}
