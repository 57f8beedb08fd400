package ingest

import (
	"github.com/go-zeromq/zmq4"

	"github.com/kvexact/kvexact/engines"
)

// The frames stage: a ZeroMQ multipart message to its sequence and payload, in the layout every
// ZeroMQ family shares (engines/zmqwire.go). A message without the layout is rejected whole
// (frame_error), counted, and the stream goes on.

// liveFrame reads a live message [topic, seq, payload].
func (rr *rankRun) liveFrame(msg zmq4.Msg) (seq uint64, payload []byte, ok bool) {
	_, seq, payload, err := engines.ParseFrames(msg.Frames)
	if err != nil {
		rr.p.reject(rr.rank, 0, false, err)
		return 0, nil, false
	}
	return seq, payload, true
}

// replayFrame reads one replay reply; end is true for the end marker.
func (rr *rankRun) replayFrame(msg zmq4.Msg) (seq uint64, payload []byte, end, ok bool) {
	seq, payload, end, err := engines.ParseReplayReply(msg.Frames)
	if err != nil {
		rr.p.reject(rr.rank, 0, false, err)
		return 0, nil, false, false
	}
	return seq, payload, end, true
}
