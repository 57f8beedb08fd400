package certificate

import (
	"encoding/json"
	"testing"
)

// FuzzParse: any bytes give a certificate or an error, never a panic; an accepted certificate
// (admission policy included) survives a write and a second parse unchanged.
func FuzzParse(f *testing.F) {
	for _, a := range []*Admission{nil, {Admit: AdmitNone}, {Admit: AdmitProbe, Specs: []string{"health", "keys"}, ValidForSeconds: 60}} {
		c := admissionCert(a)
		b, _ := json.Marshal(c)
		f.Add(b)
	}
	f.Add([]byte(`{"format":"kvexact-certificate-v1","admission":{"admit":"maybe"}}`))
	f.Add([]byte(`{`))
	f.Fuzz(func(t *testing.T, b []byte) {
		c, err := Parse(b, nil)
		if err != nil {
			return
		}
		again, err := json.Marshal(c)
		if err != nil {
			t.Fatal(err)
		}
		c2, err := Parse(again, nil)
		if err != nil {
			t.Fatalf("a parsed certificate does not parse again: %v\n%s", err, again)
		}
		if c2.AdmitsByProbe() != c.AdmitsByProbe() || string(c2.Payload()) != string(c.Payload()) {
			t.Fatalf("the certificate changed on a round trip:\n%s\n%s", c.Payload(), c2.Payload())
		}
	})
}
