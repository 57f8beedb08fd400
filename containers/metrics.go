package containers

import (
	"bufio"
	"fmt"
	"io"
	"math"
	"strconv"
	"strings"
)

// Sample is one Prometheus series value.
type Sample struct {
	Name   string
	Labels map[string]string
	Value  float64
}

// Metrics are the samples of one scrape.
type Metrics []Sample

// ParseMetrics reads the Prometheus text exposition format (what /metrics serves). Comments and
// blank lines are skipped; label values may hold any escaped text.
func ParseMetrics(r io.Reader) (Metrics, error) {
	var out Metrics
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 1<<16), 1<<22)
	line := 0
	for sc.Scan() {
		line++
		t := strings.TrimSpace(sc.Text())
		if t == "" || t[0] == '#' {
			continue
		}
		s, err := parseSample(t)
		if err != nil {
			return nil, fmt.Errorf("metrics line %d: %w", line, err)
		}
		out = append(out, s)
	}
	return out, sc.Err()
}

func parseSample(t string) (Sample, error) {
	s := Sample{Labels: map[string]string{}}
	i := strings.IndexAny(t, "{ ")
	if i < 0 {
		return s, fmt.Errorf("no value in %q", t)
	}
	s.Name = t[:i]
	rest := t[i:]
	if rest[0] == '{' {
		rest = rest[1:]
		for {
			rest = strings.TrimLeft(rest, " ,")
			if strings.HasPrefix(rest, "}") {
				rest = rest[1:]
				break
			}
			eq := strings.IndexByte(rest, '=')
			if eq < 0 || len(rest) < eq+2 || rest[eq+1] != '"' {
				return s, fmt.Errorf("bad label in %q", t)
			}
			key := rest[:eq]
			rest = rest[eq+2:]
			var b strings.Builder
			closed := false
			for j := 0; j < len(rest); j++ {
				c := rest[j]
				if c == '\\' && j+1 < len(rest) {
					j++
					switch rest[j] {
					case 'n':
						b.WriteByte('\n')
					default:
						b.WriteByte(rest[j])
					}
					continue
				}
				if c == '"' {
					rest = rest[j+1:]
					closed = true
					break
				}
				b.WriteByte(c)
			}
			if !closed {
				return s, fmt.Errorf("unterminated label value in %q", t)
			}
			s.Labels[key] = b.String()
		}
	}
	f := strings.Fields(rest)
	if len(f) == 0 {
		return s, fmt.Errorf("no value in %q", t)
	}
	v, err := strconv.ParseFloat(f[0], 64)
	if err != nil {
		switch f[0] {
		case "+Inf":
			v = math.Inf(1)
		case "-Inf":
			v = math.Inf(-1)
		default:
			return s, fmt.Errorf("value %q: %w", f[0], err)
		}
	}
	s.Value = v
	return s, nil
}

// Sum adds the values of every series named name whose labels include all of match.
func (m Metrics) Sum(name string, match map[string]string) float64 {
	total := 0.0
	for _, s := range m {
		if s.Name != name {
			continue
		}
		ok := true
		for k, v := range match {
			if s.Labels[k] != v {
				ok = false
				break
			}
		}
		if ok {
			total += s.Value
		}
	}
	return total
}
