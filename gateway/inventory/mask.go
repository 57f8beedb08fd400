package inventory

import "math/bits"

// MaxEndpoints bounds the endpoints of one index (one rule). IDs are dense, reused after
// RemoveEndpoint, and always below MaxEndpoints, so a Mask is a fixed-size value: copying it costs
// four words and no allocation on the request path.
const MaxEndpoints = 256

// EndpointID is an endpoint's dense index within one rule's index.
type EndpointID uint16

// Mask is a set of EndpointIDs (the candidates of a routing decision). The zero value is empty.
type Mask [MaxEndpoints / 64]uint64

// MaskOf returns the set of the given ids.
func MaskOf(ids ...EndpointID) Mask {
	var m Mask
	for _, id := range ids {
		m.Set(id)
	}
	return m
}

// Set adds id. An id no endpoint can have (≥ MaxEndpoints) is ignored.
func (m *Mask) Set(id EndpointID) {
	if id < MaxEndpoints {
		m[id/64] |= 1 << (id % 64)
	}
}

// Clear removes id.
func (m *Mask) Clear(id EndpointID) {
	if id < MaxEndpoints {
		m[id/64] &^= 1 << (id % 64)
	}
}

// Has reports whether id is in the set.
func (m Mask) Has(id EndpointID) bool {
	return id < MaxEndpoints && m[id/64]&(1<<(id%64)) != 0
}

// Len is the number of ids in the set.
func (m Mask) Len() int {
	n := 0
	for _, w := range m {
		n += bits.OnesCount64(w)
	}
	return n
}

// IDs appends the set's ids in ascending order to dst.
func (m Mask) IDs(dst []EndpointID) []EndpointID {
	for w, b := range m {
		for b != 0 {
			dst = append(dst, EndpointID(w*64+bits.TrailingZeros64(b)))
			b &= b - 1
		}
	}
	return dst
}
