// Package jobstest is the conformance suite for implementations of
// [jobs.Store]: every rule of the job store, checked the same way against
// every store (river's riverdrivertest pattern). A store's tests call [Run]
// with a constructor; the suite builds each store with its own [jobs.Config]
// (a fake clock, a channel registry, a guard and a subject function) and
// checks orderings, copies, fencing and the revision contract without ever
// relying on exact revision numbers.
//
// A store's test runs it with a constructor that builds an empty store from
// the suite's config:
//
//	func TestMyStore(t *testing.T) {
//		jobstest.Run(t, func(t *testing.T, cfg *jobs.Config) jobs.Store {
//			s, err := mystore.New(cfg) // an empty store, e.g. over a bucket of its own
//			if err != nil {
//				t.Fatal(err)
//			}
//			t.Cleanup(func() { s.Close() })
//			return s
//		})
//	}
//
// The suite's registry treats channels named "missing…" as absent and
// "archived…" as archived; its Subject is the input's "subject" field.
// The package uses only the standard testing package, so importing it adds
// no dependency to a module.
package jobstest

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jobkeys/jobkeys/jobs"
)

// Run runs the conformance suite against the stores newStore builds: one
// parallel subtest per rule, and the model test ([RunModel]) as subtest
// "Model".
//
// newStore builds the store under test for one subtest. It must use cfg as
// given (its clock, registry, guard and subject) and return a store with no
// jobs (for NATSStore: its own bucket). It is called from parallel
// subtests; cleanup belongs in t.Cleanup.
func Run(t *testing.T, newStore func(t *testing.T, cfg *jobs.Config) jobs.Store) {
	t.Helper()
	for _, tc := range suite {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			tc.fn(t, setup(t, newStore))
		})
	}
	t.Run("Model", func(t *testing.T) {
		t.Parallel()
		RunModel(t, newStore)
	})
}

// suite lists the rule tests; each file adds its own with register.
var suite []struct {
	name string
	fn   func(t *testing.T, h *harness)
}

func register(name string, fn func(t *testing.T, h *harness)) {
	suite = append(suite, struct {
		name string
		fn   func(t *testing.T, h *harness)
	}{name, fn})
}

// start is the fake clock's first reading.
var start = time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)

// clock is a fake clock: it moves only when told.
type clock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *clock) Advance(d time.Duration) time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
	return c.t
}

func (c *clock) Set(t time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = t
}

// registry is a fake channel registry: channels named "missing…" do not
// exist, channels named "archived…" exist but are inactive; err, when set,
// fails every question.
type registry struct {
	mu  sync.Mutex
	err error
}

func (r *registry) fail(err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.err = err
}

func (r *registry) ChannelExists(_ context.Context, id string) (bool, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.err != nil {
		return false, r.err
	}
	return !strings.HasPrefix(id, "missing"), nil
}

func (r *registry) ChannelActive(_ context.Context, id string) (bool, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.err != nil {
		return false, r.err
	}
	return !strings.HasPrefix(id, "missing") && !strings.HasPrefix(id, "archived"), nil
}

// guard is a fake Config.Guard that fails while err is set and counts its
// calls.
type guard struct {
	mu    sync.Mutex
	err   error
	calls int
}

func (g *guard) check(context.Context) error {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.calls++
	return g.err
}

func (g *guard) count() int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.calls
}

func (g *guard) fail(err error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.err = err
}

// subject is the suite's Config.Subject: the "subject" string of an object
// input, prefixed with the job type.
func subject(jobType string, input json.RawMessage) string {
	var v struct {
		Subject string `json:"subject"`
	}
	if json.Unmarshal(input, &v) != nil || v.Subject == "" {
		return ""
	}
	return jobType + ": " + v.Subject
}

// harness is one subtest's store with its fakes.
type harness struct {
	t     *testing.T
	store jobs.Store
	clock *clock
	reg   *registry
	guard *guard
	ctx   context.Context
	ch    string // the default channel
}

func setup(t *testing.T, newStore func(t *testing.T, cfg *jobs.Config) jobs.Store) *harness {
	t.Helper()
	h := &harness{t: t, clock: &clock{t: start}, reg: &registry{}, guard: &guard{}, ctx: context.Background(), ch: "chan-a"}
	h.store = newStore(t, &jobs.Config{Now: h.clock.Now, Channels: h.reg, Guard: h.guard.check, Subject: subject})
	if h.store == nil {
		t.Fatal("newStore returned nil")
	}
	return h
}

// req is an enqueue request for job id of target in the default channel,
// with an idempotency key and fingerprint derived from the id.
func (h *harness) req(id, target string) jobs.EnqueueRequest {
	return jobs.EnqueueRequest{
		ID: id, ChannelID: h.ch, Type: "render", Version: 1, Origin: "user",
		TargetKey: target, IdempotencyKey: "idem-" + id, Fingerprint: "fp-" + id,
		Input: json.RawMessage(`{"subject": "` + id + `", "n": 1}`),
	}
}

// enqueue enqueues and fails the test on error or a replay.
func (h *harness) enqueue(req jobs.EnqueueRequest) jobs.Job {
	h.t.Helper()
	out, err := h.store.Enqueue(h.ctx, req)
	if err != nil {
		h.t.Fatalf("Enqueue(%s): %v", req.ID, err)
	}
	if out.Repeated {
		h.t.Fatalf("Enqueue(%s): Repeated, want a new job", req.ID)
	}
	return out.Job
}

// add enqueues job id of target in the default channel.
func (h *harness) add(id, target string) jobs.Job {
	h.t.Helper()
	return h.enqueue(h.req(id, target))
}

// claim claims in the default channel and fails the test on error.
func (h *harness) claim(owner string, count int, ttl time.Duration) []jobs.Job {
	h.t.Helper()
	got, err := h.store.Claim(h.ctx, jobs.ClaimRequest{ChannelID: h.ch, Owner: owner, Count: count, TTL: ttl})
	if err != nil {
		h.t.Fatalf("Claim(%s, %d): %v", owner, count, err)
	}
	return got
}

// claimOne claims exactly one job and checks it is want.
func (h *harness) claimOne(owner, want string, ttl time.Duration) jobs.Job {
	h.t.Helper()
	got := h.claim(owner, 1, ttl)
	if len(got) != 1 || got[0].ID != want {
		h.t.Fatalf("Claim(%s): got %v, want [%s]", owner, ids(got), want)
	}
	return got[0]
}

// get reads a job of the default channel and fails the test on error.
func (h *harness) get(id string) jobs.Detail {
	h.t.Helper()
	d, err := h.store.Get(h.ctx, h.ch, id)
	if err != nil {
		h.t.Fatalf("Get(%s): %v", id, err)
	}
	return d
}

// rev is the default channel's revision, as a list page reports it.
func (h *harness) rev() uint64 {
	h.t.Helper()
	return h.revOf(h.ch)
}

func (h *harness) revOf(ch string) uint64 {
	h.t.Helper()
	p, err := h.store.List(h.ctx, jobs.ListRequest{ChannelID: ch, Limit: 1})
	if err != nil {
		h.t.Fatalf("List(%s): %v", ch, err)
	}
	return p.Revision
}

// unchanged fails the test when the channel revision moved from before:
// a refused request must write nothing.
func (h *harness) unchanged(before uint64, what string) {
	h.t.Helper()
	if got := h.rev(); got != before {
		h.t.Errorf("%s: channel revision moved from %d to %d; a refused request must write nothing", what, before, got)
	}
}

func ids(js []jobs.Job) []string {
	out := make([]string, len(js))
	for i, j := range js {
		out[i] = j.ID
	}
	return out
}

func summaryIDs(ss []jobs.Summary) []string {
	out := make([]string, len(ss))
	for i, s := range ss {
		out[i] = s.ID
	}
	return out
}

// wantErr fails the test unless err matches kind (errors.Is) and its
// message contains each of words.
func wantErr(t *testing.T, err, kind error, what string, words ...string) {
	t.Helper()
	if err == nil {
		t.Errorf("%s: no error, want %v", what, kind)
		return
	}
	if !errors.Is(err, kind) {
		t.Errorf("%s: error %q is not %v", what, err, kind)
		return
	}
	for _, w := range words {
		if !strings.Contains(err.Error(), w) {
			t.Errorf("%s: error %q does not mention %q", what, err, w)
		}
	}
}

// noErr fails the test now on an error.
func noErr(t *testing.T, err error, what string) {
	t.Helper()
	if err != nil {
		t.Fatalf("%s: %v", what, err)
	}
}

// equal fails the test (going on) unless got and want are deeply equal.
func equal[T any](t *testing.T, got, want T, what string) bool {
	t.Helper()
	if !reflect.DeepEqual(got, want) {
		t.Errorf("%s:\n got %+v\nwant %+v", what, got, want)
		return false
	}
	return true
}

// sameTime fails the test unless got and want are the same instant.
func sameTime(t *testing.T, got, want time.Time, what string) {
	t.Helper()
	if !got.Equal(want) {
		t.Errorf("%s: got %s, want %s", what, got.Format(time.RFC3339Nano), want.Format(time.RFC3339Nano))
	}
}

// sameJSON fails the test unless got is the JSON want (compared as values;
// nil and empty are "no value").
func sameJSON(t *testing.T, got json.RawMessage, want string, what string) {
	t.Helper()
	if want == "" {
		if len(got) != 0 {
			t.Errorf("%s: got %s, want none", what, got)
		}
		return
	}
	var g, w any
	if err := json.Unmarshal(got, &g); err != nil {
		t.Errorf("%s: got %q, not JSON: %v", what, got, err)
		return
	}
	if err := json.Unmarshal([]byte(want), &w); err != nil {
		panic(fmt.Sprintf("jobstest: bad want JSON %q", want))
	}
	if !reflect.DeepEqual(g, w) {
		t.Errorf("%s: got %s, want %s", what, got, want)
	}
}
