package proxy

import (
	"net/http"
	"strings"

	"github.com/kvexact/kvexact/gateway/route"
)

// ParseRequest parses a client request body exactly as the data path does, for /admin/explain. The
// body is a chat request when it has "messages" or the path ends in /chat/completions.
func ParseRequest(r *http.Request, body []byte) (*route.Request, error) {
	chat := strings.HasSuffix(r.URL.Path, "/chat/completions") || strings.Contains(string(body), `"messages"`)
	p, apiErr := parseBody(body, chat)
	if apiErr != nil {
		return nil, apiErr
	}
	return p.routeRequest(r), nil
}
