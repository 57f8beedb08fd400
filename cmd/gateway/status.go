package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"strings"
	"time"

	"github.com/kvexact/kvexact/gateway"
)

// runStatus is `gateway status`: the running gateway's /admin/status, read live with the admin
// token, printed per rule and endpoint (gateway.WriteStatusText).
func runStatus(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("gateway status", flag.ContinueOnError)
	fs.SetOutput(stderr)
	admin := fs.String("admin", "http://127.0.0.1:9090", "base URL of the gateway's admin listener")
	tokenFile := fs.String("token-file", "", "file holding the admin bearer token (default: $KVEXACT_ADMIN_TOKEN)")
	rule := fs.String("rule", "", "print this rule only (default: every rule)")
	raw := fs.Bool("json", false, "print /admin/status as read instead")
	timeout := fs.Duration("timeout", 10*time.Second, "how long the request may take")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	token := os.Getenv("KVEXACT_ADMIN_TOKEN")
	if *tokenFile != "" {
		b, err := os.ReadFile(*tokenFile)
		if err != nil {
			fmt.Fprintf(stderr, "gateway status: --token-file: %v\n", err)
			return 2
		}
		token = strings.TrimSpace(string(b))
	}
	if token == "" {
		fmt.Fprintln(stderr, "gateway status: no admin token: give --token-file or set KVEXACT_ADMIN_TOKEN")
		return 2
	}
	req, err := http.NewRequest(http.MethodGet, strings.TrimSuffix(*admin, "/")+"/admin/status", nil)
	if err != nil {
		fmt.Fprintf(stderr, "gateway status: --admin: %v\n", err)
		return 2
	}
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := (&http.Client{Timeout: *timeout}).Do(req)
	if err != nil {
		fmt.Fprintf(stderr, "gateway status: %v\n", err)
		return 1
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 64<<20))
	if err != nil {
		fmt.Fprintf(stderr, "gateway status: reading %s: %v\n", req.URL, err)
		return 1
	}
	if resp.StatusCode != http.StatusOK {
		fmt.Fprintf(stderr, "gateway status: %s answered %s: %s\n", req.URL, resp.Status, strings.TrimSpace(string(body)))
		return 1
	}
	if *raw {
		stdout.Write(body)
		return 0
	}
	var st gateway.Status
	if err := json.Unmarshal(body, &st); err != nil {
		fmt.Fprintf(stderr, "gateway status: %s: %v\n", req.URL, err)
		return 1
	}
	if !gateway.WriteStatusText(stdout, st, *rule) {
		if *rule != "" {
			fmt.Fprintf(stderr, "gateway status: no rule %q\n", *rule)
		} else {
			fmt.Fprintln(stderr, "gateway status: the gateway runs no rule")
		}
		return 1
	}
	return 0
}
