package ctk_test

import (
	"slices"
	"strings"
	"testing"

	"github.com/kvexact/kvexact/ctk"
	"github.com/kvexact/kvexact/ctk/certificate"
)

// TestNewAdmission: the default spec set is every spec but the cache clear, which cannot be asked
// for; whatever is listed, the specs that prove a binding are written; an unknown spec id or admit
// value is an error naming it.
func TestNewAdmission(t *testing.T) {
	a, err := ctk.NewAdmission(certificate.AdmitProbe, nil, 0)
	if err != nil {
		t.Fatal(err)
	}
	all := ctk.SpecIDs()
	if want := slices.DeleteFunc(slices.Clone(all), func(s string) bool { return s == "clear" }); !slices.Equal(a.Specs, want) {
		t.Fatalf("default specs %v, want %v", a.Specs, want)
	}
	if _, err := ctk.NewAdmission(certificate.AdmitProbe, []string{"clear"}, 0); err == nil || !strings.Contains(err.Error(), `"clear"`) {
		t.Fatalf("an admission asked to clear the cache: %v, want an error naming clear", err)
	}
	a, err = ctk.NewAdmission(certificate.AdmitProbe, []string{"replay"}, 0)
	if err != nil {
		t.Fatal(err)
	}
	if err := ctk.CheckAdmission(a); err != nil {
		t.Fatalf("the policy NewAdmission wrote: %v", err)
	}
	for _, id := range []string{"health", "release", "model", "tok-true", "tok-false", "events", "block-size", "tokens", "keys", "replay"} {
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

// TestCheckAdmission: a certificate whose admission the gateway's probe cannot run as written is
// refused naming the field and spec: no spec list, the cache clear, a spec this ctk does not know,
// a binding spec left out. No policy and admit none need nothing.
func TestCheckAdmission(t *testing.T) {
	good, err := ctk.NewAdmission(certificate.AdmitProbe, nil, 0)
	if err != nil {
		t.Fatal(err)
	}
	if err := ctk.CheckAdmission(good); err != nil {
		t.Fatalf("default policy: %v", err)
	}
	for _, a := range []*certificate.Admission{nil, {Admit: certificate.AdmitNone}} {
		if err := ctk.CheckAdmission(a); err != nil {
			t.Fatalf("%+v: %v", a, err)
		}
	}
	with := func(f func([]string) []string) *certificate.Admission {
		return &certificate.Admission{Admit: certificate.AdmitProbe, Specs: f(slices.Clone(good.Specs))}
	}
	for _, c := range []struct {
		a    *certificate.Admission
		want string
	}{
		{&certificate.Admission{Admit: certificate.AdmitProbe}, "admission.specs is empty"},
		{with(func(s []string) []string { return append(s, "clear") }), `admission.specs lists "clear"`},
		{with(func(s []string) []string { return append(s, "keyz") }), `admission.specs lists "keyz"`},
		{with(func(s []string) []string { return slices.DeleteFunc(s, func(id string) bool { return id == "keys" }) }), `admission.specs lacks "keys"`},
		{&certificate.Admission{Admit: "sometimes"}, `"sometimes"`},
	} {
		if err := ctk.CheckAdmission(c.a); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%+v: %v, want %q", c.a, err, c.want)
		}
	}
}
