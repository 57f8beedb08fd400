package security

import (
	"context"
	"io"
	"log"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/go-zeromq/zmq4"

	"github.com/kvexact/kvexact/gateway/rules"
)

// A rogue publisher on an endpoint's event address (wrong frame counts, a sequence frame of the
// wrong size, bytes that are not msgpack or not the schema, an array claiming 4 G items, deep
// nesting, then a flood) has its messages rejected whole and counted by reason
// (kvexact_ingest_rejects_total: frame_error, decode_error, schema_mismatch); the gateway keeps
// subscribing and serving. The messages are sent again until every reason is seen: a subscription
// drops what is published before it reaches the publisher.
func TestRoguePublisher(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := "tcp://" + ln.Addr().String()
	ln.Close()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	pub := zmq4.NewPub(ctx, zmq4.WithLogger(log.New(io.Discard, "", 0)))
	defer pub.Close()
	if err := pub.Listen(addr); err != nil {
		t.Fatal(err)
	}
	g := start(t, func(c *rules.Config) { c.Rules[0].Endpoints[0].Events.ZMQ = []string{addr} })
	seq := func(n byte) []byte { return []byte{0, 0, 0, 0, 0, 0, 0, n} }
	rogue := []zmq4.Msg{
		zmq4.NewMsgFrom([]byte("kv")), // one frame
		zmq4.NewMsgFrom([]byte("kv"), seq(1), []byte("not msgpack"), []byte("x")),     // four frames
		zmq4.NewMsgFrom([]byte("kv"), []byte{1, 2}, []byte{0x90}),                     // a 2-byte sequence
		zmq4.NewMsgFrom([]byte("kv"), seq(2), []byte("\xc1\xc1\xc1")),                 // reserved msgpack bytes
		zmq4.NewMsgFrom([]byte("kv"), seq(3), []byte{0xdd, 0xff, 0xff, 0xff, 0xff}),   // an array claiming 4 G items
		zmq4.NewMsgFrom([]byte("kv"), seq(4), []byte(strings.Repeat("\x92", 64<<10))), // deep nesting
	}
	// Each rogue message is rejected whole, under its reason.
	reasons := []string{"frame_error", "decode_error", "schema_mismatch"}
	missing := func() []string {
		var out []string
		for _, r := range reasons {
			if g.metric("kvexact_ingest_rejects_total", map[string]string{"reason": r}) == 0 {
				out = append(out, r)
			}
		}
		return out
	}
	deadline := time.Now().Add(15 * time.Second)
	for len(missing()) > 0 {
		if time.Now().After(deadline) {
			t.Fatalf("no rejects counted for %v (the subscription may not be up)", missing())
		}
		for _, m := range rogue {
			_ = pub.Send(m)
		}
		time.Sleep(100 * time.Millisecond)
	}
	for i := 0; i < 2000; i++ { // a flood: bounded by the rank's queue, dropped and counted beyond it
		_ = pub.Send(rogue[1])
	}
	client := &http.Client{Timeout: 10 * time.Second}
	resp, err := client.Post("http://"+g.client+"/v1/completions", "application/json", strings.NewReader(completionBody("")))
	if err != nil {
		t.Fatalf("the gateway stopped serving after the rogue messages: %v", err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("status %d after the rogue messages", resp.StatusCode)
	}
	for _, r := range []string{"frame_error", "decode_error", "schema_mismatch"} {
		t.Logf("rejects{reason=%s}: %v", r, g.metric("kvexact_ingest_rejects_total", map[string]string{"reason": r}))
	}
}
