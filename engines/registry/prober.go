package registry

import (
	"fmt"
	"net/http"
	"strings"

	"github.com/kvexact/kvexact/engines"
)

// NewProber returns the HTTP prober of family for the server at address (certification and the
// gateway's periodic re-probe use it). hc may be nil.
func NewProber(family, address string, hc *http.Client) (engines.Prober, error) {
	f, err := Lookup(family)
	if err != nil {
		return nil, fmt.Errorf("no prober for engine family %q (known: %s)", family, strings.Join(Names(), ", "))
	}
	return f.NewProber(address, hc), nil
}
