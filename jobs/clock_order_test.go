package jobs

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/jobkeys/jobkeys/internal/natstest"
)

// The times on a record are readings of whichever clock wrote it. A writer
// whose clock is behind the one that enqueued (or last changed) a job, or a
// clock that jumps, must never make a store write a record that its own
// validator refuses: such a record would be ErrCorrupt for every later
// Get, List, write and Claim. These tests drive every transition under
// random clocks — small steps either way and jumps of hours to years — and
// check after every operation that the channel still reads and that every
// record validates.

// clockOrderSeedEnv replays a run of TestClockOrderProperty: set it to the
// seed a failure printed.
const clockOrderSeedEnv = "JOBKEYS_SEED"

func TestClockOrderProperty(t *testing.T) {
	t.Parallel()
	seed := uint64(time.Now().UnixNano())
	if s := os.Getenv(clockOrderSeedEnv); s != "" {
		v, err := strconv.ParseUint(s, 10, 64)
		require.NoError(t, err, "%s=%q", clockOrderSeedEnv, s)
		seed = v
	}
	t.Logf("seed %d (replay with %s=%d)", seed, clockOrderSeedEnv, seed)
	t.Run("MemoryStore", func(t *testing.T) {
		t.Parallel()
		runClockOrder(t, seed, func(cfg *Config) Store {
			st, err := NewMemoryStore(cfg)
			require.NoError(t, err)
			return st
		})
	})
	t.Run("NATSStore", func(t *testing.T) {
		t.Parallel()
		s := natstest.Run(t)
		runClockOrder(t, seed, func(cfg *Config) Store {
			st, _ := newTestNATSStore(t, s, cfg)
			return st
		})
	})
}

// clockOrderRun is one random run against one store.
type clockOrderRun struct {
	t       *testing.T
	ctx     context.Context
	st      Store
	clk     *fixedClock
	rnd     *rand.Rand
	log     []string
	ids     []string          // every job enqueued, in order
	claims  []Claim           // every claim handed out (most are stale by now)
	done    map[string]int    // successful operations by name, for the log
	listed  []Summary         // the channel as the last check listed it
	checked map[string]uint64 // the revision of each job at its last Get
}

const clockOrderChannel = "clocks"

// clockOrderOps is the length of a run; clockOrderRuns the runs per store.
const (
	clockOrderOps  = 200
	clockOrderRuns = 2
)

func runClockOrder(t *testing.T, seed uint64, newStore func(cfg *Config) Store) {
	for run := range clockOrderRuns {
		clk := newFixedClock()
		r := &clockOrderRun{
			t: t, ctx: context.Background(), st: newStore(&Config{Now: clk.Now}), clk: clk,
			rnd: rand.New(rand.NewPCG(seed, uint64(run))), done: map[string]int{}, checked: map[string]uint64{},
		}
		for i := range clockOrderOps {
			r.op(i)
			r.check()
			if t.Failed() {
				t.Fatalf("run %d (seed %d) failed at operation %d; the last operations:\n%s", run, seed, i, strings.Join(r.log, "\n"))
			}
		}
		t.Logf("run %d: successful operations %v", run, r.done)
	}
}

func (r *clockOrderRun) logf(format string, args ...any) {
	r.log = append(r.log, r.clk.Now().Format(time.RFC3339Nano)+" "+fmt.Sprintf(format, args...))
	if len(r.log) > 30 {
		r.log = r.log[1:]
	}
}

// setClock sets the store's clock before an operation on job s (nil: no
// job in particular): an offset from s's UpdatedAt or CreatedAt (or from
// the clock), mostly a few seconds either way — 1.1 s behind, often —
// sometimes hours to years either way, kept within 2001..2199 (the years a
// NATSStore list key can order).
func (r *clockOrderRun) setClock(s *Summary) {
	base := r.clk.Now()
	if s != nil {
		switch r.rnd.IntN(4) {
		case 0, 1:
			base = s.UpdatedAt
		case 2:
			base = s.CreatedAt
		}
	}
	var d time.Duration
	switch r.rnd.IntN(8) {
	case 0:
		d = time.Duration(r.rnd.Int64N(int64(3 * 365 * 24 * time.Hour)))
	case 1, 2:
		d = 1100 * time.Millisecond
	case 3:
		d = 0
	default:
		d = time.Duration(r.rnd.Int64N(int64(3 * time.Second)))
	}
	if r.rnd.IntN(3) > 0 {
		d = -d // behind, two times in three
	}
	if y := base.Add(d).Year(); y < 2001 || y > 2199 {
		d = -d
	}
	r.clk.ns.Store(base.Add(d).UnixNano())
	r.logf("clock %+v from %s", d, base.Format(time.RFC3339Nano))
}

// op makes one operation: an enqueue now and then (of a new target or of a
// listed job's, superseding it), else a transition of a listed job (an
// active one, four times in five) that its state allows, five times in
// six, or any other (mostly refused).
func (r *clockOrderRun) op(i int) {
	if len(r.listed) == 0 || r.rnd.IntN(6) == 0 {
		var s *Summary
		target := fmt.Sprintf("t%d", i)
		if len(r.listed) > 0 && r.rnd.IntN(2) == 0 {
			s = &r.listed[r.rnd.IntN(len(r.listed))]
			target = s.TargetKey
		}
		r.setClock(s)
		r.enqueue(i, target)
		return
	}
	var active []Summary
	for _, s := range r.listed {
		if s.State.Active() {
			active = append(active, s)
		}
	}
	s := r.listed[r.rnd.IntN(len(r.listed))]
	if len(active) > 0 && r.rnd.IntN(5) > 0 {
		s = active[r.rnd.IntN(len(active))]
	}
	r.setClock(&s)
	var allowed []func(Summary)
	switch s.State {
	case StatePending:
		allowed = []func(Summary){r.claim, r.claim, r.claim, r.claim, r.pause, r.cancel, r.supersede}
	case StateRunning:
		allowed = []func(Summary){r.renew, r.renew, r.progress, r.progress, r.requeue, r.requeue, r.settle, r.fail, r.pause, r.cancel, r.supersede, r.claim}
	case StatePaused:
		allowed = []func(Summary){r.resume, r.cancel, r.supersede}
	}
	if len(allowed) == 0 || r.rnd.IntN(6) == 0 {
		allowed = []func(Summary){r.claim, r.renew, r.progress, r.requeue, r.settle, r.fail, r.pause, r.resume, r.cancel, r.supersede}
	}
	allowed[r.rnd.IntN(len(allowed))](s)
}

// outcome fails the run on an error other than a refusal (ErrConflict or
// ErrNotFound): a corrupt or unreadable record is what this test hunts.
// It returns whether the operation succeeded.
func (r *clockOrderRun) outcome(what string, err error) bool {
	r.t.Helper()
	r.logf("%s: %v", what, err)
	if err != nil && !errors.Is(err, ErrConflict) && !errors.Is(err, ErrNotFound) {
		r.t.Errorf("%s: %v", what, err)
	}
	if err == nil {
		r.done[strings.Fields(what)[0]]++
	}
	return err == nil
}

// stamped checks that a changed job carries the store's clock reading as
// its UpdatedAt, as the seed writes it, whatever the record held before.
func (r *clockOrderRun) stamped(what string, j Job) {
	r.t.Helper()
	if now := r.clk.Now(); !j.UpdatedAt.Equal(now) {
		r.t.Errorf("%s: job %q UpdatedAt %s, want the store's time %s", what, j.ID, j.UpdatedAt.Format(time.RFC3339Nano), now.Format(time.RFC3339Nano))
	}
}

// claimOf is s's claim three times in four, else a claim handed out
// earlier (most are stale).
func (r *clockOrderRun) claimOf(s Summary) Claim {
	if len(r.claims) > 0 && r.rnd.IntN(4) == 0 {
		return r.claims[r.rnd.IntN(len(r.claims))]
	}
	return Claim{ChannelID: s.ChannelID, JobID: s.ID, Owner: s.ClaimOwner, Generation: s.ClaimGeneration}
}

// someTime is a time near the clock: mostly in the past (due), up to years.
func (r *clockOrderRun) someTime() time.Time {
	if r.rnd.IntN(4) == 0 {
		return r.clk.Now().Add(time.Duration(r.rnd.Int64N(int64(4*time.Second))) - 2*time.Second)
	}
	return r.clk.Now().Add(-time.Duration(r.rnd.Int64N(int64(3 * 365 * 24 * time.Hour))))
}

func (r *clockOrderRun) enqueue(i int, target string) {
	id := fmt.Sprintf("j%d", i)
	if len(r.ids) > 0 && r.rnd.IntN(8) == 0 {
		id = r.ids[r.rnd.IntN(len(r.ids))] // a replay: same idempotency key and fingerprint
	}
	req := EnqueueRequest{
		ID: id, ChannelID: clockOrderChannel, Type: "render", Version: 1, Origin: "user",
		TargetKey: target, IdempotencyKey: "idem-" + id, Fingerprint: "fp-" + id,
		Input: json.RawMessage(`{"n":1}`),
	}
	if r.rnd.IntN(4) > 0 {
		req.AvailableAt = r.someTime()
	}
	out, err := r.st.Enqueue(r.ctx, req)
	if r.outcome("enqueue "+id+" of "+req.TargetKey, err) && !out.Repeated {
		r.stamped("enqueue", out.Job)
		r.ids = append(r.ids, id)
	}
}

func (r *clockOrderRun) claim(s Summary) {
	if s.State == StatePending && s.AvailableAt.After(r.clk.Now()) && r.rnd.IntN(2) == 0 {
		// Due, if only just: the clock may still be behind the job's other times.
		r.clk.ns.Store(s.AvailableAt.Add(time.Duration(r.rnd.Int64N(int64(2 * time.Second)))).UnixNano())
		r.logf("clock to %s's AvailableAt", s.ID)
	}
	req := ClaimRequest{ChannelID: clockOrderChannel, Owner: fmt.Sprintf("w%d", r.rnd.IntN(3)),
		Count: 1 + r.rnd.IntN(3), TTL: time.Second + time.Duration(r.rnd.Int64N(int64(time.Hour)))}
	if r.rnd.IntN(4) == 0 {
		req.ChannelID = "" // every channel
	}
	got, err := r.st.Claim(r.ctx, req)
	if r.outcome(fmt.Sprintf("claim %d by %s for %v: %v", req.Count, req.Owner, req.TTL, len(got)), err) {
		for _, j := range got {
			r.stamped("claim", j)
			r.claims = append(r.claims, ClaimOf(j))
		}
	}
}

func (r *clockOrderRun) renew(s Summary) {
	req := RenewRequest{Claim: r.claimOf(s), ExpectedRevision: s.Revision, TTL: time.Second + time.Duration(r.rnd.Int64N(int64(2*time.Hour)))}
	if r.rnd.IntN(2) == 0 {
		req.Binding = json.RawMessage(`{"slot":1}`)
	}
	j, err := r.st.Renew(r.ctx, req)
	if r.outcome("renew "+s.ID, err) {
		r.stamped("renew", j)
	}
}

func (r *clockOrderRun) progress(s Summary) {
	labels := []string{"fetching", "  rendering page 3  ", "étape ✓", "🙂 done"}
	req := ProgressRequest{Claim: r.claimOf(s), Stage: "render", Label: labels[r.rnd.IntN(len(labels))], State: ProgressStarted}
	if r.rnd.IntN(3) == 0 {
		req.State, req.Reason = ProgressInterrupted, "rate-limited"
	}
	j, err := r.st.AppendProgress(r.ctx, req)
	if r.outcome("progress "+s.ID, err) {
		r.stamped("progress", j)
	}
}

func (r *clockOrderRun) requeue(s Summary) {
	req := RequeueRequest{Claim: r.claimOf(s), Reason: "retry", CountFailure: r.rnd.IntN(2) == 0}
	if r.rnd.IntN(2) == 0 {
		req.AvailableAt = r.someTime()
	}
	j, err := r.st.Requeue(r.ctx, req)
	if r.outcome("requeue "+s.ID, err) {
		r.stamped("requeue", j)
	}
}

func (r *clockOrderRun) settle(s Summary) {
	d, err := r.st.Settle(r.ctx, SettleRequest{Claim: r.claimOf(s), Artifact: json.RawMessage(`{"ok":true}`)})
	if r.outcome("settle "+s.ID, err) {
		r.stamped("settle", d.Job)
	}
}

func (r *clockOrderRun) fail(s Summary) {
	j, err := r.st.Fail(r.ctx, FailRequest{Claim: r.claimOf(s), Reason: "gave up"})
	if r.outcome("fail "+s.ID, err) {
		r.stamped("fail", j)
	}
}

func (r *clockOrderRun) pause(s Summary) {
	j, err := r.st.Pause(r.ctx, PauseRequest{ChannelID: clockOrderChannel, JobID: s.ID, ExpectedRevision: s.Revision, Reason: "hold"})
	if r.outcome("pause "+s.ID, err) {
		r.stamped("pause", j)
	}
}

func (r *clockOrderRun) resume(s Summary) {
	req := ResumeRequest{ChannelID: clockOrderChannel, JobID: s.ID, ExpectedRevision: s.Revision}
	if r.rnd.IntN(2) == 0 {
		req.AvailableAt = r.someTime()
	}
	j, err := r.st.Resume(r.ctx, req)
	if r.outcome("resume "+s.ID, err) {
		r.stamped("resume", j)
	}
}

func (r *clockOrderRun) cancel(s Summary) {
	j, err := r.st.Cancel(r.ctx, CancelRequest{ChannelID: clockOrderChannel, JobID: s.ID})
	if r.outcome("cancel "+s.ID, err) {
		r.stamped("cancel", j)
	}
}

func (r *clockOrderRun) supersede(s Summary) {
	j, err := r.st.Supersede(r.ctx, SupersedeRequest{ChannelID: clockOrderChannel, JobID: s.ID, ExpectedRevision: s.Revision, Reason: "newer"})
	if r.outcome("supersede "+s.ID, err) {
		r.stamped("supersede", j)
	}
}

// check reads the whole channel: every page of its list must succeed and
// list every job enqueued (a NATSStore decodes and validates every record
// it lists), and every job that changed since the last check must succeed
// by Get, its job, target and artifact passing the store's validators.
func (r *clockOrderRun) check() {
	r.t.Helper()
	var listed []string
	r.listed = r.listed[:0]
	req := ListRequest{ChannelID: clockOrderChannel, Limit: 7}
	for {
		page, err := r.st.List(r.ctx, req)
		if err != nil {
			r.t.Errorf("List: %v", err)
			return
		}
		for _, s := range page.Jobs {
			listed = append(listed, s.ID)
			r.listed = append(r.listed, s)
		}
		if page.Next == nil {
			break
		}
		req.After = page.Next
	}
	require.ElementsMatch(r.t, r.ids, listed, "List lists every job enqueued")
	for _, s := range r.listed {
		if r.checked[s.ID] == s.Revision {
			continue // validated as it is
		}
		r.checked[s.ID] = s.Revision
		id := s.ID
		d, err := r.st.Get(r.ctx, clockOrderChannel, id)
		if err != nil {
			r.t.Errorf("Get(%s): %v", id, err)
			continue
		}
		if err := validateJob(&d.Job); err != nil {
			r.t.Errorf("Get(%s): the store's validator refuses the job: %v", id, err)
		}
		if err := validateTarget(&d.Target); err != nil {
			r.t.Errorf("Get(%s): %v", id, err)
		}
		if d.Artifact != nil {
			if err := validateArtifact(d.Artifact, &d.Job); err != nil {
				r.t.Errorf("Get(%s): %v", id, err)
			}
		}
	}
}
