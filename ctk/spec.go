package ctk

import (
	"context"
	"fmt"
	"time"

	"github.com/onsi/gomega"
)

// State is a spec's outcome.
type State string

// Outcomes.
const (
	Pass State = "PASS"
	Fail State = "FAIL"
	Skip State = "SKIP"
)

// Groups, in run order (the containers of the spec tree).
const (
	GroupIdentity  = "identity"
	GroupTokenizer = "tokenizer parity"
	GroupTemplate  = "chat-template parity"
	GroupHash      = "geometry and hash parity"
	GroupStream    = "event-stream semantics"
)

// Legs name what differs when a spec fails, so an operator knows which setting to fix.
const (
	LegReachability = "reachability"
	LegRelease      = "release"
	LegModel        = "model"
	LegTokenizer    = "tokenizer"
	LegTemplate     = "chat template"
	LegEvents       = "events"
	LegBlockSize    = "block size"
	LegTokens       = "tokens"
	LegSeed         = "seed"
	LegAlgorithm    = "algorithm"
	LegSequence     = "sequence"
	LegReplay       = "replay"
	LegClear        = "clear"
)

// SpecResult is one spec run against one endpoint: the requirement it checks, the outcome, and for
// a failure which leg differs, what was seen and how to fix it.
type SpecResult struct {
	Endpoint string        `json:"endpoint"`
	Group    string        `json:"group"`
	Text     string        `json:"text"`
	State    State         `json:"state"`
	Leg      string        `json:"leg,omitempty"`
	Message  string        `json:"message,omitempty"`
	Hint     string        `json:"hint,omitempty"`
	Start    time.Time     `json:"start"`
	Duration time.Duration `json:"duration"`
}

// FullText is the spec's readable requirement with its container: "<group>: <endpoint> <text>".
func (s SpecResult) FullText() string { return s.Group + ": " + s.Endpoint + " " + s.Text }

// T is what a spec body uses to record its outcome. A body returns after Fail or Skip.
type T struct {
	ctx context.Context
	res *SpecResult
	leg string // default leg for gomega failures
}

// Context is the spec's context.
func (t *T) Context() context.Context { return t.ctx }

// Failf fails the spec with the leg that differs, a fix hint and a message.
func (t *T) Failf(leg, hint, format string, a ...any) {
	if t.res.State == Fail {
		return
	}
	t.res.State, t.res.Leg, t.res.Hint, t.res.Message = Fail, leg, hint, fmt.Sprintf(format, a...)
}

// Skipf marks the spec skipped with the reason.
func (t *T) Skipf(format string, a ...any) {
	if t.res.State == Fail {
		return
	}
	t.res.State, t.res.Message = Skip, fmt.Sprintf(format, a...)
}

// Passf records a detail on a passing spec (what was proven, for the report).
func (t *T) Passf(format string, a ...any) {
	if t.res.State == Pass {
		t.res.Message = fmt.Sprintf(format, a...)
	}
}

// Failed reports whether the spec has failed so far.
func (t *T) Failed() bool { return t.res.State == Fail }

// Expect is gomega's assertion for values whose failure belongs to leg with hint: a failed
// assertion fails the spec (the body checks the returned bool to stop).
func (t *T) Expect(leg, hint string, actual any) gomega.Assertion {
	g := gomega.NewGomega(func(message string, _ ...int) { t.Failf(leg, hint, "%s", message) })
	return g.Expect(actual)
}

// spec is one node of an endpoint's spec tree.
type spec struct {
	group, text string
	body        func(t *T)
}

// run executes one spec body, turning a panic into a failure so that a bug in a spec never takes
// the CLI (or the gateway's re-probe) down.
func runSpec(ctx context.Context, endpoint string, s spec) (res SpecResult) {
	res = SpecResult{Endpoint: endpoint, Group: s.group, Text: s.text, State: Pass, Start: time.Now()}
	t := &T{ctx: ctx, res: &res}
	defer func() {
		if v := recover(); v != nil {
			res.State, res.Message = Fail, fmt.Sprintf("internal error in the spec: %v", v)
		}
		res.Duration = time.Since(res.Start)
	}()
	s.body(t)
	if res.State == Pass && ctx.Err() != nil {
		res.State, res.Message = Fail, "interrupted: "+ctx.Err().Error()
	}
	return res
}
