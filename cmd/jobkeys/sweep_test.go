package main

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/jobkeys/jobkeys"
)

// shortLeases is a job type's policy whose leases tolerate 15s of skew
// between hosts, far less than the CLI's default sweep margin.
var shortLeases = jobkeys.Policy{Key: []string{"/t"}, MaxActive: 1, HeartbeatInterval: 5 * time.Second, HeartbeatTTL: 20 * time.Second}

// liveShortLease acquires a slot of job "short-1" on key "short" under
// shortLeases (its lease expires in 20s) and returns the key's KV key.
func liveShortLease(t *testing.T, f *fixture) string {
	t.Helper()
	ctx := context.Background()
	coord, err := jobkeys.NewCoordinator(f.store, &jobkeys.Config{InstanceID: "worker-2"})
	require.NoError(t, err)
	jt, err := coord.JobType("svc", "render", shortLeases)
	require.NoError(t, err)
	adm, err := jt.Admit(ctx, "short-1", []byte(`{"t":"short"}`))
	require.NoError(t, err)
	require.Equal(t, jobkeys.KindAccepted, adm.Kind)
	acq, err := jt.Acquire(ctx, "short-1", []byte(`{"t":"short"}`))
	require.NoError(t, err)
	require.Equal(t, jobkeys.KindAcquired, acq.Kind)
	return "svc.render." + acq.Lease.KeyHash
}

// TestKeysSweepSkewedClockSweepsNothingLive is the regression test for the
// sweep's clock-skew margin: it counted a slot expired as soon as its lease
// expiry passed by this host's clock, and checked this host's clock against
// the server's with the default policy's bound (45s) whatever the job
// type's leases tolerate, so a host 40s ahead removed a live slot of a job
// type whose leases last 20s. A slot is swept now only once its lease
// expired --skew-margin ago (90s by default).
func TestKeysSweepSkewedClockSweepsNothingLive(t *testing.T) {
	t.Parallel()
	f := newFixture(t, 1)
	short := liveShortLease(t, f)
	shortBefore, _ := f.value(t, short)

	r := newRunner(t, f.srv.ClientURL())
	r.now = func() time.Time { return time.Now().Add(40 * time.Second) }
	res := r.run("keys", "sweep", "svc", "render", "-f", "--json")
	assert.Equal(t, exitCorrupt, res.code, "the corrupt key is reported: %s", res.stderr)
	var out struct {
		Removed []sweptJSON `json:"removed"`
	}
	require.NoError(t, json.Unmarshal([]byte(res.stdout), &out), res.stdout)
	var removed []string
	for _, sl := range out.Removed {
		removed = append(removed, sl.JobID)
	}
	assert.Equal(t, []string{"exp-1"}, removed, "the slot expired 2h ago goes, the live one stays")
	shortAfter, _ := f.value(t, short)
	assert.Equal(t, string(shortBefore), string(shortAfter), "the live slot's key is untouched")
}

// Slots expired within the margin are listed as kept; a host proven half
// the margin or more ahead of the server sweeps nothing; the margin is a
// flag.
func TestKeysSweepMargin(t *testing.T) {
	t.Parallel()
	f := newFixture(t, 1)
	liveShortLease(t, f)
	before := f.snapshot(t)
	r := newRunner(t, f.srv.ClientURL())

	r.now = func() time.Time { return time.Now().Add(40 * time.Second) }
	res := r.run("keys", "sweep", "svc", "render", "--dry-run")
	require.Equal(t, exitOK, res.code, res.stderr)
	assert.Regexp(t, `(?m)^1 expired slot in 1 of 6 keys \(dry run: nothing removed\):$`, res.stdout)
	assert.Regexp(t, `(?m)^1 slot expired less than --skew-margin 1m30s ago \(kept\):$`, res.stdout)
	assert.Regexp(t, `(?m)^  short +short-1 +worker-2 +\d+s ago +svc\.render\.`, res.stdout)

	// 50s ahead of the server: more than half the default margin.
	r.now = func() time.Time { return time.Now().Add(50 * time.Second) }
	res = r.run("keys", "sweep", "svc", "render", "-f")
	assert.Equal(t, exitError, res.code, res.stdout)
	assert.Contains(t, res.stderr, "sweep refused, nothing written")
	assert.Contains(t, res.stderr, "--skew-margin 1m30s needs it less than 45s ahead")
	assert.Equal(t, before, f.snapshot(t))
	// A wider margin tolerates it, and keeps the live slot.
	res = r.run("keys", "sweep", "svc", "render", "-f", "--json", "--skew-margin", "3m")
	assert.Equal(t, exitCorrupt, res.code, res.stderr)
	var out struct {
		Removed []sweptJSON `json:"removed"`
		Kept    []sweptJSON `json:"kept"`
		Margin  float64     `json:"skewMarginSeconds"`
	}
	require.NoError(t, json.Unmarshal([]byte(res.stdout), &out), res.stdout)
	require.Len(t, out.Removed, 1)
	assert.Equal(t, "exp-1", out.Removed[0].JobID)
	require.Len(t, out.Kept, 1)
	assert.Equal(t, "short-1", out.Kept[0].JobID)
	assert.Equal(t, 180.0, out.Margin)

	res = r.run("keys", "sweep", "svc", "render", "--skew-margin", "-1s")
	assert.Equal(t, exitUsage, res.code)
	assert.Contains(t, res.stderr, "--skew-margin -1s is negative")
}

// The sweep writes only on the revision it read: a slot renewed after
// the listing the sweep started from is read again and kept, and a key
// the sweep empties is deleted (its expired slot was all it held).
func TestSweepMarginKeepsASlotRenewedSinceItsListing(t *testing.T) {
	t.Parallel()
	f := newFixture(t, 1)
	ctx := context.Background()
	coord, err := jobkeys.NewCoordinator(f.store, &jobkeys.Config{InstanceID: "jobkeys-cli"})
	require.NoError(t, err)
	s := &session{keys: f.store, coord: coord, timeout: 10 * time.Second}
	kvKey := f.kv["expired"]
	read, err := coord.Inspect(ctx, "svc", kvKey)
	require.NoError(t, err)
	require.NotNil(t, read.State)
	require.Len(t, read.State.Active, 1)

	// Its holder renews it after the listing (as a heartbeat would).
	renewed := *read.State
	renewed.Active = append([]jobkeys.ActiveSlot(nil), read.State.Active...)
	now := time.Now().UTC().Truncate(time.Millisecond)
	renewed.Active[0].HeartbeatAt, renewed.Active[0].LeaseExpiresAt = now, now.Add(time.Minute)
	renewed.UpdatedAt = now
	_, err = coord.Repair(ctx, jobkeys.RepairRequest{Service: "svc", KVKey: kvKey, Revision: read.Revision, Replacement: &renewed})
	require.NoError(t, err)
	after, _ := f.value(t, kvKey)

	rep, err := sweepMargin(ctx, s, "svc", "render", 0, time.Now)
	require.ErrorIs(t, err, jobkeys.ErrCorruptState, "the fixture's corrupt key is reported")
	assert.Empty(t, rep.Removed, "the renewed slot is live")
	assert.Zero(t, rep.Deleted)
	now2, _ := f.value(t, kvKey)
	assert.Equal(t, string(after), string(now2), "the renewed state is untouched")

	// Expired again (two minutes on, by the sweep's clock): it goes, and
	// the key, left empty, with it; a margin of a minute still sweeps it.
	rep, err = sweepMargin(ctx, s, "svc", "render", time.Minute, func() time.Time { return time.Now().Add(2*time.Minute + time.Second) })
	require.ErrorIs(t, err, jobkeys.ErrCorruptState)
	var removed []string
	for _, sl := range rep.Removed {
		removed = append(removed, sl.Slot.JobID)
	}
	assert.ElementsMatch(t, []string{"exp-1", "full-1"}, removed, "full-1's lease (a minute) expired too")
	assert.Equal(t, 1, rep.Deleted, "full-2 is still queued on full")
	_, rev := f.value(t, kvKey)
	assert.Zero(t, rev, "the emptied key is deleted")
}
