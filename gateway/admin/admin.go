// Package admin is the gateway's operator API: status, routing explanations, inventories, live rule
// edits, endpoint states and Prometheus metrics, on a listener of its own (127.0.0.1 by default)
// behind a bearer token. Without the right token every path answers 401 and says nothing else.
package admin

import (
	"context"
	"crypto/subtle"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/pprof"
	"strconv"
	"strings"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/kvexact/kvexact/gateway/inventory"
	"github.com/kvexact/kvexact/gateway/rules"
)

// Backend is what the admin API reads and changes (the running gateway).
type Backend interface {
	// Status is the whole state, JSON-encodable.
	Status() any
	// Inventory returns an endpoint's resident keys.
	Inventory(rule, endpoint string) ([]inventory.KeyCount, bool)
	// Explain routes a client request without sending it; it reads r's body within the data path's
	// limit. An error with StatusCode() sets the answer's status (400 otherwise).
	Explain(ctx context.Context, listener string, r *http.Request) (any, error)
	// Rules is the live rule set.
	Rules() *rules.Store
	// SetEndpointState sets down, up or drain.
	SetEndpointState(rule, endpoint, state string) bool
	// Registry holds the metrics.
	Registry() *prometheus.Registry
}

// Handler returns the admin API. token must be non-empty for anything to be served.
func Handler(b Backend, token string) http.Handler {
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(b.Registry(), promhttp.HandlerOpts{}))
	// Profiles for operators chasing overhead (behind the same token as everything else).
	mux.HandleFunc("GET /debug/pprof/", pprof.Index)
	mux.HandleFunc("GET /debug/pprof/profile", pprof.Profile)
	mux.HandleFunc("GET /debug/pprof/trace", pprof.Trace)
	mux.HandleFunc("GET /admin/status", func(w http.ResponseWriter, r *http.Request) { writeJSON(w, http.StatusOK, b.Status()) })
	mux.HandleFunc("POST /admin/explain", func(w http.ResponseWriter, r *http.Request) {
		listener := r.URL.Query().Get("listener")
		d, err := b.Explain(r.Context(), listener, r)
		if err != nil {
			var se interface{ StatusCode() int }
			code := http.StatusBadRequest
			if errors.As(err, &se) {
				code = se.StatusCode()
			}
			fail(w, code, err.Error())
			return
		}
		writeJSON(w, http.StatusOK, d)
	})
	mux.HandleFunc("GET /admin/inventory/{rule}/{endpoint}", func(w http.ResponseWriter, r *http.Request) {
		keys, ok := b.Inventory(r.PathValue("rule"), r.PathValue("endpoint"))
		if !ok {
			fail(w, http.StatusNotFound, fmt.Sprintf("no endpoint %q in rule %q", r.PathValue("endpoint"), r.PathValue("rule")))
			return
		}
		type kc struct {
			Key   string `json:"key"` // decimal uint64 (JSON numbers lose precision above 2^53)
			Count int    `json:"count"`
		}
		out := struct {
			Rule     string `json:"rule"`
			Endpoint string `json:"endpoint"`
			Total    int    `json:"total"`
			Blocks   []kc   `json:"blocks"`
		}{Rule: r.PathValue("rule"), Endpoint: r.PathValue("endpoint"), Total: len(keys), Blocks: make([]kc, len(keys))}
		for i, k := range keys {
			out.Blocks[i] = kc{Key: strconv.FormatUint(k.Key, 10), Count: k.Count}
		}
		writeJSON(w, http.StatusOK, out)
	})
	mux.HandleFunc("GET /admin/rules", func(w http.ResponseWriter, r *http.Request) { writeJSON(w, http.StatusOK, b.Rules().List()) })
	mux.HandleFunc("GET /admin/rules/{name}", func(w http.ResponseWriter, r *http.Request) {
		rule, ok := b.Rules().Get(r.PathValue("name"))
		if !ok {
			fail(w, http.StatusNotFound, fmt.Sprintf("rule %q does not exist", r.PathValue("name")))
			return
		}
		writeJSON(w, http.StatusOK, rule)
	})
	put := func(w http.ResponseWriter, r *http.Request, name string) {
		var rule rules.Rule
		dec := json.NewDecoder(io.LimitReader(r.Body, 1<<20))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&rule); err != nil {
			fail(w, http.StatusBadRequest, "rule body: "+err.Error())
			return
		}
		if name != "" && rule.Name != "" && rule.Name != name {
			fail(w, http.StatusBadRequest, fmt.Sprintf("name: body says %q, path says %q", rule.Name, name))
			return
		}
		if name != "" {
			rule.Name = name
		}
		_, existed := b.Rules().Get(rule.Name)
		got, err := b.Rules().Put(&rule)
		if err != nil {
			fail(w, http.StatusUnprocessableEntity, err.Error())
			return
		}
		code := http.StatusOK
		if !existed {
			code = http.StatusCreated
		}
		writeJSON(w, code, got)
	}
	mux.HandleFunc("POST /admin/rules", func(w http.ResponseWriter, r *http.Request) { put(w, r, "") })
	mux.HandleFunc("PUT /admin/rules/{name}", func(w http.ResponseWriter, r *http.Request) { put(w, r, r.PathValue("name")) })
	mux.HandleFunc("DELETE /admin/rules/{name}", func(w http.ResponseWriter, r *http.Request) {
		if err := b.Rules().Delete(r.PathValue("name")); err != nil {
			fail(w, http.StatusNotFound, err.Error())
			return
		}
		w.WriteHeader(http.StatusNoContent)
	})
	mux.HandleFunc("POST /admin/rules/{rule}/endpoints/{endpoint}/{state}", func(w http.ResponseWriter, r *http.Request) {
		st := r.PathValue("state")
		if st != "down" && st != "up" && st != "drain" {
			fail(w, http.StatusBadRequest, fmt.Sprintf("state %q is not one of down, up, drain", st))
			return
		}
		if !b.SetEndpointState(r.PathValue("rule"), r.PathValue("endpoint"), st) {
			fail(w, http.StatusNotFound, fmt.Sprintf("no endpoint %q in rule %q", r.PathValue("endpoint"), r.PathValue("rule")))
			return
		}
		writeJSON(w, http.StatusOK, map[string]string{"endpoint": r.PathValue("endpoint"), "state": st})
	})
	if cr, ok := b.(CertificateReloader); ok {
		mux.HandleFunc("POST /admin/certificates/reload", func(w http.ResponseWriter, r *http.Request) {
			st, err := cr.ReloadCertificates()
			if err != nil {
				fail(w, http.StatusUnprocessableEntity, "certificate reload failed, the certificates in force stay: "+err.Error())
				return
			}
			writeJSON(w, http.StatusOK, map[string]any{"certificates": st})
		})
	}
	if sn, ok := b.(EndpointSnapshotter); ok {
		// A peer replica starting fetches an endpoint's inventory snapshot (docs/replicas.md).
		mux.HandleFunc("GET /admin/snapshot/{rule}/{endpoint}", func(w http.ResponseWriter, r *http.Request) {
			sw := &snapshotWriter{w: w}
			if err := sn.EndpointSnapshot(r.PathValue("rule"), r.PathValue("endpoint"), sw); err != nil {
				if sw.started {
					// The body is under way: cut it. The peer's decoder refuses a truncated
					// snapshot (its checksum comes last).
					panic(http.ErrAbortHandler)
				}
				var se interface{ StatusCode() int }
				code := http.StatusInternalServerError
				if errors.As(err, &se) {
					code = se.StatusCode()
				}
				fail(w, code, err.Error())
			}
		})
	}
	if hc, ok := b.(ExactHoldClearer); ok {
		mux.HandleFunc("POST /admin/rules/{rule}/endpoints/{endpoint}/exact/clear", func(w http.ResponseWriter, r *http.Request) {
			st, err := hc.ClearExactHold(r.PathValue("rule"), r.PathValue("endpoint"), r.URL.Query().Get("hold"))
			if err != nil {
				var se interface{ StatusCode() int }
				code := http.StatusBadRequest
				if errors.As(err, &se) {
					code = se.StatusCode()
				}
				fail(w, code, err.Error())
				return
			}
			writeJSON(w, http.StatusOK, st)
		})
	}
	return requireToken(token, mux)
}

// ExactHoldClearer is a Backend that lets the operator lift a KV-exact hold by hand (POST
// /admin/rules/{rule}/endpoints/{endpoint}/exact/clear[?hold=realized_shortfall]) after fixing the
// engine; it answers with the endpoint's exactness. An error with StatusCode() sets the answer's
// status (404 for an unknown endpoint, 400 for a hold that only evidence lifts).
type ExactHoldClearer interface {
	ClearExactHold(rule, endpoint, hold string) (any, error)
}

// snapshotWriter streams a snapshot's encoding as the answer's body (chunked: its length is not
// known before it is written), so the answer holds no copy of it; the headers go with the first
// write.
type snapshotWriter struct {
	w       http.ResponseWriter
	started bool
}

func (s *snapshotWriter) Write(p []byte) (int, error) {
	if !s.started {
		s.started = true
		s.w.Header().Set("Content-Type", "application/octet-stream")
		s.w.Header().Set("Cache-Control", "no-store")
	}
	return s.w.Write(p)
}

// EndpointSnapshotter is a Backend that can write an endpoint's inventory snapshot (GET
// /admin/snapshot/{rule}/{endpoint}, the body in package ingest's snapshot layout) for a peer
// replica to start from. An error with StatusCode() sets the answer's status (404 unknown, 409 not
// synchronized or not snapshot-able).
type EndpointSnapshotter interface {
	EndpointSnapshot(rule, endpoint string, w io.Writer) error
}

// CertificateReloader is a Backend that can re-read its certificate files (POST
// /admin/certificates/reload); on error nothing changes.
type CertificateReloader interface {
	ReloadCertificates() (any, error)
}

// requireToken answers 401 (and nothing else) unless the request carries "Authorization: Bearer
// <token>": the scheme case-insensitive (RFC 9110 §11.1), the token compared in constant time. An
// empty configured token locks the API entirely.
func requireToken(token string, next http.Handler) http.Handler {
	want := []byte(token)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		scheme, got, _ := strings.Cut(r.Header.Get("Authorization"), " ")
		got = strings.TrimLeft(got, " ")
		if token == "" || !strings.EqualFold(scheme, "Bearer") || subtle.ConstantTimeCompare([]byte(got), want) != 1 {
			w.Header().Set("WWW-Authenticate", `Bearer realm="kvexact-admin"`)
			if r.ContentLength != 0 {
				// The body is not read: the connection closes after the answer (net/http discards at
				// most 256 KiB of it within the listener's read deadline, the lingering close at most
				// server.lingerBytes), so an unauthenticated upload cannot hold it.
				w.Header().Set("Connection", "close")
			}
			http.Error(w, "unauthorized", http.StatusUnauthorized)
			return
		}
		next.ServeHTTP(w, r)
	})
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	_ = enc.Encode(v)
}

func fail(w http.ResponseWriter, code int, msg string) {
	writeJSON(w, code, map[string]any{"error": map[string]any{"message": msg, "type": strings.ReplaceAll(strings.ToLower(http.StatusText(code)), " ", "_"), "code": code}})
}
