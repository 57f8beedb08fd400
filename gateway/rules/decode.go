package rules

import (
	"errors"
	"fmt"
	"regexp"
	"strconv"
	"strings"

	"go.yaml.in/yaml/v3"
)

// valueError is a scalar that does not parse as its field's type (a duration), with its position,
// so that fieldPaths can name the field.
type valueError struct {
	line, column int
	msg          string
}

func (e *valueError) Error() string { return fmt.Sprintf("line %d: %s", e.line, e.msg) }

// yamlLine matches the "line N: …" errors of the YAML decoder (its TypeError entries).
var yamlLine = regexp.MustCompile("^line ([0-9]+): (.*)$")

// fieldPaths turns a decoding error of doc into errors naming their field path
// (rules[0].upstream.idleTimeout) instead of a line: numbers that overflow, values of the wrong
// type, bad durations, unknown keys. An error it cannot place is returned as it is.
func fieldPaths(doc []byte, err error) error {
	var root yaml.Node
	if yaml.Unmarshal(doc, &root) != nil {
		return err
	}
	var msgs []struct {
		line, col int
		msg       string
	}
	var ve *valueError
	var te *yaml.TypeError
	switch {
	case errors.As(err, &ve):
		msgs = append(msgs, struct {
			line, col int
			msg       string
		}{ve.line, ve.column, ve.msg})
	case errors.As(err, &te):
		for _, e := range te.Errors {
			m := yamlLine.FindStringSubmatch(e)
			if m == nil {
				return err
			}
			line, _ := strconv.Atoi(m[1])
			msgs = append(msgs, struct {
				line, col int
				msg       string
			}{line, 0, m[2]})
		}
	default:
		return err
	}
	var out []error
	for _, m := range msgs {
		path := locate(&root, m.line, m.col, m.msg)
		if path == "" {
			out = append(out, fmt.Errorf("line %d: %s", m.line, m.msg))
			continue
		}
		out = append(out, &FieldError{Field: path, Msg: m.msg})
	}
	if len(out) == 1 {
		return out[0]
	}
	return errors.Join(out...)
}

// locate finds the field path of the node the message at (line, col) is about: the value node at
// that position, else the key or value on that line the message quotes (`value` or "field x").
func locate(root *yaml.Node, line, col int, msg string) string {
	type spot struct {
		n    *yaml.Node
		path string
		key  bool
	}
	var spots []spot
	var walk func(n *yaml.Node, path string)
	walk = func(n *yaml.Node, path string) {
		switch n.Kind {
		case yaml.DocumentNode:
			for _, c := range n.Content {
				walk(c, path)
			}
			return
		case yaml.MappingNode:
			for i := 0; i+1 < len(n.Content); i += 2 {
				k, v := n.Content[i], n.Content[i+1]
				p := k.Value
				if path != "" {
					p = path + "." + k.Value
				}
				spots = append(spots, spot{k, p, true})
				walk(v, p)
			}
		case yaml.SequenceNode:
			for i, c := range n.Content {
				walk(c, fmt.Sprintf("%s[%d]", path, i))
			}
		}
		if path != "" {
			spots = append(spots, spot{n, path, false})
		}
	}
	walk(root, "")
	quoted := ""
	if i := strings.IndexByte(msg, '`'); i >= 0 {
		if j := strings.IndexByte(msg[i+1:], '`'); j >= 0 {
			quoted = strings.TrimSuffix(msg[i+1:i+1+j], "...")
		}
	}
	field := ""
	if rest, ok := strings.CutPrefix(msg, "field "); ok {
		field, _, _ = strings.Cut(rest, " ")
	}
	best := ""
	for _, s := range spots {
		if s.n.Line != line {
			continue
		}
		switch {
		case col > 0 && s.n.Column == col && !s.key:
			return s.path
		case field != "" && s.key && s.n.Value == field:
			return s.path
		case field == "" && quoted != "" && !s.key && s.n.Kind == yaml.ScalarNode && strings.HasPrefix(s.n.Value, quoted):
			return s.path
		case best == "" && !s.key && s.n.Kind == yaml.ScalarNode:
			best = s.path
		}
	}
	return best
}
