package main

import (
	"bytes"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

// indexServer serves the package index's JSON API on 127.0.0.1: releases per package, each release
// a list of files with their yanked flag.
func indexServer(t *testing.T, pkgs map[string]map[string][]bool) *httptest.Server {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		name := strings.TrimSuffix(strings.TrimPrefix(r.URL.Path, "/pypi/"), "/json")
		rels, ok := pkgs[name]
		if !ok {
			http.NotFound(w, r)
			return
		}
		doc := map[string]map[string][]map[string]bool{"releases": {}}
		for v, files := range rels {
			for _, y := range files {
				doc["releases"][v] = append(doc["releases"][v], map[string]bool{"yanked": y})
			}
			if len(files) == 0 {
				doc["releases"][v] = []map[string]bool{}
			}
		}
		_ = json.NewEncoder(w).Encode(doc)
	}))
	t.Cleanup(srv.Close)
	return srv
}

func TestCheckIndexNewerAndYanked(t *testing.T) {
	srv := indexServer(t, map[string]map[string][]bool{
		"vllm": {"0.32.0": {false}, "0.33.0": {false, false}, "0.33.1": {true, true}, "0.34.0rc1": {false},
			"0.34.0": {false, true}, "0.2.1": {true}, "not-a-version": {false}},
		"sglang": {"0.5.23": {false}, "0.5.22": {false}},
	})
	var out, errb bytes.Buffer
	code := listContracts([]string{"--check-index", "--index", srv.URL + "/pypi", "--json"}, &out, &errb)
	if code != 1 {
		t.Fatalf("exit %d (want 1: newer releases), stderr %s, stdout %s", code, errb.String(), out.String())
	}
	var rows []indexRow
	if err := json.Unmarshal(out.Bytes(), &rows); err != nil {
		t.Fatal(err)
	}
	by := map[string]indexRow{}
	for _, r := range rows {
		by[r.Family] = r
	}
	v := by["vllm"]
	// 0.34.0 has one live file, so it is not yanked; 0.33.1 has none; the pre-release sorts first.
	if v.Package != "vllm" || v.NewestPin != "v0.33.0" || strings.Join(v.Newer, ",") != "0.34.0rc1,0.34.0" || strings.Join(v.Yanked, ",") != "0.2.1,0.33.1" {
		t.Errorf("vllm row %+v", v)
	}
	if s := by["sglang"]; len(s.Newer) != 0 || s.Package != "sglang" || s.NewestPin != "v0.5.23" {
		t.Errorf("sglang row %+v", s)
	}
	if tr := by["trtllm"]; tr.Unpinned == "" || tr.Package != "" {
		t.Errorf("trtllm row %+v: a family without a package artifact is reported, not asked", tr)
	}
}

func TestCheckIndexNothingNewer(t *testing.T) {
	srv := indexServer(t, map[string]map[string][]bool{
		"vllm":   {"0.33.0": {false}},
		"sglang": {"0.5.23": {false}},
	})
	var out, errb bytes.Buffer
	if code := listContracts([]string{"--check-index", "--index", srv.URL + "/pypi"}, &out, &errb); code != 0 {
		t.Fatalf("exit %d, stderr %s", code, errb.String())
	}
	if !strings.Contains(out.String(), "vllm      vllm     v0.33.0     none") || strings.Contains(out.String(), "to pin a release") {
		t.Errorf("table:\n%s", out.String())
	}
}

func TestCheckIndexErrors(t *testing.T) {
	srv := indexServer(t, map[string]map[string][]bool{"sglang": {"0.5.23": {false}}})
	var out, errb bytes.Buffer
	if code := listContracts([]string{"--check-index", "--index", srv.URL + "/pypi"}, &out, &errb); code != 3 || !strings.Contains(errb.String(), "/pypi/vllm/json: HTTP 404") {
		t.Errorf("missing package: exit %d, stderr %q", code, errb.String())
	}
	bad := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { _, _ = w.Write([]byte(`{"info": {}}`)) }))
	defer bad.Close()
	errb.Reset()
	if code := listContracts([]string{"--check-index", "--index", bad.URL}, &out, &errb); code != 3 || !strings.Contains(errb.String(), "no releases field") {
		t.Errorf("not the JSON API: exit %d, stderr %q", code, errb.String())
	}
	errb.Reset()
	if code := listContracts([]string{"--check-index", "--index"}, &out, &errb); code != 2 || !strings.Contains(errb.String(), "--index needs") {
		t.Errorf("--index without URL: exit %d, stderr %q", code, errb.String())
	}
}
