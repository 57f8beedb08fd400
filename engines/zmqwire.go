package engines

import (
	"encoding/binary"
	"errors"
	"fmt"
)

// ZeroMQ frame layout shared by vLLM and SGLang publishers (and TensorRT-LLM 1.3+ push events):
//
//	live (PUB → SUB):           [topic, seq u64 BE, payload]
//	replay request (DEALER):    ["", start_seq u64 BE]          (ROUTER sees [identity, "", start])
//	replay reply (DEALER view): ["", seq u64 BE, payload] …     (newer vLLM: ["", topic, seq, payload])
//	replay end marker:          ["", ff ff ff ff ff ff ff ff, ""]

// ReplayEndSeq is the sequence number of the replay end marker ((-1).to_bytes(8, "big", signed=True)).
const ReplayEndSeq = ^uint64(0)

func frameErr(i int, name string, err error) error {
	return &DecodeError{Reason: ReasonFrame, Offset: -1, Field: fmt.Sprintf("frame %d (%s)", i, name), Err: err}
}

func parseSeq(frames [][]byte, i int) (uint64, error) {
	if len(frames[i]) != 8 {
		return 0, frameErr(i, "sequence", fmt.Errorf("%d bytes, want 8 (u64 big-endian)", len(frames[i])))
	}
	return binary.BigEndian.Uint64(frames[i]), nil
}

// ParseFrames splits a live multipart message into topic, sequence and payload. The topic is
// returned as sent: SGLang `main` appends `\x00sgl-kv-epoch=…` to it, so compare by prefix.
func ParseFrames(frames [][]byte) (topic string, seq uint64, payload []byte, err error) {
	if len(frames) != 3 {
		return "", 0, nil, &DecodeError{Reason: ReasonFrame, Offset: -1, Field: "frames",
			Err: fmt.Errorf("%d frames, want 3 [topic, seq, payload]", len(frames))}
	}
	if seq, err = parseSeq(frames, 1); err != nil {
		return "", 0, nil, err
	}
	return string(frames[0]), seq, frames[2], nil
}

// SeqBytes is the 8-byte big-endian sequence frame.
func SeqBytes(seq uint64) []byte { return binary.BigEndian.AppendUint64(make([]byte, 0, 8), seq) }

// LiveFrames builds the publisher's multipart message (for the simulator).
func LiveFrames(topic string, seq uint64, payload []byte) [][]byte {
	return [][]byte{[]byte(topic), SeqBytes(seq), payload}
}

// ReplayRequest is what a DEALER sends to a publisher's replay ROUTER: an empty delimiter and the
// first wanted sequence. (A REQ socket would receive only the first reply; use a DEALER.)
func ReplayRequest(start uint64) [][]byte { return [][]byte{{}, SeqBytes(start)} }

// ParseReplayRequest reads a request as a ROUTER receives it, [identity, "", start].
func ParseReplayRequest(frames [][]byte) (identity []byte, start uint64, err error) {
	if len(frames) != 3 {
		return nil, 0, &DecodeError{Reason: ReasonFrame, Offset: -1, Field: "frames",
			Err: fmt.Errorf("%d frames, want 3 [identity, \"\", start_seq]", len(frames))}
	}
	if len(frames[1]) != 0 {
		return nil, 0, frameErr(1, "delimiter", errors.New("not empty"))
	}
	start, err = parseSeq(frames, 2)
	return frames[0], start, err
}

// ReplayReply is one replayed batch as the DEALER receives it (the ROUTER prepends the identity).
func ReplayReply(seq uint64, payload []byte) [][]byte { return [][]byte{{}, SeqBytes(seq), payload} }

// ReplayEnd is the end-of-replay marker as the DEALER receives it.
func ReplayEnd() [][]byte { return [][]byte{{}, SeqBytes(ReplayEndSeq), {}} }

// ParseReplayReply reads one reply on the DEALER. It takes the last two frames as (seq, payload),
// whatever the count, because vLLM after v0.25.1 inserts a topic frame. end is true for the end
// marker (seq ff…ff, or an empty payload), after which no batch follows.
func ParseReplayReply(frames [][]byte) (seq uint64, payload []byte, end bool, err error) {
	if len(frames) < 3 {
		return 0, nil, false, &DecodeError{Reason: ReasonFrame, Offset: -1, Field: "frames",
			Err: fmt.Errorf("%d frames, want [\"\", (topic,) seq, payload]", len(frames))}
	}
	if len(frames[0]) != 0 {
		return 0, nil, false, frameErr(0, "delimiter", errors.New("not empty"))
	}
	n := len(frames)
	if seq, err = parseSeq(frames, n-2); err != nil {
		return 0, nil, false, err
	}
	payload = frames[n-1]
	return seq, payload, seq == ReplayEndSeq || len(payload) == 0, nil
}
