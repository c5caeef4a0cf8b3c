package jobkeys

// Linearizability under concurrency: many clients, each with its own NATS
// connection, store and coordinator (and so its own state cache), run random
// operations on a few keys of one bucket of a real embedded server. Every
// call is recorded (input, outcome, call and return time) and the history is
// checked with porcupine against the sequential model of system_model_test.go; the
// bucket's every revision is then audited (audit_test.go).
//
// JOBKEYS_SEED reproduces a run's random choices (not its interleaving);
// JOBKEYS_LONG=1 runs more clients and operations.

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"
	"github.com/jobkeys/jobkeys/internal/natstest"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"
)

// opKind names a coordinator operation in a recorded history.
type opKind int

const (
	opAdmit opKind = iota
	opAcquire
	opRenew
	opRelease
	opRemove
	opRestore
)

func (k opKind) String() string {
	return [...]string{"admit", "acquire", "renew", "release", "remove", "restore"}[k]
}

// linKey is one key of a run: the payload that derives it and its policy.
type linKey struct {
	payload []byte
	policy  Policy // normalized
	mp      modelPolicy
	key     JobKey
}

func newLinKey(t testing.TB, service, jobType, tenant string, p Policy) linKey {
	t.Helper()
	p.Key = []string{"tenant", "/t"}
	norm, err := p.Normalize()
	require.NoError(t, err)
	payload := fmt.Appendf(nil, `{"t":%q}`, tenant)
	key, err := DeriveKey(service, jobType, payload, norm.Key)
	require.NoError(t, err)
	return linKey{payload: payload, policy: norm, key: key, mp: modelPolicy{maxActive: norm.MaxActive, maxQueued: norm.MaxQueuedPerKey,
		whenFull: norm.WhenFull, stale: norm.StalePolicy, ttl: norm.HeartbeatTTL.Milliseconds()}}
}

// linPolicyOf returns the audit's policy lookup for keys.
func linPolicyOf(keys []linKey) func(string) (Policy, bool) {
	return func(kvKey string) (Policy, bool) {
		for _, k := range keys {
			if k.key.KVKey == kvKey {
				return k.policy, true
			}
		}
		return Policy{}, false
	}
}

// linInput is a recorded call.
type linInput struct {
	kind     opKind
	key      int // index into the run's keys
	job      string
	strict   bool // admit
	retry    bool // acquire
	tries    int
	instance string
	ctx      TraceContext
	lease    Lease       // renew, release
	replaced ReplacedJob // restore; job is the replacement
	// lo and hi bound, in Unix milliseconds, the clock reading the
	// coordinator used: taken just before the call and just after it.
	lo, hi int64
}

// linOutput is a recorded outcome: the one of the call's kind, or err.
type linOutput struct {
	err         error
	admission   Admission
	acquisition Acquisition
	renewal     Renewal
	release     ReleaseOutcome
	removal     Removal
	restoration Restoration
}

// linOp is one recorded operation.
type linOp struct {
	client    int
	in        linInput
	out       linOutput
	call, ret int64 // monotonic nanoseconds since the recorder started
}

// state returns the state the operation wrote (an empty one when it
// deleted the key), or nil when it wrote nothing or failed.
func (op *linOp) state() *KeyState {
	if op.out.err != nil {
		return nil
	}
	switch op.in.kind {
	case opAdmit:
		return op.out.admission.State
	case opAcquire:
		return op.out.acquisition.State
	case opRenew:
		return op.out.renewal.State
	case opRelease:
		return op.out.release.State
	case opRemove:
		return op.out.removal.State
	default:
		return op.out.restoration.State
	}
}

func (op *linOp) kind() Kind {
	switch op.in.kind {
	case opAdmit:
		return op.out.admission.Kind
	case opAcquire:
		return op.out.acquisition.Kind
	case opRenew:
		return op.out.renewal.Kind
	case opRelease:
		return op.out.release.Kind
	case opRemove:
		return op.out.removal.Kind
	default:
		return modelKindRestored
	}
}

// linRecorder collects the operations of all clients. Safe for concurrent use.
type linRecorder struct {
	start time.Time
	mu    sync.Mutex
	ops   []*linOp
}

func newLinRecorder() *linRecorder { return &linRecorder{start: time.Now()} }

func (r *linRecorder) record(client int, in linInput, run func() linOutput) linOutput {
	call := time.Since(r.start).Nanoseconds()
	in.lo = time.Now().UnixMilli()
	out := run()
	in.hi = time.Now().UnixMilli()
	ret := time.Since(r.start).Nanoseconds()
	r.mu.Lock()
	r.ops = append(r.ops, &linOp{client: client, in: in, out: out, call: call, ret: ret})
	r.mu.Unlock()
	return out
}

func (r *linRecorder) log() []*linOp {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.ops)
}

// linClient runs recorded operations through one coordinator.
type linClient struct {
	id       int
	service  string
	jobType  string
	keys     []linKey
	rec      *linRecorder
	instance string

	mu     sync.Mutex
	coord  *KeyCoordinator
	nc     *nats.Conn
	js     jetstream.JetStream
	closed bool // close was called: redial must not open a new connection
}

// linDial opens a connection of its own to url (a comma-separated list for
// a cluster) that reconnects forever, even when the server is down at
// first, and a store and coordinator over it.
func linDial(url string, instance string) (*nats.Conn, jetstream.JetStream, *KeyCoordinator, error) {
	nc, err := nats.Connect(url, nats.MaxReconnects(-1), nats.ReconnectWait(20*time.Millisecond),
		nats.Name(instance), nats.ReconnectBufSize(-1), nats.RetryOnFailedConnect(true))
	if err != nil {
		return nil, nil, nil, fmt.Errorf("connect %s: %w", url, err)
	}
	js, err := jetstream.New(nc, jetstream.WithDefaultTimeout(5*time.Second))
	if err != nil {
		nc.Close()
		return nil, nil, nil, err
	}
	store, err := NewNATSStore(js)
	if err == nil {
		var coord *KeyCoordinator
		if coord, err = NewCoordinator(store, &Config{InstanceID: instance}); err == nil {
			return nc, js, coord, nil
		}
	}
	nc.Close()
	return nil, nil, nil, err
}

func linConnect(t testing.TB, url string, instance string) (*nats.Conn, jetstream.JetStream, *KeyCoordinator) {
	t.Helper()
	nc, js, coord, err := linDial(url, instance)
	require.NoError(t, err)
	t.Cleanup(nc.Close)
	return nc, js, coord
}

// newLinStoreClient returns a client over a store of the caller's (it
// cannot reconnect or drain).
func newLinStoreClient(t testing.TB, id int, store Store, service, jobType string, keys []linKey, rec *linRecorder) *linClient {
	t.Helper()
	c := &linClient{id: id, service: service, jobType: jobType, keys: keys, rec: rec, instance: fmt.Sprintf("client-%d", id)}
	coord, err := NewCoordinator(store, &Config{InstanceID: c.instance})
	require.NoError(t, err)
	c.coord = coord
	return c
}

func newLinClient(t testing.TB, id int, url, service, jobType string, keys []linKey, rec *linRecorder) *linClient {
	t.Helper()
	c := &linClient{id: id, service: service, jobType: jobType, keys: keys, rec: rec, instance: fmt.Sprintf("client-%d", id)}
	var err error
	if c.nc, c.js, c.coord, err = linDial(url, c.instance); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.close) // the connection of the last redial too
	return c
}

// redial replaces the client's connection, store and coordinator (and so
// its state cache) with new ones and closes the old connection, under any
// operation in flight on it. Safe to call from any goroutine.
func (c *linClient) redial(url string) error {
	nc, js, coord, err := linDial(url, c.instance)
	if err != nil {
		return err
	}
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		nc.Close()
		return nil
	}
	old := c.nc
	c.nc, c.js, c.coord = nc, js, coord
	c.mu.Unlock()
	old.Close()
	return nil
}

// close closes the client's connection for good: a later redial closes the
// connection it opens.
func (c *linClient) close() {
	c.mu.Lock()
	c.closed = true
	nc := c.nc
	c.mu.Unlock()
	nc.Close()
}

func (c *linClient) current() *KeyCoordinator {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.coord
}

func (c *linClient) conn() *nats.Conn {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.nc
}

func (c *linClient) admit(ctx context.Context, k int, job string, strict bool, tc TraceContext) linOutput {
	in := linInput{kind: opAdmit, key: k, job: job, strict: strict, ctx: tc}
	return c.rec.record(c.id, in, func() linOutput {
		a, err := c.current().Admit(ctx, AdmitRequest{Service: c.service, JobType: c.jobType, JobID: job,
			Payload: c.keys[k].payload, Context: tc, Policy: c.keys[k].policy, StrictCreate: strict})
		return linOutput{admission: a, err: err}
	})
}

func (c *linClient) acquire(ctx context.Context, k int, job string, retry bool, tries int, tc TraceContext) linOutput {
	in := linInput{kind: opAcquire, key: k, job: job, retry: retry, tries: tries, instance: c.instance, ctx: tc}
	return c.rec.record(c.id, in, func() linOutput {
		a, err := c.current().Acquire(ctx, AcquireRequest{Service: c.service, JobType: c.jobType, JobID: job,
			Payload: c.keys[k].payload, Context: tc, Retry: retry, Tries: tries, InstanceID: c.instance, Policy: c.keys[k].policy})
		return linOutput{acquisition: a, err: err}
	})
}

func (c *linClient) renew(ctx context.Context, k int, l Lease) linOutput {
	return c.rec.record(c.id, linInput{kind: opRenew, key: k, job: l.JobID, lease: l}, func() linOutput {
		r, err := c.current().Renew(ctx, RenewRequest{Lease: l})
		return linOutput{renewal: r, err: err}
	})
}

func (c *linClient) release(ctx context.Context, k int, l Lease) linOutput {
	return c.rec.record(c.id, linInput{kind: opRelease, key: k, job: l.JobID, lease: l}, func() linOutput {
		r, err := c.current().Release(ctx, ReleaseRequest{Lease: l})
		return linOutput{release: r, err: err}
	})
}

func (c *linClient) remove(ctx context.Context, k int, job string) linOutput {
	return c.rec.record(c.id, linInput{kind: opRemove, key: k, job: job}, func() linOutput {
		r, err := c.current().RemoveQueued(ctx, RemoveRequest{Service: c.service, JobType: c.jobType, JobID: job,
			Payload: c.keys[k].payload, Policy: c.keys[k].policy})
		return linOutput{removal: r, err: err}
	})
}

func (c *linClient) restore(ctx context.Context, k int, replacement string, replaced ReplacedJob) linOutput {
	return c.rec.record(c.id, linInput{kind: opRestore, key: k, job: replacement, replaced: replaced}, func() linOutput {
		r, err := c.current().RestoreReplaced(ctx, RestoreRequest{Service: c.service, JobType: c.jobType,
			ReplacementJobID: replacement, Replaced: replaced, Payload: c.keys[k].payload, Policy: c.keys[k].policy})
		return linOutput{restoration: r, err: err}
	})
}

// drain empties every key through recorded operations: it releases slots
// (with their tokens, read from the store) and acquires and releases
// queued jobs until each key is deleted. Operations that fail are retried.
func (c *linClient) drain(t testing.TB, ctx context.Context) {
	t.Helper()
	for k, key := range c.keys {
		for attempt := 0; ; attempt++ {
			if attempt > 2000 || ctx.Err() != nil {
				t.Fatalf("drain: key %s does not empty (%v)", key.key.KVKey, ctx.Err())
			}
			c.mu.Lock()
			js := c.js
			c.mu.Unlock()
			kv, err := js.KeyValue(ctx, BucketPrefixDefault+"_"+c.service)
			if err != nil {
				time.Sleep(50 * time.Millisecond)
				continue
			}
			e, err := kv.Get(ctx, key.key.KVKey)
			if errors.Is(err, jetstream.ErrKeyNotFound) {
				break
			}
			if err != nil {
				time.Sleep(50 * time.Millisecond)
				continue
			}
			st, err := ParseState(e.Value())
			require.NoError(t, err, "drain: key %s revision %d", key.key.KVKey, e.Revision())
			switch {
			case len(st.Active) > 0:
				a := st.Active[0]
				c.release(ctx, k, Lease{Service: st.Service, JobType: st.JobType, JobID: a.JobID, DisplayKey: st.DisplayKey,
					KeyHash: st.KeyHash, SlotToken: a.SlotToken, Policy: key.policy})
			case len(st.Queued) > 0:
				out := c.acquire(ctx, k, st.Queued[0].JobID, false, 1, TraceContext{})
				if out.err == nil && out.acquisition.Kind == KindAcquired {
					c.release(ctx, k, out.acquisition.Lease)
				}
			}
		}
	}
}

// linPool is what the clients of a run share: the job ids admitted per key
// and every lease handed out, to pick operands from.
type linPool struct {
	mu     sync.Mutex
	jobs   [][]string
	leases []linLease
}

type linLease struct {
	key   int
	lease Lease
}

func (p *linPool) addJob(k int, job string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.jobs[k] = append(p.jobs[k], job)
	if len(p.jobs[k]) > 24 {
		p.jobs[k] = p.jobs[k][1:]
	}
}

func (p *linPool) dropJob(k int, job string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.jobs[k] = slices.DeleteFunc(p.jobs[k], func(j string) bool { return j == job })
}

func (p *linPool) job(rng *rand.Rand, k int) (string, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(p.jobs[k]) == 0 {
		return "", false
	}
	return p.jobs[k][rng.IntN(len(p.jobs[k]))], true
}

func (p *linPool) addLease(k int, l Lease) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.leases = append(p.leases, linLease{k, l})
}

func (p *linPool) lease(rng *rand.Rand) (linLease, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(p.leases) == 0 {
		return linLease{}, false
	}
	return p.leases[rng.IntN(len(p.leases))], true
}

// linRandomClient runs n random operations: admissions of new and known
// jobs (strict or not), acquisitions (some as retries), renewals and
// releases of its own leases and of anyone's, removals, restores of jobs it
// saw replaced, and crashes that abandon its leases to expire.
func linRandomClient(ctx context.Context, c *linClient, pool *linPool, rng *rand.Rand, n int) {
	type replacement struct {
		key      int
		job      string
		replaced ReplacedJob
	}
	var held []linLease
	var replaced []replacement
	tc := func(job string) TraceContext {
		if rng.IntN(3) == 0 {
			return TraceContext{}
		}
		return TraceContext{RequestID: "req-" + job, TraceID: fmt.Sprintf("%032x", rng.Uint64()),
			Traceparent: fmt.Sprintf("00-%032x-%016x-01", rng.Uint64(), rng.Uint64())}
	}
	for i := 0; i < n && ctx.Err() == nil; i++ {
		k := rng.IntN(len(c.keys))
		switch p := rng.IntN(100); {
		case p < 28:
			job := fmt.Sprintf("c%d-j%d", c.id, i)
			if known, ok := pool.job(rng, k); ok && rng.IntN(6) == 0 {
				job = known
			}
			out := c.admit(ctx, k, job, rng.IntN(4) == 0, tc(job))
			if out.err == nil && out.admission.State != nil {
				pool.addJob(k, job)
			}
			if r := out.admission.Replaced; out.err == nil && r != nil {
				replaced = append(replaced, replacement{k, job, *r})
				pool.dropJob(k, r.ID)
			}
		case p < 52:
			job, ok := pool.job(rng, k)
			if !ok || rng.IntN(20) == 0 {
				job = fmt.Sprintf("c%d-r%d", c.id, i)
			}
			out := c.acquire(ctx, k, job, rng.IntN(10) == 0, rng.IntN(3), tc(job))
			if out.err == nil && out.acquisition.Kind == KindAcquired {
				l := linLease{k, out.acquisition.Lease}
				held = append(held, l)
				pool.addLease(k, l.lease)
				if rng.IntN(5) != 0 {
					pool.dropJob(k, job)
				}
			}
		case p < 66:
			if l, ok := linPickLease(rng, held, pool); ok {
				c.renew(ctx, l.key, l.lease)
			}
		case p < 82:
			if l, ok := linPickLease(rng, held, pool); ok {
				c.release(ctx, l.key, l.lease)
				held = slices.DeleteFunc(held, func(h linLease) bool { return h.lease.SlotToken == l.lease.SlotToken })
			}
		case p < 90:
			if job, ok := pool.job(rng, k); ok {
				if out := c.remove(ctx, k, job); out.err == nil && out.removal.Kind == KindRemoved {
					pool.dropJob(k, job)
				}
			}
		case p < 95:
			if len(replaced) > 0 {
				r := replaced[len(replaced)-1]
				replaced = replaced[:len(replaced)-1]
				c.restore(ctx, r.key, r.job, r.replaced)
			}
		case p < 98:
			held = nil // crash: these leases are never renewed or released
		default: // let time pass, and leases expire
			time.Sleep(time.Duration(rng.IntN(40)) * time.Millisecond)
		}
	}
}

func linPickLease(rng *rand.Rand, held []linLease, pool *linPool) (linLease, bool) {
	if len(held) > 0 && rng.IntN(5) != 0 {
		return held[rng.IntN(len(held))], true
	}
	return pool.lease(rng)
}

// ---- the porcupine model ----

// linModel is the sequential specification of one key (histories are
// partitioned by key): the model of system_model_test.go, with the operation's
// clock reading left open within [lo, hi] where the outcome does not
// reveal it.
func linModel(keys []linKey) porcupine.Model {
	return porcupine.Model{
		Partition: func(history []porcupine.Operation) [][]porcupine.Operation {
			parts := make([][]porcupine.Operation, len(keys))
			for _, op := range history {
				k := op.Input.(linInput).key
				parts[k] = append(parts[k], op)
			}
			return slices.DeleteFunc(parts, func(p []porcupine.Operation) bool { return len(p) == 0 })
		},
		Init: func() any { return (*modelState)(nil) },
		Step: func(state, input, output any) (bool, any) {
			in := input.(linInput)
			return linStep(keys[in.key].mp, state.(*modelState), in, output.(linOutput))
		},
		Equal: func(a, b any) bool { return modelEqual(a.(*modelState), b.(*modelState)) },
		Hash: func(s any) uint64 {
			if m := s.(*modelState); m != nil {
				return m.hash()
			}
			return 0
		},
		DescribeOperation: func(input, output any) string {
			in, out := input.(linInput), output.(linOutput)
			op := linOp{in: in, out: out}
			desc := fmt.Sprintf("%s %s", in.kind, in.job)
			if in.kind == opRenew || in.kind == opRelease {
				desc += "/" + in.lease.SlotToken[:8]
			}
			if out.err != nil {
				return desc + " -> error: " + out.err.Error()
			}
			desc += fmt.Sprintf(" [%d,%d] -> %s", in.lo%100000, in.hi%100000, op.kind())
			if out.acquisition.Reason != "" {
				desc += " " + string(out.acquisition.Reason)
			}
			return desc
		},
		DescribeState: func(s any) string { return s.(*modelState).describe() },
	}
}

func modelEqual(a, b *modelState) bool {
	if a == nil || b == nil {
		return a == b
	}
	return a.maxActive == b.maxActive && a.maxQueued == b.maxQueued && a.takeovers == b.takeovers && a.updated == b.updated &&
		slices.Equal(a.active, b.active) && slices.Equal(a.queued, b.queued)
}

// linApply runs the operation through the model at clock reading now. An
// acquisition's token is the one its outcome reports.
func linApply(mp modelPolicy, s *modelState, in linInput, out linOutput, now int64) modelResult {
	switch in.kind {
	case opAdmit:
		return modelAdmit(s, in.job, in.strict, in.ctx, mp, now)
	case opAcquire:
		return modelAcquire(s, in.job, in.retry, in.tries, in.instance, in.ctx, mp, now, out.acquisition.Lease.SlotToken)
	case opRenew:
		return modelRenew(s, in.lease.JobID, in.lease.SlotToken, in.lease.Policy.HeartbeatTTL.Milliseconds(), now)
	case opRelease:
		return modelRelease(s, in.lease.JobID, in.lease.SlotToken, now)
	case opRemove:
		return modelRemove(s, in.job, now)
	default:
		r := in.replaced
		q := modelQueued{job: r.ID, created: modelMs(r.CreatedAt), requestID: r.RequestID, ctx: r.Context}
		if q.requestID == "" {
			q.requestID = modelRequestID(r.Context, r.ID)
		}
		return modelRestore(s, in.job, q, mp, now)
	}
}

func linDiff(in linInput, out linOutput, want modelResult) string {
	switch in.kind {
	case opAdmit:
		return modelDiffAdmission(want, out.admission, in.job)
	case opAcquire:
		return modelDiffAcquisition(want, out.acquisition, in.job, out.acquisition.Lease.SlotToken)
	case opRenew:
		return modelDiffSimple(want, out.renewal.Kind, out.renewal.LeaseExpiresAt, out.renewal.State)
	case opRelease:
		return modelDiffSimple(want, out.release.Kind, time.Time{}, out.release.State)
	case opRemove:
		return modelDiffSimple(want, out.removal.Kind, time.Time{}, out.removal.State)
	default:
		return modelDiffSimple(want, modelKindRestored, time.Time{}, out.restoration.State)
	}
}

// linStep is the model's step. A failed operation is allowed only as
// ErrContention, which writes nothing; the other errors leave the outcome
// unknown and are not checked here (the fault tests audit those runs).
func linStep(mp modelPolicy, s *modelState, in linInput, out linOutput) (bool, any) {
	if out.err != nil {
		return errors.Is(out.err, ErrContention), s
	}
	op := linOp{in: in, out: out}
	if written := op.state(); written != nil {
		now := modelMs(written.UpdatedAt)
		if now < in.lo || now > in.hi {
			return false, s
		}
		r := linApply(mp, s, in, out, now)
		if !r.changed || linDiff(in, out, r) != "" || modelDiffStates(r.next, written) != "" {
			return false, s
		}
		return true, modelSettle(r).next
	}
	// Nothing written: the outcome must be the model's at some clock
	// reading in [lo, hi]. It can only change where a lease expires.
	candidates := []int64{in.lo}
	if s != nil {
		for _, a := range s.active {
			if a.expires > in.lo && a.expires <= in.hi {
				candidates = append(candidates, a.expires)
			}
		}
	}
	for _, now := range candidates {
		if r := linApply(mp, s, in, out, now); !r.changed && linDiff(in, out, r) == "" {
			return true, s
		}
	}
	return false, s
}

// linCheck checks a recorded history with porcupine, within timeout. An
// illegal history fails the test and leaves a visualization in the temp
// directory; a timeout is logged.
func linCheck(t testing.TB, keys []linKey, log []*linOp, timeout time.Duration) porcupine.CheckResult {
	t.Helper()
	history := make([]porcupine.Operation, 0, len(log))
	for _, op := range log {
		history = append(history, porcupine.Operation{ClientId: op.client, Input: op.in, Output: op.out, Call: op.call, Return: op.ret})
	}
	model := linModel(keys)
	start := time.Now()
	res, info := porcupine.CheckOperationsVerbose(model, history, timeout)
	t.Logf("porcupine: %d operations on %d keys: %s in %v", len(history), len(keys), res, time.Since(start).Round(time.Millisecond))
	switch res {
	case porcupine.Illegal:
		path := filepath.Join(os.TempDir(), fmt.Sprintf("jobkeys-%s-%d.html", filepath.Base(t.Name()), time.Now().UnixNano()))
		if err := porcupine.VisualizePath(model, info, path); err != nil {
			t.Logf("visualization: %v", err)
		}
		t.Errorf("the history is not linearizable against the model; visualization: %s\n%s", path, linExplain(model, &info, history))
	case porcupine.Unknown:
		t.Logf("porcupine timed out after %v: the history was neither proven nor refuted", timeout)
	}
	return res
}

// linCountOutcomes tallies a history's outcomes for the log.
func linCountOutcomes(log []*linOp) map[string]int {
	counts := map[string]int{}
	for _, op := range log {
		k := op.in.kind.String() + ":"
		if op.out.err != nil {
			k += "error"
		} else {
			k += string(op.kind())
			if r := op.out.acquisition.Reason; r != "" {
				k += "/" + string(r)
			}
			if len(op.out.acquisition.Stale) > 0 {
				k += "/took-over"
			}
		}
		counts[k]++
	}
	return counts
}

// linServer starts an embedded server for t with file storage.
func linServer(t testing.TB) *server.Server { return natstest.Run(t) }

// TestLinearizableUnderConcurrency runs random operations from many
// clients (each with its own connection and coordinator, and two more
// sharing the first's coordinator) on three keys (one policy each: replace-oldest with fail-stale,
// coalesce with block, reject with fail-stale; 150ms leases, so that
// abandoned slots expire and are taken over during the run), checks the
// history with porcupine, drains the keys and audits every revision.
func TestLinearizableUnderConcurrency(t *testing.T) {
	t.Parallel()
	seed := reliabilitySeed(t)
	clients, opsPerClient, timeout := 6, 250, 30*time.Second
	if reliabilityLong() {
		clients, opsPerClient, timeout = 16, 1500, 5*time.Minute
	}
	s := linServer(t)
	const service, jobType = "lin", "work"
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	_, js := natstest.Connect(t, s)
	bucket := auditCreateBucket(t, ctx, js, service, 1, jetstream.FileStorage)
	ttl := 150 * time.Millisecond
	keys := []linKey{
		newLinKey(t, service, jobType, "a", Policy{MaxActive: 1, MaxQueuedPerKey: 1, WhenFull: ReplaceOldest, StalePolicy: FailStale, HeartbeatTTL: ttl, HeartbeatInterval: ttl / 3}),
		newLinKey(t, service, jobType, "b", Policy{MaxActive: 2, MaxQueuedPerKey: 1, WhenFull: Coalesce, StalePolicy: Block, HeartbeatTTL: ttl, HeartbeatInterval: ttl / 3}),
		newLinKey(t, service, jobType, "c", Policy{MaxActive: 1, MaxQueuedPerKey: 0, WhenFull: Reject, StalePolicy: FailStale, HeartbeatTTL: ttl, HeartbeatInterval: ttl / 3}),
	}
	rec := newLinRecorder()
	pool := &linPool{jobs: make([][]string, len(keys))}
	var wg sync.WaitGroup
	cs := make([]*linClient, clients)
	for i := range cs {
		cs[i] = newLinClient(t, i, s.ClientURL(), service, jobType, keys, rec)
	}
	// Two more clients share client 0's coordinator (its connection, state
	// cache and per-key lanes), as goroutines of one worker process do.
	for i := range 2 {
		sharing := &linClient{id: clients + i, service: service, jobType: jobType, keys: keys, rec: rec,
			instance: fmt.Sprintf("client-%d", clients+i), coord: cs[0].coord, nc: cs[0].nc, js: cs[0].js}
		cs = append(cs, sharing)
	}
	for i, c := range cs {
		wg.Go(func() { linRandomClient(ctx, c, pool, rand.New(rand.NewPCG(seed, uint64(i))), opsPerClient) })
	}
	wg.Wait()
	cs[0].drain(t, ctx)
	log := rec.log()
	for _, op := range log {
		if op.out.err != nil && !errors.Is(op.out.err, ErrContention) {
			t.Errorf("client %d: %s %s: %v", op.client, op.in.kind, op.in.job, op.out.err)
		}
	}
	t.Logf("%d clients (%d connections and coordinators), %d operations: %v", len(cs), clients, len(log), linCountOutcomes(log))
	linCheck(t, keys, log, timeout)
	sum := auditAll(t, js, bucket, log, linPolicyOf(keys), true)
	if sum.TakenOver == 0 {
		t.Logf("no slot was taken over in this run")
	}
}

// TestLinearizabilityCheckerRejects shows that the checker can fail: a
// real sequential history passes, and the same history with one outcome
// moved before the operation that made it possible does not.
func TestLinearizabilityCheckerRejects(t *testing.T) {
	t.Parallel()
	const service, jobType = "lincheck", "work"
	keys := []linKey{newLinKey(t, service, jobType, "a", Policy{MaxActive: 1, MaxQueuedPerKey: 1})}
	rec := newLinRecorder()
	c := newLinStoreClient(t, 0, NewMemoryStore(), service, jobType, keys, rec)
	ctx := context.Background()
	c.admit(ctx, 0, "j1", false, TraceContext{})
	c.admit(ctx, 0, "j2", false, TraceContext{})
	first := c.acquire(ctx, 0, "j1", false, 0, TraceContext{})
	c.release(ctx, 0, first.acquisition.Lease)
	second := c.acquire(ctx, 0, "j2", false, 0, TraceContext{})
	c.release(ctx, 0, second.acquisition.Lease)
	log := rec.log()
	require.Equal(t, KindAcquired, first.acquisition.Kind, "setup: first acquisition")
	require.Equal(t, KindAcquired, second.acquisition.Kind, "setup: second acquisition")
	require.Equal(t, porcupine.Ok, linCheck(t, keys, log, 10*time.Second), "a sequential history")
	// j2's acquisition now seems to finish before j1's release started:
	// with MaxActive 1 it must have been blocked.
	tampered := make([]*linOp, len(log))
	for i, op := range log {
		cp := *op
		tampered[i] = &cp
	}
	tampered[4].call, tampered[4].ret = tampered[2].ret+1, tampered[2].ret+2
	model := linModel(keys)
	history := make([]porcupine.Operation, 0, len(tampered))
	for _, op := range tampered {
		history = append(history, porcupine.Operation{ClientId: op.client, Input: op.in, Output: op.out, Call: op.call, Return: op.ret})
	}
	require.Equal(t, porcupine.Illegal, porcupine.CheckOperationsTimeout(model, history, 10*time.Second),
		"a history with two overlapping slots on a MaxActive 1 key")
	// A renewal that reports a lease lost while its slot exists is illegal.
	lost := *log[3]
	lost.in.kind, lost.out = opRenew, linOutput{renewal: Renewal{Kind: KindLost}}
	lost.call, lost.ret = log[2].ret+1, log[2].ret+2
	history = history[:0]
	for _, op := range append(slices.Clone(log[:3]), &lost) {
		history = append(history, porcupine.Operation{ClientId: op.client, Input: op.in, Output: op.out, Call: op.call, Return: op.ret})
	}
	require.Equal(t, porcupine.Illegal, porcupine.CheckOperationsTimeout(model, history, 10*time.Second),
		"a renewal reported lost while its slot is held")
}

// linStaleReads looks for the usual cause of an illegal history on a
// replicated bucket: an operation that wrote nothing and whose outcome fits
// only a state older than one some other operation had already written,
// and been told so, before this operation was called. It returns a
// description of each such operation (at most limit).
func linStaleReads(keys []linKey, log []*linOp, entries []auditEntry, limit int) []string {
	type rev struct {
		rev   uint64
		state *modelState
	}
	keyIndex := map[string]int{}
	for i, k := range keys {
		keyIndex[k.key.KVKey] = i
	}
	history := make([][]rev, len(keys))
	revOf := map[string]uint64{}
	for _, e := range entries {
		k, ok := keyIndex[e.key]
		if !ok {
			continue
		}
		var st *modelState
		if !e.deleted && e.err == nil {
			st = modelFromState(e.state)
			revOf[string(e.value)] = e.rev
		}
		history[k] = append(history[k], rev{e.rev, st})
	}
	// Acknowledged writes per key in order of return, with the newest
	// revision acknowledged so far.
	type ack struct {
		ret   int64
		floor uint64
		by    *linOp
	}
	acks := make([][]ack, len(keys))
	writes := slices.Clone(log)
	slices.SortFunc(writes, func(a, b *linOp) int { return int(a.ret - b.ret) })
	for _, w := range writes {
		st := w.state()
		if st == nil || st.Empty() {
			continue
		}
		k := w.in.key
		a := ack{ret: w.ret, by: w, floor: revOf[string(appendState(nil, st))]}
		if n := len(acks[k]); n > 0 && acks[k][n-1].floor > a.floor {
			a.floor, a.by = acks[k][n-1].floor, acks[k][n-1].by
		}
		acks[k] = append(acks[k], a)
	}
	var found []string
	for _, op := range log {
		if op.out.err != nil || op.state() != nil {
			continue
		}
		// The newest revision of this key acknowledged before op was called.
		list := acks[op.in.key]
		i, _ := slices.BinarySearchFunc(list, op.call, func(a ack, call int64) int {
			if a.ret < call {
				return -1
			}
			return 1
		})
		if i == 0 {
			continue
		}
		floor, by := list[i-1].floor, list[i-1].by
		if floor == 0 {
			continue
		}
		fits := func(st *modelState) bool { return linOutcomeFits(keys[op.in.key], st, op) }
		newer, older := false, uint64(0)
		h := history[op.in.key]
		at, _ := slices.BinarySearchFunc(h, floor, func(r rev, floor uint64) int { return int(int64(r.rev) - int64(floor)) })
		// A window around the floor: no operation here overlaps hundreds
		// of writes to its key.
		for _, r := range h[max(0, at-64):min(len(h), at+256)] {
			if r.rev >= floor {
				if fits(r.state) {
					newer = true
					break
				}
			} else if fits(r.state) {
				older = r.rev
			}
		}
		if !newer && older > 0 {
			found = append(found, fmt.Sprintf("client %d: %s %s returned %s %s, which fits revision %d of %s but no revision from %d on; "+
				"revision %d had been written by client %d's %s %s, which returned %v before this call",
				op.client, op.in.kind, op.in.job, op.kind(), op.out.acquisition.Reason, older, keys[op.in.key].key.KVKey, floor,
				floor, by.client, by.in.kind, by.in.job, time.Duration(op.call-by.ret)))
			if len(found) >= limit {
				break
			}
		}
	}
	return found
}

// linOutcomeFits reports whether op's outcome, which wrote nothing, is the
// outcome the model gives on state st of key k at some instant of op: its
// earliest clock reading, or the expiry of a slot of st within op.
func linOutcomeFits(k linKey, st *modelState, op *linOp) bool {
	candidates := []int64{op.in.lo}
	if st != nil {
		for _, a := range st.active {
			if a.expires > op.in.lo && a.expires <= op.in.hi {
				candidates = append(candidates, a.expires)
			}
		}
	}
	for _, now := range candidates {
		if r := linApply(k.mp, st, op.in, op.out, now); !r.changed && linDiff(op.in, op.out, r) == "" {
			return true
		}
	}
	return false
}

// linExplain describes where the longest linearization porcupine found
// stops, in the first partition that has one: the model state it reached
// and the operation that returned earliest among those it could not place.
func linExplain(model porcupine.Model, info *porcupine.LinearizationInfo, history []porcupine.Operation) string {
	for _, partials := range info.PartialLinearizationsOperations() {
		var longest []porcupine.Operation
		for _, p := range partials {
			if len(p) > len(longest) {
				longest = p
			}
		}
		if len(longest) == 0 {
			continue
		}
		total := 0
		for _, op := range history {
			if op.Input.(linInput).key == longest[0].Input.(linInput).key {
				total++
			}
		}
		if len(longest) == total {
			continue // this partition is linearizable
		}
		placed := map[int64]bool{}
		state := model.Init()
		var b strings.Builder
		for i, op := range longest {
			placed[op.Call] = true
			_, state = model.Step(state, op.Input, op.Output)
			if i >= len(longest)-4 {
				fmt.Fprintf(&b, "  placed: client %d %s\n", op.ClientId, model.DescribeOperation(op.Input, op.Output))
			}
		}
		fmt.Fprintf(&b, "  state then: %s\n", model.DescribeState(state))
		key := longest[0].Input.(linInput).key
		var stuck *porcupine.Operation
		for i := range history {
			op := &history[i]
			if op.Input.(linInput).key == key && !placed[op.Call] && (stuck == nil || op.Return < stuck.Return) {
				stuck = op
			}
		}
		if stuck != nil {
			fmt.Fprintf(&b, "  cannot place (earliest return among the rest): client %d %s, called %v after the last placed call\n",
				stuck.ClientId, model.DescribeOperation(stuck.Input, stuck.Output), time.Duration(stuck.Call-longest[len(longest)-1].Call))
		}
		return b.String()
	}
	return ""
}
