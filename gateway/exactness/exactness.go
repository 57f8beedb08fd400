// Package exactness is one endpoint's exactness state machine: whether KV-exact may route to it,
// and, when not, every cause with the evidence that lifts it.
//
// Everything the gateway learns about an endpoint while it runs — its certificate, restarts, the
// live parity watch, re-probes, the verification probes, the router binding's token check, the
// engine's realized cached tokens — is an Evidence applied to the endpoint's Machine. The machine
// holds one Hold per Cause; a hold lifts only on the evidence for its own cause (or a
// re-certification, which starts the endpoint afresh). /admin/status, the metrics and the log lines
// are all read from the machine, so the reason shown is the cause observed.
//
// The router's fence is per endpoint, not per request kind: any hold fences KV-exact for every
// kind, so "verified for this request's kind" is implied by "eligible".
package exactness

import (
	"fmt"
	"strings"
	"time"
)

// Cause is one reason KV-exact is off on an endpoint. It is the reason label of the exactness
// metrics, so the set is closed: Causes lists every value.
type Cause string

const (
	// Uncertified: no certificate covers the endpoint (or the one that did expired).
	Uncertified Cause = "uncertified"
	// Reprobe: the periodic re-probe found another version, model or tokenizer.
	Reprobe Cause = "reprobe_failed"
	// Restart: the engine restarted, cleared its cache or changed identity; KV-exact waits for
	// the verification the machine was configured with (Config.Needs).
	Restart Cause = "unverified_since_restart"
	// Parity: a block the engine published does not hash to its key with the rule's
	// binding.
	Parity Cause = "parity_mismatch"
	// Geometry: the engine's events show another block size than the rule's (tokens_per_block,
	// page size): every block the gateway keys would be another one.
	Geometry Cause = "geometry_mismatch"
	// Probe: a verification probe (a completion or a chat whose keys the gateway computed)
	// was sent to the engine and the engine stored other blocks: tokenizer, chat template, block
	// size or hash no longer match.
	Probe Cause = "probe_not_reproduced"
	// Shortfall: the engine reports no cached tokens where the gateway predicted them.
	Shortfall Cause = "realized_shortfall"
	// TokenDrift: on the router binding, the engine's events do not reproduce the gateway's
	// tokenization of prompts routed to it.
	TokenDrift Cause = "token_drift"
	// Unsynced: the gateway's mirror of the endpoint does not follow the engine's event stream
	// (a rank is not connected, or its replay has not rebuilt the inventory yet): blocks the
	// engine evicted meanwhile may still be claimed.
	Unsynced Cause = "events_unsynced"
)

// Causes is every cause in the stable order status, metrics and fence reasons use.
var Causes = []Cause{Uncertified, Reprobe, Restart, Parity, Geometry, Probe, Shortfall, TokenDrift, Unsynced}

// ClearedByHand reports whether the operator's clear (POST …/exact/clear) lifts c: the causes whose
// evidence cannot come back while the endpoint is fenced (a fenced endpoint gets no KV-exact hits
// and no routed prompts to check).
func ClearedByHand(c Cause) bool { return c == Shortfall || c == TokenDrift }

// Lifts says, for the status and the fence reason, what lifts a hold of c.
func Lifts(c Cause) string {
	switch c {
	case Uncertified:
		return "lifts when a valid certificate covering this endpoint is loaded (ctk certify, then POST /admin/certificates/reload or SIGHUP)"
	case Reprobe:
		return "lifts when a later re-probe passes, or on re-certification"
	case Restart:
		return "lifts when the new process is verified (see verification), or on re-certification"
	case Parity, Geometry:
		return "lifts on re-certification, or when the engine restarts and its new process is verified"
	case Probe:
		return "lifts when a later probe of the same kind is reproduced, or on re-certification"
	case Unsynced:
		return "lifts when every rank's event stream is connected and its replay completed"
	case Shortfall, TokenDrift:
		return "lifts only by POST /admin/rules/{rule}/endpoints/{endpoint}/exact/clear?hold=" + string(c) + " after fixing the engine, or on re-certification"
	}
	return ""
}

// Kind is a request kind whose keys are verified separately: a chat's keys depend on the chat
// template, a completion's do not.
type Kind string

const (
	Completion Kind = "completion"
	Chat       Kind = "chat"
)

// State is the endpoint's exactness as a whole.
type State string

const (
	// StateUncertified: no certificate covers the endpoint.
	StateUncertified State = "uncertified"
	// StateEligible: certified and nothing seen since stops KV-exact.
	StateEligible State = "eligible"
	// StateVerifying: certified, restarted, and only the verification of the new process is
	// outstanding.
	StateVerifying State = "verifying"
	// StateSuspended: certified, but a check failed while running.
	StateSuspended State = "suspended"
)

// Config is what the restart verification needs before the Restart hold lifts.
type Config struct {
	// ParityBlocks is how many matching blocks the live parity watch must see after a restart
	// (engine binding). 0: the parity watch does not run (router binding); a passing re-probe
	// stands in for it.
	ParityBlocks int
	// Probes are the kinds whose verification probe must be reproduced after a restart (empty:
	// none can be sent, e.g. KV-exact is off).
	Probes []Kind
}

// EvidenceType names what an Evidence reports.
type EvidenceType int

const (
	// Certified: the certificates were (re)loaded and cover the endpoint. Every hold lifts and
	// the endpoint starts afresh (a re-certification).
	Certified EvidenceType = iota + 1
	// NotCertified: the certificates do not (or no longer) cover the endpoint; Detail says why.
	NotCertified
	// Restarted: a new engine process or a cache clear; Detail says how it was seen.
	Restarted
	// ParityMatched: the live parity watch checked Blocks blocks and they matched.
	ParityMatched
	// ParityMismatched: the live parity watch found a block that does not match; Detail names the
	// leg.
	ParityMismatched
	// GeometryMismatched: the engine's events carry blocks of another size than the rule's (Detail
	// names both).
	GeometryMismatched
	// ReprobePassed and ReprobeFailed: the periodic re-probe's verdict (Detail says why it failed).
	ReprobePassed
	ReprobeFailed
	// ProbeReproduced and ProbeNotReproduced: a verification probe of Kind appeared in the
	// engine's events with the gateway's keys, or the engine stored other blocks (Detail).
	ProbeReproduced
	ProbeNotReproduced
	// ShortfallSeen: consecutive KV-exact hits realized no cached token (Detail).
	ShortfallSeen
	// TokenDriftSeen: consecutive routed prompts not reproduced (Detail).
	TokenDriftSeen
	// Cleared: the operator cleared Cause by hand (only causes ClearedByHand accepts).
	Cleared
	// StreamUnsynced: a rank's event stream was lost or is replaying (Detail says which);
	// StreamSynced: every rank follows the engine again.
	StreamUnsynced
	StreamSynced
)

// Evidence is one observation about the endpoint.
type Evidence struct {
	Type   EvidenceType
	Detail string
	Blocks int
	Kind   Kind
	Cause  Cause
	// At is when it was observed (reasons carry it).
	At time.Time
}

// Hold is one active cause with its reason text.
type Hold struct {
	Cause  Cause
	Reason string
	Since  time.Time
}

// Verification is the progress of a restart's verification.
type Verification struct {
	Since        time.Time `json:"since,omitzero"`
	ParityBlocks int       `json:"parity_blocks"`
	ParityNeeded int       `json:"parity_blocks_needed"`
	ReprobeOK    bool      `json:"reprobe_passed,omitempty"`
	Reproduced   []Kind    `json:"probes_reproduced,omitempty"`
	Needed       []Kind    `json:"probes_needed,omitempty"`
}

// Transition is what one Evidence changed.
type Transition struct {
	From, To State
	Raised   []Cause
	Lifted   []Cause
}

// Changed reports whether the evidence raised or lifted a hold.
func (t Transition) Changed() bool { return len(t.Raised) > 0 || len(t.Lifted) > 0 || t.From != t.To }

// Machine is one endpoint's exactness. It is not safe for concurrent use: the owner serialises.
type Machine struct {
	cfg       Config
	certified bool
	certWhy   string
	holds     map[Cause]Hold
	// Restart verification, meaningful while the Restart hold is held.
	verifyingSince time.Time
	parityBlocks   int
	reprobeOK      bool
	reproduced     map[Kind]bool
	// failedKinds are the kinds whose last probe was not reproduced (the Probe hold
	// lifts when none is left).
	failedKinds map[Kind]string
}

// New returns the machine of an endpoint the certificates cover (certified) or not (why).
func New(cfg Config, certified bool, why string) *Machine {
	m := &Machine{cfg: cfg, holds: map[Cause]Hold{}, reproduced: map[Kind]bool{}, failedKinds: map[Kind]string{}}
	if certified {
		m.Apply(Evidence{Type: Certified})
	} else {
		m.Apply(Evidence{Type: NotCertified, Detail: why})
	}
	return m
}

// Config returns the machine's restart verification needs.
func (m *Machine) Config() Config { return m.cfg }

// SetConfig changes what a restart's verification needs (a rule change); a verification under
// way is re-evaluated.
func (m *Machine) SetConfig(cfg Config, at time.Time) Transition {
	from := m.State()
	m.cfg = cfg
	t := Transition{From: from}
	m.tryLiftRestart(&t)
	t.To = m.State()
	return t
}

// Certified reports whether a certificate covers the endpoint.
func (m *Machine) Certified() bool { return m.certified }

// CertificateReason is the certificate's verdict ("certified (engine)" or why not).
func (m *Machine) CertificateReason() string { return m.certWhy }

// Eligible reports whether KV-exact may route requests of kind to the endpoint.
func (m *Machine) Eligible(Kind) bool { return m.certified && len(m.holds) == 0 }

// State is the endpoint's state as a whole.
func (m *Machine) State() State {
	switch {
	case !m.certified:
		return StateUncertified
	case len(m.holds) == 0:
		return StateEligible
	case len(m.holds) == 1 && m.has(Restart):
		return StateVerifying
	}
	return StateSuspended
}

// Holds returns the active holds in Causes order (Uncertified first when not certified).
func (m *Machine) Holds() []Hold {
	var out []Hold
	if !m.certified {
		out = append(out, Hold{Cause: Uncertified, Reason: m.certWhy})
	}
	for _, c := range Causes {
		if h, ok := m.holds[c]; ok {
			out = append(out, h)
		}
	}
	return out
}

// Held reports whether cause c holds.
func (m *Machine) Held(c Cause) bool {
	if c == Uncertified {
		return !m.certified
	}
	return m.has(c)
}

func (m *Machine) has(c Cause) bool { _, ok := m.holds[c]; return ok }

// FenceReason is the router's fence text: every hold's reason and what lifts it, "" when none.
func (m *Machine) FenceReason() string {
	var out []string
	for _, c := range Causes {
		if h, ok := m.holds[c]; ok {
			out = append(out, h.Reason+" ("+Lifts(c)+")")
		}
	}
	return strings.Join(out, "; ")
}

// Verification returns the restart verification's progress (ok false when none is under way).
func (m *Machine) Verification() (Verification, bool) {
	if !m.has(Restart) {
		return Verification{}, false
	}
	v := Verification{Since: m.verifyingSince, ParityBlocks: m.parityBlocks, ParityNeeded: m.cfg.ParityBlocks, ReprobeOK: m.reprobeOK, Needed: m.cfg.Probes}
	for _, k := range m.cfg.Probes {
		if m.reproduced[k] {
			v.Reproduced = append(v.Reproduced, k)
		}
	}
	return v, true
}

// Apply moves the machine on one piece of evidence and says what changed.
func (m *Machine) Apply(ev Evidence) Transition {
	t := Transition{From: m.State()}
	at := ev.At
	if !m.certified && ev.Type != Certified && ev.Type != NotCertified {
		// Nothing to hold on an endpoint KV-exact does not use; a certificate starts it afresh.
		return t
	}
	switch ev.Type {
	case Certified:
		m.certified, m.certWhy = true, "certified"
		if ev.Detail != "" {
			m.certWhy = ev.Detail
		}
		for c := range m.holds {
			m.lift(&t, c)
		}
		clear(m.failedKinds)
		m.resetVerification(at)
	case NotCertified:
		m.certified, m.certWhy = false, ev.Detail
		if m.certWhy == "" {
			m.certWhy = "no certificate covers this endpoint"
		}
	case Restarted:
		// The process that produced a parity mismatch is gone; the new one must prove itself
		// from scratch, which the Restart hold demands.
		m.lift(&t, Parity)
		m.lift(&t, Geometry)
		m.resetVerification(at)
		m.raise(&t, Restart, fmt.Sprintf("unverified since restart at %s: %s; %s", stamp(at), ev.Detail, m.needsText()), at)
	case ParityMatched:
		if m.has(Restart) {
			m.parityBlocks += ev.Blocks
		}
	case ParityMismatched:
		m.raise(&t, Parity, fmt.Sprintf("live parity mismatch at %s: %s", stamp(at), ev.Detail), at)
	case GeometryMismatched:
		m.raise(&t, Geometry, fmt.Sprintf("block geometry changed at %s: %s", stamp(at), ev.Detail), at)
	case ReprobePassed:
		m.lift(&t, Reprobe)
		if m.has(Restart) {
			m.reprobeOK = true
		}
	case ReprobeFailed:
		m.raise(&t, Reprobe, "re-probe failed: "+ev.Detail, at)
		m.reprobeOK = false
	case ProbeReproduced:
		if m.has(Restart) {
			m.reproduced[ev.Kind] = true
		}
		if _, ok := m.failedKinds[ev.Kind]; ok {
			delete(m.failedKinds, ev.Kind)
			if len(m.failedKinds) == 0 {
				m.lift(&t, Probe)
			} else {
				m.setProbeHold(&t, at)
			}
		}
	case ProbeNotReproduced:
		m.failedKinds[ev.Kind] = ev.Detail
		m.reproduced[ev.Kind] = false
		m.setProbeHold(&t, at)
	case ShortfallSeen:
		m.raise(&t, Shortfall, ev.Detail, at)
	case TokenDriftSeen:
		m.raise(&t, TokenDrift, ev.Detail, at)
	case StreamUnsynced:
		if m.has(Unsynced) {
			break // the hold keeps the moment the stream stopped following the engine
		}
		m.raise(&t, Unsynced, fmt.Sprintf("event stream not synchronized since %s: %s", stamp(at), ev.Detail), at)
	case StreamSynced:
		m.lift(&t, Unsynced)
	case Cleared:
		if ClearedByHand(ev.Cause) {
			m.lift(&t, ev.Cause)
		}
	}
	m.tryLiftRestart(&t)
	t.To = m.State()
	return t
}

func (m *Machine) setProbeHold(t *Transition, at time.Time) {
	var parts []string
	for _, k := range []Kind{Completion, Chat} {
		if d, ok := m.failedKinds[k]; ok {
			parts = append(parts, fmt.Sprintf("the %s probe was not reproduced: %s", k, d))
		}
	}
	reason := strings.Join(parts, "; ")
	if h, ok := m.holds[Probe]; ok {
		h.Reason = reason
		m.holds[Probe] = h
		return
	}
	m.raise(t, Probe, reason, at)
}

// tryLiftRestart lifts the Restart hold once its verification is complete: the parity watch's
// blocks (or, without one, a passing re-probe), every configured probe reproduced, and no parity
// mismatch or failed probe since.
func (m *Machine) tryLiftRestart(t *Transition) {
	if !m.has(Restart) || m.has(Parity) || m.has(Geometry) || m.has(Probe) {
		return
	}
	if m.cfg.ParityBlocks > 0 && m.parityBlocks < m.cfg.ParityBlocks {
		return
	}
	if m.cfg.ParityBlocks == 0 && !m.reprobeOK {
		return
	}
	for _, k := range m.cfg.Probes {
		if !m.reproduced[k] {
			return
		}
	}
	m.lift(t, Restart)
}

func (m *Machine) resetVerification(at time.Time) {
	m.verifyingSince, m.parityBlocks, m.reprobeOK = at, 0, false
	clear(m.reproduced)
}

func (m *Machine) needsText() string {
	var need []string
	if m.cfg.ParityBlocks > 0 {
		need = append(need, fmt.Sprintf("%d matching blocks on the live parity watch", m.cfg.ParityBlocks))
	} else {
		need = append(need, "a passing re-probe")
	}
	for _, k := range m.cfg.Probes {
		need = append(need, "a reproduced "+string(k)+" probe")
	}
	return "KV-exact resumes after " + strings.Join(need, ", ")
}

func (m *Machine) raise(t *Transition, c Cause, reason string, at time.Time) {
	h, had := m.holds[c]
	if !had {
		h.Since = at
		t.Raised = append(t.Raised, c)
	}
	h.Cause, h.Reason = c, reason
	m.holds[c] = h
}

func (m *Machine) lift(t *Transition, c Cause) {
	if _, ok := m.holds[c]; !ok {
		return
	}
	delete(m.holds, c)
	if c == Probe {
		clear(m.failedKinds)
	}
	t.Lifted = append(t.Lifted, c)
}

func stamp(t time.Time) string {
	if t.IsZero() {
		return "an unknown time"
	}
	return t.UTC().Format(time.RFC3339)
}
