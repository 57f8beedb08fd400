package main

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"

	"github.com/kvexact/kvexact/contracts"
)

func TestContractsListsEveryPin(t *testing.T) {
	var out, errb bytes.Buffer
	if code := listContracts(nil, &out, &errb); code != 0 {
		t.Fatalf("exit %d: %s", code, errb.String())
	}
	lines := strings.Split(strings.TrimRight(out.String(), "\n"), "\n")
	if len(lines) != len(contracts.All())+1 {
		t.Fatalf("%d lines for %d contracts:\n%s", len(lines), len(contracts.All()), out.String())
	}
	for _, want := range []string{
		"vllm-v0.30", "v0.30.0 – v0.30.x", "unknown (unverified)", "vllm/v0.28.0",
		`unset = "vllm-none-hash" for sha256, sha256_cbor, random for the others`,
		"vllm-kv-map-v2", "752a3a504485", "unset = random roots", "sglang/v0.5.18",
	} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("listing lacks %q:\n%s", want, out.String())
		}
	}
}

func TestContractsJSON(t *testing.T) {
	var out, errb bytes.Buffer
	if code := listContracts([]string{"--json"}, &out, &errb); code != 0 {
		t.Fatalf("exit %d: %s", code, errb.String())
	}
	var rows []contractRow
	if err := json.Unmarshal(out.Bytes(), &rows); err != nil {
		t.Fatal(err)
	}
	byID := map[string]contractRow{}
	for _, r := range rows {
		byID[r.ID] = r
	}
	if r := byID["vllm-kv-map-v2"]; r.Commit != "752a3a504485790a2e8491cacbb35c137339ad34" || !r.CommitVerified || r.Pin != "v0.25.1" {
		t.Errorf("vllm-kv-map-v2 row: %+v", r)
	}
	if r := byID["llamacpp-nokv-v1"]; r.SeedRule != "no seed" {
		t.Errorf("llamacpp row: %+v", r)
	}
	if code := listContracts([]string{"--yaml"}, &out, &errb); code != 2 {
		t.Errorf("unknown flag: exit %d", code)
	}
}
