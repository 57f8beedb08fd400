package registry

import (
	"errors"
	"testing"
)

func TestLookup(t *testing.T) {
	for _, n := range Names() {
		f, err := Lookup(n)
		if err != nil || f.Name() != n || f.Display() == "" {
			t.Fatalf("Lookup(%q) = %v, %v", n, f, err)
		}
	}
	_, err := Lookup("vllmx")
	var ue *UnknownError
	if !errors.As(err, &ue) || ue.Name != "vllmx" {
		t.Fatalf("Lookup(vllmx) error = %v, want *UnknownError naming it", err)
	}
	if _, err := Lookup(""); err == nil {
		t.Fatal("Lookup(\"\") succeeded")
	}
}
