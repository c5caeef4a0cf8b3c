package jobkeys

import (
	"errors"
	"regexp"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestPolicyNormalizeDefaults(t *testing.T) {
	t.Parallel()
	in := Policy{Key: []string{"tenant", "/tenant"}}
	got, err := in.Normalize()
	require.NoError(t, err)
	require.Equal(t, Policy{
		Key:               []string{"tenant", "/tenant"},
		MaxActive:         1,
		HeartbeatInterval: 30 * time.Second,
		HeartbeatTTL:      120 * time.Second,
		StalePolicy:       FailStale,
		MaxQueuedPerKey:   0,
		WhenFull:          Reject,
	}, got)
	// The defaults are the TS original's and the exported constants say so.
	require.Equal(t, 1, MaxActiveDefault)
	require.Equal(t, 30*time.Second, HeartbeatIntervalDefault)
	require.Equal(t, 120*time.Second, HeartbeatTTLDefault)
	require.Equal(t, FailStale, StalePolicyDefault)
	require.Equal(t, 0, MaxQueuedPerKeyDefault)
	require.Equal(t, Reject, WhenFullDefault)
	require.Equal(t, StalePolicy("fail-stale"), FailStale)
	require.Equal(t, StalePolicy("block"), Block)
	require.Equal(t, WhenFull("reject"), Reject)
	require.Equal(t, WhenFull("coalesce"), Coalesce)
	require.Equal(t, WhenFull("replace-oldest"), ReplaceOldest)

	// Normalize neither changes its receiver nor shares the key slice.
	require.Equal(t, Policy{Key: []string{"tenant", "/tenant"}}, in)
	got.Key[0] = "changed"
	require.Equal(t, "tenant", in.Key[0], "Normalize's Key aliases the input")

	// Normalizing twice gives the same policy.
	again, err := got.Normalize()
	require.NoError(t, err)
	require.Equal(t, got, again)
}

func TestPolicyNormalizeKeepsSetValues(t *testing.T) {
	t.Parallel()
	in := Policy{Key: []string{"/a~0b/c~1d", "/", "lit:eral", "/0"}, MaxActive: 7, HeartbeatInterval: time.Second,
		HeartbeatTTL: 3 * time.Second, StalePolicy: Block, MaxQueuedPerKey: 12, WhenFull: ReplaceOldest}
	got, err := in.Normalize()
	require.NoError(t, err)
	require.Equal(t, in, got)

	for _, w := range []WhenFull{Reject, Coalesce, ReplaceOldest} {
		p, err := Policy{Key: []string{"k"}, WhenFull: w}.Normalize()
		require.NoError(t, err, "WhenFull %q", w)
		require.Equal(t, w, p.WhenFull)
	}
	// Only the TTL set: the interval defaults and must stay below it.
	p, err := Policy{Key: []string{"k"}, HeartbeatTTL: 31 * time.Second}.Normalize()
	require.NoError(t, err)
	require.Equal(t, 30*time.Second, p.HeartbeatInterval)
	// Only the interval set, below the default TTL.
	p, err = Policy{Key: []string{"k"}, HeartbeatInterval: 119 * time.Second}.Normalize()
	require.NoError(t, err)
	require.Equal(t, 120*time.Second, p.HeartbeatTTL)
}

func TestPolicyNormalizeRejects(t *testing.T) {
	t.Parallel()
	k := []string{"tenant", "/tenant"}
	cases := []struct {
		name  string
		p     Policy
		field string
	}{
		{"nil key template", Policy{}, "Key"},
		{"empty key template", Policy{Key: []string{}}, "Key"},
		{"empty segment", Policy{Key: []string{"tenant", ""}}, "Key"},
		{"bad ~ escape", Policy{Key: []string{"/a~2b"}}, "Key"},
		{"~ at the end", Policy{Key: []string{"/a~"}}, "Key"},
		{"bad ~ escape in a later token", Policy{Key: []string{"t", "/ok/x~y"}}, "Key"},
		{"negative MaxActive", Policy{Key: k, MaxActive: -1}, "MaxActive"},
		{"very negative MaxActive", Policy{Key: k, MaxActive: -1 << 40}, "MaxActive"},
		{"negative MaxQueuedPerKey", Policy{Key: k, MaxQueuedPerKey: -1}, "MaxQueuedPerKey"},
		{"negative HeartbeatInterval", Policy{Key: k, HeartbeatInterval: -time.Second}, "HeartbeatInterval"},
		{"negative HeartbeatTTL", Policy{Key: k, HeartbeatTTL: -time.Second}, "HeartbeatTTL"},
		{"TTL equal to the interval", Policy{Key: k, HeartbeatInterval: 10 * time.Second, HeartbeatTTL: 10 * time.Second}, "HeartbeatTTL"},
		{"TTL below the interval", Policy{Key: k, HeartbeatInterval: 10 * time.Second, HeartbeatTTL: 5 * time.Second}, "HeartbeatTTL"},
		{"TTL below the default interval", Policy{Key: k, HeartbeatTTL: 20 * time.Second}, "HeartbeatTTL"},
		{"interval above the default TTL", Policy{Key: k, HeartbeatInterval: 120 * time.Second}, "HeartbeatTTL"},
		{"unknown stale policy", Policy{Key: k, StalePolicy: "fail_stale"}, "StalePolicy"},
		{"stale policy in another case", Policy{Key: k, StalePolicy: "Block"}, "StalePolicy"},
		{"unknown whenFull", Policy{Key: k, WhenFull: "drop"}, "WhenFull"},
		{"whenFull with spaces", Policy{Key: k, WhenFull: " reject"}, "WhenFull"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got, err := c.p.Normalize()
			if err == nil {
				t.Fatalf("Normalize accepted %+v as %+v", c.p, got)
			}
			require.True(t, errors.Is(err, ErrInvalidPolicy), "error does not wrap ErrInvalidPolicy: %v", err)
			re := `(^|[^A-Za-z])` + regexp.QuoteMeta(c.field) + `([^A-Za-z]|$)`
			require.Regexp(t, re, err.Error(), "error does not name the field %s", c.field)
			require.Equal(t, Policy{}, zeroKey(got), "a rejected policy comes back as the zero value")
		})
	}
}

func zeroKey(p Policy) Policy {
	if len(p.Key) == 0 {
		p.Key = nil
	}
	return p
}

// Limits travel as JSON numbers, which the TS original reads as doubles and
// the Go decoder accepts up to 2^53. A policy Normalize accepts must give
// states that read back; refusing such limits is the other answer.
func TestPolicyLimitsFitTheWire(t *testing.T) {
	t.Parallel()
	for _, p := range []Policy{
		{Key: []string{"k"}, MaxActive: 1<<53 + 1},
		{Key: []string{"k"}, MaxQueuedPerKey: 1<<53 + 1},
		{Key: []string{"k"}, MaxActive: 1 << 62},
	} {
		n, err := p.Normalize()
		if err != nil {
			require.True(t, errors.Is(err, ErrInvalidPolicy), "%v", err)
			continue
		}
		s := ReduceAdmission(nil, rtKey, AdmitRequest{JobID: "j1"}, n, rt0).State
		out := encodeState(t, s)
		_, err = ParseState(out)
		require.NoError(t, err, "Normalize accepted MaxActive %d, MaxQueuedPerKey %d, but the state it gives does not read back", n.MaxActive, n.MaxQueuedPerKey)
	}
}
