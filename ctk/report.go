package ctk

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"github.com/onsi/ginkgo/v2/reporters"
	"github.com/onsi/ginkgo/v2/types"
)

// Output file names in the --out folder.
const (
	CertificateFile = "certificate.json"
	ReportFile      = "report.txt"
	JUnitFile       = "junit.xml"
	JSONFile        = "report.json"
)

// WriteText writes the human report: one line per spec — state, endpoint, requirement, and for a
// failure the leg that differs, what was seen and the fix — then one verdict line per endpoint.
func (r *Result) WriteText(w io.Writer) error {
	var b strings.Builder
	fmt.Fprintf(&b, "# ctk certify %s — %d endpoint(s), %d spec(s)\n", r.Finished.UTC().Format("2006-01-02T15:04:05Z"), len(r.Endpoints), len(r.Specs))
	for _, s := range r.Specs {
		line := fmt.Sprintf("%s %s | %s: %s", s.State, s.Endpoint, s.Group, s.Text)
		switch s.State {
		case Fail:
			line += fmt.Sprintf(" | leg: %s | %s", s.Leg, oneLine(s.Message))
			if s.Hint != "" {
				line += " | fix: " + oneLine(s.Hint)
			}
		default:
			if s.Message != "" {
				line += " | " + oneLine(s.Message)
			}
		}
		b.WriteString(line + "\n")
	}
	for _, e := range r.Endpoints {
		cov := make([]string, len(e.Certified))
		for i, c := range e.Certified {
			cov[i] = string(c)
		}
		verdict := "CERTIFIED"
		switch {
		case !e.OK:
			verdict = "NOT CERTIFIED"
		case len(e.FailedLegs) > 0 && e.Reason != "":
			verdict = "CERTIFIED WITH FAILING LEGS"
		}
		line := fmt.Sprintf("# %s %s (%s %s, contract %s, requires %s): proven [%s]", verdict, e.Name, e.Family, e.Release, e.Contract, e.Require, strings.Join(cov, ", "))
		if e.Binding != "" {
			line += ", KV-exact binding " + e.Binding
		}
		if e.Reason != "" {
			line += " — " + e.Reason
		}
		b.WriteString(line + "\n")
	}
	for _, c := range r.Certificates {
		fmt.Fprintf(&b, "# certificate %s %s profile %s, expires %s\n", c.Profile.Family, c.Profile.Contract, c.ProfileDigest, c.ExpiresAt.Format("2006-01-02T15:04:05Z"))
	}
	fmt.Fprintf(&b, "# exit %d\n", r.ExitCode)
	_, err := io.WriteString(w, b.String())
	return err
}

func oneLine(s string) string { return strings.Join(strings.Fields(s), " ") }

// GinkgoReport is the run as a ginkgo suite report (one It per spec, containers endpoint and
// group), so CI tooling reads it like any conformance suite's.
func (r *Result) GinkgoReport() types.Report {
	rep := types.Report{SuitePath: "ctk", SuiteDescription: "kvexact pool certification", SuiteSucceeded: r.ExitCode == 0,
		StartTime: r.Started, EndTime: r.Finished, RunTime: r.Finished.Sub(r.Started),
		PreRunStats: types.PreRunStats{TotalSpecs: len(r.Specs), SpecsThatWillRun: len(r.Specs)}}
	for _, s := range r.Specs {
		sr := types.SpecReport{ContainerHierarchyTexts: []string{s.Endpoint, s.Group}, LeafNodeType: types.NodeTypeIt,
			LeafNodeText: s.Text, StartTime: s.Start, EndTime: s.Start.Add(s.Duration), RunTime: s.Duration, ParallelProcess: 1}
		switch s.State {
		case Pass:
			sr.State = types.SpecStatePassed
			sr.CapturedStdOutErr = s.Message
		case Skip:
			sr.State = types.SpecStateSkipped
			sr.Failure = types.Failure{Message: s.Message}
		default:
			sr.State = types.SpecStateFailed
			msg := fmt.Sprintf("[%s] %s", s.Leg, s.Message)
			if s.Hint != "" {
				msg += "\nfix: " + s.Hint
			}
			sr.Failure = types.Failure{Message: msg, FailureNodeType: types.NodeTypeIt, FailureNodeContext: types.FailureNodeIsLeafNode}
		}
		rep.SpecReports = append(rep.SpecReports, sr)
	}
	return rep
}

// WriteFiles writes the certificate(s), report.txt, junit.xml and report.json into dir. One
// engine family gives certificate.json; several give certificate-<family>.json each.
func (r *Result) WriteFiles(dir string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	for _, c := range r.Certificates {
		name := CertificateFile
		if len(r.Certificates) > 1 {
			name = "certificate-" + c.Profile.Family + ".json"
		}
		if err := c.Write(filepath.Join(dir, name)); err != nil {
			return err
		}
	}
	f, err := os.Create(filepath.Join(dir, ReportFile))
	if err != nil {
		return err
	}
	if err := r.WriteText(f); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	if err := reporters.GenerateJUnitReport(r.GinkgoReport(), filepath.Join(dir, JUnitFile)); err != nil {
		return err
	}
	b, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(dir, JSONFile), append(b, '\n'), 0o644)
}
