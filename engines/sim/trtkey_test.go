package sim

import "testing"

// The worked examples of reference §2.4 (they agree with TensorRT-LLM's own Python port).
func TestTRTBlockKeyWorkedExamples(t *testing.T) {
	cases := []struct {
		parent uint64
		tokens []uint32
		want   uint64
	}{
		{0, []uint32{1, 2, 3, 4}, 924206229973855},
		{924206229973855, []uint32{5, 6, 7, 8}, 2728178455351807326},
		{0, []uint32{128000, 9906, 11, 1917}, 511057048059633},
		{511057048059633, []uint32{0, 358, 1097, 264}, 15225379107926195450},
	}
	for _, c := range cases {
		if got := trtBlockKey(c.parent, c.tokens); got != c.want {
			t.Errorf("trtBlockKey(%d, %v) = %d, want %d", c.parent, c.tokens, got, c.want)
		}
	}
	if a, b := trtBlockKey(0, []uint32{1, 2, 3}), trtBlockKey(0, []uint32{1, 2, 3, 0}); a == b {
		t.Errorf("a partial block must hash differently from its zero-padded full form")
	}
	if trtBlockKeyLoRA(0, []uint32{1, 2, 3, 4}, 7) == trtBlockKey(0, []uint32{1, 2, 3, 4}) {
		t.Errorf("LoRA task id must change the key")
	}
}
