package security

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kvexact/kvexact/gateway/rules"
	"github.com/kvexact/kvexact/internal/openaisdk"
)

// A refused body gets its status even while the client is still sending it: the gateway answers
// and then closes lingering (reads and discards the rest, within server.lingerTimeout and
// lingerBytes), so the client's last writes are not answered with a reset that would discard
// the answer. Limit 1 MiB, body 1.1 MB; 20 tries per client.
const (
	oversizeLimit = 1 << 20
	oversizeBody  = 1_100_000
	tries         = 20
)

func oversizeGateway(t *testing.T) *gw {
	return start(t, func(c *rules.Config) { c.MaxBodyBytes = oversizeLimit })
}

type outcome struct {
	Status int    `json:"status"`
	Error  string `json:"error"`
	Body   string `json:"body"`
}

func want413(t *testing.T, client string, outs []outcome) {
	t.Helper()
	if len(outs) != tries {
		t.Fatalf("%s: %d outcomes, want %d", client, len(outs), tries)
	}
	bad := 0
	for i, o := range outs {
		if o.Status != http.StatusRequestEntityTooLarge {
			bad++
			t.Errorf("%s try %d: status %d %s", client, i, o.Status, o.Error)
		}
	}
	if bad > 0 {
		t.Fatalf("%s: %d of %d tries did not read the 413", client, bad, tries)
	}
}

// Raw sockets: every refusal of a body the client is still sending — too large by its
// Content-Length (413 at once), too large as it streams (chunked, 413 at the limit), the wrong
// media type (415 before any byte is read) — is read by a client that sends the whole body first
// and only then reads, as most HTTP/1.1 clients do, while the upload lasts past net/http's own
// 500 ms wait before it closes with the body unread.
func TestRefusedUploadReadsItsStatus(t *testing.T) {
	g := oversizeGateway(t)
	body := completionBody(`,"pad":"` + strings.Repeat("x", oversizeBody) + `"`)
	chunked := func(b string) string {
		var sb strings.Builder
		for len(b) > 0 {
			n := min(len(b), 32<<10)
			fmt.Fprintf(&sb, "%x\r\n%s\r\n", n, b[:n])
			b = b[n:]
		}
		return sb.String() + "0\r\n\r\n"
	}
	for _, tc := range []struct{ name, head, body, want string }{
		{"content-length over the limit", fmt.Sprintf("POST /v1/completions HTTP/1.1\r\nHost: gw\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n", len(body)), body, "413"},
		{"chunked past the limit", "POST /v1/completions HTTP/1.1\r\nHost: gw\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n", chunked(body), "413"},
		{"wrong media type", fmt.Sprintf("POST /v1/completions HTTP/1.1\r\nHost: gw\r\nContent-Type: text/plain\r\nContent-Length: %d\r\n\r\n", len(body)), body, "415"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for i := range 2 {
				c := dial(t, g.client, 20*time.Second)
				_, werr := io.WriteString(c, tc.head)
				// Still uploading well past the refusal: 16 pieces 40 ms apart.
				piece := (len(tc.body) + 15) / 16
				for b := tc.body; werr == nil && len(b) > 0; b = b[min(piece, len(b)):] {
					_, werr = io.WriteString(c, b[:min(piece, len(b))])
					time.Sleep(40 * time.Millisecond)
				}
				got, rerr := io.ReadAll(c)
				c.Close()
				// A reset mid-upload fails the client's write: most clients (urllib, http.client)
				// then raise "connection reset" and never read the answer.
				if werr != nil || status(string(got)) != tc.want {
					t.Fatalf("try %d: write %v, read %v, status %q, want %s", i, werr, rerr, status(string(got)), tc.want)
				}
			}
		})
	}
}

// A client sending its body slower than server.bodyTimeout reads the 408 though it keeps sending.
func TestSlowUploadReadsItsTimeout(t *testing.T) {
	g := start(t, func(c *rules.Config) { c.Server.BodyTimeout = rules.Duration(300 * time.Millisecond) })
	c := dial(t, g.client, 20*time.Second)
	if _, err := io.WriteString(c, "POST /v1/completions HTTP/1.1\r\nHost: gw\r\nContent-Type: application/json\r\nContent-Length: 100000\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
	var werr error
	for range 10 { // 1 KiB every 100 ms: still sending well after the deadline
		if _, werr = c.Write(bytes.Repeat([]byte("x"), 1024)); werr != nil {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	got, err := io.ReadAll(c)
	if werr != nil || status(string(got)) != "408" {
		t.Fatalf("write %v, read %v, status %q, want 408:\n%s", werr, err, status(string(got)), got)
	}
}

func TestOversizeGoClient(t *testing.T) {
	g := oversizeGateway(t)
	body := completionBody(`,"pad":"` + strings.Repeat("x", oversizeBody) + `"`)
	var outs []outcome
	for range tries {
		resp, err := http.Post("http://"+g.client+"/v1/completions", "application/json", strings.NewReader(body))
		if err != nil {
			outs = append(outs, outcome{Error: err.Error()})
			continue
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		outs = append(outs, outcome{Status: resp.StatusCode})
	}
	want413(t, "Go net/http", outs)
}

func runScript(t *testing.T, cmd *exec.Cmd) []outcome {
	t.Helper()
	out, err := cmd.Output()
	if err != nil {
		var stderr []byte
		if ee, ok := err.(*exec.ExitError); ok {
			stderr = ee.Stderr
		}
		t.Fatalf("%s: %v\n%s\n%s", cmd.Path, err, out, stderr)
	}
	var outs []outcome
	if err := json.Unmarshal(out, &outs); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	return outs
}

func TestOversizePythonURLLib(t *testing.T) {
	py, err := exec.LookPath("python3")
	if err != nil {
		t.Skip("python3 not found: apt-get install python3 (.ci/run has it)")
	}
	g := oversizeGateway(t)
	outs := runScript(t, exec.Command(py, "testdata/oversize.py", "http://"+g.client, model, fmt.Sprint(oversizeBody), fmt.Sprint(tries), "urllib"))
	want413(t, "Python urllib", outs)
}

func TestOversizeOpenAIPythonSDK(t *testing.T) {
	py := openaisdk.Python(t)
	g := oversizeGateway(t)
	outs := runScript(t, exec.Command(py, "testdata/oversize.py", "http://"+g.client, model, fmt.Sprint(oversizeBody), fmt.Sprint(tries), "sdk"))
	want413(t, "OpenAI Python SDK", outs)
}

func TestOversizeOpenAINodeSDK(t *testing.T) {
	dir := openaisdk.Node(t)
	g := oversizeGateway(t)
	script, _ := filepath.Abs("testdata/oversize.js")
	cmd := exec.Command("node", script, "http://"+g.client, model, fmt.Sprint(oversizeBody), fmt.Sprint(tries))
	cmd.Env = append(os.Environ(), "NODE_PATH="+filepath.Join(dir, "node_modules"))
	want413(t, "OpenAI Node SDK", runScript(t, cmd))
}
