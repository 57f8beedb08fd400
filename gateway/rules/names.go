package rules

import (
	"fmt"
	"strings"
)

// maxNameLen caps names (they appear in response headers, log fields and metric series).
const maxNameLen = 256

// checkName is the one rule for every name that reaches a response header (X-Kvexact-Rule,
// X-Kvexact-Endpoint), a log field or a metric label: rule and endpoint names, model and adapter
// names from the YAML, the admin API and adapter discovery. It must be 1..256 characters from
// A-Z a-z 0-9 and . _ ~ : / @ + - [ ] (URL characters enough for an address as name: the default
// endpoint name is its address). No control characters, no spaces, no quotes: nothing a header
// would drop or a metrics scraper would misread.
func checkName(field, name string) error {
	if name == "" {
		return fieldErr(field, "required")
	}
	if len(name) > maxNameLen {
		return fieldErr(field, "%d bytes; at most %d", len(name), maxNameLen)
	}
	for i := 0; i < len(name); i++ {
		if !nameByte(name[i]) {
			return fieldErr(field, "%s: byte %d (%s) is not allowed; use A-Z a-z 0-9 and . _ ~ : / @ + - [ ]", fmt.Sprintf("%q", name), i, describeByte(name[i]))
		}
	}
	return nil
}

func nameByte(b byte) bool {
	switch {
	case 'a' <= b && b <= 'z', 'A' <= b && b <= 'Z', '0' <= b && b <= '9':
		return true
	}
	return strings.IndexByte("._~:/@+-[]", b) >= 0
}

func describeByte(b byte) string {
	switch {
	case b == '\r':
		return "CR"
	case b == '\n':
		return "LF"
	case b < 0x20 || b == 0x7f:
		return fmt.Sprintf("control character 0x%02x", b)
	case b >= 0x80:
		return fmt.Sprintf("non-ASCII byte 0x%02x", b)
	}
	return fmt.Sprintf("%q", string(rune(b)))
}
