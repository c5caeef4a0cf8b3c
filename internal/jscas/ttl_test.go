package jscas

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
)

// TTLValue rounds up to whole seconds: a message never goes before d.
func TestTTLValue(t *testing.T) {
	t.Parallel()
	for d, want := range map[time.Duration]string{
		time.Nanosecond:                        "1",
		time.Second:                            "1",
		time.Second + time.Nanosecond:          "2",
		90 * time.Minute:                       "5400",
		30*24*time.Hour + 500*time.Millisecond: "2592001",
	} {
		assert.Equal(t, want, TTLValue(d), "%v", d)
	}
}
