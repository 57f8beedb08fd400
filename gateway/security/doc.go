// Package security is the gateway's wire-level hostile-input suite: requests and peers that try to
// smuggle, confuse, stall or exhaust the gateway's listeners, each case written with what the
// gateway must answer beside it. It holds no code of its own; its tests start a whole gateway
// (gateway/assemble) on 127.0.0.1 in front of a scripted engine and speak raw bytes, Go's client,
// Python's urllib and the OpenAI SDKs to it.
//
// `go test ./gateway/security` (part of `make test`) runs the quick cases. The many-connection
// cases (hundreds of slow or stalled clients at once) run with KVEXACT_SECURITY=long, which
// `make security` sets and .ci/run calls; docs/security.md lists every case.
package security
