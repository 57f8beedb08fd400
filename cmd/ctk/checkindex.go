package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"sort"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/kvexact/kvexact/contracts"
)

// DefaultPackageIndex is the Python package index's JSON API (GET {index}/{package}/json).
const DefaultPackageIndex = "https://pypi.org/pypi"

// Limits of one index answer: a package's JSON lists every release and file, a few MB for vLLM.
const (
	indexTimeout  = 30 * time.Second
	indexMaxBytes = 64 << 20
)

// indexRow is one family's answer: the releases the index serves beyond the newest pin, and the
// yanked releases (any version).
type indexRow struct {
	Family    string   `json:"family"`
	Package   string   `json:"package"`
	NewestPin string   `json:"newestPin"`
	Newer     []string `json:"newer"`
	Yanked    []string `json:"yanked"`
	// Unpinned is set when no contract of the family records a package artifact.
	Unpinned string `json:"unpinned,omitempty"`
}

// packageOf is the index's name of an artifact: a wheel's distribution name ("vllm" of
// "vllm-0.33.0-cp38-abi3-….whl", "sglang" of "sglang-0.5.23-….whl").
func packageOf(file string) string {
	name, _, _ := strings.Cut(file, "-")
	return strings.ReplaceAll(name, "_", "-")
}

// checkIndex asks the package index, per family whose contracts pin a package artifact, which
// releases are newer than the family's newest pin and which are yanked. Exit 0: nothing newer;
// 1: newer releases to pin; 3: the index could not be read (the message names the URL).
func checkIndex(index string, asJSON bool, stdout, stderr io.Writer) int {
	newest := map[string]*contracts.Contract{}
	var families []string
	for _, c := range contracts.All() {
		n, seen := newest[c.Family]
		if !seen {
			families = append(families, c.Family)
		}
		if !seen || mustVersion(c.Pin.Release).Compare(mustVersion(n.Pin.Release)) > 0 {
			newest[c.Family] = c
		}
	}
	client := &http.Client{Timeout: indexTimeout}
	var rows []indexRow
	anyNewer := false
	for _, fam := range families {
		n := newest[fam]
		row := indexRow{Family: fam, NewestPin: n.Pin.Release, Newer: []string{}, Yanked: []string{}}
		if n.Pin.Artifact == nil {
			row.Unpinned = "the newest contract (" + n.ID + ") records no package artifact (pin.artifact)"
			rows = append(rows, row)
			continue
		}
		row.Package = packageOf(n.Pin.Artifact.File)
		rels, err := indexReleases(client, index, row.Package)
		if err != nil {
			fmt.Fprintf(stderr, "ctk contracts --check-index: %v\n", err)
			return 3
		}
		pin := mustVersion(n.Pin.Release)
		var newer []contracts.Version
		for _, r := range rels {
			v, err := contracts.ParseVersion(r.version)
			if err != nil {
				continue // not an engine release number (the index keeps odd historic ones)
			}
			if r.yanked {
				row.Yanked = append(row.Yanked, r.version)
			}
			if v.Compare(pin) > 0 && !r.yanked {
				newer = append(newer, v)
				row.Newer = append(row.Newer, r.version)
			}
		}
		sort.Slice(row.Newer, func(i, j int) bool {
			return mustVersion(row.Newer[i]).Compare(mustVersion(row.Newer[j])) < 0
		})
		sort.Slice(row.Yanked, func(i, j int) bool {
			return mustVersion(row.Yanked[i]).Compare(mustVersion(row.Yanked[j])) < 0
		})
		anyNewer = anyNewer || len(newer) > 0
		rows = append(rows, row)
	}
	if asJSON {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		if err := enc.Encode(rows); err != nil {
			fmt.Fprintf(stderr, "ctk contracts --check-index: %v\n", err)
			return 3
		}
	} else {
		tw := tabwriter.NewWriter(stdout, 0, 0, 2, ' ', 0)
		fmt.Fprintln(tw, "FAMILY\tPACKAGE\tNEWEST PIN\tNEWER ON THE INDEX\tYANKED")
		for _, r := range rows {
			if r.Unpinned != "" {
				fmt.Fprintf(tw, "%s\t-\t%s\t(not checked: %s)\t-\n", r.Family, r.NewestPin, r.Unpinned)
				continue
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", r.Family, r.Package, r.NewestPin, listOrNone(r.Newer), listOrNone(r.Yanked))
		}
		if err := tw.Flush(); err != nil {
			fmt.Fprintf(stderr, "ctk contracts --check-index: %v\n", err)
			return 3
		}
		if anyNewer {
			fmt.Fprintln(stdout, "to pin a release: docs/vectors.md, \"Pinning a release\" (make vectors, a contract, the differential)")
		}
	}
	if anyNewer {
		return 1
	}
	return 0
}

func listOrNone(s []string) string {
	if len(s) == 0 {
		return "none"
	}
	return strings.Join(s, ", ")
}

func mustVersion(s string) contracts.Version {
	v, err := contracts.ParseVersion(s)
	if err != nil {
		panic(err) // pins parse (contracts validate them); index versions are parsed before use
	}
	return v
}

type indexRelease struct {
	version string
	yanked  bool // every file of the release is yanked
}

// indexReleases reads GET {index}/{package}/json: {"releases": {"0.33.0": [{"yanked": false, …}], …}}.
func indexReleases(client *http.Client, index, pkg string) ([]indexRelease, error) {
	u := strings.TrimRight(index, "/") + "/" + url.PathEscape(pkg) + "/json"
	ctx, cancel := context.WithTimeout(context.Background(), indexTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", u, err)
	}
	req.Header.Set("Accept", "application/json")
	resp, err := client.Do(req)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", u, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("%s: HTTP %d", u, resp.StatusCode)
	}
	body, err := io.ReadAll(io.LimitReader(resp.Body, indexMaxBytes+1))
	if err != nil {
		return nil, fmt.Errorf("%s: %w", u, err)
	}
	if len(body) > indexMaxBytes {
		return nil, fmt.Errorf("%s: answer larger than %d bytes", u, indexMaxBytes)
	}
	var doc struct {
		Releases map[string][]struct {
			Yanked bool `json:"yanked"`
		} `json:"releases"`
	}
	if err := json.Unmarshal(body, &doc); err != nil {
		return nil, fmt.Errorf("%s: not the index's JSON API: %w", u, err)
	}
	if doc.Releases == nil {
		return nil, errors.New(u + ": no releases field (not the index's JSON API)")
	}
	var out []indexRelease
	for v, files := range doc.Releases {
		yanked := len(files) > 0
		for _, f := range files {
			yanked = yanked && f.Yanked
		}
		out = append(out, indexRelease{version: v, yanked: yanked})
	}
	return out, nil
}
