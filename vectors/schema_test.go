package vectors

import (
	"bytes"
	"encoding/json"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/kvexact/kvexact/gateway/hashcore"
)

// sharedVectors is ../shared/vectors beside the repository (the engine-produced originals), or ""
// when the checkout has none beside it: the project's own files are checked either way.
func sharedVectors(t *testing.T) string {
	t.Helper()
	d := filepath.Join(mustDir(t), "..", "..", "shared", "vectors")
	if _, err := os.Stat(d); err != nil {
		t.Logf("no engine-produced originals beside the repository (%v): checking the project's files only", err)
		return ""
	}
	return d
}

// TestEveryVectorFileMatchesItsSchema loads every JSON file under vectors/ and ../shared/vectors
// against its schema: a project file against the JSON Schema and the loader (flags as derived from
// the case, each documented), an engine-produced block-hash original through its engine's layout
// (and, where ../shared has it, byte for byte the same file: imported unchanged), an event-sample
// file through the sample loader (the project's against the JSON Schema; an original as one of
// the engine-produced sample layouts, and, where ../shared has it, byte for byte the same file). A file of no known kind fails.
func TestEveryVectorFileMatchesItsSchema(t *testing.T) {
	own, shared := mustDir(t), sharedVectors(t)
	kinds := map[string]int{}
	roots := []string{own}
	if shared != "" {
		roots = append(roots, shared)
	}
	for _, root := range roots {
		err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
			if err != nil {
				return err
			}
			rel, _ := filepath.Rel(root, path)
			if d.IsDir() && (rel == "schema" || rel == "testdata") {
				return filepath.SkipDir
			}
			if d.IsDir() || filepath.Ext(path) != ".json" {
				return nil
			}
			kind := checkVectorFile(t, root == shared, path)
			kinds[kind]++
			if (kind == "project" || kind == "project event samples") && root == shared {
				t.Errorf("%s: the engine-produced originals keep their own schema", path)
			}
			if (kind == "original" || kind == "event samples") && root == own && shared != "" {
				if orig, err := os.ReadFile(filepath.Join(shared, rel)); err == nil {
					mine, _ := os.ReadFile(path)
					if !bytes.Equal(orig, mine) {
						t.Errorf("%s differs from ../shared/vectors/%s: an imported original is kept unchanged", path, rel)
					}
				}
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	t.Logf("files by kind: %v", kinds)
	// 6 converted + 8 generated project files; 5 originals in vectors/ and 5 in ../shared; the
	// project's event-sample file; 3 + 3 engine-produced event-sample files.
	minOriginals, minSamples := 10, 6
	if shared == "" {
		minOriginals, minSamples = 5, 3
	}
	if kinds["project"] < 14 || kinds["original"] < minOriginals || kinds["project event samples"] < 1 || kinds["event samples"] < minSamples {
		t.Errorf("files by kind %v: fewer than the repository holds", kinds)
	}
}

// checkVectorFile checks one file against its schema and returns its kind.
func checkVectorFile(t *testing.T, fromShared bool, path string) string {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var top map[string]json.RawMessage
	if err := json.Unmarshal(data, &top); err != nil {
		t.Errorf("%s: %v", path, err)
		return "broken"
	}
	switch {
	case top["schema"] != nil && firstGroupType(top["testGroups"]) == eventPayloadTest:
		f, err := ParseSamples(path, data)
		if err != nil {
			t.Errorf("project event-sample file: %v", err)
			return "project event samples"
		}
		for _, s := range f.Samples {
			for _, fl := range s.Flags {
				if FlagDescription(fl) == "" || f.Header.Flags[fl] != FlagDescription(fl) {
					t.Errorf("%s: note %s says %q, the flag means %q", path, fl, f.Header.Flags[fl], FlagDescription(fl))
				}
			}
		}
		if _, err := Parse(path, data); !errors.Is(err, ErrNotVectorFile) {
			t.Errorf("%s: an event-sample file must not load as block-hash vectors (%v)", path, err)
		}
		return "project event samples"
	case top["schema"] != nil:
		f, err := Parse(path, data)
		if err != nil {
			t.Errorf("project file: %v", err)
			return "project"
		}
		for _, c := range f.Cases {
			if !slices.Equal(c.Flags, Flags(&c)) {
				t.Errorf("%s: tcId %d (%s): flags %v, the case exercises %v", path, c.ID, c.Name, c.Flags, Flags(&c))
			}
			for _, fl := range c.Flags {
				if f.Header.Flags[fl] != FlagDescription(fl) {
					t.Errorf("%s: note %s says %q, the flag means %q", path, fl, f.Header.Flags[fl], FlagDescription(fl))
				}
			}
		}
		return "project"
	case top["cases"] != nil:
		f, err := Parse(path, data)
		if err != nil {
			t.Errorf("engine-produced original: %v", err)
			return "original"
		}
		if f.Header.Generated() || f.Header.Source != SourceEngine {
			t.Errorf("%s: an original in an engine's layout must be engine-produced (origin %q)", path, f.Header.Origin)
		}
		return "original"
	case top["samples"] != nil || top["bodies"] != nil:
		if f, err := ParseSamples(path, data); err != nil || f.Header.Engine == "" || len(f.Samples) == 0 {
			t.Errorf("%s: an event-sample file names its engine and holds samples or bodies (%v)", path, err)
		}
		if _, err := Parse(path, data); !errors.Is(err, ErrNotVectorFile) {
			t.Errorf("%s: an event-sample file must not load as block-hash vectors (%v)", path, err)
		}
		return "event samples"
	}
	t.Errorf("%s: not a vector file of any known kind (project schema, engine case layout, event samples)", path)
	return "unknown"
}

// firstGroupType is the type of a project file's first test group.
func firstGroupType(groups json.RawMessage) string {
	var g []struct{ Type string }
	if json.Unmarshal(groups, &g) != nil || len(g) == 0 {
		return ""
	}
	return g[0].Type
}

// TestSchemaBothDirections: a small valid project file loads, and each broken one is refused with
// the JSON path of what is wrong — by the JSON Schema itself where it can say so, by the loader for
// what a JSON Schema cannot (tcId uniqueness, numberOfTests, undocumented flags).
func TestSchemaBothDirections(t *testing.T) {
	dir := filepath.Join(mustDir(t), "testdata")
	f, err := Load(filepath.Join(dir, "valid-project.json"))
	if err != nil {
		t.Fatal(err)
	}
	if len(f.Cases) != 2 || f.Cases[0].Name != "salted_empty" || f.Cases[0].ID != 1 || f.Cases[1].Request.CacheSalt != "" ||
		f.Cases[0].Request.CacheSalt != "t" || f.Header.KeyType != KeyInt64 || f.Field(qKeys) != "keys" {
		t.Fatalf("valid file read as %+v", f)
	}
	if p, fl, sk := VerifyFile(f, []hashcore.Impl{hashcore.ImplGo}).Counts(); p != 2 || fl != 0 || sk != 0 {
		t.Errorf("valid file: %d passed, %d failed, %d skipped under the Go reference", p, fl, sk)
	}
	for _, c := range []struct {
		file, path, want string
		bySchema         bool
	}{
		{"broken-token.json", "$.testGroups[0].tests[0].tokens[0]", "maximum", true},
		{"broken-unknown-field.json", "$.testGroups[0].tests[0]", "page_size", true},
		{"broken-no-keys.json", "$.testGroups[0].tests[0].expected", "keys", true},
		{"broken-origin.json", "$", "origin", true},
		{"broken-count.json", "$.numberOfTests", "numberOfTests is 3, the test groups hold 2", false},
		{"broken-tcid.json", "$.testGroups[0].tests[1].tcId", "tcId 2 is not unique", false},
		{"broken-flag.json", "$.testGroups[0].tests[1].flags[1]", `flag "CacheSalt" is not documented`, false},
	} {
		t.Run(c.file, func(t *testing.T) {
			path := filepath.Join(dir, c.file)
			_, err := Load(path)
			var pe *PathError
			if !errors.As(err, &pe) || pe.File != path || pe.Path != c.path || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("error %v, want a path error at %s containing %q", err, c.path, c.want)
			}
			if got := strings.Contains(err.Error(), "does not match "+SchemaName); got != c.bySchema {
				t.Errorf("refused by the JSON Schema: %t, want %t (%v)", got, c.bySchema, err)
			}
		})
	}
}
