package tokenize

import (
	"path/filepath"
	"testing"
)

// TestReferenceFiles replays every reference file: all text and chat cases must pass; a file whose
// tokenizer folder is missing (gemma3 before the fetch script ran) is skipped with the reason.
func TestReferenceFiles(t *testing.T) {
	files, err := filepath.Glob(filepath.Join(refDir, "*.json"))
	if err != nil || len(files) == 0 {
		t.Skipf("no reference files under %s", refDir)
	}
	for _, f := range files {
		t.Run(filepath.Base(f), func(t *testing.T) {
			res, err := CheckReferenceFile(f, testRoots(), LoadForCheck)
			if err != nil {
				t.Fatal(err)
			}
			if res.Skipped != "" {
				t.Skip(res.Skipped)
			}
			for _, line := range res.Failures {
				t.Error(line)
			}
			if res.Passed == 0 {
				t.Errorf("no case passed")
			}
			t.Logf("%s: %d passed, %d failed", res.Dir, res.Passed, res.Failed)
		})
	}
}
