package ctk_test

import (
	"fmt"
	"sort"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	"github.com/kvexact/kvexact/contracts"
	"github.com/kvexact/kvexact/ctk"
	"github.com/kvexact/kvexact/ctk/certificate"
	"github.com/kvexact/kvexact/engines/sim"
)

// sglangPins are the pinned SGLang contracts, oldest first, from the data: a new release's contract
// joins the newest end of these tests by itself.
func sglangPins() []*contracts.Contract {
	var cs []*contracts.Contract
	for _, c := range contracts.All() {
		if c.Family == "sglang" {
			cs = append(cs, c)
		}
	}
	sort.Slice(cs, func(i, j int) bool {
		a, _ := contracts.ParseVersion(cs[i].Pin.Release)
		b, _ := contracts.ParseVersion(cs[j].Pin.Release)
		return a.Compare(b) < 0
	})
	return cs
}

// Certification per pinned SGLang release: the oldest pin (v0.5.18, tagged arrays) and the newest
// (v0.5.21, tagged maps), each against a simulator publishing its release's wire.
var _ = Describe("pinned SGLang releases", func() {
	pins := sglangPins()
	for _, c := range []*contracts.Contract{pins[0], pins[len(pins)-1]} {
		It("certifies "+c.Pin.Release+" ("+c.WireSchema+") for the engine and router bindings", func() {
			e := startSim("sglang", c.Pin.Release, nil)
			res := certify(poolFor(e, "S0"), nil)
			Expect(res.ExitCode).To(Equal(0), failed(res))
			Expect(res.Endpoints[0].Certified).To(ConsistOf(certificate.CoverAffinity, certificate.CoverEngine, certificate.CoverRouter))
			Expect(spec(res, "S0", "block keys").State).To(Equal(ctk.Pass))
			Expect(spec(res, "S0", "cache clear").State).To(Equal(ctk.Pass))
		})
	}

	It("refuses a release between the pins (v0.5.20, layout not established), naming the nearest pinned contract", func() {
		old := pins[0]
		e := startSim("sglang", old.Pin.Release, func(c *sim.Config) { c.ReportVersion = "0.5.20" })
		res := certify(poolFor(e, "S0"), nil)
		Expect(res.ExitCode).To(Equal(1))
		s := spec(res, "S0", "release")
		Expect(s.Leg).To(Equal(ctk.LegRelease))
		Expect(s.Message).To(ContainSubstring(fmt.Sprintf("nearest pinned: sglang %s (contract %s, pin %s)", old.Versions.String(), old.ID, old.Pin.Release)))
	})

	It("refuses a release newer than the newest pin, naming it and what to verify", func() {
		n := pins[len(pins)-1]
		v, err := contracts.ParseVersion(n.Pin.Release)
		Expect(err).NotTo(HaveOccurred())
		newer := fmt.Sprintf("%d.%d.%d", v.Nums[0], v.Nums[1], v.Nums[2]+1)
		e := startSim("sglang", n.Pin.Release, func(c *sim.Config) { c.ReportVersion = newer })
		res := certify(poolFor(e, "S0"), nil)
		Expect(res.ExitCode).To(Equal(1))
		s := spec(res, "S0", "release")
		Expect(s.Leg).To(Equal(ctk.LegRelease))
		Expect(s.Message).To(ContainSubstring(fmt.Sprintf("nearest pinned: sglang %s (contract %s, pin %s)", n.Versions.String(), n.ID, n.Pin.Release)))
		Expect(s.Hint).To(ContainSubstring("kv_events.py"))
	})
})
