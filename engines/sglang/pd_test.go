package sglang

import "testing"

func TestBootstrapHost(t *testing.T) {
	for in, want := range map[string]string{"http://10.0.0.5:30000": "10.0.0.5", "http://[fd00::5]:30000": "[fd00::5]", "http://pf-0.svc:8000/v1": "pf-0.svc"} {
		if got := bootstrapHost(in); got != want {
			t.Errorf("%s: %s, want %s", in, got, want)
		}
	}
}
