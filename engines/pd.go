package engines

import (
	"context"
	"encoding/json"
	"net/http"
)

// PD is the prefill/decode facet: how the family's engines split one request between a prefill
// endpoint, which computes the prompt's KV, and a decode endpoint, which generates from it.
type PD interface {
	// PDDialect is the family's dialect, nil when its engines have none (a rule of that family
	// cannot have prefill/decode roles).
	PDDialect() PDDialect
}

// PDDialect is one P/D wire protocol, as contracts name it (contracts.PDDialects). It decides the
// choreography of the two legs and the parameters relayed between them; the proxy sends the legs
// (PDLegs) and owns everything the dialects share: breakers, retries, receipts, timeouts, the
// relay, metrics and logs.
type PDDialect interface {
	// Name is the dialect's contract name; the proxy's metrics label it so.
	Name() string
	// Serve runs one P/D attempt of a request. It ends with the client answered through legs, or
	// with legs.SendFailed naming an endpoint the attempt could not reach (the proxy then re-runs
	// the selection without it).
	Serve(legs PDLegs)
}

// PDRole names one of an attempt's two endpoints.
type PDRole int

const (
	PDPrefill PDRole = iota
	PDDecode
)

// PDRequest is what a dialect reads of the client's request.
type PDRequest struct {
	// Body is the client's body as received; a dialect patches copies of it, never it.
	Body []byte
	// Batch is the number of prompts of a completions request (1 for one prompt or a chat).
	Batch        int
	Stream, Chat bool
}

// PDEndpoint is one endpoint of the attempt's pair.
type PDEndpoint struct {
	Name, Address string
	// BootstrapPort is the rule's bootstrapPort for the endpoint, 0 when unset.
	BootstrapPort int
}

// LegAnswer is a prefill leg's answer as the proxy read it.
type LegAnswer struct {
	Status int
	Header http.Header
	// Body is the answer read whole up to the proxy's cap (Whole false when it was longer). A
	// drained leg (PDLegs.DrainPrefill) keeps it only for an error status.
	Body  []byte
	Whole bool
	// Tail is a drained successful answer's last bytes (where its usage object is).
	Tail []byte
	// Err is why the leg failed: no answer at all, or a body that broke off.
	Err error
	// Unreachable: the endpoint gave no response at all (connect failure, open breaker);
	// TimedOut: it did not answer within the prefill timeout.
	Unreachable, TimedOut bool
}

// Failed reports whether the leg did not bring a successful answer.
func (a LegAnswer) Failed() bool { return a.Err != nil || a.Status >= 400 }

// DecodeResult is how a decode leg sent with PDLegs.StreamDecode ended.
type DecodeResult struct {
	// Err: the leg got no response (Unreachable as in LegAnswer); nothing reached the client.
	Err         error
	Unreachable bool
	Status      int
	// Relayed: the whole answer reached the client. Refused: the commit hook refused it, and
	// nothing was written.
	Relayed, Refused bool
}

// PDLegs is the leg runner the proxy hands a dialect for one attempt.
type PDLegs interface {
	Request() PDRequest
	Endpoint(PDRole) PDEndpoint
	// Context is the client request's; PrefillContext bounds a prefill leg by the rule's prefill
	// timeout.
	Context() context.Context
	PrefillContext() (context.Context, context.CancelFunc)

	// FetchPrefill sends body to the prefill endpoint, within the prefill timeout, and reads the
	// answer whole. done means the request is over (answered, left by the client, or an endpoint
	// excluded for a retry): the dialect returns at once.
	FetchPrefill(body []byte) (a LegAnswer, done bool)
	// DrainPrefill sends body to the prefill endpoint under ctx and reads its answer to the end,
	// for a dialect whose legs run concurrently.
	DrainPrefill(ctx context.Context, body []byte) LegAnswer
	// RelayDecode re-validates the decode endpoint (it may have died during a long prefill),
	// sends it body and relays its answer. viaPrefill names the prefill endpoint in the receipt:
	// the decode leg uses its KV.
	RelayDecode(body []byte, viaPrefill bool)
	// StreamDecode sends body to the decode endpoint under ctx and relays its answer with both
	// receipts; commit is asked just before the first byte goes out and may refuse.
	StreamDecode(ctx context.Context, body []byte, commit func() bool) DecodeResult

	// RelayPrefill answers with the prefill endpoint's own answer (its verdict on the client's
	// body, or a request it already finished); RelayPrefillEvents with a 200 event stream made of
	// events, as the prefill endpoint's.
	RelayPrefill(a LegAnswer)
	RelayPrefillEvents(events []byte)
	// AccountPrefill takes the prefill answer's usage (the account of the KV-exact prediction,
	// which was about the prefill endpoint).
	AccountPrefill(a LegAnswer)

	// SendFailed ends the attempt after a leg's failed send: an unreachable endpoint is excluded
	// and the selection re-runs without it; anything else is answered 502 (unless the client left).
	SendFailed(role PDRole, err error)
	// Fail answers with a server error (OpenAI's shape); PrefillTimedOut with 504
	// pd_prefill_timeout; InternalError with 500 internal_error.
	Fail(status int, code, format string, args ...any)
	PrefillTimedOut()
	InternalError(err error)

	// Params counts transfer parameters found in (or missing from) the prefill answer;
	// BadResponse counts a prefill answer the dialect cannot use.
	Params(found bool)
	BadResponse()
	// Warn logs msg with the rule before and the request id after args.
	Warn(msg string, args ...any)
}

// MaxTransferParams caps the transfer parameters relayed between legs; larger ones are dropped and
// decode recomputes the prompt (the reference gateway's 64 KB buffer).
const MaxTransferParams = 64 << 10

// PatchJSON rewrites top-level members of a JSON object (edit sets or deletes map entries).
func PatchJSON(raw []byte, edit func(m map[string]json.RawMessage)) ([]byte, error) {
	var m map[string]json.RawMessage
	if err := json.Unmarshal(raw, &m); err != nil {
		return nil, err
	}
	edit(m)
	return json.Marshal(m)
}

// RawJSON encodes a plain value (strings, numbers, slices and maps of them).
func RawJSON(v any) json.RawMessage {
	b, _ := json.Marshal(v)
	return b
}

// IsNull reports whether a raw member is absent or null.
func IsNull(m json.RawMessage) bool { return len(m) == 0 || string(m) == "null" }
