package jobkeys

import (
	"context"
	"encoding/binary"
	"math"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/jobkeys/jobkeys/internal/natstest"
	"github.com/jobkeys/jobkeys/internal/wake"
)

// A wake-up is a hint (DESIGN §6.1): anyone allowed to publish on the
// wake-up subjects can send any revision and any state, and nothing a
// wake-up carries may become a state a write is computed from. These
// tests forge wake-ups as a user allowed only that publish (the grant the
// README documents for wake-ups, without any KV right) and check that
// they cost the waiter reads, never a write.

// forgeScene is one key (MaxActive 1) in two worker processes with
// wake-ups, a and b (b's coordinator counts its operations), and a server
// with a user, "forger", allowed only to publish on the bucket's wake-up
// subjects.
type forgeScene struct {
	svc, bucket string
	admin       jetstream.JetStream
	forger      *nats.Conn
	policy      Policy
	a, b        *wakeProc
	metrics     *metricsReader // b's coordinator's
	ledger      *forgeLedger
}

// forgeLedger records the handlers that run: how many at once, at most,
// which jobs, and the slot tokens they held (every Run of the test
// releases its slot when its handler returns).
type forgeLedger struct {
	mu         sync.Mutex
	running    int
	maxRunning int
	ran        map[string]int
	tokens     []string
}

func (l *forgeLedger) enter(id string, lease Lease) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.running++
	l.maxRunning = max(l.maxRunning, l.running)
	l.ran[id]++
	l.tokens = append(l.tokens, lease.SlotToken)
}

func (l *forgeLedger) leave() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.running--
}

func newForgeScene(t *testing.T, ctx context.Context, name string) *forgeScene {
	t.Helper()
	svc := jkService(name)
	bucket := BucketPrefixDefault + "_" + svc
	s := natstest.RunWith(t, natstest.Options{Configure: func(o *server.Options) {
		o.Users = append(o.Users,
			&server.User{Username: "admin", Password: "admin"},
			&server.User{Username: "forger", Password: "forger", Permissions: &server.Permissions{
				// The README's wake-up grant, publish half; no KV rights,
				// no subscriptions (so no reads, no request replies).
				Publish:   &server.SubjectPermission{Allow: []string{WakePrefixDefault + "." + bucket + ".>"}},
				Subscribe: &server.SubjectPermission{Deny: []string{">"}},
			}})
	}})
	_, admin := natstest.Connect(t, s, nats.UserInfo("admin", "admin"))
	auditCreateBucket(t, ctx, admin, svc, 1, jetstream.MemoryStorage)
	forger, _ := natstest.Connect(t, s, nats.UserInfo("forger", "forger"))
	sc := &forgeScene{
		svc: svc, bucket: bucket, admin: admin, forger: forger,
		policy:  Policy{Key: benchPolicy.Key, MaxActive: 1, MaxQueuedPerKey: 8},
		metrics: newMetricsReader(t),
		ledger:  &forgeLedger{ran: map[string]int{}},
	}
	sc.a = sc.newProc(t, s, nil)
	sc.b = sc.newProc(t, s, &Config{MeterProvider: sc.metrics.mp})
	return sc
}

// newProc makes a worker process on its own connection (as admin: the
// workers' own rights are not what the test is about), over the bucket the
// scene made. Its Runs recheck every second: a job a forgery erased
// learns it then.
func (sc *forgeScene) newProc(t *testing.T, s *server.Server, cfg *Config) *wakeProc {
	t.Helper()
	_, js := natstest.Connect(t, s, nats.UserInfo("admin", "admin"))
	return newWakeProc(t, s, sc.svc, sc.policy, wakeProcConfig{js: js, noCreate: true, coord: cfg, recheck: time.Second})
}

// run admits job id in p and runs it in a goroutine; its handler records
// itself in the ledger, closes ran and returns when release is closed.
// The Run's error (or nil) is sent on done.
func (sc *forgeScene) run(t *testing.T, ctx context.Context, p *wakeProc, id string, release <-chan struct{}) (ran chan struct{}, done chan error) {
	t.Helper()
	payload := benchPayload(0)
	adm, err := p.jt.Admit(ctx, id, payload)
	require.NoError(t, err)
	require.Equal(t, KindAccepted, adm.Kind, "admit %s", id)
	ran, done = make(chan struct{}), make(chan error, 1)
	go func() {
		_, err := p.r.Run(ctx, id, payload, func(_ context.Context, lease Lease) error {
			sc.ledger.enter(id, lease)
			defer sc.ledger.leave()
			close(ran)
			select {
			case <-release:
			case <-ctx.Done():
			}
			return nil
		})
		done <- err
	}()
	return ran, done
}

// acquisitions is how many acquisitions b's coordinator made (each try of
// its Runs is one).
func (sc *forgeScene) acquisitions(t *testing.T) int64 {
	t.Helper()
	return valueWhere(t, sc.metrics.collect(), "jobkeys.key.operations", attrOperation.String(metricOpAcquire))
}

// forge publishes, as the forger, to job's wake-up subject the state of
// kvKey at revision cur (value) as a writer would send it, but with no
// slot taken and only job queued, under revision rev.
func (sc *forgeScene) forge(t *testing.T, kvKey, job string, value []byte, rev uint64) {
	t.Helper()
	st, err := decodeState(value)
	require.NoError(t, err)
	i := indexQueued(st.Queued, job)
	require.GreaterOrEqual(t, i, 0, "%s is queued", job)
	st.Active = []ActiveSlot{}
	st.Queued = []QueuedJob{st.Queued[i]}
	payload := binary.BigEndian.AppendUint64(nil, rev)
	payload = appendState(payload, st)
	subject := WakePrefixDefault + "." + sc.bucket + "." + kvKey + "." + wake.Token(job)
	require.NoError(t, sc.forger.Publish(subject, payload))
	require.NoError(t, sc.forger.Flush())
}

// TestForgedWakeUpsNeverWrite: while job h holds the key's only slot (in
// process a), job w waits for its wake-ups (in process b) and job q2 is
// queued behind it (waiting in a), a user allowed only to publish on the
// wake-up subjects sends w's subject the key's state with no slot taken
// and only w queued: under the key's current revision, or under every
// revision from 1 to 20 past it. Each forged wake-up costs b at most a
// read: w's Run does not take the slot while h holds it, q2 stays queued,
// and once h ends w then q2 run, one at a time; the key's history passes
// the audit. Before, the waiter wrote on the forged state: its
// compare-and-swap on the current revision succeeded, w ran beside h, and
// q2 was erased (its Run ended "not queued").
func TestForgedWakeUpsNeverWrite(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		revs func(cur uint64) []uint64
	}{
		{"current revision", func(cur uint64) []uint64 { return []uint64{cur} }},
		{"revision sweep", func(cur uint64) []uint64 {
			var revs []uint64
			for r := uint64(1); r <= cur+20; r++ {
				revs = append(revs, r)
			}
			return revs
		}},
		// A revision the key never reaches: before, it signalled w's
		// Run again after each of its tries, for ever.
		{"revision past any", func(uint64) []uint64 { return []uint64{math.MaxUint64} }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			sc := newForgeScene(t, ctx, "wakeforge")

			releaseH := make(chan struct{})
			ranH, doneH := sc.run(t, ctx, sc.a, "h", releaseH)
			select {
			case <-ranH:
			case <-ctx.Done():
				t.Fatal("h never got the slot")
			}
			ranW, doneW := sc.run(t, ctx, sc.b, "w", released())
			sc.b.waitBlocked(t, ctx, "w")
			ranQ2, doneQ2 := sc.run(t, ctx, sc.a, "q2", released())
			sc.a.waitBlocked(t, ctx, "q2")

			key, err := sc.a.jt.key("w", benchPayload(0))
			require.NoError(t, err)
			kv, err := sc.admin.KeyValue(ctx, sc.bucket)
			require.NoError(t, err)
			entry, err := kv.Get(ctx, key.KVKey)
			require.NoError(t, err)
			revs := tc.revs(entry.Revision())
			startReads, startTries := sc.b.ops.reads.Load(), sc.acquisitions(t)
			received := sc.b.store.wakeCounters().Received
			reads, writes := sc.b.ops.reads.Load(), sc.b.ops.writes.Load()
			// One forged wake-up at a time, each sent once w's Run acted
			// on the one before (an acquisition of b's, or w running).
			forged := 0
		forging:
			for _, rev := range revs {
				before := sc.acquisitions(t)
				sc.forge(t, key.KVKey, "w", entry.Value(), rev)
				forged++
				for sc.acquisitions(t) == before {
					select {
					case <-ranW:
						break forging // it wrote on a forged state
					case <-ctx.Done():
						t.Fatalf("w's Run did not try after forged wake-up %d of %d (revision %d)", forged, len(revs), rev)
					case <-time.After(time.Millisecond):
					}
				}
			}
			assert.Equal(t, uint64(forged), sc.b.store.wakeCounters().Received-received, "forged wake-ups handed to w's Run")
			assert.Zero(t, sc.b.ops.writes.Load()-writes, "b's writes on %d forged wake-ups", forged)
			assert.LessOrEqual(t, sc.b.ops.reads.Load()-reads, int64(forged), "b's reads on %d forged wake-ups: at most one each", forged)
			select {
			case <-ranW:
				t.Errorf("w ran while h held the key's only slot, after forged wake-up %d of %d", forged, len(revs))
			default:
			}

			close(releaseH)
			assert.NoError(t, <-doneH, "h's Run")
			for _, j := range []struct {
				id   string
				ran  chan struct{}
				done chan error
			}{{"w", ranW, doneW}, {"q2", ranQ2, doneQ2}} {
				select {
				case err := <-j.done:
					assert.NoError(t, err, "%s's Run", j.id)
				case <-ctx.Done():
					t.Fatalf("%s's Run did not end", j.id)
				}
			}

			// Beyond one each for the forged wake-ups: w's first try, its
			// try on h's release (its read and write), a retry or two.
			assert.LessOrEqual(t, sc.b.ops.reads.Load()-startReads, int64(forged+3), "b's reads while w waited, %d forged wake-ups", forged)
			assert.LessOrEqual(t, sc.acquisitions(t)-startTries, int64(forged+3), "w's tries, %d forged wake-ups", forged)

			l := sc.ledger
			l.mu.Lock()
			defer l.mu.Unlock()
			assert.Equal(t, 1, l.maxRunning, "handlers running at once (MaxActive 1)")
			assert.Equal(t, map[string]int{"h": 1, "w": 1, "q2": 1}, l.ran, "handler runs per job")
			facts := newAuditFacts(nil)
			for _, tok := range l.tokens {
				facts.acquiredTokens[tok], facts.releaseCalled[tok] = true, true
			}
			sum := auditCheck(t, auditRead(t, ctx, sc.admin, sc.bucket), facts, func(string) (Policy, bool) { return sc.policy, true }, true)
			t.Logf("%s; %d forged wake-ups; rechecks a %d b %d", sum, forged, sc.a.r.rechecks.Load(), sc.b.r.rechecks.Load())
		})
	}
}
