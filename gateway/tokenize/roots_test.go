package tokenize

import (
	"strings"
	"testing"
)

// TestFindModelDirErrorNamesWhatItSearched: with roots, the error names each folder searched;
// with none, it says no folder is configured and names the variable that sets one.
func TestFindModelDirErrorNamesWhatItSearched(t *testing.T) {
	a, b := t.TempDir(), t.TempDir()
	_, err := FindModelDir([]string{a, b}, "llama3")
	if err == nil || !strings.Contains(err.Error(), "no llama3/tokenizer.json under "+a+", "+b+" (") {
		t.Fatalf("with two roots: %v", err)
	}
	_, err = FindModelDir(nil, "llama3")
	if err == nil || !strings.Contains(err.Error(), "no tokenizer folder is configured") || !strings.Contains(err.Error(), "KVEXACT_TOKENIZERS") ||
		strings.Contains(err.Error(), "under  ") {
		t.Fatalf("with no roots: %v", err)
	}
}
