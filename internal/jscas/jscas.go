package jscas

import (
	"errors"

	"github.com/nats-io/nats.go/jetstream"
)

// IsConflict reports whether err is a compare-and-swap write that found
// another revision than it expected: JetStream error 10071 (wrong last
// sequence) or 10164 (the same on a replicated stream while a write is in
// flight). It matches by code, never by message text.
func IsConflict(err error) bool {
	var apiErr *jetstream.APIError
	if !errors.As(err, &apiErr) {
		return false
	}
	return apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequence ||
		apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequenceConstant
}
