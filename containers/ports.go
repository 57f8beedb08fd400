package containers

import (
	"fmt"
	"os"
	"path/filepath"

	"github.com/kvexact/kvexact/gateway/tokenize"
	"github.com/kvexact/kvexact/internal/lateport"
)

// FreePorts returns n distinct TCP ports free on every interface of the host. Containers share the
// host's network, so the ports are chosen here and passed on their command lines; the engine in a
// container binds them seconds to minutes later, so they are drawn outside the kernel's ephemeral
// range, where no other listener's ":0" can be given one meanwhile (internal/lateport).
func FreePorts(n int) ([]int, error) {
	ps, err := lateport.PickDistinct("0.0.0.0", n)
	if err != nil {
		return nil, fmt.Errorf("free ports: %w", err)
	}
	return ps, nil
}

// TokenizerRoot returns the first tokenizer root (tokenize.DefaultRoots: $KVEXACT_TOKENIZERS,
// ../shared/tokenizers, .cache/tokenizers) that holds model/tokenizer.json.
func TokenizerRoot(model string) (string, error) {
	roots := tokenize.DefaultRoots()
	for _, r := range roots {
		if _, err := os.Stat(filepath.Join(r, model, "tokenizer.json")); err == nil {
			return r, nil
		}
	}
	return "", fmt.Errorf("no tokenizer folder %q under %v: run make tokenizers or set KVEXACT_TOKENIZERS", model, roots)
}
