package containers

import (
	"fmt"
	"net"
	"os"
	"path/filepath"

	"github.com/kvexact/kvexact/gateway/tokenize"
)

// FreePorts returns n distinct TCP ports free on every interface of the host. Containers share the
// host's network, so the ports are chosen here and passed on their command lines; they are held
// until all n are chosen so that no two are equal.
func FreePorts(n int) ([]int, error) {
	ls := make([]net.Listener, 0, n)
	defer func() {
		for _, l := range ls {
			l.Close()
		}
	}()
	out := make([]int, 0, n)
	for range n {
		l, err := net.Listen("tcp", "0.0.0.0:0")
		if err != nil {
			return nil, fmt.Errorf("free ports: %w", err)
		}
		ls = append(ls, l)
		out = append(out, l.Addr().(*net.TCPAddr).Port)
	}
	return out, nil
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
