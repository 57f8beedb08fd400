package engines

import (
	"encoding/hex"
	"errors"
	"path/filepath"
	"testing"

	"github.com/kvexact/kvexact/vectors"
)

// evSampleFrames returns the live frames of every vLLM and SGLang sample: [topic, seq, payload],
// read by the one sample loader.
func evSampleFrames(t testing.TB) [][][]byte {
	t.Helper()
	var out [][][]byte
	for _, fam := range []string{"vllm/v0.25.1", "sglang/v0.5.18"} {
		f, err := vectors.LoadSamples(filepath.Join("..", "vectors", fam, "events-samples.json"))
		if err != nil {
			t.Fatal(err)
		}
		for _, s := range f.Samples {
			out = append(out, [][]byte{s.Topic, s.SeqFrame, s.Payload})
		}
	}
	return out
}

func TestParseFramesSamples(t *testing.T) {
	frames := evSampleFrames(t)
	if len(frames) != 13 {
		t.Fatalf("%d samples", len(frames))
	}
	for _, f := range frames {
		topic, seq, payload, err := ParseFrames(f)
		if err != nil {
			t.Fatal(err)
		}
		if topic != string(f[0]) || hex.EncodeToString(SeqBytes(seq)) != hex.EncodeToString(f[1]) || len(payload) != len(f[2]) {
			t.Fatalf("%q %d", topic, seq)
		}
		again := LiveFrames(topic, seq, payload)
		for i := range again {
			if string(again[i]) != string(f[i]) {
				t.Fatalf("LiveFrames frame %d differs", i)
			}
		}
	}
}

func TestParseFramesErrorsNameTheFrame(t *testing.T) {
	cases := []struct {
		frames [][]byte
		field  string
	}{
		{[][]byte{{}, SeqBytes(1)}, "frames"},
		{[][]byte{{}, {0, 1}, {0x90}}, "frame 1 (sequence)"},
		{[][]byte{{}, SeqBytes(1), {0x90}, {}}, "frames"},
	}
	for _, c := range cases {
		_, _, _, err := ParseFrames(c.frames)
		var de *DecodeError
		if !errors.As(err, &de) || de.Reason != ReasonFrame || de.Field != c.field {
			t.Errorf("%x: %v, want %s", c.frames, err, c.field)
		}
	}
}

func TestReplayFrames(t *testing.T) {
	id, start, err := ParseReplayRequest(append([][]byte{[]byte("peer")}, ReplayRequest(42)...))
	if err != nil || string(id) != "peer" || start != 42 {
		t.Fatalf("%q %d %v", id, start, err)
	}
	if _, _, err := ParseReplayRequest([][]byte{[]byte("peer"), {1}, SeqBytes(1)}); err == nil {
		t.Fatal("non-empty delimiter accepted")
	}
	seq, p, end, err := ParseReplayReply(ReplayReply(7, []byte{0x93}))
	if err != nil || seq != 7 || end || len(p) != 1 {
		t.Fatalf("%d %x %v %v", seq, p, end, err)
	}
	// Newer vLLM inserts a topic frame: take the last two.
	seq, _, end, err = ParseReplayReply([][]byte{{}, []byte("kv"), SeqBytes(8), {0x93}})
	if err != nil || seq != 8 || end {
		t.Fatalf("topic reply: %d %v %v", seq, end, err)
	}
	seq, _, end, err = ParseReplayReply(ReplayEnd())
	if err != nil || !end || seq != ReplayEndSeq {
		t.Fatalf("end marker: %d %v %v", seq, end, err)
	}
	if _, _, _, err := ParseReplayReply([][]byte{{}, SeqBytes(1)}); err == nil {
		t.Fatal("two-frame reply accepted")
	}
}

func TestCheckRank(t *testing.T) {
	b := &Batch{DPRank: 1, HasDPRank: true}
	var de *DecodeError
	if err := CheckRank(b, 0); !errors.As(err, &de) || de.Reason != ReasonRankMismatch {
		t.Fatalf("%v", err)
	}
	if CheckRank(b, 1) != nil || CheckRank(&Batch{}, 3) != nil {
		t.Fatal("matching or unstamped rank rejected")
	}
}

func FuzzParseFrames(f *testing.F) {
	for _, fr := range evSampleFrames(f) {
		f.Add(fr[0], fr[1], fr[2], uint8(3))
	}
	f.Fuzz(func(t *testing.T, a, b, c []byte, n uint8) {
		frames := [][]byte{a, b, c, a}[:n%5]
		topic, seq, payload, err := ParseFrames(frames)
		if err != nil {
			var de *DecodeError
			if !errors.As(err, &de) || de.Reason != ReasonFrame {
				t.Fatalf("untyped error %v", err)
			}
		} else if len(frames) != 3 || topic != string(a) || string(SeqBytes(seq)) != string(b) || string(payload) != string(c) {
			t.Fatalf("accepted %x as %q %d %x", frames, topic, seq, payload)
		}
		if _, _, _, err := ParseReplayReply(frames); err != nil {
			var de *DecodeError
			if !errors.As(err, &de) {
				t.Fatalf("untyped replay error %v", err)
			}
		}
	})
}
