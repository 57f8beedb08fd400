package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/kvexact/kvexact/gateway/tokenize"
)

func init() {
	register("tokenize", "encode stdin with a tokenizer folder, or --check reference files",
		func(args []string) int { return runTokenize(args, os.Stdin, os.Stdout, os.Stderr) })
}

const tokenizeUsage = `usage:
  ctk tokenize --tokenizer DIR [--chat] [--no-special] < input
      Encode stdin (text, or with --chat an OpenAI chat request body) and print the ids as a JSON
      array. Text uses add_special_tokens=true unless --no-special; a chat request uses its own
      add_special_tokens field (default false), or false with --no-special.
  ctk tokenize --check FILE... [--tokenizers ROOT]...
      Replay reference files (schema of ../shared/tokenizer-ref/*.json) against the tokenizer folders
      ROOT/<model>/ (default roots: $KVEXACT_TOKENIZERS, ../shared/tokenizers, .cache/tokenizers).
      Prints one line per failing case, a line per skipped file (tokenizer folder missing), then
      "N passed, M failed". A folder whose files differ from the file's sha256 fails every case.
      Exit 0 when nothing failed, 1 on failures, 2 on bad arguments or an unreadable file.
`

// runTokenize parses arguments by hand so flags may come before or after the files.
func runTokenize(args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	var dir string
	var roots, files []string
	var chat, noSpecial, check bool
	usageErr := func(format string, a ...any) int {
		fmt.Fprintf(stderr, "ctk tokenize: "+format+"\n\n%s", append(a, tokenizeUsage)...)
		return 2
	}
	for i := 0; i < len(args); i++ {
		a := args[i]
		name, val, hasVal := strings.Cut(a, "=")
		value := func() (string, bool) {
			if hasVal {
				return val, true
			}
			if i+1 < len(args) {
				i++
				return args[i], true
			}
			return "", false
		}
		switch name {
		case "-h", "--help", "-help":
			fmt.Fprint(stdout, tokenizeUsage)
			return 0
		case "--tokenizer", "-tokenizer":
			v, ok := value()
			if !ok || v == "" {
				return usageErr("%s needs a folder", name)
			}
			dir = v
		case "--tokenizers", "-tokenizers":
			v, ok := value()
			if !ok || v == "" {
				return usageErr("%s needs a folder", name)
			}
			roots = append(roots, v)
		case "--chat", "-chat":
			chat = true
		case "--no-special", "-no-special":
			noSpecial = true
		case "--check", "-check":
			check = true
		default:
			if strings.HasPrefix(a, "-") && a != "-" {
				return usageErr("unknown flag %s", a)
			}
			files = append(files, a)
		}
	}
	if check {
		if dir != "" || chat || noSpecial {
			return usageErr("--check takes reference files and --tokenizers only")
		}
		if len(files) == 0 {
			return usageErr("--check needs at least one reference file")
		}
		if len(roots) == 0 {
			roots = tokenize.DefaultRoots()
		}
		return checkReferenceFiles(files, roots, stdout, stderr)
	}
	if len(files) > 0 || len(roots) > 0 {
		return usageErr("files and --tokenizers need --check")
	}
	if dir == "" {
		return usageErr("--tokenizer DIR is required")
	}
	tok, err := tokenize.Load(dir)
	if err != nil {
		fmt.Fprintf(stderr, "ctk tokenize: %v\n", err)
		return 2
	}
	input, err := io.ReadAll(stdin)
	if err != nil {
		fmt.Fprintf(stderr, "ctk tokenize: reading stdin: %v\n", err)
		return 2
	}
	var ids []uint32
	if chat {
		req, err := tokenize.ParseChatRequest(input)
		if err != nil {
			fmt.Fprintf(stderr, "ctk tokenize: %v\n", err)
			return 2
		}
		if noSpecial {
			req.AddSpecialTokens = false
		}
		if ids, _, err = tok.EncodeChat(req); err != nil {
			fmt.Fprintf(stderr, "ctk tokenize: %v\n", err)
			return 1
		}
	} else if ids, err = tok.Encode(string(input), !noSpecial); err != nil {
		fmt.Fprintf(stderr, "ctk tokenize: %v\n", err)
		return 1
	}
	if ids == nil {
		ids = []uint32{}
	}
	out, _ := json.Marshal(ids)
	fmt.Fprintf(stdout, "%s\n", out)
	return 0
}

func checkReferenceFiles(files, roots []string, stdout, stderr io.Writer) int {
	passed, failed := 0, 0
	for _, f := range files {
		res, err := tokenize.CheckReferenceFile(f, roots, tokenize.LoadForCheck)
		if err != nil {
			if errors.Is(err, tokenize.ErrRefFile) {
				fmt.Fprintf(stderr, "ctk tokenize: %v\n", err)
			} else {
				fmt.Fprintf(stderr, "ctk tokenize: %s: %v\n", f, err)
			}
			return 2
		}
		if res.Skipped != "" {
			fmt.Fprintf(stdout, "%s: skipped: %s\n", f, res.Skipped)
			continue
		}
		for _, line := range res.Failures {
			fmt.Fprintln(stdout, line)
		}
		passed += res.Passed
		failed += res.Failed
	}
	fmt.Fprintf(stdout, "%d passed, %d failed\n", passed, failed)
	if failed > 0 {
		return 1
	}
	return 0
}
