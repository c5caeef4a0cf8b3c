package main

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/jobkeys/jobkeys"
	"github.com/jobkeys/jobkeys/internal/leakcheck"
	"github.com/jobkeys/jobkeys/internal/natstest"
	"github.com/jobkeys/jobkeys/jobs"
)

func TestMain(m *testing.M) { leakcheck.Main(m) }

// syncBuffer is a bytes.Buffer safe for a command writing while the test
// reads.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// cliRun is one run of the command tree.
type cliRun struct {
	code           int
	stdout, stderr string
}

// runner runs the command tree against a server with an environment of its
// own (HOME in a temp dir: no context of the machine is read).
type runner struct {
	t        *testing.T
	env      map[string]string
	terminal bool   // stdin is a terminal
	stdin    string // what the operator types
	jobStore func(context.Context, *session, *options) (jobs.Store, error)
	// defaultArgs go before the arguments of every run.
	defaultArgs []string
	// now is the command's clock; nil: time.Now.
	now func() time.Time
}

func newRunner(t *testing.T, url string) *runner {
	return &runner{t: t, env: map[string]string{"NATS_URL": url, "HOME": t.TempDir()}}
}

func (r *runner) run(args ...string) cliRun {
	r.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var out, errOut syncBuffer
	return r.runCtx(ctx, &out, &errOut, args...)
}

func (r *runner) runCtx(ctx context.Context, out, errOut *syncBuffer, args ...string) cliRun {
	c := &cli{stdin: strings.NewReader(r.stdin), stdout: out, stderr: errOut,
		getenv:     func(k string) string { return r.env[k] },
		isTerminal: func(io.Reader) bool { return r.terminal }, jobStore: r.jobStore, now: r.now}
	code := c.run(ctx, append(append([]string(nil), r.defaultArgs...), args...))
	return cliRun{code: code, stdout: out.String(), stderr: errOut.String()}
}

// fixture is a service with keys in every condition.
type fixture struct {
	srv     *server.Server
	js      jetstream.JetStream
	store   *jobkeys.NATSStore
	service string
	// KV keys by condition: idle, full, expired, orphan, corrupt.
	kv map[string]string
}

var testPolicy = jobkeys.Policy{Key: []string{"/t"}, MaxActive: 1, MaxQueuedPerKey: 1,
	HeartbeatInterval: 10 * time.Second, HeartbeatTTL: time.Minute}

// newFixture writes, in service "svc" of a new server:
//   - idle: one job queued just now;
//   - full: one live slot (full-1) and one queued job (full-2);
//   - expired: a slot (exp-1) acquired two hours ago, never renewed;
//   - orphan: a job (ghost) queued an hour ago whose job never came;
//   - corrupt: a value that is not key state.
func newFixture(t *testing.T, history uint8) *fixture {
	t.Helper()
	ctx := context.Background()
	srv := natstest.Run(t)
	_, js := natstest.Connect(t, srv)
	if history > 1 {
		_, err := js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: "JOBS_KEYS_svc", History: history, Storage: jetstream.MemoryStorage})
		require.NoError(t, err)
	}
	st, err := jobkeys.NewNATSStore(js, jobkeys.WithCreateBuckets(jetstream.MemoryStorage, 1))
	require.NoError(t, err)
	f := &fixture{srv: srv, js: js, store: st, service: "svc", kv: map[string]string{}}
	at := func(d time.Duration) *jobkeys.JobType {
		// States written at other times: the clock is moved on purpose.
		now := time.Now().Add(d)
		coord, err := jobkeys.NewCoordinator(st, &jobkeys.Config{InstanceID: "worker-1", IgnoreClockSkew: true, Now: func() time.Time { return now }})
		require.NoError(t, err)
		jt, err := coord.JobType("svc", "render", testPolicy)
		require.NoError(t, err)
		return jt
	}
	admit := func(jt *jobkeys.JobType, id, key string) {
		adm, err := jt.Admit(ctx, id, []byte(`{"t":"`+key+`"}`))
		require.NoError(t, err)
		require.Equal(t, jobkeys.KindAccepted, adm.Kind, "%s", id)
		k, err := jt.Key([]byte(`{"t":"` + key + `"}`))
		require.NoError(t, err)
		f.kv[key] = k.KVKey
	}
	acquire := func(jt *jobkeys.JobType, id, key string) {
		acq, err := jt.Acquire(ctx, id, []byte(`{"t":"`+key+`"}`))
		require.NoError(t, err)
		require.Equal(t, jobkeys.KindAcquired, acq.Kind, "%s", id)
	}
	past2h, past1h, now := at(-2*time.Hour), at(-time.Hour), at(0)
	admit(past2h, "exp-1", "expired")
	acquire(past2h, "exp-1", "expired")
	admit(past1h, "ghost", "orphan")
	admit(now, "idle-1", "idle")
	admit(now, "full-1", "full")
	acquire(now, "full-1", "full")
	admit(now, "full-2", "full")
	f.kv["corrupt"] = "svc.render." + strings.Repeat("c", 64)
	_, err = st.Create(ctx, "svc", f.kv["corrupt"], []byte(`{"version":1,"service":"svc","jobType":`))
	require.NoError(t, err)
	return f
}

// value returns the stored bytes and revision of kvKey (nil, 0 when
// absent).
func (f *fixture) value(t *testing.T, kvKey string) ([]byte, uint64) {
	t.Helper()
	v, rev, err := f.store.Get(context.Background(), f.service, kvKey)
	if err != nil {
		require.ErrorIs(t, err, jobkeys.ErrKeyNotFound)
		return nil, 0
	}
	return v, rev
}

// snapshot returns every key's value.
func (f *fixture) snapshot(t *testing.T) map[string]string {
	t.Helper()
	out := map[string]string{}
	for _, kvKey := range f.kv {
		if v, rev := f.value(t, kvKey); rev != 0 {
			out[kvKey] = string(v)
		}
	}
	return out
}

func TestHelpListsEveryCommand(t *testing.T) {
	t.Parallel()
	r := newRunner(t, "nats://127.0.0.1:1")
	res := r.run("--help")
	require.Equal(t, exitOK, res.code)
	for _, cmd := range commands() {
		assert.Contains(t, res.stdout, cmd.name+" ", "--help lists %s", cmd.name)
	}
	for _, flag := range []string{"--server", "--creds", "--context", "--json", "--force", "Exit codes"} {
		assert.Contains(t, res.stdout, flag)
	}
	res = r.run("keys", "repair", "--help")
	require.Equal(t, exitOK, res.code)
	assert.Contains(t, res.stdout, "--revision")

	assert.Equal(t, exitUsage, r.run("keys", "frobnicate").code)
	assert.Equal(t, exitUsage, r.run("keys", "ls").code, "SERVICE missing")
	assert.Equal(t, exitUsage, r.run("keys", "ls", "--nope", "svc").code)
	assert.Equal(t, exitUsage, r.run().code)
	res = r.run("keys", "show", "not-a-kv-key")
	assert.Equal(t, exitUsage, res.code)
	assert.Contains(t, res.stderr, `"not-a-kv-key"`)
}

func TestKeysLs(t *testing.T) {
	t.Parallel()
	f := newFixture(t, 1)
	r := newRunner(t, f.srv.ClientURL())

	res := r.run("keys", "ls", "svc", "render")
	require.Equal(t, exitCorrupt, res.code, "a corrupt key is listed, and the exit code says so: %s", res.stderr)
	assert.Contains(t, res.stderr, "1 of 5 keys")
	lines := strings.Split(strings.TrimSpace(res.stdout), "\n")
	require.Len(t, lines, 6, res.stdout)
	assert.Regexp(t, `^KEY +ACTIVE +QUEUED +OLDEST QUEUED +NEXT EXPIRY +EXPIRED +STALE +KV KEY +PROBLEM$`, lines[0])
	rows := map[string][]string{}
	for _, l := range lines[1:] {
		fields := strings.Fields(l)
		rows[fields[0]] = fields
	}
	assert.Equal(t, []string{"full", "1/1", "1/1", "0s", "in", "1m0s", "0", "0", f.kv["full"]}, fixAges(rows["full"]))
	assert.Equal(t, []string{"idle", "0/1", "1/2", "0s", "-", "0", "0", f.kv["idle"]}, fixAges(rows["idle"]))
	assert.Equal(t, []string{"expired", "1/1", "0/1", "-", "-", "1", "0", f.kv["expired"]}, rows["expired"])
	assert.Equal(t, []string{"orphan", "0/1", "1/2", "1h0m0s", "-", "0", "0", f.kv["orphan"]}, fixAges(rows["orphan"]))
	require.Contains(t, rows, "(corrupt)")
	assert.Equal(t, f.kv["corrupt"], rows["(corrupt)"][7])
	assert.Contains(t, strings.Join(rows["(corrupt)"], " "), "corrupt key state")

	// Columns line up.
	col := strings.Index(lines[0], "KV KEY")
	for _, l := range lines[1:] {
		assert.Equal(t, "svc.render.", l[col:col+len("svc.render.")], "KV KEY column of %q", l)
	}

	res = r.run("--json", "keys", "ls", "svc")
	require.Equal(t, exitCorrupt, res.code)
	var keys []keyJSON
	require.NoError(t, json.Unmarshal([]byte(res.stdout), &keys), res.stdout)
	require.Len(t, keys, 5)
	by := map[string]keyJSON{}
	for _, k := range keys {
		by[k.KVKey] = k
	}
	full := by[f.kv["full"]]
	assert.Equal(t, [5]int{1, 1, 1, 1, 1}, [5]int{full.Active, full.MaxActive, full.Queued, full.MaxQueuedPerKey, full.QueueLimit})
	assert.NotNil(t, full.NextLeaseExpiry)
	assert.False(t, full.Corrupt)
	exp := by[f.kv["expired"]]
	assert.Equal(t, 1, exp.ExpiredSlots)
	assert.Nil(t, exp.NextLeaseExpiry, "no live slot")
	orphan := by[f.kv["orphan"]]
	assert.InDelta(t, 3600, orphan.OldestQueuedAgeSec, 120)
	bad := by[f.kv["corrupt"]]
	assert.True(t, bad.Corrupt)
	assert.Contains(t, bad.Problem, f.kv["corrupt"], "the problem names the KV key")
	assert.Nil(t, bad.State)

	res = r.run("keys", "ls", "svc", "a.b")
	assert.Equal(t, exitUsage, res.code, "a job type that cannot be one: %s", res.stderr)
	assert.Contains(t, res.stderr, `"a.b"`)
	// A missing bucket is named.
	res = r.run("keys", "ls", "nosuch")
	assert.Equal(t, exitNotFound, res.code)
	assert.Contains(t, res.stderr, `"JOBS_KEYS_nosuch"`)
}

// fixAges rounds the age columns of a table row, which depend on how long
// the test took: "0s"/"12ms"-style ages below a minute become "0s", an hour
// and a few seconds becomes "1h0m0s", "in 59s" becomes "in 1m0s".
func fixAges(fields []string) []string {
	out := append([]string(nil), fields...)
	for i, f := range out {
		d, err := time.ParseDuration(f)
		if err != nil || !strings.ContainsAny(f, "smh") {
			continue
		}
		switch {
		case i > 0 && out[i-1] == "in":
			out[i] = time.Minute.String()
		case d < time.Minute:
			out[i] = "0s"
		default:
			out[i] = d.Round(time.Hour).String()
		}
	}
	return out
}

func TestKeysShow(t *testing.T) {
	t.Parallel()
	f := newFixture(t, 1)
	r := newRunner(t, f.srv.ClientURL())

	res := r.run("keys", "show", f.kv["full"])
	require.Equal(t, exitOK, res.code, res.stderr)
	assert.Regexp(t, `(?m)^Active: +1/1 \(0 expired\)$`, res.stdout)
	assert.Regexp(t, `(?m)^Queued: +1/1 \(MaxQueuedPerKey 1\)$`, res.stdout)
	assert.Regexp(t, `(?m)^  full-1 +worker-1 +.* ago +.* ago +expires in .* +0 +[0-9a-f-]{36}$`, res.stdout)
	assert.Regexp(t, `(?m)^  full-2 +\d{4}-\d\d-\d\d `, res.stdout)

	res = r.run("keys", "show", "svc", "render", "--key", "expired", "--json")
	require.Equal(t, exitOK, res.code, res.stderr)
	var shown []keyJSON
	require.NoError(t, json.Unmarshal([]byte(res.stdout), &shown))
	require.Len(t, shown, 1)
	assert.Equal(t, f.kv["expired"], shown[0].KVKey)
	st, err := jobkeys.ParseState(shown[0].State)
	require.NoError(t, err, "--json carries the stored state")
	assert.Equal(t, "exp-1", st.Active[0].JobID)

	res = r.run("keys", "show", f.kv["corrupt"])
	assert.Equal(t, exitCorrupt, res.code)
	assert.Regexp(t, `(?m)^Problem: +jobkeys: corrupt key state: KV key "`+regexp.QuoteMeta(f.kv["corrupt"]), res.stdout)
	assert.Contains(t, res.stdout, `{"version":1,"service":"svc","jobType":`)
	assert.Contains(t, res.stdout, "jobkeys keys repair "+f.kv["corrupt"]+" --revision ")

	res = r.run("keys", "show", "svc.render."+strings.Repeat("d", 64))
	assert.Equal(t, exitNotFound, res.code)
	res = r.run("keys", "show", "svc", "render", "--key", "nobody")
	assert.Equal(t, exitNotFound, res.code)
	assert.Contains(t, res.stderr, `display key "nobody"`)
}

func TestKeysRemoveQueued(t *testing.T) {
	t.Parallel()
	f := newFixture(t, 1)
	r := newRunner(t, f.srv.ClientURL())
	before := f.snapshot(t)
	orphan := f.kv["orphan"]

	// No terminal, no -f: refused, nothing changed.
	res := r.run("keys", "remove-queued", orphan, "ghost")
	assert.Equal(t, exitNotConfirmed, res.code)
	assert.Contains(t, res.stderr, "pass -f")
	assert.Equal(t, before, f.snapshot(t))
	// Asked and answered no.
	r.terminal, r.stdin = true, "n\n"
	res = r.run("keys", "remove-queued", orphan, "ghost")
	assert.Equal(t, exitNotConfirmed, res.code)
	assert.Contains(t, res.stderr, "Remove queued job ghost from key orphan? [y/N]")
	assert.Equal(t, before, f.snapshot(t))
	// Not queued there.
	res = r.run("keys", "remove-queued", f.kv["full"], "ghost")
	assert.Equal(t, exitNotFound, res.code)
	assert.Contains(t, res.stderr, "queued: full-2")

	// Answered yes: exactly that entry goes; the orphan key, left empty, is
	// deleted; every other key is as it was.
	r.stdin = "y\n"
	res = r.run("keys", "remove-queued", orphan, "ghost")
	require.Equal(t, exitOK, res.code, res.stderr)
	assert.Contains(t, res.stdout, "removed queued job ghost from key orphan; 0 still queued")
	after := f.snapshot(t)
	delete(before, orphan)
	assert.Equal(t, before, after)

	// Of a key with more in it, only the entry goes.
	r.terminal = false
	fullBefore, _ := f.value(t, f.kv["full"])
	res = r.run("keys", "remove-queued", "-f", "--json", f.kv["full"], "full-2")
	require.Equal(t, exitOK, res.code, res.stderr)
	assert.JSONEq(t, `{"removed":true,"kvKey":"`+f.kv["full"]+`","jobId":"full-2","queuedLeft":0}`, res.stdout)
	fullAfter, _ := f.value(t, f.kv["full"])
	was, err := jobkeys.ParseState(fullBefore)
	require.NoError(t, err)
	now, err := jobkeys.ParseState(fullAfter)
	require.NoError(t, err)
	assert.Equal(t, was.Active, now.Active, "the slot is untouched")
	assert.Empty(t, now.Queued)

	res = r.run("keys", "remove-queued", "-f", f.kv["corrupt"], "x")
	assert.Equal(t, exitCorrupt, res.code)
	assert.Contains(t, res.stderr, f.kv["corrupt"])
}

func TestKeysRepair(t *testing.T) {
	t.Parallel()
	f := newFixture(t, 1)
	r := newRunner(t, f.srv.ClientURL())
	before := f.snapshot(t)
	bad := f.kv["corrupt"]
	_, rev := f.value(t, bad)

	res := r.run("keys", "repair", bad)
	assert.Equal(t, exitNotConfirmed, res.code)
	assert.Equal(t, before, f.snapshot(t))
	r.terminal, r.stdin = true, "no\n"
	res = r.run("keys", "repair", bad)
	assert.Equal(t, exitNotConfirmed, res.code)
	assert.Contains(t, res.stdout, "corrupt key state")
	assert.Contains(t, res.stderr, "Delete the value of "+bad+" at revision ")
	assert.Equal(t, before, f.snapshot(t))
	// The revision the operator saw is not the key's: nothing written.
	res = r.run("keys", "repair", "-f", bad, "--revision", "1")
	assert.Equal(t, exitConflict, res.code)
	assert.Contains(t, res.stderr, "inspect it again")
	assert.Equal(t, before, f.snapshot(t))

	r.stdin = "y\n"
	res = r.run("keys", "repair", bad, "--revision", strconv.FormatUint(rev, 10))
	require.Equal(t, exitOK, res.code, res.stderr)
	assert.Contains(t, res.stdout, "deleted the value of "+bad)
	delete(before, bad)
	assert.Equal(t, before, f.snapshot(t), "only the corrupt key changed")
	res = r.run("keys", "ls", "svc", "render")
	assert.Equal(t, exitOK, res.code, "no corrupt key left")

	// Replacing a usable state with a file.
	idle := f.kv["idle"]
	v, _ := f.value(t, idle)
	st, err := jobkeys.ParseState(v)
	require.NoError(t, err)
	st.Queued[0].JobID = "idle-renamed"
	file := filepath.Join(t.TempDir(), "state.json")
	require.NoError(t, os.WriteFile(file, []byte(strings.Replace(string(v), `"idle-1"`, `"idle-renamed"`, 1)), 0o600))
	r.terminal = false
	res = r.run("keys", "repair", "-f", "--replace", file, idle)
	require.Equal(t, exitOK, res.code, res.stderr)
	got, _ := f.value(t, idle)
	now, err := jobkeys.ParseState(got)
	require.NoError(t, err)
	assert.Equal(t, st.Queued, now.Queued)

	res = r.run("keys", "repair", "-f", "svc.render."+strings.Repeat("e", 64))
	assert.Equal(t, exitNotFound, res.code)
}

func TestKeysSweep(t *testing.T) {
	t.Parallel()
	f := newFixture(t, 1)
	r := newRunner(t, f.srv.ClientURL())
	before := f.snapshot(t)

	res := r.run("keys", "sweep", "svc", "render", "--dry-run")
	require.Equal(t, exitOK, res.code, res.stderr)
	assert.Regexp(t, `(?m)^  expired +exp-1 +worker-1 +1h\d+m\d+s ago +`+regexp.QuoteMeta(f.kv["expired"])+`$`, res.stdout)
	assert.Equal(t, before, f.snapshot(t))
	res = r.run("keys", "sweep", "svc", "render")
	assert.Equal(t, exitNotConfirmed, res.code)
	assert.Equal(t, before, f.snapshot(t))

	res = r.run("keys", "sweep", "svc", "render", "-f", "--json")
	// The corrupt key cannot be swept; it is reported, the rest is done.
	assert.Equal(t, exitCorrupt, res.code, res.stderr)
	var out struct {
		Removed []sweptJSON `json:"removed"`
		Deleted int         `json:"deletedKeys"`
	}
	require.NoError(t, json.Unmarshal([]byte(res.stdout), &out), res.stdout)
	require.Len(t, out.Removed, 1)
	assert.Equal(t, "exp-1", out.Removed[0].JobID)
	assert.Equal(t, 1, out.Deleted)
	delete(before, f.kv["expired"])
	assert.Equal(t, before, f.snapshot(t))
}

func TestKeysHistory(t *testing.T) {
	t.Parallel()
	f := newFixture(t, 10)
	r := newRunner(t, f.srv.ClientURL())
	res := r.run("keys", "history", f.kv["full"])
	require.Equal(t, exitOK, res.code, res.stderr)
	lines := strings.Split(strings.TrimSpace(res.stdout), "\n")
	require.Len(t, lines, 4, res.stdout)
	assert.Regexp(t, `^REVISION +TIME +OP +ACTIVE +QUEUED +DETAIL$`, lines[0])
	assert.Regexp(t, `PUT +0 +1 +queued full-1$`, lines[1])
	assert.Regexp(t, `PUT +1 +0 +slot full-1$`, lines[2])
	assert.Regexp(t, `PUT +1 +1 +slot full-1, queued full-2$`, lines[3])

	res = r.run("keys", "history", "--json", "--last", "1", f.kv["full"])
	require.Equal(t, exitOK, res.code, res.stderr)
	var h []historyJSON
	require.NoError(t, json.Unmarshal([]byte(res.stdout), &h))
	require.Len(t, h, 1)
	assert.Equal(t, [2]int{1, 1}, [2]int{h[0].Active, h[0].Queued})
}

func TestKeysWatch(t *testing.T) {
	t.Parallel()
	f := newFixture(t, 1)
	r := newRunner(t, f.srv.ClientURL())
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	wctx, stop := context.WithCancel(ctx)
	var out, errOut syncBuffer
	done := make(chan cliRun, 1)
	go func() { done <- r.runCtx(wctx, &out, &errOut, "keys", "watch", "--json", "svc", "render") }()
	events := func(n int) []watchJSON {
		t.Helper()
		require.Eventually(t, func() bool { return strings.Count(out.String(), "\n") >= n }, time.Minute, 20*time.Millisecond,
			"%d events: %s %s", n, out.String(), errOut.String())
		var evs []watchJSON
		for _, l := range strings.Split(strings.TrimSpace(out.String()), "\n") {
			var e watchJSON
			require.NoError(t, json.Unmarshal([]byte(l), &e), l)
			evs = append(evs, e)
		}
		return evs
	}
	evs := events(5)
	for _, e := range evs {
		assert.Equal(t, "initial", e.Event)
	}

	now := time.Now()
	coord, err := jobkeys.NewCoordinator(f.store, &jobkeys.Config{Now: func() time.Time { return now }})
	require.NoError(t, err)
	jt, err := coord.JobType("svc", "render", testPolicy)
	require.NoError(t, err)
	ctxb := context.Background()
	payload := []byte(`{"t":"idle"}`)
	acq, err := jt.Acquire(ctxb, "idle-1", payload)
	require.NoError(t, err)
	evs = events(6)
	assert.Equal(t, "changed", evs[5].Event)
	assert.Equal(t, [2]int{1, 0}, [2]int{evs[5].Active, evs[5].Queued})
	for range 3 { // renewals: not events
		now = now.Add(time.Second)
		_, err := jt.Renew(ctxb, acq.Lease)
		require.NoError(t, err)
	}
	_, err = jt.Release(ctxb, acq.Lease)
	require.NoError(t, err)
	evs = events(7)
	require.Len(t, evs, 7, "the release (deleting the key) follows the acquisition: no renewal in between")
	assert.Equal(t, "deleted", evs[6].Event)
	assert.Equal(t, f.kv["idle"], evs[6].KVKey)

	stop()
	res := <-done
	assert.Equal(t, exitOK, res.code, res.stderr)

	// For people: one aligned line per key.
	tctx, tstop := context.WithCancel(ctx)
	var tout, terr syncBuffer
	go func() { done <- r.runCtx(tctx, &tout, &terr, "keys", "watch", "svc") }()
	require.Eventually(t, func() bool { return strings.Count(tout.String(), "\n") >= 4 }, time.Minute, 20*time.Millisecond)
	tstop()
	res = <-done
	assert.Equal(t, exitOK, res.code, res.stderr)
	assert.Regexp(t, `(?m)^\d\d:\d\d:\d\d\.\d{3}  initial   full  active 1/1  queued 1/1  expired 0  `+regexp.QuoteMeta(f.kv["full"])+`$`, res.stdout)
	assert.Regexp(t, `(?m)^\d\d:\d\d:\d\d\.\d{3}  initial   `+regexp.QuoteMeta(f.kv["corrupt"])+` CORRUPT: `, res.stdout)
}

// --context names a nats CLI context read from $XDG_CONFIG_HOME/nats/context;
// NATS_CONTEXT and the selected context work the same.
func TestContext(t *testing.T) {
	t.Parallel()
	f := newFixture(t, 1)
	dir := t.TempDir()
	ctxDir := filepath.Join(dir, "nats", "context")
	require.NoError(t, os.MkdirAll(ctxDir, 0o700))
	require.NoError(t, os.WriteFile(filepath.Join(ctxDir, "ops.json"),
		[]byte(`{"description":"test","url":"`+f.srv.ClientURL()+`"}`), 0o600))

	r := &runner{t: t, env: map[string]string{"XDG_CONFIG_HOME": dir}}
	res := r.run("keys", "ls", "--context", "ops", "svc", "render", "--json")
	assert.Equal(t, exitCorrupt, res.code, "connected through the context: %s", res.stderr)
	assert.Contains(t, res.stdout, f.kv["full"])

	r.env["NATS_CONTEXT"] = "ops"
	res = r.run("keys", "show", f.kv["full"])
	assert.Equal(t, exitOK, res.code, res.stderr)
	delete(r.env, "NATS_CONTEXT")

	res = r.run("--context", "nosuch", "keys", "ls", "svc")
	assert.Equal(t, exitNotFound, res.code)
	assert.Contains(t, res.stderr, `nats context "nosuch"`)

	// The selected context (nats context select ops).
	require.NoError(t, os.WriteFile(filepath.Join(dir, "nats", "context.txt"), []byte("ops"), 0o600))
	res = r.run("keys", "show", f.kv["idle"])
	assert.Equal(t, exitOK, res.code, res.stderr)

	// --server wins over the context.
	res = r.run("keys", "show", "--server", "nats://127.0.0.1:1", f.kv["idle"])
	assert.Equal(t, exitError, res.code)
	assert.Contains(t, res.stderr, "connect to nats://127.0.0.1:1")
}
