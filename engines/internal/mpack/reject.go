package mpack

import (
	"errors"

	"github.com/kvexact/kvexact/engines"
)

// Reject turns a reader error met while decoding field into the event path's typed reject: a
// malformed encoding is a decode_error, a well-formed value of the wrong shape a schema_mismatch,
// both at the byte offset where it was found. An error that already is a reject passes through.
func (r *Reader) Reject(err error, field string) error {
	var de *engines.DecodeError
	if errors.As(err, &de) {
		return err
	}
	reason, off := engines.ReasonSchemaMismatch, r.Offset()
	var me *Error
	if errors.As(err, &me) {
		off = me.Offset
		if me.Malformed {
			reason = engines.ReasonDecodeError
		}
		err = me.Err
	}
	return &engines.DecodeError{Reason: reason, Offset: off, Field: field, Err: err}
}
