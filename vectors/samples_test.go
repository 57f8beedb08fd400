package vectors

import (
	"errors"
	"path/filepath"
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
		{"vllm/v0.28.0/events-samples.json", SourceReconstructed, TransportZMQ, 5},
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
