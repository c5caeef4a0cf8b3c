package jobs

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/jobkeys/jobkeys/internal/natstest"
)

// The linearizability check of NATSStore's claimed calls: several workers,
// each over its own connection, claim, renew and settle the jobs of one
// channel concurrently; porcupine checks the history against a sequential
// model of the jobs. The clock ticks a microsecond on every reading (so a
// renewal's expiry is always later) and the TTL is far beyond the test's
// length: no claim expires, so a job's owner can only change by a claim of
// a pending job.

const linJobs = 8

type linState struct {
	jobs [linJobs]linJob
}

type linJob struct {
	state State
	owner int
	gen   uint64
	rev   uint64
}

type linKind int

const (
	linClaim linKind = iota
	linRenew
	linSettle
)

type linInput struct {
	kind   linKind
	client int
	job    int    // renew, settle
	gen    uint64 // renew, settle: the claim generation presented
	expect uint64 // renew: the expected revision
}

type linOutput struct {
	ok  bool
	job int // claim: the job claimed (ok)
	gen uint64
	rev uint64 // the revision written (ok)
	err error  // a failure other than a conflict: never legal
}

func linModelStep(st linState, in linInput, out linOutput) (bool, linState) {
	if out.err != nil {
		return false, st
	}
	switch in.kind {
	case linClaim:
		first := -1
		for i, j := range st.jobs {
			if j.state == StatePending {
				first = i
				break
			}
		}
		if !out.ok {
			return first == -1, st
		}
		j := st.jobs[out.job]
		if out.job != first || out.gen != j.gen+1 || out.rev <= j.rev {
			return false, st
		}
		st.jobs[out.job] = linJob{state: StateRunning, owner: in.client, gen: out.gen, rev: out.rev}
		return true, st
	case linRenew, linSettle:
		j := st.jobs[in.job]
		holds := j.state == StateRunning && j.owner == in.client && j.gen == in.gen
		if in.kind == linRenew {
			holds = holds && in.expect == j.rev
		}
		if !out.ok {
			return !holds, st
		}
		if !holds || out.rev <= j.rev {
			return false, st
		}
		j.rev = out.rev
		if in.kind == linSettle {
			j.state = StateCompleted
		}
		st.jobs[in.job] = j
		return true, st
	}
	return false, st
}

func linModel() porcupine.Model {
	return porcupine.Model{
		Init: func() any {
			var st linState
			for i := range st.jobs {
				st.jobs[i] = linJob{state: StatePending, owner: -1}
			}
			return st
		},
		Step: func(state, input, output any) (bool, any) {
			return linModelStep(state.(linState), input.(linInput), output.(linOutput))
		},
		DescribeOperation: func(input, output any) string {
			in, out := input.(linInput), output.(linOutput)
			return fmt.Sprintf("c%d %v job=%d gen=%d exp=%d -> ok=%t job=%d gen=%d rev=%d err=%v",
				in.client, in.kind, in.job, in.gen, in.expect, out.ok, out.job, out.gen, out.rev, out.err)
		},
	}
}

// tickClock reads a time that grows by a microsecond on every reading.
type tickClock struct{ ns atomic.Int64 }

func (c *tickClock) Now() time.Time { return time.Unix(0, c.ns.Add(1000)).UTC() }

func TestNATSStoreLinearizableClaims(t *testing.T) {
	t.Parallel()
	seed := time.Now().UnixNano()
	t.Logf("seed %d", seed)
	s := natstest.Run(t)
	clk := &tickClock{}
	clk.ns.Store(time.Date(2026, 5, 6, 7, 8, 9, 0, time.UTC).UnixNano())
	cfg := &Config{Now: clk.Now}
	first, _ := newTestNATSStore(t, s, cfg)
	ctx := context.Background()
	for i := range linJobs {
		_, err := first.Enqueue(ctx, testEnqueueRequest("ch", fmt.Sprintf("j%d", i), fmt.Sprintf("doc%d", i)))
		require.NoError(t, err)
	}
	const clients, opsPerClient = 4, 25
	var (
		mu      sync.Mutex
		history []porcupine.Operation
		epoch   = time.Now()
		wg      sync.WaitGroup
	)
	for c := range clients {
		st := openTestNATSStore(t, s, first, cfg)
		rng := rand.New(rand.NewPCG(uint64(seed), uint64(c)))
		wg.Add(1)
		go func() {
			defer wg.Done()
			var held *Job
			var lastRev uint64
			for range opsPerClient {
				in := linInput{client: c, kind: linClaim}
				if held != nil {
					in.job, in.gen, in.expect = jobIndex(held.ID), held.ClaimGeneration, lastRev
					switch r := rng.IntN(10); {
					case r < 7:
						in.kind = linRenew
						if r == 0 {
							in.expect-- // a stale revision
						}
					default:
						in.kind = linSettle
					}
				}
				call := time.Since(epoch).Nanoseconds()
				out := linRun(ctx, st, in, held)
				ret := time.Since(epoch).Nanoseconds()
				mu.Lock()
				history = append(history, porcupine.Operation{ClientId: c, Input: in, Output: out, Call: call, Return: ret})
				mu.Unlock()
				switch {
				case in.kind == linClaim && out.ok:
					held = &Job{ID: fmt.Sprintf("j%d", out.job), ClaimGeneration: out.gen}
					lastRev = out.rev
				case in.kind == linRenew && out.ok:
					lastRev = out.rev
				case in.kind == linSettle && out.ok:
					held = nil
				case in.kind == linSettle && rng.IntN(2) == 0:
					held = nil
				}
			}
		}()
	}
	wg.Wait()
	succeeded := map[linKind]int{}
	for _, op := range history {
		out := op.Output.(linOutput)
		require.NoError(t, out.err)
		if out.ok {
			succeeded[op.Input.(linInput).kind]++
		}
	}
	require.LessOrEqual(t, succeeded[linClaim], linJobs, "a job is claimed at most once: no claim expires")
	require.NotZero(t, succeeded[linClaim])
	require.NotZero(t, succeeded[linSettle])
	require.NotZero(t, succeeded[linRenew])
	res := porcupine.CheckOperationsTimeout(linModel(), history, 30*time.Second)
	require.Equal(t, porcupine.Ok, res, "history of %d operations is not linearizable (seed %d)", len(history), seed)

	// The check can fail: the same history with one claim's job swapped.
	for i, op := range history {
		if in, out := op.Input.(linInput), op.Output.(linOutput); in.kind == linClaim && out.ok {
			out.job = (out.job + 1) % linJobs
			bad := append([]porcupine.Operation(nil), history...)
			bad[i].Output = out
			assert.Equal(t, porcupine.Illegal, porcupine.CheckOperationsTimeout(linModel(), bad, 30*time.Second))
			break
		}
	}
}

func jobIndex(id string) int {
	var i int
	_, _ = fmt.Sscanf(id, "j%d", &i)
	return i
}

// linRun performs one operation; a conflict is a failed operation, any
// other error is recorded as such.
func linRun(ctx context.Context, st *NATSStore, in linInput, held *Job) linOutput {
	switch in.kind {
	case linClaim:
		got, err := st.Claim(ctx, ClaimRequest{ChannelID: "ch", Owner: fmt.Sprintf("c%d", in.client), Count: 1, TTL: time.Hour})
		if err != nil {
			return linOutput{err: err}
		}
		if len(got) == 0 {
			return linOutput{}
		}
		return linOutput{ok: true, job: jobIndex(got[0].ID), gen: got[0].ClaimGeneration, rev: got[0].Revision}
	case linRenew, linSettle:
		claim := Claim{ChannelID: "ch", JobID: held.ID, Owner: fmt.Sprintf("c%d", in.client), Generation: in.gen}
		var rev uint64
		var err error
		if in.kind == linRenew {
			var j Job
			j, err = st.Renew(ctx, RenewRequest{Claim: claim, ExpectedRevision: in.expect, TTL: time.Hour})
			rev = j.Revision
		} else {
			var d Detail
			d, err = st.Settle(ctx, SettleRequest{Claim: claim})
			rev = d.Job.Revision
		}
		if errors.Is(err, ErrConflict) {
			return linOutput{}
		}
		if err != nil {
			return linOutput{err: err}
		}
		return linOutput{ok: true, rev: rev}
	}
	return linOutput{err: errors.New("unknown operation")}
}
