package contracts

import (
	"fmt"
	"strconv"
	"strings"
)

// Version is an engine release number as engines print it: "v0.25.1", "0.25.1", "1.2",
// "1.3.0rc24", "0.4.6.post5", "0.26.0.dev12+g1234", or llama.cpp's "b10573" (also "b10573-d775b89").
// Pre-releases (rc, a, b, dev) sort before their release, post-releases after it; a local suffix
// ("+g1234") is kept for display and ignored in comparisons.
type Version struct {
	Raw   string
	Nums  []int
	Pre   int // -1 for a pre-release, 0 for a release, +1 for a post-release
	PreN  int // number after rc/a/b/dev/post
	Local string
}

// ParseVersion reads an engine version string; the error names the offending text.
func ParseVersion(s string) (Version, error) {
	v := Version{Raw: s}
	t := strings.TrimSpace(s)
	if i := strings.IndexByte(t, '+'); i >= 0 {
		v.Local, t = t[i+1:], t[:i]
	}
	t = strings.TrimPrefix(strings.TrimPrefix(t, "v"), "V")
	// llama.cpp builds: b<build>[-<commit>].
	if len(t) > 1 && t[0] == 'b' && t[1] >= '0' && t[1] <= '9' {
		t = t[1:]
		if i := strings.IndexByte(t, '-'); i >= 0 {
			v.Local, t = t[i+1:], t[:i]
		}
	}
	end := 0
	for end < len(t) && (t[end] == '.' || (t[end] >= '0' && t[end] <= '9')) {
		end++
	}
	num, suffix := strings.TrimSuffix(t[:end], "."), strings.TrimPrefix(t[end:], "-")
	if num == "" {
		return Version{}, fmt.Errorf("version %q: no release number", s)
	}
	for _, part := range strings.Split(num, ".") {
		n, err := strconv.Atoi(part)
		if err != nil {
			return Version{}, fmt.Errorf("version %q: component %q is not a number", s, part)
		}
		v.Nums = append(v.Nums, n)
	}
	if suffix != "" {
		kinds := []struct {
			prefix string
			pre    int
		}{{"post", 1}, {"dev", -1}, {"rc", -1}, {"alpha", -1}, {"beta", -1}, {"a", -1}, {"b", -1}}
		matched := false
		for _, k := range kinds {
			if rest, ok := strings.CutPrefix(suffix, k.prefix); ok {
				rest = strings.TrimPrefix(rest, ".")
				n := 0
				if rest != "" {
					var err error
					if n, err = strconv.Atoi(rest); err != nil {
						return Version{}, fmt.Errorf("version %q: suffix %q is not %s<number>", s, suffix, k.prefix)
					}
				}
				v.Pre, v.PreN, matched = k.pre, n, true
				break
			}
		}
		if !matched {
			return Version{}, fmt.Errorf("version %q: unknown suffix %q (want rcN, aN, bN, devN or postN)", s, suffix)
		}
	}
	return v, nil
}

// Compare orders two versions: missing trailing components count as zero ("1.2" == "1.2.0").
func (v Version) Compare(w Version) int {
	for i := 0; i < max(len(v.Nums), len(w.Nums)); i++ {
		a, b := at(v.Nums, i), at(w.Nums, i)
		if a != b {
			return cmpInt(a, b)
		}
	}
	if v.Pre != w.Pre {
		return cmpInt(v.Pre, w.Pre)
	}
	return cmpInt(v.PreN, w.PreN)
}

func (v Version) String() string { return v.Raw }

func at(n []int, i int) int {
	if i < len(n) {
		return n[i]
	}
	return 0
}

func cmpInt(a, b int) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// Range is an inclusive span of releases. Max may end in ".x" to take every release, pre-release
// and post-release of that line ("v0.25.x", "1.2.x").
type Range struct {
	Min string `yaml:"min"`
	Max string `yaml:"max"`

	min, max Version
	maxLine  []int // set when Max ends in ".x"
}

func (r *Range) compile() error {
	var err error
	if r.min, err = ParseVersion(r.Min); err != nil {
		return fmt.Errorf("versions.min: %w", err)
	}
	if line, ok := strings.CutSuffix(r.Max, ".x"); ok {
		lv, err := ParseVersion(line)
		if err != nil {
			return fmt.Errorf("versions.max: %w", err)
		}
		if lv.Pre != 0 {
			return fmt.Errorf("versions.max: %q: a release line cannot carry a suffix", r.Max)
		}
		r.maxLine = lv.Nums
		r.max = lv
	} else if r.max, err = ParseVersion(r.Max); err != nil {
		return fmt.Errorf("versions.max: %w", err)
	}
	if r.maxLine == nil && r.min.Compare(r.max) > 0 {
		return fmt.Errorf("versions: min %s is above max %s", r.Min, r.Max)
	}
	return nil
}

// Contains reports whether v lies in the range.
func (r *Range) Contains(v Version) bool {
	if v.Compare(r.min) < 0 {
		return false
	}
	if r.maxLine != nil {
		for i, n := range r.maxLine {
			if at(v.Nums, i) != n {
				return v.Compare(r.max) < 0
			}
		}
		return true
	}
	return v.Compare(r.max) <= 0
}

func (r *Range) String() string {
	if r.Min == r.Max {
		return r.Min
	}
	return r.Min + " – " + r.Max
}
