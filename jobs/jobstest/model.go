package jobstest

import (
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jobkeys/jobkeys/jobs"
)

// Environment variables of the model test.
const (
	// SeedEnv replays a model run: set it to the seed a failure printed.
	SeedEnv = "JOBKEYS_SEED"
	// OpsEnv sets how many operations each model run makes (default 300).
	OpsEnv = "JOBKEYS_MODEL_OPS"
)

// RunModel runs random operation sequences against stores newStore builds
// and against a simple model of the rules written independently of the
// stores, comparing every outcome (conflict, not found or the changed jobs)
// and, now and then, every job and the list order. The seed is printed;
// set JOBKEYS_SEED to replay it and JOBKEYS_MODEL_OPS to change the length.
// [Run] calls it as its "Model" subtest.
func RunModel(t *testing.T, newStore func(t *testing.T, cfg *jobs.Config) jobs.Store) {
	t.Helper()
	seed := uint64(time.Now().UnixNano())
	if s := os.Getenv(SeedEnv); s != "" {
		v, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			t.Fatalf("%s=%q: %v", SeedEnv, s, err)
		}
		seed = v
	}
	ops := 300
	if s := os.Getenv(OpsEnv); s != "" {
		v, err := strconv.Atoi(s)
		if err != nil || v < 1 {
			t.Fatalf("%s=%q: want a positive number", OpsEnv, s)
		}
		ops = v
	}
	t.Logf("model seed %d (replay with %s=%d), %d operations per run", seed, SeedEnv, seed, ops)
	for run := range 2 {
		h := setup(t, newStore)
		m := &modelRun{t: t, h: h, rnd: rand.New(rand.NewPCG(seed, uint64(run))), seed: seed, m: newModel()}
		for i := range ops {
			m.step = i
			m.op()
			if t.Failed() {
				t.Fatalf("model run %d (seed %d) failed at operation %d; the last operations:\n%s", run, seed, i, strings.Join(m.log, "\n"))
			}
		}
		m.checkAll()
	}
}

// ---- the model ----

type mJob struct {
	id, ch, target, idem, fp string
	gen                      uint64
	state                    jobs.State
	attempts, failures       int
	claimGen                 uint64
	owner                    string
	expires                  time.Time
	available                time.Time
	created, updated         time.Time
	reason                   string
	progress                 []string // labels, the last ProgressLimit
	rev                      uint64   // the revision last seen; 0 unknown
	artifact                 *string
}

type mChannel struct {
	ids     []string // job ids in enqueue order
	jobs    map[string]*mJob
	targets map[string]uint64
	idem    map[string]string
	rev     uint64 // the highest revision seen; every change goes above it
}

type model struct {
	chans map[string]*mChannel
}

func newModel() *model { return &model{chans: map[string]*mChannel{}} }

func (m *model) channel(id string) *mChannel {
	c := m.chans[id]
	if c == nil {
		c = &mChannel{jobs: map[string]*mJob{}, targets: map[string]uint64{}, idem: map[string]string{}}
		m.chans[id] = c
	}
	return c
}

func active(s jobs.State) bool {
	return s == jobs.StatePending || s == jobs.StatePaused || s == jobs.StateRunning
}

// outcome kinds
const (
	okay     = "ok"
	conflict = "conflict"
	notFound = "not found"
)

func kindOf(err error) string {
	switch {
	case err == nil:
		return okay
	case errors.Is(err, jobs.ErrConflict):
		return conflict
	case errors.Is(err, jobs.ErrNotFound):
		return notFound
	}
	return "unexpected error: " + err.Error()
}

type modelRun struct {
	t      *testing.T
	h      *harness
	rnd    *rand.Rand
	seed   uint64
	step   int
	m      *model
	nextID int
	claims []jobs.Claim
	log    []string
}

var modelChannels = []string{"m-a", "m-b"}

func (r *modelRun) logf(format string, args ...any) {
	r.log = append(r.log, fmt.Sprintf("%4d %s: ", r.step, r.h.clock.Now().Sub(start))+fmt.Sprintf(format, args...))
	if len(r.log) > 25 {
		r.log = r.log[1:]
	}
}

func (r *modelRun) now() time.Time { return r.h.clock.Now() }

func (r *modelRun) pick(n int) int { return r.rnd.IntN(n) }

func (r *modelRun) op() {
	switch x := r.pick(100); {
	case x < 22:
		r.enqueue()
	case x < 40:
		r.claim()
	case x < 47:
		r.renew()
	case x < 52:
		r.requeue()
	case x < 59:
		r.progress()
	case x < 66:
		r.settle()
	case x < 69:
		r.fail()
	case x < 79:
		r.control()
	case x < 89:
		d := time.Duration(r.pick(2500)) * time.Millisecond
		r.h.clock.Advance(d)
		r.logf("advance %v", d)
	case x < 94:
		r.get()
	case x < 98:
		r.list()
	default:
		if r.pick(4) == 0 {
			r.deleteChannel()
		} else {
			r.get()
		}
	}
}

// expect fails the run unless the store's outcome is the model's.
func (r *modelRun) expect(what, want string, err error) bool {
	r.t.Helper()
	if got := kindOf(err); got != want {
		r.t.Errorf("%s: store says %s (%v), model says %s", what, got, err, want)
		return false
	}
	return want == okay
}

// seen records a changed job the store returned: its revision must be
// above every revision seen before the call in its channel (before).
func (r *modelRun) seen(what string, got jobs.Job, mj *mJob, before uint64) {
	r.t.Helper()
	if got.Revision <= before {
		r.t.Errorf("%s: job %s Revision %d not above the channel's %d", what, got.ID, got.Revision, before)
	}
	mj.rev = got.Revision
	c := r.m.channel(mj.ch)
	c.rev = max(c.rev, got.Revision)
	r.compare(what, got, mj)
}

// compare fails the run when the store's job differs from the model's.
func (r *modelRun) compare(what string, got jobs.Job, mj *mJob) {
	r.t.Helper()
	diffs := []string{}
	check := func(field string, g, w any) {
		if fmt.Sprint(g) != fmt.Sprint(w) {
			diffs = append(diffs, fmt.Sprintf("%s: store %v, model %v", field, g, w))
		}
	}
	tm := func(t time.Time) string {
		if t.IsZero() {
			return "zero"
		}
		return t.UTC().Format(time.RFC3339Nano)
	}
	check("ID", got.ID, mj.id)
	check("ChannelID", got.ChannelID, mj.ch)
	check("TargetKey", got.TargetKey, mj.target)
	check("TargetGeneration", got.TargetGeneration, mj.gen)
	check("IdempotencyKey", got.IdempotencyKey, mj.idem)
	check("Fingerprint", got.Fingerprint, mj.fp)
	check("State", got.State, mj.state)
	check("Attempts", got.Attempts, mj.attempts)
	check("Failures", got.Failures, mj.failures)
	check("ClaimGeneration", got.ClaimGeneration, mj.claimGen)
	check("ClaimOwner", got.ClaimOwner, mj.owner)
	check("ClaimExpiresAt", tm(got.ClaimExpiresAt), tm(mj.expires))
	check("AvailableAt", tm(got.AvailableAt), tm(mj.available))
	check("CreatedAt", tm(got.CreatedAt), tm(mj.created))
	check("UpdatedAt", tm(got.UpdatedAt), tm(mj.updated))
	check("Reason", got.Reason, mj.reason)
	labels := make([]string, len(got.Progress))
	for i, p := range got.Progress {
		labels[i] = p.Label
	}
	check("Progress", labels, mj.progress)
	if mj.rev != 0 {
		check("Revision", got.Revision, mj.rev)
	}
	if len(diffs) > 0 {
		r.t.Errorf("%s: job %s/%s differs:\n  %s", what, mj.ch, mj.id, strings.Join(diffs, "\n  "))
	}
}

// ---- operations ----

func (r *modelRun) enqueue() {
	ch := modelChannels[r.pick(len(modelChannels))]
	if r.pick(30) == 0 {
		ch = "missing-m"
	}
	key := fmt.Sprintf("k%d", r.pick(10))
	fp := "fp-" + key
	if r.pick(6) == 0 {
		fp = "other"
	}
	r.nextID++
	id := fmt.Sprintf("j%04d", r.nextID)
	c := r.m.channel(ch)
	if r.pick(15) == 0 && len(c.ids) > 0 {
		id = c.ids[r.pick(len(c.ids))] // an id taken in this channel
	}
	target := fmt.Sprintf("t%d", r.pick(3))
	var avail time.Time
	switch r.pick(5) {
	case 0:
		avail = r.now().Add(time.Duration(r.pick(3000)) * time.Millisecond)
	case 1:
		avail = r.now().Add(-time.Second)
	}
	req := jobs.EnqueueRequest{ID: id, ChannelID: ch, Type: "model", Version: 1, TargetKey: target,
		IdempotencyKey: key, Fingerprint: fp, Input: json.RawMessage(`{"id":"` + id + `"}`), AvailableAt: avail}
	what := fmt.Sprintf("enqueue %s/%s key %s fp %s target %s", ch, id, key, fp, target)
	r.logf("%s", what)
	out, err := r.h.store.Enqueue(r.h.ctx, req)

	now := r.now()
	if ch == "missing-m" {
		delete(r.m.chans, ch)
		r.expect(what, notFound, err)
		return
	}
	if prev, ok := c.idem[key]; ok {
		mj := c.jobs[prev]
		if mj.fp != fp {
			r.expect(what, conflict, err)
			return
		}
		if r.expect(what, okay, err) {
			if !out.Repeated {
				r.t.Errorf("%s: not Repeated", what)
			}
			r.compare(what+" (replay)", out.Job, mj)
		}
		return
	}
	if c.jobs[id] != nil {
		r.expect(what, conflict, err)
		return
	}
	before := c.rev
	gen := c.targets[target] + 1
	for _, oid := range c.ids {
		o := c.jobs[oid]
		if o.target == target && o.gen < gen && active(o.state) {
			o.state = jobs.StateSuperseded
			o.owner, o.expires, o.reason, o.updated, o.rev = "", time.Time{}, "", now, 0
		}
	}
	if avail.IsZero() {
		avail = now
	}
	mj := &mJob{id: id, ch: ch, target: target, idem: key, fp: fp, gen: gen, state: jobs.StatePending,
		available: avail, created: now, updated: now}
	c.targets[target] = gen
	c.idem[key] = id
	c.jobs[id] = mj
	c.ids = append(c.ids, id)
	if r.expect(what, okay, err) {
		if out.Repeated {
			r.t.Errorf("%s: Repeated for a new key", what)
		}
		r.seen(what, out.Job, mj, before)
	}
}

func (r *modelRun) claim() {
	ch := ""
	if x := r.pick(3); x > 0 {
		ch = modelChannels[x-1]
	}
	owner := fmt.Sprintf("w%d", r.pick(2))
	count := 1 + r.pick(4)
	ttl := time.Duration(1+r.pick(5)) * time.Second
	what := fmt.Sprintf("claim %q owner %s count %d ttl %v", ch, owner, count, ttl)
	r.logf("%s", what)
	got, err := r.h.store.Claim(r.h.ctx, jobs.ClaimRequest{ChannelID: ch, Owner: owner, Count: count, TTL: ttl})
	now := r.now()
	due := func(j *mJob) time.Time {
		if j.state == jobs.StateRunning {
			return j.expires
		}
		return j.available
	}
	var eligible []*mJob
	for _, name := range modelChannels {
		c := r.m.chans[name]
		if c == nil || ch != "" && ch != name {
			continue
		}
		for _, id := range c.ids {
			j := c.jobs[id]
			if j.gen != c.targets[j.target] {
				continue
			}
			if j.state == jobs.StatePending && !j.available.After(now) || j.state == jobs.StateRunning && !j.expires.After(now) {
				eligible = append(eligible, j)
			}
		}
	}
	slices.SortStableFunc(eligible, func(a, b *mJob) int {
		if c := due(a).Compare(due(b)); c != 0 {
			return c
		}
		if c := a.created.Compare(b.created); c != 0 {
			return c
		}
		if c := strings.Compare(a.id, b.id); c != 0 {
			return c
		}
		return strings.Compare(a.ch, b.ch)
	})
	eligible = eligible[:min(len(eligible), count)]
	if !r.expect(what, okay, err) {
		return
	}
	var want, have []string
	for _, j := range eligible {
		want = append(want, j.ch+"/"+j.id)
	}
	for _, j := range got {
		have = append(have, j.ChannelID+"/"+j.ID)
	}
	if !slices.Equal(want, have) {
		r.t.Errorf("%s: store claimed %v, model %v", what, have, want)
		return
	}
	before := map[string]uint64{}
	for _, j := range eligible {
		if _, ok := before[j.ch]; !ok {
			before[j.ch] = r.m.chans[j.ch].rev
		}
	}
	for i, j := range eligible {
		j.state, j.attempts, j.claimGen, j.owner = jobs.StateRunning, j.attempts+1, j.claimGen+1, owner
		j.expires, j.reason, j.updated = now.Add(ttl), "", now
		r.seen(what, got[i], j, before[j.ch])
		r.claims = append(r.claims, jobs.ClaimOf(got[i]))
	}
	if len(r.claims) > 40 {
		r.claims = r.claims[len(r.claims)-40:]
	}
}

// held picks a claim handed out before (current or stale), or nil.
func (r *modelRun) held() *jobs.Claim {
	if len(r.claims) == 0 {
		return nil
	}
	// Prefer recent claims: they are more often still valid.
	i := len(r.claims) - 1 - r.pick(min(len(r.claims), 1+r.pick(8)))
	c := r.claims[i]
	return &c
}

// fence is the model's claimed-call check; it returns the job and the
// outcome.
func (r *modelRun) fence(c jobs.Claim) (*mJob, string) {
	mc := r.m.chans[c.ChannelID]
	if mc == nil || mc.jobs[c.JobID] == nil {
		return nil, notFound
	}
	j := mc.jobs[c.JobID]
	if j.state != jobs.StateRunning || j.owner != c.Owner || j.claimGen != c.Generation ||
		!j.expires.After(r.now()) || j.gen != mc.targets[j.target] {
		return j, conflict
	}
	return j, okay
}

func (r *modelRun) renew() {
	c := r.held()
	if c == nil {
		return
	}
	ttl := time.Duration(1+r.pick(6)) * time.Second
	j, want := r.fence(*c)
	var expected uint64
	if j != nil {
		expected = j.rev
		if r.pick(8) == 0 {
			expected--
		}
	}
	what := fmt.Sprintf("renew %s/%s gen %d owner %s expected %d ttl %v", c.ChannelID, c.JobID, c.Generation, c.Owner, expected, ttl)
	r.logf("%s", what)
	got, err := r.h.store.Renew(r.h.ctx, jobs.RenewRequest{Claim: *c, ExpectedRevision: expected, TTL: ttl})
	now := r.now()
	if want == okay && (expected != j.rev || j.rev == 0 || !now.Add(ttl).After(j.expires)) {
		want = conflict
	}
	if r.expect(what, want, err) {
		before := r.m.chans[j.ch].rev
		j.expires, j.updated = now.Add(ttl), now
		r.seen(what, got, j, before)
	}
}

func (r *modelRun) requeue() {
	c := r.held()
	if c == nil {
		return
	}
	count := r.pick(2) == 0
	var avail time.Time
	if r.pick(2) == 0 {
		avail = r.now().Add(time.Duration(r.pick(2000)) * time.Millisecond)
	}
	reason := fmt.Sprintf("r%d", r.step)
	what := fmt.Sprintf("requeue %s/%s gen %d owner %s count %v", c.ChannelID, c.JobID, c.Generation, c.Owner, count)
	r.logf("%s", what)
	got, err := r.h.store.Requeue(r.h.ctx, jobs.RequeueRequest{Claim: *c, AvailableAt: avail, Reason: reason, CountFailure: count})
	j, want := r.fence(*c)
	if r.expect(what, want, err) {
		now := r.now()
		before := r.m.chans[j.ch].rev
		if avail.IsZero() {
			avail = now
		}
		j.state, j.owner, j.expires, j.available, j.reason, j.updated = jobs.StatePending, "", time.Time{}, avail, reason, now
		if count {
			j.failures++
		}
		r.seen(what, got, j, before)
	}
}

func (r *modelRun) progress() {
	c := r.held()
	if c == nil {
		return
	}
	label := fmt.Sprintf("p%d", r.step)
	what := fmt.Sprintf("progress %s/%s gen %d owner %s", c.ChannelID, c.JobID, c.Generation, c.Owner)
	r.logf("%s", what)
	got, err := r.h.store.AppendProgress(r.h.ctx, jobs.ProgressRequest{Claim: *c, Stage: "work", Label: label, State: jobs.ProgressStarted})
	j, want := r.fence(*c)
	if r.expect(what, want, err) {
		before := r.m.chans[j.ch].rev
		j.progress = append(j.progress, label)
		if len(j.progress) > jobs.ProgressLimit {
			j.progress = j.progress[1:]
		}
		j.updated = r.now()
		r.seen(what, got, j, before)
	}
}

func (r *modelRun) settle() {
	c := r.held()
	if c == nil {
		return
	}
	value := fmt.Sprintf(`{"step":%d}`, r.step)
	what := fmt.Sprintf("settle %s/%s gen %d owner %s", c.ChannelID, c.JobID, c.Generation, c.Owner)
	r.logf("%s", what)
	d, err := r.h.store.Settle(r.h.ctx, jobs.SettleRequest{Claim: *c, Artifact: json.RawMessage(value)})
	j, want := r.fence(*c)
	if r.expect(what, want, err) {
		before := r.m.chans[j.ch].rev
		j.state, j.owner, j.expires, j.reason, j.updated = jobs.StateCompleted, "", time.Time{}, "", r.now()
		j.artifact = &value
		r.seen(what, d.Job, j, before)
		if d.Artifact == nil || string(d.Artifact.Value) != value || d.Artifact.Revision != d.Job.Revision {
			r.t.Errorf("%s: artifact %+v, want %s at revision %d", what, d.Artifact, value, d.Job.Revision)
		}
	}
}

func (r *modelRun) fail() {
	c := r.held()
	if c == nil {
		return
	}
	what := fmt.Sprintf("fail %s/%s gen %d owner %s", c.ChannelID, c.JobID, c.Generation, c.Owner)
	r.logf("%s", what)
	got, err := r.h.store.Fail(r.h.ctx, jobs.FailRequest{Claim: *c, Reason: "gave-up"})
	j, want := r.fence(*c)
	if r.expect(what, want, err) {
		before := r.m.chans[j.ch].rev
		j.state, j.owner, j.expires, j.reason, j.updated = jobs.StateFailed, "", time.Time{}, "gave-up", r.now()
		j.failures++
		r.seen(what, got, j, before)
	}
}

// control makes a pause, resume, cancel or supersede of a random job.
func (r *modelRun) control() {
	op := []string{"pause", "resume", "cancel", "supersede"}[r.pick(4)]
	ch := modelChannels[r.pick(len(modelChannels))]
	c := r.m.chans[ch]
	id := "nope"
	if c != nil && len(c.ids) > 0 && r.pick(20) > 0 {
		id = c.ids[r.pick(len(c.ids))]
		// Mostly a job the call applies to: most jobs end terminal,
		// where every control is a conflict.
		var live []string
		for _, x := range c.ids {
			if s := c.jobs[x].state; op == "resume" && s == jobs.StatePaused || op != "resume" && active(s) {
				live = append(live, x)
			}
		}
		if len(live) > 0 && r.pick(4) > 0 {
			id = live[r.pick(len(live))]
		}
	}
	var j *mJob
	if c != nil {
		j = c.jobs[id]
	}
	var expected uint64 = 1
	if j != nil {
		expected = j.rev
		if r.pick(8) == 0 {
			expected++
		}
	}
	what := fmt.Sprintf("%s %s/%s expected %d", op, ch, id, expected)
	r.logf("%s", what)
	var got jobs.Job
	var err error
	var from []jobs.State
	var to jobs.State
	reason := ""
	var avail time.Time
	switch op {
	case "pause":
		got, err = r.h.store.Pause(r.h.ctx, jobs.PauseRequest{ChannelID: ch, JobID: id, ExpectedRevision: expected, Reason: "hold"})
		from, to, reason = []jobs.State{jobs.StatePending, jobs.StateRunning}, jobs.StatePaused, "hold"
	case "resume":
		if r.pick(2) == 0 {
			avail = r.now().Add(time.Duration(r.pick(2000)) * time.Millisecond)
		}
		got, err = r.h.store.Resume(r.h.ctx, jobs.ResumeRequest{ChannelID: ch, JobID: id, ExpectedRevision: expected, AvailableAt: avail})
		from, to = []jobs.State{jobs.StatePaused}, jobs.StatePending
	case "cancel":
		got, err = r.h.store.Cancel(r.h.ctx, jobs.CancelRequest{ChannelID: ch, JobID: id})
		from, to = []jobs.State{jobs.StatePending, jobs.StatePaused, jobs.StateRunning}, jobs.StateCancelled
	case "supersede":
		got, err = r.h.store.Supersede(r.h.ctx, jobs.SupersedeRequest{ChannelID: ch, JobID: id, ExpectedRevision: expected, Reason: "op"})
		from, to, reason = []jobs.State{jobs.StatePending, jobs.StatePaused, jobs.StateRunning}, jobs.StateSuperseded, "op"
	}
	want := okay
	switch {
	case j == nil:
		want = notFound
	case op != "cancel" && (j.rev == 0 || expected != j.rev):
		want = conflict
	case !slices.Contains(from, j.state) || j.gen != c.targets[j.target]:
		want = conflict
	}
	if r.expect(what, want, err) {
		now := r.now()
		before := c.rev
		j.state, j.owner, j.expires, j.reason, j.updated = to, "", time.Time{}, reason, now
		if op == "resume" {
			if avail.IsZero() {
				avail = now
			}
			j.available = avail
		}
		r.seen(what, got, j, before)
	}
}

func (r *modelRun) get() {
	ch := modelChannels[r.pick(len(modelChannels))]
	c := r.m.chans[ch]
	if c == nil || len(c.ids) == 0 {
		return
	}
	j := c.jobs[c.ids[r.pick(len(c.ids))]]
	r.logf("get %s/%s", ch, j.id)
	r.checkJob(c, j)
}

func (r *modelRun) checkJob(c *mChannel, j *mJob) {
	r.t.Helper()
	d, err := r.h.store.Get(r.h.ctx, j.ch, j.id)
	what := "get " + j.ch + "/" + j.id
	if !r.expect(what, okay, err) {
		return
	}
	if j.rev == 0 {
		j.rev = d.Job.Revision // learnt: a change the store did not return
	}
	r.compare(what, d.Job, j)
	if d.Target.Generation != c.targets[j.target] {
		r.t.Errorf("%s: target generation %d, model %d", what, d.Target.Generation, c.targets[j.target])
	}
	if d.Revision < c.rev {
		r.t.Errorf("%s: Detail.Revision %d below a revision seen before, %d", what, d.Revision, c.rev)
	}
	switch {
	case j.artifact == nil && d.Artifact != nil:
		r.t.Errorf("%s: artifact %s, model none", what, d.Artifact.Value)
	case j.artifact != nil && (d.Artifact == nil || string(d.Artifact.Value) != *j.artifact):
		r.t.Errorf("%s: artifact %+v, model %s", what, d.Artifact, *j.artifact)
	}
}

func (r *modelRun) list() {
	ch := modelChannels[r.pick(len(modelChannels))]
	r.logf("list %s", ch)
	r.checkList(ch)
}

func (r *modelRun) checkList(ch string) {
	r.t.Helper()
	var want []string
	if c := r.m.chans[ch]; c != nil {
		js := make([]*mJob, 0, len(c.ids))
		for _, id := range c.ids {
			js = append(js, c.jobs[id])
		}
		slices.SortFunc(js, func(a, b *mJob) int {
			if x := b.created.Compare(a.created); x != 0 {
				return x
			}
			return strings.Compare(a.id, b.id)
		})
		for _, j := range js {
			want = append(want, j.id)
		}
	}
	var got []string
	var after *jobs.Cursor
	for range len(want) + 2 {
		p, err := r.h.store.List(r.h.ctx, jobs.ListRequest{ChannelID: ch, Limit: 3, After: after})
		if !r.expect("list "+ch, okay, err) {
			return
		}
		for _, s := range p.Jobs {
			got = append(got, s.ID)
		}
		if p.Next == nil {
			break
		}
		after = p.Next
	}
	if !slices.Equal(got, want) {
		r.t.Errorf("list %s: store %v, model %v", ch, got, want)
	}
}

func (r *modelRun) deleteChannel() {
	ch := modelChannels[r.pick(len(modelChannels))]
	r.logf("delete %s", ch)
	err := r.h.store.DeleteChannel(r.h.ctx, ch)
	if r.expect("delete "+ch, okay, err) {
		delete(r.m.chans, ch)
	}
}

// checkAll compares every job and both lists at the end of a run.
func (r *modelRun) checkAll() {
	r.t.Helper()
	for _, ch := range modelChannels {
		if c := r.m.chans[ch]; c != nil {
			for _, id := range c.ids {
				r.checkJob(c, c.jobs[id])
			}
		}
		r.checkList(ch)
	}
}
