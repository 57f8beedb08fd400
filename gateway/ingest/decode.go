package ingest

import "github.com/kvexact/kvexact/engines"

// decoder is one rank's decode stage: the family's payload decoder into a batch whose buffers every
// message reuses, then the rank check.
type decoder struct {
	decode engines.Decoder
	batch  engines.Batch
}

// run returns payload's batch, or false after counting and tracing the reject (a payload that
// does not decode, or a batch stamped with another rank than its socket's).
func (d *decoder) run(p *pipeline, rank int, seq uint64, payload []byte) (*engines.Batch, bool) {
	if err := d.decode(&d.batch, payload); err != nil {
		p.reject(rank, seq, true, err)
		return nil, false
	}
	if err := engines.CheckRank(&d.batch, rank); err != nil {
		p.reject(rank, seq, true, err)
		return nil, false
	}
	return &d.batch, true
}
