package tokenize

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
)

// Reference checking: a reference file (schema of ../shared/tokenizer-ref/<model>.json, see
// reference/tokenization.md §5) names a model, the sha256 of its tokenizer files, text cases (ids for
// one add_special_tokens value) and chat cases (request body in; rendering and ids out, or an
// error). CheckReferenceFile replays every case through this package.
//
// Policy: a tokenizer folder that is missing is a skip (its cases are not counted); a folder whose
// files differ from the header's sha256 fails every case of the file (one line says why), because a
// wrong tokenizer must never pass.

// RefTokenizer is what the checker needs from a loaded tokenizer.
type RefTokenizer interface {
	Encode(text string, addSpecialTokens bool) ([]uint32, error)
	Config() *Config
}

// RefLoader loads the tokenizer in a folder.
type RefLoader func(dir string) (RefTokenizer, error)

// RefResult is the outcome of one reference file.
type RefResult struct {
	File     string
	Model    string
	Dir      string // tokenizer folder used; "" when skipped
	Passed   int
	Failed   int
	Failures []string // one line per failing case (or one line for a whole-file failure)
	Skipped  string   // reason, when the tokenizer folder is missing
}

type refFile struct {
	Model string `json:"model"`
	Files map[string]struct {
		Bytes  int64  `json:"bytes"`
		SHA256 string `json:"sha256"`
	} `json:"files"`
	Cases     []refTextCase `json:"cases"`
	ChatCases []refChatCase `json:"chat_cases"`
}

type refTextCase struct {
	ID               string   `json:"id"`
	Text             *string  `json:"text"`
	AddSpecialTokens *bool    `json:"add_special_tokens"`
	IDs              []uint32 `json:"ids"`
}

type refChatCase struct {
	ID          string   `json:"id"`
	RequestJSON *string  `json:"request_json"`
	Rendered    *string  `json:"rendered"`
	IDs         []uint32 `json:"ids"`
	Error       *string  `json:"error"`
}

// ErrRefFile marks an unreadable or malformed reference file.
var ErrRefFile = errors.New("bad reference file")

func readRefFile(path string) (*refFile, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrRefFile, err)
	}
	var rf refFile
	if err := json.Unmarshal(data, &rf); err != nil {
		return nil, fmt.Errorf("%w: %s: %v", ErrRefFile, path, err)
	}
	if rf.Model == "" || strings.ContainsAny(rf.Model, `/\`) || rf.Model == "." || rf.Model == ".." {
		return nil, fmt.Errorf("%w: %s: $.model: want a folder name, got %q", ErrRefFile, path, rf.Model)
	}
	for _, name := range []string{"tokenizer.json", "tokenizer_config.json"} {
		f, ok := rf.Files[name]
		if !ok || len(f.SHA256) != 64 {
			return nil, fmt.Errorf("%w: %s: $.files[%q].sha256: missing or not 64 hex digits", ErrRefFile, path, name)
		}
	}
	for i, c := range rf.Cases {
		if c.ID == "" || c.Text == nil || c.AddSpecialTokens == nil || c.IDs == nil {
			return nil, fmt.Errorf("%w: %s: $.cases[%d]: needs id, text, add_special_tokens and ids", ErrRefFile, path, i)
		}
	}
	for i, c := range rf.ChatCases {
		if c.ID == "" || c.RequestJSON == nil {
			return nil, fmt.Errorf("%w: %s: $.chat_cases[%d]: needs id and request_json", ErrRefFile, path, i)
		}
		if c.Error == nil && (c.Rendered == nil || c.IDs == nil) {
			return nil, fmt.Errorf("%w: %s: $.chat_cases[%d] (%s): needs rendered and ids, or error", ErrRefFile, path, i, c.ID)
		}
	}
	return &rf, nil
}

// CheckReferenceFile replays one reference file. roots are searched in order for <root>/<model>/.
// The error is non-nil only for an unreadable or malformed file.
func CheckReferenceFile(path string, roots []string, load RefLoader) (*RefResult, error) {
	rf, err := readRefFile(path)
	if err != nil {
		return nil, err
	}
	res := &RefResult{File: path, Model: rf.Model}
	total := len(rf.Cases) + len(rf.ChatCases)
	for _, r := range roots {
		d := filepath.Join(r, rf.Model)
		if _, err := os.Stat(filepath.Join(d, "tokenizer.json")); err == nil {
			res.Dir = d
			break
		}
	}
	if res.Dir == "" {
		res.Skipped = fmt.Sprintf("no tokenizer folder %q under %s", rf.Model, strings.Join(roots, ", "))
		return res, nil
	}
	failAll := func(format string, a ...any) (*RefResult, error) {
		res.Failed = total
		res.Failures = append(res.Failures, fmt.Sprintf("%s: all %d cases fail: %s", path, total, fmt.Sprintf(format, a...)))
		return res, nil
	}
	for _, name := range []string{"tokenizer.json", "tokenizer_config.json"} {
		got, err := fileSHA256(filepath.Join(res.Dir, name))
		if err != nil {
			return failAll("%v", err)
		}
		if want := strings.ToLower(rf.Files[name].SHA256); got != want {
			return failAll("%s has sha256 %s, the reference was made with %s", filepath.Join(res.Dir, name), got, want)
		}
	}
	tok, err := load(res.Dir)
	if err != nil {
		return failAll("loading %s: %v", res.Dir, err)
	}
	fail := func(id, format string, a ...any) {
		res.Failed++
		res.Failures = append(res.Failures, fmt.Sprintf("%s: %s: %s", path, id, fmt.Sprintf(format, a...)))
	}
	for _, c := range rf.Cases {
		id := fmt.Sprintf("%s [add_special_tokens=%t]", c.ID, *c.AddSpecialTokens)
		got, err := tok.Encode(*c.Text, *c.AddSpecialTokens)
		if err != nil {
			fail(id, "encode: %v", err)
			continue
		}
		if d := diffIDs(c.IDs, got); d != "" {
			fail(id, "%s", d)
			continue
		}
		res.Passed++
	}
	if len(rf.ChatCases) == 0 {
		return res, nil
	}
	ct, ctErr := ChatTemplateFor(tok.Config())
	for _, c := range rf.ChatCases {
		if ctErr != nil {
			fail(c.ID, "chat template: %v", ctErr)
			continue
		}
		if d := checkChatCase(ct, tok, c); d != "" {
			fail(c.ID, "%s", d)
			continue
		}
		res.Passed++
	}
	return res, nil
}

func checkChatCase(ct *ChatTemplate, tok RefTokenizer, c refChatCase) string {
	req, err := ParseChatRequest([]byte(*c.RequestJSON))
	if err != nil {
		return fmt.Sprintf("request_json: %v", err)
	}
	rendered, err := ct.Render(req)
	if c.Error != nil {
		if err == nil {
			return fmt.Sprintf("expected error %q, rendering succeeded", *c.Error)
		}
		want := *c.Error
		if i := strings.Index(want, ": "); i >= 0 {
			want = want[i+2:]
		}
		if !errors.Is(err, ErrTemplate) || !strings.Contains(err.Error(), want) {
			return fmt.Sprintf("expected error %q, got %v", *c.Error, err)
		}
		return ""
	}
	if err != nil {
		return fmt.Sprintf("render: %v", err)
	}
	if rendered != *c.Rendered {
		return "rendered text " + diffText(*c.Rendered, rendered)
	}
	ids, err := tok.Encode(rendered, req.AddSpecialTokens)
	if err != nil {
		return fmt.Sprintf("encode: %v", err)
	}
	return diffIDs(c.IDs, ids)
}

func fileSHA256(path string) (string, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return "", err
	}
	sum := sha256.Sum256(data)
	return hex.EncodeToString(sum[:]), nil
}

// diffIDs describes the first difference between two id sequences, or returns "".
func diffIDs(want, got []uint32) string {
	n := min(len(want), len(got))
	for i := 0; i < n; i++ {
		if want[i] != got[i] {
			return fmt.Sprintf("ids differ at index %d: expected %d, got %d (lengths %d vs %d)", i, want[i], got[i], len(want), len(got))
		}
	}
	if len(want) != len(got) {
		if len(want) > n {
			return fmt.Sprintf("ids differ at index %d: expected %d, got end of ids (lengths %d vs %d)", n, want[n], len(want), len(got))
		}
		return fmt.Sprintf("ids differ at index %d: expected end of ids, got %d (lengths %d vs %d)", n, got[n], len(want), len(got))
	}
	return ""
}

// diffText describes the first differing byte of two strings with a little context.
func diffText(want, got string) string {
	i := 0
	for i < len(want) && i < len(got) && want[i] == got[i] {
		i++
	}
	clip := func(s string) string {
		if len(s) > 40 {
			s = s[:40]
		}
		return fmt.Sprintf("%q", s)
	}
	return fmt.Sprintf("differs at byte %d: expected %s, got %s (lengths %d vs %d)", i, clip(want[i:]), clip(got[i:]), len(want), len(got))
}
