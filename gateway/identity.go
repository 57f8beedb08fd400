package gateway

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"
)

// processStartMetric is the engines' process identity: vLLM and SGLang serve prometheus_client's
// process collector on /metrics, whose start time changes with every restart even when the new
// process reuses the ports and its event sequence happens to continue where the old one stopped.
const processStartMetric = "process_start_time_seconds"

// processIdentity remembers an endpoint's last seen process start time.
type processIdentity struct {
	mu      sync.Mutex
	start   float64 // 0: not seen yet
	version string  // the last /version answer ("" not seen yet)
}

// started is the process start time last read (0: not seen).
func (p *processIdentity) started() float64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.start
}

// checkVersion records the engine's /version answer and reports a change since the last one (an
// upgrade, even within the same contract, restarts the engine: its blocks must be verified again).
func (p *processIdentity) checkVersion(v string) string {
	if v == "" {
		return ""
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	old := p.version
	p.version = v
	if old != "" && old != v {
		return fmt.Sprintf("the engine's /version changed from %q to %q (an upgrade or another engine)", old, v)
	}
	return ""
}

// checkProcess reads the endpoint's process start time and reports a change since the last read
// ("" when unchanged, first seen, or not readable: an engine without the metric is not a restart).
// answered is false when /metrics did not answer 200 (the engine's HTTP server is down or still
// starting), so the read says nothing yet.
func (p *processIdentity) checkProcess(ctx context.Context, hc *http.Client, address string) (why string, answered bool) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, strings.TrimRight(address, "/")+"/metrics", nil)
	if err != nil {
		return "", false
	}
	resp, err := hc.Do(req)
	if err != nil {
		return "", false
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return "", false
	}
	v, ok := scanGauge(io.LimitReader(resp.Body, 8<<20), processStartMetric)
	if !ok {
		return "", true
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	old := p.start
	p.start = v
	if old != 0 && v != old {
		return fmt.Sprintf("the engine's %s changed from %s to %s (a new process)", processStartMetric,
			strconv.FormatFloat(old, 'f', -1, 64), strconv.FormatFloat(v, 'f', -1, 64)), true
	}
	return "", true
}

// scanGauge finds an unlabelled sample of name in Prometheus text exposition.
func scanGauge(r io.Reader, name string) (float64, bool) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
	for sc.Scan() {
		rest, ok := strings.CutPrefix(sc.Text(), name+" ")
		if !ok {
			continue
		}
		f, err := strconv.ParseFloat(strings.Fields(rest + " ")[0], 64)
		return f, err == nil
	}
	return 0, false
}

// probeProcess checks one endpoint's process identity and marks it unverified since restart on a
// change. It runs with each periodic re-probe; it reports whether /metrics answered.
func (g *Gateway) probeProcess(ctx context.Context, ew *endpointWatch) bool {
	why, answered := ew.proc.checkProcess(ctx, &http.Client{Transport: g.transport()}, ew.x.addr)
	if why != "" {
		ew.newProcess(why)
	}
	return answered
}

// Reconnect identity waits: an engine's event sockets answer before its HTTP server (vLLM binds
// its publisher while its API server still loads the model), so on a restart the stream
// reconnects first, and one read at that instant finds nothing to read. The check is retried
// until /metrics answers, for as long as a slow engine takes to start; a newer reconnect
// replaces it.
const (
	processWaitFirst = 100 * time.Millisecond
	processWaitMax   = 5 * time.Second // the backoff's ceiling
	processWaitFor   = 15 * time.Minute
)

// awaitProcess is the reconnect's identity check: it reads the process identity as soon as the
// engine's HTTP server answers, so a restart the event stream did not show (its sequence
// happened to continue, or the reconnect's clear carried no restart sign) is still seen, and
// verified, without waiting for the next periodic re-probe.
func (g *Gateway) awaitProcess(ctx context.Context, ew *endpointWatch) {
	ctx, cancel := context.WithTimeout(ctx, processWaitFor)
	ew.mu.Lock()
	if ew.stopWait != nil {
		ew.stopWait()
	}
	ew.stopWait = cancel
	ew.mu.Unlock()
	defer cancel()
	for wait := processWaitFirst; !g.probeProcess(ctx, ew); wait = min(2*wait, processWaitMax) {
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
	}
}

// newProcess is a restart seen on the engine's identity: the inventory goes at once (the new
// process's first event may be far off), then the restart's evidence as for any other. Unless
// the event stream saw the process first: an engine's event sockets often answer long before its
// HTTP server (vLLM binds its publisher while its API server is still starting), so the stream's
// clear (a sequence regression, a replay without the last message) came after this process
// started, and what the inventory learned since is the new process's own blocks — dropping them
// would lose them until the engine stores them again. Then nothing is dropped, and a restart
// evidence the stream already raised is not raised twice (its verification probes and parity
// blocks were the new process's).
func (ew *endpointWatch) newProcess(why string) {
	cleared, restarted := ew.seenOnStream(ew.proc.started())
	if cleared && restarted {
		ew.log.Info("new engine process already seen on the event stream: its inventory is kept", "why", why)
		return
	}
	if !cleared && ew.drop != nil {
		ew.drop()
	}
	ew.reset()
	ew.restarted(why)
}
