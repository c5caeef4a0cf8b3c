package jscas

import (
	"errors"
	"fmt"
	"testing"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/assert"
)

func TestIsConflict(t *testing.T) {
	wrap := func(code jetstream.ErrorCode) error {
		return fmt.Errorf("update: %w", &jetstream.APIError{Code: 400, ErrorCode: code})
	}
	assert.True(t, IsConflict(wrap(jetstream.JSErrCodeStreamWrongLastSequence)))
	assert.True(t, IsConflict(wrap(jetstream.JSErrCodeStreamWrongLastSequenceConstant)))
	assert.False(t, IsConflict(wrap(jetstream.JSErrCodeStreamNotFound)))
	assert.False(t, IsConflict(errors.New("wrong last sequence")), "never by text")
	assert.False(t, IsConflict(nil))
}
