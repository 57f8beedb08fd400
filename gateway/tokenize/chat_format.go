package tokenize

import (
	"fmt"
	"strings"
)

// Content format detection, as vLLM does it (docs/chat-templates.md): a template is "openai" when it
// loops over a message's content — `{% for x in m['content'] %}` or `m.content` (through filters,
// tests and slices) where m is the target of a loop over `messages` or over a variable assigned from
// it — and "string" otherwise. vLLM walks jinja2's AST; ardanlabs/jinja keeps its AST private, so
// this file has its own small lexer and parser for the statements the rule looks at ({% for %} and
// {% set %}), following jinja2's grammar so that the node shapes (Filter, Test, Getitem with a slice,
// Getattr, Name) are the same ones vLLM inspects.

// ContentFormat is how message content reaches the template.
type ContentFormat string

const (
	// ContentString: text parts are joined with "\n" into one string.
	ContentString ContentFormat = "string"
	// ContentOpenAI: content stays a list of {"type": "text", "text": ...} parts.
	ContentOpenAI ContentFormat = "openai"
)

// DetectContentFormat applies vLLM's detection rule to a template source. An error means this parser
// could not read a statement jinja2 may accept; the caller must then not guess.
func DetectContentFormat(src string) (ContentFormat, error) {
	stmts, err := scanStatements(src)
	if err != nil {
		return "", err
	}
	var fors []*jForStmt
	var sets []*jSetStmt
	for _, st := range stmts {
		switch st := st.(type) {
		case *jForStmt:
			fors = append(fors, st)
		case *jSetStmt:
			sets = append(sets, st)
		}
	}
	// Variables derived from messages (breadth first, as vLLM walks them). vLLM asserts that every
	// matching assignment target is a plain name; a failed assertion makes it fall back to "string".
	derived := []string{"messages"}
	seen := map[string]bool{"messages": true}
	for q := 0; q < len(derived); q++ {
		v := derived[q]
		for _, s := range sets {
			if !isVarOrElemsAccess(s.value, v, "") {
				continue
			}
			if s.target == "" {
				return ContentString, nil
			}
			if !seen[s.target] {
				seen[s.target] = true
				derived = append(derived, s.target)
			}
		}
	}
	var msgVars []string
	for _, f := range fors {
		for _, v := range derived {
			if isVarOrElemsAccess(f.iter, v, "") {
				if f.target == "" {
					return ContentString, nil
				}
				msgVars = append(msgVars, f.target)
				break
			}
		}
	}
	for _, f := range fors {
		for _, v := range msgVars {
			if isVarOrElemsAccess(f.iter, v, "content") {
				if f.target == "" {
					return ContentString, nil
				}
				return ContentOpenAI, nil
			}
		}
	}
	return ContentString, nil
}

func isVarOrElemsAccess(n *jNode, name, key string) bool {
	if n == nil {
		return false
	}
	switch n.kind {
	case jFilter, jTest:
		return isVarOrElemsAccess(n.child, name, key)
	case jGetitem:
		if n.arg != nil && n.arg.kind == jSlice {
			return isVarOrElemsAccess(n.child, name, key)
		}
	}
	if key == "" {
		return n.kind == jName && n.name == name
	}
	switch n.kind {
	case jGetitem:
		return n.child.kind == jName && n.child.name == name && n.arg.kind == jConstStr && n.arg.name == key
	case jGetattr:
		return n.child.kind == jName && n.child.name == name && n.name == key
	}
	return false
}

type jKind int

const (
	jOther jKind = iota
	jName
	jConstStr
	jGetattr
	jGetitem
	jSlice
	jFilter
	jTest
)

// jNode is the part of a jinja2 expression node the rule needs.
type jNode struct {
	kind  jKind
	name  string // Name, Getattr attribute, string constant, filter / test name
	child *jNode // Getattr / Getitem / Filter / Test operand
	arg   *jNode // Getitem argument
}

var jOtherNode = &jNode{kind: jOther}

// jForStmt is `{% for target in iter %}`; target is "" when it is not a single name.
type jForStmt struct {
	target string
	iter   *jNode
}

// jSetStmt is `{% set target = value %}`; target is "" for namespace or tuple targets.
type jSetStmt struct {
	target string
	value  *jNode
}

type jTokKind int

const (
	tkName jTokKind = iota
	tkString
	tkNumber
	tkOp
	tkEnd
)

type jTok struct {
	kind jTokKind
	val  string
}

// scanStatements finds {% for %} and {% set %} statements in template order, skipping comments,
// expressions and raw blocks.
func scanStatements(src string) ([]any, error) {
	var out []any
	i := 0
	for i < len(src) {
		j := strings.IndexByte(src[i:], '{')
		if j < 0 || i+j+1 >= len(src) {
			break
		}
		i += j
		switch src[i+1] {
		case '#':
			k := strings.Index(src[i+2:], "#}")
			if k < 0 {
				return nil, fmt.Errorf("chat template: offset %d: unclosed comment", i)
			}
			i += 2 + k + 2
		case '{':
			toks, next, err := lexTag(src, i+2, "}}")
			if err != nil {
				return nil, err
			}
			_ = toks
			i = next
		case '%':
			start := i
			toks, next, err := lexTag(src, i+2, "%}")
			if err != nil {
				return nil, err
			}
			i = next
			if len(toks) == 0 || toks[0].kind != tkName {
				continue
			}
			switch toks[0].val {
			case "raw":
				k := findEndRaw(src, i)
				if k < 0 {
					return nil, fmt.Errorf("chat template: offset %d: raw block without endraw", start)
				}
				i = k
			case "for", "set":
				p := &jParser{toks: toks[1:]}
				st, err := p.statement(toks[0].val)
				if err != nil {
					return nil, fmt.Errorf("chat template: offset %d: %s statement: %w", start, toks[0].val, err)
				}
				if st != nil {
					out = append(out, st)
				}
			}
		default:
			i++
		}
	}
	return out, nil
}

func findEndRaw(src string, from int) int {
	for i := from; i < len(src); {
		k := strings.Index(src[i:], "{%")
		if k < 0 {
			return -1
		}
		i += k
		toks, next, err := lexTag(src, i+2, "%}")
		if err == nil && len(toks) == 1 && toks[0].kind == tkName && toks[0].val == "endraw" {
			return next
		}
		i += 2
	}
	return -1
}

var jOps = []string{"//", "**", "==", "!=", "<=", ">=", "+", "-", "/", "*", "%", "~", "[", "]", "(", ")", "{", "}", "<", ">", "=", ".", ":", "|", ",", ";"}

// lexTag tokenizes from pos up to the closing delimiter (with its optional - or + whitespace
// control), returning the tokens and the offset after the delimiter.
func lexTag(src string, pos int, end string) ([]jTok, int, error) {
	var toks []jTok
	if pos < len(src) && (src[pos] == '-' || src[pos] == '+') {
		pos++
	}
	depth := 0 // brackets: "}}" inside a dict literal is two braces, not the end
	for pos < len(src) {
		c := src[pos]
		if c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v' {
			pos++
			continue
		}
		if depth == 0 {
			if strings.HasPrefix(src[pos:], end) {
				return toks, pos + len(end), nil
			}
			if (c == '-' || c == '+') && strings.HasPrefix(src[pos+1:], end) {
				return toks, pos + 1 + len(end), nil
			}
		}
		switch {
		case c == '\'' || c == '"':
			s, n, err := lexString(src, pos)
			if err != nil {
				return nil, 0, err
			}
			toks = append(toks, jTok{tkString, s})
			pos = n
		case c >= '0' && c <= '9':
			n := pos
			for n < len(src) && (isDigit(src[n]) || src[n] == '_' || src[n] == '.' && n+1 < len(src) && isDigit(src[n+1]) ||
				(src[n] == 'e' || src[n] == 'E') && n+1 < len(src) && (isDigit(src[n+1]) || src[n+1] == '-' || src[n+1] == '+') ||
				(src[n] == '-' || src[n] == '+') && (src[n-1] == 'e' || src[n-1] == 'E')) {
				n++
			}
			toks = append(toks, jTok{tkNumber, src[pos:n]})
			pos = n
		case c == '_' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= 0x80:
			n := pos
			for n < len(src) && (src[n] == '_' || isDigit(src[n]) || src[n] >= 'a' && src[n] <= 'z' || src[n] >= 'A' && src[n] <= 'Z' || src[n] >= 0x80) {
				n++
			}
			toks = append(toks, jTok{tkName, src[pos:n]})
			pos = n
		default:
			op := ""
			for _, o := range jOps {
				if strings.HasPrefix(src[pos:], o) {
					op = o
					break
				}
			}
			if op == "" {
				return nil, 0, fmt.Errorf("chat template: offset %d: unexpected character %q", pos, c)
			}
			switch op {
			case "(", "[", "{":
				depth++
			case ")", "]", "}":
				if depth > 0 {
					depth--
				}
			}
			toks = append(toks, jTok{tkOp, op})
			pos += len(op)
		}
	}
	return nil, 0, fmt.Errorf("chat template: unclosed tag (want %q)", end)
}

func isDigit(c byte) bool { return c >= '0' && c <= '9' }

// lexString reads a quoted string with Python escapes (only the value of plain keys matters here).
func lexString(src string, pos int) (string, int, error) {
	q := src[pos]
	var b strings.Builder
	for i := pos + 1; i < len(src); i++ {
		c := src[i]
		switch {
		case c == '\\' && i+1 < len(src):
			i++
			switch src[i] {
			case 'n':
				b.WriteByte('\n')
			case 't':
				b.WriteByte('\t')
			case 'r':
				b.WriteByte('\r')
			default:
				b.WriteByte('\\')
				b.WriteByte(src[i])
			}
		case c == q:
			return b.String(), i + 1, nil
		default:
			b.WriteByte(c)
		}
	}
	return "", 0, fmt.Errorf("chat template: offset %d: unclosed string", pos)
}

// jParser is a recursive-descent parser following jinja2's Parser for expressions.
type jParser struct {
	toks []jTok
	pos  int
}

func (p *jParser) cur() jTok {
	if p.pos < len(p.toks) {
		return p.toks[p.pos]
	}
	return jTok{kind: tkEnd}
}

func (p *jParser) peek(n int) jTok {
	if p.pos+n < len(p.toks) {
		return p.toks[p.pos+n]
	}
	return jTok{kind: tkEnd}
}

func (p *jParser) isOp(op string) bool   { t := p.cur(); return t.kind == tkOp && t.val == op }
func (p *jParser) isName(n string) bool  { t := p.cur(); return t.kind == tkName && t.val == n }
func (p *jParser) skipOp(op string) bool { ok := p.isOp(op); p.pos += b2i(ok); return ok }
func (p *jParser) skipName(n string) bool {
	ok := p.isName(n)
	p.pos += b2i(ok)
	return ok
}

func b2i(b bool) int {
	if b {
		return 1
	}
	return 0
}

func (p *jParser) expectOp(op string) error {
	if !p.skipOp(op) {
		return p.fail("want %q", op)
	}
	return nil
}

func (p *jParser) fail(format string, a ...any) error {
	t := p.cur()
	got := "end of tag"
	if t.kind != tkEnd {
		got = fmt.Sprintf("%q", t.val)
	}
	return fmt.Errorf("%s, got %s", fmt.Sprintf(format, a...), got)
}

func (p *jParser) statement(kw string) (any, error) {
	if kw == "for" {
		target, err := p.assignTarget(false, "in")
		if err != nil {
			return nil, err
		}
		if !p.skipName("in") {
			return nil, p.fail("want \"in\"")
		}
		iter, err := p.tuple(false, "recursive")
		if err != nil {
			return nil, err
		}
		return &jForStmt{target: target, iter: iter}, nil
	}
	target, err := p.assignTarget(true, "")
	if err != nil {
		return nil, err
	}
	if !p.skipOp("=") {
		return nil, nil // {% set x %}...{% endset %}: not an Assign
	}
	v, err := p.tuple(true, "")
	if err != nil {
		return nil, err
	}
	return &jSetStmt{target: target, value: v}, nil
}

// assignTarget returns the single name assigned, or "" for namespace and tuple targets.
func (p *jParser) assignTarget(namespace bool, endName string) (string, error) {
	if namespace && p.cur().kind == tkName && p.peek(1).kind == tkOp && p.peek(1).val == "." {
		p.pos += 2
		if p.cur().kind != tkName {
			return "", p.fail("want an attribute name")
		}
		p.pos++
		return "", nil
	}
	var names []string
	tuple := false
	for {
		if len(names) > 0 && !p.skipOp(",") {
			break
		}
		if p.cur().kind == tkEnd || p.isOp("=") || endName != "" && p.isName(endName) {
			break
		}
		if p.skipOp("(") {
			if _, err := p.assignTarget(false, ""); err != nil {
				return "", err
			}
			if err := p.expectOp(")"); err != nil {
				return "", err
			}
			names = append(names, "")
			tuple = true
			continue
		}
		if p.cur().kind != tkName {
			return "", p.fail("want a name")
		}
		names = append(names, p.cur().val)
		p.pos++
		if p.isOp(",") {
			tuple = true
		}
	}
	if len(names) == 0 {
		return "", p.fail("want an assignment target")
	}
	if tuple {
		return "", nil
	}
	return names[0], nil
}

func (p *jParser) tupleEnd(endName string) bool {
	t := p.cur()
	return t.kind == tkEnd || t.kind == tkOp && t.val == ")" || endName != "" && t.kind == tkName && t.val == endName
}

func (p *jParser) tuple(condexpr bool, endName string) (*jNode, error) {
	var args []*jNode
	isTuple := false
	for {
		if len(args) > 0 {
			if err := p.expectOp(","); err != nil {
				return nil, err
			}
		}
		if p.tupleEnd(endName) {
			break
		}
		n, err := p.expression(condexpr)
		if err != nil {
			return nil, err
		}
		args = append(args, n)
		if p.isOp(",") {
			isTuple = true
		} else {
			break
		}
	}
	if !isTuple && len(args) == 1 {
		return args[0], nil
	}
	if len(args) == 0 && !isTuple {
		return nil, p.fail("want an expression")
	}
	return jOtherNode, nil
}

func (p *jParser) expression(condexpr bool) (*jNode, error) {
	if !condexpr {
		return p.or()
	}
	n, err := p.or()
	if err != nil {
		return nil, err
	}
	for p.skipName("if") {
		if _, err := p.or(); err != nil {
			return nil, err
		}
		if p.skipName("else") {
			if _, err := p.expression(true); err != nil {
				return nil, err
			}
		}
		n = jOtherNode
	}
	return n, nil
}

func (p *jParser) binary(next func() (*jNode, error), match func() bool) (*jNode, error) {
	n, err := next()
	if err != nil {
		return nil, err
	}
	for match() {
		if _, err := next(); err != nil {
			return nil, err
		}
		n = jOtherNode
	}
	return n, nil
}

func (p *jParser) or() (*jNode, error) {
	return p.binary(p.and, func() bool { return p.skipName("or") })
}

func (p *jParser) and() (*jNode, error) {
	return p.binary(p.not, func() bool { return p.skipName("and") })
}

func (p *jParser) not() (*jNode, error) {
	if p.skipName("not") {
		if _, err := p.not(); err != nil {
			return nil, err
		}
		return jOtherNode, nil
	}
	return p.compare()
}

func (p *jParser) compare() (*jNode, error) {
	return p.binary(p.math1, func() bool {
		t := p.cur()
		switch {
		case t.kind == tkOp && (t.val == "==" || t.val == "!=" || t.val == "<" || t.val == ">" || t.val == "<=" || t.val == ">="):
			p.pos++
			return true
		case p.isName("in"):
			p.pos++
			return true
		case p.isName("not") && p.peek(1).kind == tkName && p.peek(1).val == "in":
			p.pos += 2
			return true
		}
		return false
	})
}

func (p *jParser) math1() (*jNode, error) {
	return p.binary(p.concat, func() bool { return p.skipOp("+") || p.skipOp("-") })
}

func (p *jParser) concat() (*jNode, error) {
	return p.binary(p.math2, func() bool { return p.skipOp("~") })
}

func (p *jParser) math2() (*jNode, error) {
	return p.binary(p.pow, func() bool { return p.skipOp("*") || p.skipOp("/") || p.skipOp("//") || p.skipOp("%") })
}

func (p *jParser) pow() (*jNode, error) {
	return p.binary(func() (*jNode, error) { return p.unary(true) }, func() bool { return p.skipOp("**") })
}

func (p *jParser) unary(withFilter bool) (*jNode, error) {
	var n *jNode
	var err error
	if p.skipOp("-") || p.skipOp("+") {
		if _, err = p.unary(false); err != nil {
			return nil, err
		}
		n = jOtherNode
	} else if n, err = p.primary(); err != nil {
		return nil, err
	}
	if n, err = p.postfix(n); err != nil {
		return nil, err
	}
	if withFilter {
		return p.filterExpr(n)
	}
	return n, nil
}

func (p *jParser) primary() (*jNode, error) {
	t := p.cur()
	switch t.kind {
	case tkName:
		p.pos++
		switch t.val {
		case "true", "false", "True", "False", "none", "None":
			return jOtherNode, nil
		}
		return &jNode{kind: jName, name: t.val}, nil
	case tkString:
		s := t.val
		p.pos++
		for p.cur().kind == tkString {
			s += p.cur().val
			p.pos++
		}
		return &jNode{kind: jConstStr, name: s}, nil
	case tkNumber:
		p.pos++
		return jOtherNode, nil
	case tkOp:
		switch t.val {
		case "(":
			p.pos++
			if p.skipOp(")") {
				return jOtherNode, nil
			}
			n, err := p.tuple(true, "")
			if err != nil {
				return nil, err
			}
			return n, p.expectOp(")")
		case "[":
			p.pos++
			return jOtherNode, p.items("]", false)
		case "{":
			p.pos++
			return jOtherNode, p.items("}", true)
		}
	}
	return nil, p.fail("want an expression")
}

// items parses list or dict literal items up to the closing bracket.
func (p *jParser) items(closer string, dict bool) error {
	for !p.isOp(closer) {
		if _, err := p.expression(true); err != nil {
			return err
		}
		if dict {
			if err := p.expectOp(":"); err != nil {
				return err
			}
			if _, err := p.expression(true); err != nil {
				return err
			}
		}
		if !p.skipOp(",") {
			break
		}
	}
	return p.expectOp(closer)
}

func (p *jParser) postfix(n *jNode) (*jNode, error) {
	for {
		switch {
		case p.isOp(".") || p.isOp("["):
			var err error
			if n, err = p.subscript(n); err != nil {
				return nil, err
			}
		case p.isOp("("):
			if err := p.call(); err != nil {
				return nil, err
			}
			n = jOtherNode
		default:
			return n, nil
		}
	}
}

func (p *jParser) filterExpr(n *jNode) (*jNode, error) {
	for {
		switch {
		case p.skipOp("|"):
			name, err := p.dottedName()
			if err != nil {
				return nil, err
			}
			if p.isOp("(") {
				if err := p.call(); err != nil {
					return nil, err
				}
			}
			n = &jNode{kind: jFilter, name: name, child: n}
		case p.skipName("is"):
			negated := p.skipName("not")
			name, err := p.dottedName()
			if err != nil {
				return nil, err
			}
			if p.isOp("(") {
				if err := p.call(); err != nil {
					return nil, err
				}
			} else if t := p.cur(); (t.kind == tkName || t.kind == tkString || t.kind == tkNumber || t.kind == tkOp && (t.val == "(" || t.val == "[" || t.val == "{")) &&
				!(t.kind == tkName && (t.val == "else" || t.val == "or" || t.val == "and")) {
				if t.kind == tkName && t.val == "is" {
					return nil, p.fail("test argument")
				}
				a, err := p.primary()
				if err != nil {
					return nil, err
				}
				if _, err := p.postfix(a); err != nil {
					return nil, err
				}
			}
			n = &jNode{kind: jTest, name: name, child: n}
			if negated {
				n = jOtherNode
			}
		case p.isOp("("):
			if err := p.call(); err != nil {
				return nil, err
			}
			n = jOtherNode
		default:
			return n, nil
		}
	}
}

func (p *jParser) dottedName() (string, error) {
	if p.cur().kind != tkName {
		return "", p.fail("want a name")
	}
	name := p.cur().val
	p.pos++
	for p.isOp(".") && p.peek(1).kind == tkName {
		name += "." + p.peek(1).val
		p.pos += 2
	}
	return name, nil
}

func (p *jParser) subscript(n *jNode) (*jNode, error) {
	if p.skipOp(".") {
		t := p.cur()
		switch t.kind {
		case tkName:
			p.pos++
			return &jNode{kind: jGetattr, name: t.val, child: n}, nil
		case tkNumber:
			p.pos++
			return &jNode{kind: jGetitem, child: n, arg: jOtherNode}, nil
		}
		return nil, p.fail("want an attribute")
	}
	p.pos++ // [
	var args []*jNode
	for !p.isOp("]") {
		if len(args) > 0 {
			if err := p.expectOp(","); err != nil {
				return nil, err
			}
		}
		a, err := p.subscribed()
		if err != nil {
			return nil, err
		}
		args = append(args, a)
	}
	p.pos++
	arg := jOtherNode
	if len(args) == 1 {
		arg = args[0]
	}
	return &jNode{kind: jGetitem, child: n, arg: arg}, nil
}

func (p *jParser) subscribed() (*jNode, error) {
	if !p.isOp(":") {
		n, err := p.expression(true)
		if err != nil {
			return nil, err
		}
		if !p.isOp(":") {
			return n, nil
		}
	}
	p.pos++ // first ':'
	if !p.isOp("]") && !p.isOp(",") && !p.isOp(":") {
		if _, err := p.expression(true); err != nil {
			return nil, err
		}
	}
	if p.skipOp(":") && !p.isOp("]") && !p.isOp(",") {
		if _, err := p.expression(true); err != nil {
			return nil, err
		}
	}
	return &jNode{kind: jSlice}, nil
}

func (p *jParser) call() error {
	p.pos++ // (
	for !p.isOp(")") {
		if p.cur().kind == tkEnd {
			return p.fail("want \")\"")
		}
		if !p.skipOp("**") {
			p.skipOp("*")
		}
		if p.cur().kind == tkName && p.peek(1).kind == tkOp && p.peek(1).val == "=" {
			p.pos += 2
		}
		if _, err := p.expression(true); err != nil {
			return err
		}
		if !p.skipOp(",") {
			break
		}
	}
	return p.expectOp(")")
}

// fixTrimAdjacency rewrites a template so that ardanlabs/jinja v1.12 trims whitespace as jinja2 does.
// That engine applies a tag's whitespace control (lstrip_blocks / trim_blocks defaults and the -
// flags) to the nearest text segment even when another tag sits in between, where jinja2 only ever
// touches the text directly next to the tag (so `{% for %}{{ m }}\n{% endfor %}` lost its newline).
// A trimming side with no adjacent text is a no-op in jinja2, so it is turned off here: a "-" flag
// is dropped and "+" (keep) is written instead of the implicit block default.
func fixTrimAdjacency(src string) (string, error) {
	type tag struct{ open, close int } // [open, close): the whole tag including delimiters
	var tags []tag
	for i := 0; i < len(src); {
		j := strings.IndexByte(src[i:], '{')
		if j < 0 || i+j+1 >= len(src) {
			break
		}
		i += j
		var end string
		switch src[i+1] {
		case '{':
			end = "}}"
		case '%':
			end = "%}"
		case '#':
			end = "#}"
		default:
			i++
			continue
		}
		var next int
		if end == "#}" {
			k := strings.Index(src[i+2:], "#}")
			if k < 0 {
				return "", fmt.Errorf("chat template: offset %d: unclosed comment", i)
			}
			next = i + 2 + k + 2
		} else {
			toks, n, err := lexTag(src, i+2, end)
			if err != nil {
				return "", err
			}
			next = n
			if end == "%}" && len(toks) == 1 && toks[0].kind == tkName && toks[0].val == "raw" {
				tags = append(tags, tag{i, next})
				k := findEndRaw(src, next)
				if k < 0 {
					return "", fmt.Errorf("chat template: offset %d: raw block without endraw", i)
				}
				// The raw body is text; its endraw tag ends at k.
				e := strings.LastIndex(src[:k], "{%")
				tags = append(tags, tag{e, k})
				i = k
				continue
			}
		}
		tags = append(tags, tag{i, next})
		i = next
	}
	var b strings.Builder
	prev := 0
	for n, t := range tags {
		b.WriteString(src[prev:t.open])
		leftText := t.open > 0 && (n == 0 || tags[n-1].close < t.open)
		rightText := t.close < len(src) && (n+1 == len(tags) || tags[n+1].open > t.close)
		block := src[t.open+1] != '{' // {% %} and {# #} carry the lstrip/trim_blocks defaults
		body := src[t.open+2 : t.close-2]
		b.WriteString(src[t.open : t.open+2])
		if len(body) > 0 && (body[0] == '-' || body[0] == '+') {
			if leftText || body[0] == '+' {
				b.WriteByte(body[0])
			} else if block {
				b.WriteByte('+')
			}
			body = body[1:]
		} else if !leftText && block {
			b.WriteByte('+')
		}
		flag := byte(0)
		if len(body) > 0 && (body[len(body)-1] == '-' || body[len(body)-1] == '+') {
			flag, body = body[len(body)-1], body[:len(body)-1]
		}
		b.WriteString(body)
		switch {
		case flag == '+' || flag == '-' && rightText:
			b.WriteByte(flag)
		case !rightText && block:
			b.WriteByte('+')
		}
		b.WriteString(src[t.close-2 : t.close])
		prev = t.close
	}
	b.WriteString(src[prev:])
	return b.String(), nil
}
