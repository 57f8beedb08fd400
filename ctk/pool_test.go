package ctk_test

import (
	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	"github.com/kvexact/kvexact/ctk"
)

const goodPool = `model: llama3
engine: {family: vllm, release: v0.25.1}
seed: "0"
endpoints:
  - name: P0
    address: http://127.0.0.1:8000
    events: {zmq: [tcp://127.0.0.1:5557], replay: [tcp://127.0.0.1:5600]}
`

var _ = Describe("a pool file", func() {
	It("takes the rule's defaults from the contract", func() {
		p, err := ctk.ParsePool([]byte(goodPool))
		Expect(err).NotTo(HaveOccurred())
		st, ok := p.Staged("vllm")
		Expect(ok).To(BeTrue())
		Expect(st.BlockSize).To(Equal(16))
		Expect(st.Algorithm).To(Equal("sha256"))
		Expect(st.Binding).To(Equal("auto"))
		Expect(p.Endpoints[0].Require).To(Equal(ctk.RequireExact))
	})

	DescribeTable("is refused with the offending field named",
		func(doc, field string) {
			_, err := ctk.ParsePool([]byte(doc))
			Expect(err).To(HaveOccurred())
			Expect(err.Error()).To(ContainSubstring(field))
		},
		Entry("without a model", "endpoints: [{address: http://x}]\n", "model"),
		Entry("with an unknown key", goodPool+"colour: blue\n", "colour"),
		Entry("without endpoints", "model: m\nengine: {family: vllm, release: v0.25.1}\n", "endpoints"),
		Entry("with an address that is no URL", "model: m\nengine: {family: vllm, release: v0.25.1}\nendpoints: [{address: localhost:8000, events: {zmq: [tcp://127.0.0.1:1]}}]\n", "endpoints[0].address"),
		Entry("with an unknown family", "model: m\nengine: {family: tgi, release: v1}\nendpoints: [{address: http://x}]\n", "endpoints[0].family"),
		Entry("with an unpinned release", "model: m\nengine: {family: vllm, release: v0.9.0}\nendpoints: [{address: http://x}]\n", "endpoints[0].release"),
		Entry("with the engine binding and no seed", "model: m\nbinding: engine\nengine: {family: vllm, release: v0.25.1}\nendpoints: [{address: http://x, events: {zmq: [tcp://127.0.0.1:1]}}]\n", "seed"),
		Entry("with an algorithm the contract does not offer", "model: m\nhashAlgorithm: md5\nengine: {family: vllm, release: v0.25.1}\nendpoints: [{address: http://x, events: {zmq: [tcp://127.0.0.1:1]}}]\n", "hashAlgorithm"),
		Entry("asking exact routing of llama.cpp", "model: m\nengine: {family: llamacpp, release: b10573}\nendpoints: [{address: http://x, require: exact}]\n", "endpoints[0].require"),
		Entry("asking exact routing without an event address", "model: m\nengine: {family: sglang, release: v0.5.18}\nendpoints: [{address: http://x}]\n", "endpoints[0].events.zmq"),
		Entry("with replay addresses not one per rank", "model: m\nengine: {family: sglang, release: v0.5.18}\nendpoints: [{address: http://x, events: {zmq: [tcp://a:1, tcp://a:2], replay: [tcp://a:3]}}]\n", "endpoints[0].events.replay"),
		Entry("with ZeroMQ events for TensorRT-LLM", "model: m\nengine: {family: trtllm, release: \"1.2\"}\nendpoints: [{address: http://x, events: {zmq: [tcp://a:1]}}]\n", "endpoints[0].events.zmq"),
		Entry("with duplicate endpoint names", "model: m\nengine: {family: llamacpp, release: b10573}\nendpoints: [{name: a, address: http://x}, {name: a, address: http://y}]\n", "endpoints[1].name"),
	)
})
