package vectors

import (
	"bytes"
	"encoding/binary"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestSampleFilesLoad: the one sample loader reads the project's sample file (schema-checked) and
// the three engine-produced sample layouts, with every sample's payload, frames and rendering;
// the block-hash loader refuses a sample file as not being block-hash vectors.
func TestSampleFilesLoad(t *testing.T) {
	dir := mustDir(t)
	for _, c := range []struct {
		rel, source, transport string
		n                      int
	}{
		{"vllm/v0.28.0/events-samples.json", SourceEngine, TransportZMQ, 5},
		{"sglang/v0.5.21/events-samples.json", SourceEngine, TransportZMQ, 7},
		{"vllm/v0.25.1/events-samples.json", SourceEngine, TransportZMQ, 7},
		{"sglang/v0.5.18/events-samples.json", SourceEngine, TransportZMQ, 6},
		{"trtllm/v1.2/kv-cache-events-samples.json", SourceEngine, TransportHTTP, 6},
	} {
		t.Run(c.rel, func(t *testing.T) {
			path := filepath.Join(dir, c.rel)
			f, err := LoadSamples(path)
			if err != nil {
				t.Fatal(err)
			}
			if len(f.Samples) != c.n || f.Header.Source != c.source || f.Header.Engine == "" || f.Header.Tag == "" || len(f.Header.Generator) == 0 {
				t.Fatalf("%d samples, header %+v", len(f.Samples), f.Header)
			}
			for i, s := range f.Samples {
				if s.ID != i+1 || s.Name == "" || s.Transport != c.transport || len(s.Payload) == 0 || s.Decoded == nil || s.Result != ResultValid {
					t.Errorf("sample %d: %+v", i, s)
				}
				if c.transport == TransportZMQ && len(s.SeqFrame) != 8 {
					t.Errorf("%s: seq frame %x", s.Name, s.SeqFrame)
				}
				if c.transport == TransportHTTP && s.BlockSize == 0 {
					t.Errorf("%s: no tokens per block", s.Name)
				}
			}
			if _, err := Load(path); !errors.Is(err, ErrNotVectorFile) {
				t.Errorf("the block-hash loader must refuse a sample file: %v", err)
			}
		})
	}
}

// TestSampleFilesRefused: a broken sample file is refused with the JSON path of what is wrong — by
// the JSON Schema where it can say so, by the loader for what it cannot.
func TestSampleFilesRefused(t *testing.T) {
	dir := mustDir(t)
	own, err := os.ReadFile(filepath.Join(dir, "vllm", "v0.28.0", "events-samples.json"))
	if err != nil {
		t.Fatal(err)
	}
	orig, err := os.ReadFile(filepath.Join(dir, "vllm", "v0.25.1", "events-samples.json"))
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name           string
		data           []byte
		old, new       string
		path, want     string
		bySchema, notS bool
	}{
		{"no frames", own, `"frames": {`, `"framez": {`, "$.testGroups[0].tests[0]", "framez", true, false},
		{"seq frame", own, `"seqFrame": "0000000000000001"`, `"seqFrame": "0000000000000002"`, "$.testGroups[0].tests[1].frames.seqFrame", "is not seq 1", false, false},
		{"undocumented flag", own, `"HashOnlyStore"
     ]`, `"HashOnlyStore", "Nope"
     ]`, "$.testGroups[0].tests[2].flags[3]", `flag "Nope" is not documented`, false, false},
		{"tcId", own, `"tcId": 2,`, `"tcId": 1,`, "$.testGroups[0].tests[1].tcId", "tcId 1 is not unique", false, false},
		{"reconstructed block hashes", own, `"type": "EventPayloadTest"`, `"type": "BlockHashTest"`, "$.testGroups[0]", "blockSize", true, false},
		{"original payload", orig, `"payload_hex": "93`, `"payload_hex": "9z`, "$.samples[0].payload_hex", "hex", false, false},
		{"original engine", orig, `"engine": "vllm"`, `"engine": "nope"`, "$.engine", "not an event-payload sample file", false, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			data := bytes.Replace(c.data, []byte(c.old), []byte(c.new), 1)
			if bytes.Equal(data, c.data) {
				t.Fatalf("%q not in the file", c.old)
			}
			_, err := ParseSamples("f.json", data)
			var pe *PathError
			if !errors.As(err, &pe) || pe.Path != c.path || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("error %v, want a path error at %s containing %q", err, c.path, c.want)
			}
			if got := strings.Contains(err.Error(), "does not match "+SchemaName); got != c.bySchema {
				t.Errorf("refused by the JSON Schema: %t, want %t (%v)", got, c.bySchema, err)
			}
			if errors.Is(err, ErrNotSampleFile) != c.notS {
				t.Errorf("ErrNotSampleFile: %t, want %t", errors.Is(err, ErrNotSampleFile), c.notS)
			}
		})
	}
}

// TestReconstructedHoldsNoBlockHashes: a reconstructed file may hold event payloads only, never
// block-hash truth.
func TestReconstructedHoldsNoBlockHashes(t *testing.T) {
	raw, err := os.ReadFile(filepath.Join(mustDir(t), "testdata", "valid-project.json"))
	if err != nil {
		t.Fatal(err)
	}
	data := bytes.Replace(raw, []byte(`"source": "engine"`), []byte(`"source": "reconstructed"`), 1)
	_, err = Parse("f.json", data)
	var pe *PathError
	if !errors.As(err, &pe) || pe.Path != "$.testGroups[0].type" || !strings.Contains(err.Error(), "does not match "+SchemaName) {
		t.Fatalf("error %v, want the JSON Schema to refuse $.testGroups[0].type", err)
	}
}

// FuzzParseSamples: the sample loader refuses or reads any input without panicking, and what it
// reads holds its invariants (tcIds 1..n in order, a ZeroMQ sample's sequence frame is its seq).
func FuzzParseSamples(f *testing.F) {
	dir := mustDir(f)
	for _, rel := range []string{"vllm/v0.28.0/events-samples.json", "vllm/v0.29.0/hybrid-samples.json", "vllm/v0.25.1/events-samples.json", "sglang/v0.5.18/events-samples.json", "trtllm/v1.2/kv-cache-events-samples.json"} {
		data, err := os.ReadFile(filepath.Join(dir, rel))
		if err != nil {
			f.Fatal(err)
		}
		f.Add(data)
	}
	f.Add([]byte(`{"engine":"tensorrt-llm","version":"1","bodies":[{"name":"x","body_text":"[]","body":[]}]}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		file, err := ParseSamples("fuzz.json", data)
		if err != nil {
			return
		}
		for i, s := range file.Samples {
			if s.ID != i+1 || s.Name == "" {
				t.Fatalf("sample %d: id %d name %q", i, s.ID, s.Name)
			}
			if s.Transport == TransportZMQ && (len(s.SeqFrame) != 8 || binary.BigEndian.Uint64(s.SeqFrame) != s.Seq) {
				t.Fatalf("%s: seq frame %x for seq %d", s.Name, s.SeqFrame, s.Seq)
			}
			for _, ph := range s.PrefixHits {
				if ph.HitTokens > ph.FullTokens || ph.HashBlockSize < 1 || ph.LimitingGroup < -1 {
					t.Fatalf("%s/%s: %+v", s.Name, ph.Name, ph)
				}
			}
		}
	})
}
