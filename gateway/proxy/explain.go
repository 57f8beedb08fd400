package proxy

import (
	"net/http"
	"strings"

	"github.com/kvexact/kvexact/gateway/route"
)

// ParseRequest parses a client request body exactly as the data path does, for /admin/explain: the
// same Content-Type check (415), the same typed request and the same errors. The caller bounds the
// body as the data path does (413). The body is a chat request when the path ends in
// /chat/completions or it has "messages". Errors carry StatusCode().
func ParseRequest(r *http.Request, body []byte) (*route.Request, error) {
	if e := checkJSONType(r); e != nil {
		return nil, e
	}
	chat := strings.HasSuffix(r.URL.Path, "/chat/completions") || strings.Contains(string(body), `"messages"`)
	p, apiErr := parseBody(body, chat)
	if apiErr != nil {
		return nil, apiErr
	}
	return p.routeRequest(r), nil
}
