package jobs

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// Fuzz targets for request validation: whatever a request holds, a store
// refuses it with a conflict or not-found error or stores a record that
// validates, and never panics.

// requireKind fails unless err is nil, ErrConflict or ErrNotFound.
func requireKind(t *testing.T, err error, what string) {
	t.Helper()
	if err != nil && !errors.Is(err, ErrConflict) && !errors.Is(err, ErrNotFound) {
		t.Fatalf("%s: %v is neither a conflict nor not found", what, err)
	}
}

func FuzzEnqueueRequest(f *testing.F) {
	f.Add("j1", "c", "render", "doc", "k", "fp", 1, []byte(`{"a":1}`), int64(0))
	f.Add("", "", "", "", "", "", 0, []byte(nil), int64(-1))
	f.Add("j\xff", "c", "t", "d", "k", "f", -1, []byte(`{"a":`), int64(253402300800)) // year 10000
	f.Add("j2", "c", "t", "d", "k", "f", 3, []byte(" null "), int64(1700000000))
	f.Add("j3", "c", "t", "d", "k", "f", 1, []byte(`"\ud800"`), int64(-62135596801))
	f.Fuzz(func(t *testing.T, id, channel, typ, target, key, fp string, version int, input []byte, avail int64) {
		s, err := NewMemoryStore(&Config{Now: func() time.Time { return testNow }})
		require.NoError(t, err)
		req := EnqueueRequest{ID: id, ChannelID: channel, Type: typ, Version: version, TargetKey: target,
			IdempotencyKey: key, Fingerprint: fp, Input: input}
		if avail != 0 {
			req.AvailableAt = time.Unix(avail, 0)
		}
		ctx := context.Background()
		out, err := s.Enqueue(ctx, req)
		requireKind(t, err, "enqueue")
		if err != nil {
			p, lerr := s.List(ctx, ListRequest{ChannelID: channel})
			if lerr == nil {
				require.Empty(t, p.Jobs, "a refused enqueue stored a job")
			}
			return
		}
		require.NoError(t, validateJob(&out.Job))
		if out.Job.Input != nil {
			require.True(t, json.Valid(out.Job.Input))
			var c bytes.Buffer
			require.NoError(t, json.Compact(&c, out.Job.Input))
			require.Equal(t, c.String(), string(out.Job.Input), "Input is compact")
		}
		again, err := s.Enqueue(ctx, req)
		require.NoError(t, err)
		require.True(t, again.Repeated)
		require.Equal(t, out.Job, again.Job)
	})
}

func FuzzClaimedRequests(f *testing.F) {
	f.Add("w", 1, int64(time.Minute), []byte(`{"b":1}`), []byte(`[1]`), "why", "stage", " label ", "started", "", int64(time.Second))
	f.Add("", 0, int64(0), []byte(`{`), []byte(`{`), "\xff", "", "", "", "", int64(-1))
	f.Add("w", 1000, int64(1<<62), []byte(`null`), []byte(nil), "r", "s-1", "x", "interrupted", "rate-limited", int64(1<<62))
	f.Add("w", 2, int64(1), []byte(" "), []byte(`"x"`), "", "Stage", "\t", "completed", "no", int64(time.Hour))
	f.Fuzz(func(t *testing.T, owner string, count int, ttl int64, binding, artifact []byte, reason, stage, label, pstate, preason string, renewTTL int64) {
		now := testNow
		s, err := NewMemoryStore(&Config{Now: func() time.Time { return now }})
		require.NoError(t, err)
		ctx := context.Background()
		_, err = s.Enqueue(ctx, EnqueueRequest{ID: "j1", ChannelID: "c", Type: "t", Version: 1, TargetKey: "d", IdempotencyKey: "k", Fingerprint: "f"})
		require.NoError(t, err)
		got, err := s.Claim(ctx, ClaimRequest{ChannelID: "c", Owner: owner, Count: count, TTL: time.Duration(ttl)})
		requireKind(t, err, "claim")
		if err != nil {
			return
		}
		require.Len(t, got, 1)
		j := got[0]
		require.NoError(t, validateJob(&j))
		c := ClaimOf(j)

		p, err := s.AppendProgress(ctx, ProgressRequest{Claim: c, Stage: stage, Label: label, State: ProgressState(pstate), Reason: preason})
		requireKind(t, err, "progress")
		if err == nil {
			require.NoError(t, validateJob(&p))
			j = p
		}
		r, err := s.Renew(ctx, RenewRequest{Claim: c, ExpectedRevision: j.Revision, TTL: time.Duration(renewTTL), Binding: binding})
		requireKind(t, err, "renew")
		if err == nil {
			require.NoError(t, validateJob(&r))
			require.LessOrEqual(t, len(r.ClaimBinding), BindingSizeLimit)
		}
		d, err := s.Settle(ctx, SettleRequest{Claim: c, Artifact: artifact})
		requireKind(t, err, "settle")
		if err == nil {
			require.NoError(t, validateJob(&d.Job))
			require.NoError(t, validateArtifact(d.Artifact, &d.Job))
			return
		}
		q, err := s.Requeue(ctx, RequeueRequest{Claim: c, Reason: reason, CountFailure: true})
		requireKind(t, err, "requeue")
		if err == nil {
			require.NoError(t, validateJob(&q))
		}
	})
}

func FuzzControlAndListRequests(f *testing.F) {
	f.Add("c", "j1", uint64(2), "hold", int64(0), true, 10, int64(0), "j")
	f.Add("", "", uint64(0), "\xff", int64(-62135596801), false, -1, int64(253402300800), "")
	f.Fuzz(func(t *testing.T, channel, id string, rev uint64, reason string, avail int64, allow bool, limit int, after int64, afterID string) {
		s, err := NewMemoryStore(&Config{Now: func() time.Time { return testNow }})
		require.NoError(t, err)
		ctx := context.Background()
		_, err = s.Enqueue(ctx, EnqueueRequest{ID: "j1", ChannelID: "c", Type: "t", Version: 1, TargetKey: "d", IdempotencyKey: "k", Fingerprint: "f"})
		require.NoError(t, err)
		var at time.Time
		if avail != 0 {
			at = time.Unix(avail, 0)
		}
		check := func(what string, j Job, err error) {
			requireKind(t, err, what)
			if err == nil {
				require.NoError(t, validateJob(&j), what)
			}
		}
		j, err := s.Pause(ctx, PauseRequest{ChannelID: channel, JobID: id, ExpectedRevision: rev, Reason: reason})
		check("pause", j, err)
		j, err = s.Resume(ctx, ResumeRequest{ChannelID: channel, JobID: id, ExpectedRevision: rev, AvailableAt: at})
		check("resume", j, err)
		j, err = s.Supersede(ctx, SupersedeRequest{ChannelID: channel, JobID: id, ExpectedRevision: rev, Reason: reason})
		check("supersede", j, err)
		j, err = s.Cancel(ctx, CancelRequest{ChannelID: channel, JobID: id, AllowArchived: allow})
		check("cancel", j, err)
		var cur *Cursor
		if after != 0 || afterID != "" {
			cur = &Cursor{CreatedAt: time.Unix(after, 0), ID: afterID}
		}
		p, err := s.List(ctx, ListRequest{ChannelID: channel, Limit: limit, After: cur})
		requireKind(t, err, "list")
		if err == nil {
			require.LessOrEqual(t, len(p.Jobs), ListLimit)
		}
		_, err = s.Get(ctx, channel, id)
		requireKind(t, err, "get")
		requireKind(t, s.DeleteChannel(ctx, channel), "delete")
	})
}
