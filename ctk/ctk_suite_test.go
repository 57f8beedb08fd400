package ctk_test

import (
	"testing"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
)

func TestCTK(t *testing.T) {
	RegisterFailHandler(Fail)
	RunSpecs(t, "ctk certify")
}
