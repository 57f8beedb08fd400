package proxy

import (
	"bytes"
	"fmt"
	"io"
	"log"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"
)

// net/http's Transport reports an upstream that wrote a response on an idle keep-alive connection
// (it closes that connection, so nothing reaches a client) only through the standard library's
// global logger (transport.go: "Unsolicited response received on idle HTTP channel starting with
// %q; err=%v"). The proxy therefore routes that logger through stdLog: every line becomes an slog
// record, and that one is also counted. The logger is process-wide, so the count is too; the line
// names no upstream, so neither can the metric.
const unsolicitedPrefix = "Unsolicited response received on idle HTTP channel"

var (
	stdLogOnce   sync.Once
	stdLogPrev   io.Writer                   // the standard logger's output before
	stdLogTarget atomic.Pointer[slog.Logger] // the newest proxy's logger
	unsolicited  atomic.Uint64
)

// captureStdLog routes the standard library's global logger through l (installed once per process;
// a later proxy's logger replaces the target). slog's own default handler writes through the
// standard logger, so it is never a target: that would loop; those lines keep their old output.
func captureStdLog(l *slog.Logger) {
	if l != nil && fmt.Sprintf("%T", l.Handler()) != "*slog.defaultHandler" {
		stdLogTarget.Store(l)
	}
	stdLogOnce.Do(func() {
		stdLogPrev = log.Writer()
		log.SetOutput(stdLog{})
	})
}

// stdLog is the standard logger's output: one Write per log line (flags and prefix included).
type stdLog struct{}

func (stdLog) Write(b []byte) (int, error) {
	line := string(bytes.TrimRight(b, "\n"))
	_, rest, found := strings.Cut(line, unsolicitedPrefix)
	if found {
		unsolicited.Add(1)
	}
	l := stdLogTarget.Load()
	switch {
	case l == nil:
		return stdLogPrev.Write(b)
	case found:
		l.Warn("unsolicited upstream response on an idle connection; net/http closed the connection, no client saw it",
			"source", "net/http", "detail", strings.TrimSpace(rest))
	default:
		l.Info(line, "source", "stdlib")
	}
	return len(b), nil
}

// unsolicitedCounter exposes the process-wide count on one registry.
func unsolicitedCounter() prometheus.CounterFunc {
	return prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "kvexact_proxy_upstream_unsolicited_responses_total",
		Help: "Responses an upstream wrote on an idle keep-alive connection (net/http closed the connection; no client saw them). Process-wide: the standard library does not say which upstream."},
		func() float64 { return float64(unsolicited.Load()) })
}
