package llamacpp

import (
	"errors"
	"strings"
	"testing"
)

func TestNewEventSourceRefuses(t *testing.T) {
	for _, rel := range []string{"b10573", ""} {
		err := NewEventSource(rel)
		if !errors.Is(err, ErrNoEvents) {
			t.Fatalf("%q: %v does not wrap ErrNoEvents", rel, err)
		}
		var re *RefusalError
		if !errors.As(err, &re) || re.Release != rel {
			t.Fatalf("%q: %v", rel, err)
		}
		for _, want := range []string{"no KV-cache events", "Exact routing is refused", "chwbl", rel} {
			if !strings.Contains(err.Error(), want) {
				t.Errorf("%q: message %q lacks %q", rel, err, want)
			}
		}
	}
}
