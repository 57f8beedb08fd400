package registry

import (
	"errors"
	"testing"

	"github.com/kvexact/kvexact/contracts"
)

func TestLookup(t *testing.T) {
	for _, n := range Names() {
		f, err := Lookup(n)
		if err != nil || f.Name() != n || f.Display() == "" {
			t.Fatalf("Lookup(%q) = %v, %v", n, f, err)
		}
	}
	_, err := Lookup("vllmx")
	var ue *contracts.UnknownError
	if !errors.As(err, &ue) || ue.Family != "vllmx" || ue.Version != "" {
		t.Fatalf("Lookup(vllmx) error = %v, want *contracts.UnknownError naming it", err)
	}
	if _, err := Lookup(""); err == nil {
		t.Fatal("Lookup(\"\") succeeded")
	}
}
