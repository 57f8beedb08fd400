package ctk_test

import (
	"slices"
	"strings"
	"testing"

	"github.com/kvexact/kvexact/ctk"
	"github.com/kvexact/kvexact/ctk/certificate"
)

// TestNewAdmission: the default spec set is every spec but the cache clear; whatever is listed,
// the specs that prove a binding are run; an unknown spec id or admit value is an error naming it.
func TestNewAdmission(t *testing.T) {
	a, err := ctk.NewAdmission(certificate.AdmitProbe, nil, 0)
	if err != nil {
		t.Fatal(err)
	}
	all := ctk.SpecIDs()
	if want := slices.DeleteFunc(slices.Clone(all), func(s string) bool { return s == "clear" }); !slices.Equal(a.Specs, want) {
		t.Fatalf("default specs %v, want %v", a.Specs, want)
	}
	a, err = ctk.NewAdmission(certificate.AdmitProbe, []string{"clear"}, 0)
	if err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{"health", "release", "model", "tok-true", "tok-false", "events", "block-size", "tokens", "keys", "clear"} {
		if !slices.Contains(a.Specs, id) {
			t.Fatalf("specs %v lack %s", a.Specs, id)
		}
	}
	if slices.Contains(a.Specs, "template") {
		t.Fatalf("template was not asked for: %v", a.Specs)
	}
	if _, err := ctk.NewAdmission(certificate.AdmitProbe, []string{"keyz"}, 0); err == nil || !strings.Contains(err.Error(), `"keyz"`) {
		t.Fatalf("unknown spec: %v", err)
	}
	if _, err := ctk.NewAdmission("sometimes", nil, 0); err == nil || !strings.Contains(err.Error(), `"sometimes"`) {
		t.Fatalf("unknown admit: %v", err)
	}
	if a, err := ctk.NewAdmission(certificate.AdmitNone, nil, 0); err != nil || a.Admit != certificate.AdmitNone || a.Specs != nil {
		t.Fatalf("admit none: %+v %v", a, err)
	}
}
