package jobkeys

// BenchmarkCeiling measures, with bare nats.go and none of jobkeys'
// coordination code, how fast n processes on their own connections can
// cycle jobs through ONE key with MaxActive 1, for two wake-up designs:
// every process watching the key (as jobkeys' Watcher does), and targeted
// wake-ups (a write that leaves the slot free with jobs queued sends the
// revision and value to the queue head's process on its own core NATS
// subject; a lost admission or release reads the key). It separates the
// protocol's limit from the library's (issue 11). Each cycle is admit,
// acquire, release: three compare-and-swap revisions of the key. Run it
// with:
//
//	go test -run '^$' -bench 'BenchmarkCeiling' -benchtime 2s -count 1 .
//
// Each row X runs as X/base then X/row: base is the baseline B0 (or P0
// for the P rows) just before the row, as other load on the machine
// drifts; only row/base ratios mean anything.
//
//	B0                   3 kv.Update per cycle on the last revision, a real state's size
//	B1-watch-Nconns      the protocol below, every connection watching the key
//	B2-wake-Nconns       the protocol without watches, targeted wake-ups
//	*-pipelined          each worker admits its next job while it holds the slot, so no
//	                     admission races the next job's acquisition
//	B3-1worker+15watch-* B0 beside 15 idle connections watching the same key (values or
//	                     headers only) or another key
//	P0, P*-…procs        B0, B1, B2 and B3 with each worker (or idle watcher) a separate OS
//	                     process: the test binary re-executed (TestCeilingChild)
//
// cpu-µs/cycle is the CPU time (user+system) the server and every client
// used per cycle (the benchmark process, and its children for the P rows):
// 2 cores can run at most 2e6 / cpu-µs/cycle cycles per second, however
// quiet the machine.
//
// The protocol's state is {"active": job|null, "queue": [jobs]}: admit
// appends the job (CAS), the queue's head acquires when no job is active
// (CAS), release clears the active job (CAS). Every run is checked: the
// acquisitions' and releases' revisions never overlap (MaxActive 1, across
// processes), no two goroutines of a process hold the slot at once, every
// admitted job runs exactly once, and the key ends empty.

import (
	"bytes"
	"cmp"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jobkeys/jobkeys/internal/natstest"

	"github.com/stretchr/testify/require"
)

// ceilKey is the one key every row works on; ceilOtherKey is the key
// B3's second variant watches instead.
const (
	ceilKey      = "k"
	ceilOtherKey = "other"
)

// ceilStallTimeout bounds any wait for a delivery or a wake-up: a protocol
// that stops making progress fails the run instead of hanging it.
const ceilStallTimeout = 30 * time.Second

// ceilWakeFallback is how long a targeted waiter waits for a wake-up it
// is owed before it reads the key; every such read is counted
// (fallback-reads), and the protocol is built so there are none.
const ceilWakeFallback = time.Second

// ceilMode is the protocol a worker runs.
type ceilMode string

const (
	ceilRaw   ceilMode = "raw"   // B0: three kv.Updates per cycle
	ceilWatch ceilMode = "watch" // B1: every worker watches the key
	ceilWake  ceilMode = "wake"  // B2: targeted wake-ups, no watch
	ceilIdle  ceilMode = "idle"  // B3: watches a key and does nothing else
)

// ceilState is the protocol's key state.
type ceilState struct {
	Active *string  `json:"active"`
	Queue  []string `json:"queue"`
}

func (s ceilState) encode() []byte {
	b, err := json.Marshal(s)
	if err != nil {
		panic(err) // a struct of strings always encodes
	}
	return b
}

func decodeCeilState(b []byte) (ceilState, error) {
	var s ceilState
	if err := json.Unmarshal(b, &s); err != nil {
		return s, fmt.Errorf("ceiling: decode state %q: %w", b, err)
	}
	return s, nil
}

// ceilKnown is a revision of the key and its state.
type ceilKnown struct {
	st  ceilState
	rev uint64
}

// ceilRun is one job's turn on the slot: the revisions that acquired and
// released it.
type ceilRun struct {
	Job      string `json:"job"`
	Acquired uint64 `json:"acq"`
	Released uint64 `json:"rel"`
}

// ceilStats is what one worker did.
type ceilStats struct {
	Cycles        int       `json:"cycles"`
	Admitted      int       `json:"admitted"`
	Writes        int       `json:"writes"`         // successful CAS
	Failed        int       `json:"failed"`         // lost CAS
	Reads         int       `json:"reads"`          // kv.Get
	FallbackReads int       `json:"fallback_reads"` // reads after an owed wake-up did not come
	Wakes         int       `json:"wakes"`          // wake-ups published
	Deliveries    int       `json:"deliveries"`     // watch entries or wake-ups received
	CPU           int64     `json:"cpu_ns"`         // child process: its CPU time (user+system) over the run
	Runs          []ceilRun `json:"runs"`
}

func (s *ceilStats) add(o ceilStats) {
	s.Cycles += o.Cycles
	s.Admitted += o.Admitted
	s.Writes += o.Writes
	s.Failed += o.Failed
	s.Reads += o.Reads
	s.FallbackReads += o.FallbackReads
	s.Wakes += o.Wakes
	s.Deliveries += o.Deliveries
	s.CPU += o.CPU
	s.Runs = append(s.Runs, o.Runs...)
}

// ceilSpec configures one worker; a child process gets it as JSON.
type ceilSpec struct {
	URL    string   `json:"url"`
	Bucket string   `json:"bucket"`
	Key    string   `json:"key"`  // the key worked on, or watched by an idle worker
	Mode   ceilMode `json:"mode"` // the protocol
	ID     int      `json:"id"`
	Cycles int      `json:"cycles"`
	Wakes  string   `json:"wakes"` // subject prefix of the wake-ups; worker i listens on Wakes.i
	Value  []byte   `json:"value"` // ceilRaw: the value written
	// Pipelined makes a worker admit its next job while it holds the slot.
	Pipelined bool `json:"pipelined,omitempty"`
	// MetaOnly makes an idle worker's watch deliver headers only.
	MetaOnly bool `json:"meta_only,omitempty"`
	// Child process only: the subject the child says it is ready on, the
	// subject it is started ("start") and stopped ("stop") on, and the
	// file it writes its stats to.
	Ready string `json:"ready,omitempty"`
	Ctl   string `json:"ctl,omitempty"`
	Out   string `json:"out,omitempty"`
}

func ceilJob(id, cycle int) string { return "w" + strconv.Itoa(id) + "-" + strconv.Itoa(cycle) }

// ceilJobWorker returns the worker of a job ceilJob named.
func ceilJobWorker(job string) (int, error) {
	w, _, ok := strings.Cut(strings.TrimPrefix(job, "w"), "-")
	if !ok {
		return 0, fmt.Errorf("ceiling: job %q has no worker", job)
	}
	return strconv.Atoi(w)
}

// ceilWorker is one worker, its connection and its key's handle, prepared
// before the timer starts.
type ceilWorker struct {
	spec   ceilSpec
	nc     *nats.Conn
	kv     jetstream.KeyValue
	holder *atomic.Int64 // the in-process slot holder (worker ID + 1), nil in a child process

	watch jetstream.KeyWatcher // ceilWatch, ceilIdle
	wakes chan *nats.Msg       // ceilWake
	sub   *nats.Subscription
	cur   ceilKnown
	stats ceilStats
	idle  chan struct{} // ceilIdle: closed when the drain ends
}

// newCeilWorker connects a worker and sets up its watch or wake-up
// subscription; the caller closes it.
func newCeilWorker(ctx context.Context, spec ceilSpec, holder *atomic.Int64) (*ceilWorker, error) {
	nc, err := nats.Connect(spec.URL)
	if err != nil {
		return nil, fmt.Errorf("ceiling: worker %d: connect: %w", spec.ID, err)
	}
	w := &ceilWorker{spec: spec, nc: nc, holder: holder}
	if err := w.prepare(ctx); err != nil {
		w.close()
		return nil, fmt.Errorf("ceiling: worker %d: %w", spec.ID, err)
	}
	return w, nil
}

func (w *ceilWorker) prepare(ctx context.Context) error {
	js, err := jetstream.New(w.nc)
	if err != nil {
		return err
	}
	if w.kv, err = js.KeyValue(ctx, w.spec.Bucket); err != nil {
		return err
	}
	switch w.spec.Mode {
	case ceilRaw:
		e, err := w.kv.Get(ctx, w.spec.Key)
		if err != nil {
			return err
		}
		w.cur.rev = e.Revision()
	case ceilWatch:
		if w.watch, err = w.kv.Watch(ctx, w.spec.Key); err != nil {
			return err
		}
		// The initial value, then the end-of-initial-values marker.
		for {
			e, err := w.receive(ctx)
			if err != nil {
				return err
			}
			if e == nil {
				break
			}
		}
		if w.cur.rev == 0 {
			return errors.New("the watch delivered no initial value")
		}
		w.stats.Deliveries = 0
	case ceilWake:
		w.wakes = make(chan *nats.Msg, 256)
		if w.sub, err = w.nc.ChanSubscribe(w.spec.Wakes+"."+strconv.Itoa(w.spec.ID), w.wakes); err != nil {
			return err
		}
		if err := w.nc.Flush(); err != nil {
			return err
		}
		if err := w.read(ctx); err != nil {
			return err
		}
		w.stats.Reads = 0
	case ceilIdle:
		opts := []jetstream.WatchOpt{jetstream.UpdatesOnly()}
		if w.spec.MetaOnly {
			opts = append(opts, jetstream.MetaOnly())
		}
		if w.watch, err = w.kv.Watch(ctx, w.spec.Key, opts...); err != nil {
			return err
		}
		w.idle = make(chan struct{})
		go func() {
			defer close(w.idle)
			for range w.watch.Updates() {
			}
		}()
	default:
		return fmt.Errorf("unknown mode %q", w.spec.Mode)
	}
	return nil
}

// close stops the worker's watch or subscription and closes its
// connection. A stopped watch's delivery goroutine may be blocked on the
// full channel: it is drained until the watch closes it.
func (w *ceilWorker) close() {
	if w.watch != nil {
		_ = w.watch.Stop()
		if w.idle == nil {
			t := time.NewTimer(ceilStallTimeout)
		drain:
			for {
				select {
				case _, ok := <-w.watch.Updates():
					if !ok {
						break drain
					}
				case <-t.C:
					break drain
				}
			}
			t.Stop()
		}
	}
	if w.sub != nil {
		_ = w.sub.Unsubscribe()
	}
	w.nc.Close()
	if w.idle != nil {
		<-w.idle
	}
}

// run does the worker's cycles.
func (w *ceilWorker) run(ctx context.Context) error {
	var err error
	switch w.spec.Mode {
	case ceilRaw:
		err = w.runRaw(ctx)
	case ceilWatch, ceilWake:
		err = w.runCycles(ctx)
	}
	if err != nil {
		return fmt.Errorf("ceiling: worker %d (%s): %w", w.spec.ID, w.spec.Mode, err)
	}
	return nil
}

func (w *ceilWorker) runRaw(ctx context.Context) error {
	for range w.spec.Cycles {
		for range 3 {
			rev, err := w.kv.Update(ctx, w.spec.Key, w.spec.Value, w.cur.rev)
			if err != nil {
				return err
			}
			w.cur.rev = rev
			w.stats.Writes++
		}
		w.stats.Cycles++
	}
	return nil
}

// receive waits for the next watch entry (nil: the end of the initial
// values) and takes it as the known state when it is newer.
func (w *ceilWorker) receive(ctx context.Context) (jetstream.KeyValueEntry, error) {
	t := time.NewTimer(ceilStallTimeout)
	defer t.Stop()
	select {
	case e, ok := <-w.watch.Updates():
		if !ok {
			return nil, errors.New("the watch ended")
		}
		return e, w.take(e)
	case <-t.C:
		return nil, fmt.Errorf("no watch delivery for %v after revision %d", ceilStallTimeout, w.cur.rev)
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

func (w *ceilWorker) take(e jetstream.KeyValueEntry) error {
	if e == nil {
		return nil
	}
	w.stats.Deliveries++
	if e.Revision() <= w.cur.rev {
		return nil
	}
	if e.Operation() != jetstream.KeyValuePut {
		return fmt.Errorf("the key was deleted at revision %d", e.Revision())
	}
	st, err := decodeCeilState(e.Value())
	if err != nil {
		return err
	}
	w.cur = ceilKnown{st: st, rev: e.Revision()}
	return nil
}

// drain takes every delivery already received, without waiting.
func (w *ceilWorker) drain() error {
	for {
		var err error
		if w.watch != nil {
			select {
			case e, ok := <-w.watch.Updates():
				if !ok {
					return errors.New("the watch ended")
				}
				err = w.take(e)
			default:
				return nil
			}
		} else {
			select {
			case m := <-w.wakes:
				err = w.takeWake(m)
			default:
				return nil
			}
		}
		if err != nil {
			return err
		}
	}
}

// awaitNewer waits until the known revision is newer than rev: from the
// watch, or (wake mode) from a wake-up; a waiter owed a wake-up (owed)
// reads the key when it does not come within ceilWakeFallback.
func (w *ceilWorker) awaitNewer(ctx context.Context, rev uint64, owed bool) error {
	if err := w.drain(); err != nil {
		return err
	}
	for w.cur.rev <= rev {
		if w.watch != nil {
			if _, err := w.receive(ctx); err != nil {
				return err
			}
			continue
		}
		wait := ceilStallTimeout
		if owed {
			wait = ceilWakeFallback
		}
		t := time.NewTimer(wait)
		select {
		case m := <-w.wakes:
			t.Stop()
			if err := w.takeWake(m); err != nil {
				return err
			}
		case <-t.C:
			if !owed {
				return fmt.Errorf("no wake-up for %v after revision %d", wait, w.cur.rev)
			}
			w.stats.FallbackReads++
			if err := w.read(ctx); err != nil {
				return err
			}
		case <-ctx.Done():
			t.Stop()
			return ctx.Err()
		}
	}
	return nil
}

// A wake-up is the revision (8 bytes, big-endian) and the state written.
func ceilWakeData(k ceilKnown) []byte {
	return append(binary.BigEndian.AppendUint64(nil, k.rev), k.st.encode()...)
}

func (w *ceilWorker) takeWake(m *nats.Msg) error {
	w.stats.Deliveries++
	if len(m.Data) < 8 {
		return fmt.Errorf("a wake-up of %d bytes", len(m.Data))
	}
	rev := binary.BigEndian.Uint64(m.Data)
	if rev <= w.cur.rev {
		return nil
	}
	st, err := decodeCeilState(m.Data[8:])
	if err != nil {
		return err
	}
	w.cur = ceilKnown{st: st, rev: rev}
	return nil
}

func (w *ceilWorker) read(ctx context.Context) error {
	w.stats.Reads++
	e, err := w.kv.Get(ctx, w.spec.Key)
	if err != nil {
		return err
	}
	st, err := decodeCeilState(e.Value())
	if err != nil {
		return err
	}
	if e.Revision() > w.cur.rev {
		w.cur = ceilKnown{st: st, rev: e.Revision()}
	}
	return nil
}

// write is one compare-and-swap of st on the known revision; lost is true
// when another revision came first. In wake mode a written state with a
// free slot and a queue wakes the queue's head (unless it is the writer's
// own job, which acts on it at once).
func (w *ceilWorker) write(ctx context.Context, st ceilState, job string) (lost bool, err error) {
	rev, err := w.kv.Update(ctx, w.spec.Key, st.encode(), w.cur.rev)
	if errors.Is(err, jetstream.ErrKeyExists) {
		w.stats.Failed++
		return true, nil
	}
	if err != nil {
		return false, err
	}
	w.stats.Writes++
	w.cur = ceilKnown{st: st, rev: rev}
	if w.wakes != nil && st.Active == nil && len(st.Queue) > 0 && st.Queue[0] != job {
		head, err := ceilJobWorker(st.Queue[0])
		if err != nil {
			return false, err
		}
		w.stats.Wakes++
		if err := w.nc.Publish(w.spec.Wakes+"."+strconv.Itoa(head), ceilWakeData(w.cur)); err != nil {
			return false, err
		}
	}
	return false, nil
}

// runCycles does the worker's cycles: admit a job, wait for its turn,
// acquire, release. Pipelined, the worker admits its next job while it
// holds the slot, before releasing it.
func (w *ceilWorker) runCycles(ctx context.Context) error {
	n := w.spec.Cycles
	if w.spec.Pipelined && n > 0 {
		if err := w.admit(ctx, ceilJob(w.spec.ID, 0)); err != nil {
			return err
		}
	}
	for c := range n {
		job := ceilJob(w.spec.ID, c)
		if !w.spec.Pipelined {
			if err := w.admit(ctx, job); err != nil {
				return err
			}
		}
		run, err := w.acquire(ctx, job)
		if err != nil {
			return err
		}
		// The job runs (does nothing).
		if w.spec.Pipelined && c+1 < n {
			if err := w.admit(ctx, ceilJob(w.spec.ID, c+1)); err != nil {
				return err
			}
		}
		if err := w.release(ctx, run); err != nil {
			return err
		}
		w.stats.Cycles++
	}
	return nil
}

// admit appends job on the known revision; a lost race waits for the
// next delivery (watch) or reads the key (wake-ups).
func (w *ceilWorker) admit(ctx context.Context, job string) error {
	for {
		if slices.Contains(w.cur.st.Queue, job) || (w.cur.st.Active != nil && *w.cur.st.Active == job) {
			return fmt.Errorf("job %s is in the state at revision %d before its admission", job, w.cur.rev)
		}
		st := ceilState{Active: w.cur.st.Active, Queue: append(slices.Clip(w.cur.st.Queue), job)}
		lost, err := w.write(ctx, st, job)
		if err != nil {
			return fmt.Errorf("admit %s: %w", job, err)
		}
		if !lost {
			break
		}
		if w.watch != nil {
			err = w.awaitNewer(ctx, w.cur.rev, false)
		} else {
			err = w.read(ctx)
		}
		if err != nil {
			return fmt.Errorf("admit %s: %w", job, err)
		}
	}
	w.stats.Admitted++
	return nil
}

// acquire waits until the slot is free and job heads the queue, and takes
// the slot.
func (w *ceilWorker) acquire(ctx context.Context, job string) (ceilRun, error) {
	for {
		st := w.cur.st
		if !slices.Contains(st.Queue, job) {
			return ceilRun{}, fmt.Errorf("job %s left the queue at revision %d without acquiring", job, w.cur.rev)
		}
		if st.Active != nil || st.Queue[0] != job {
			// Not this job's turn: wait for a change (a wake-up when its
			// turn comes).
			if err := w.awaitNewer(ctx, w.cur.rev, false); err != nil {
				return ceilRun{}, fmt.Errorf("acquire %s: %w", job, err)
			}
			continue
		}
		lost, err := w.write(ctx, ceilState{Active: &job, Queue: st.Queue[1:]}, job)
		if err != nil {
			return ceilRun{}, fmt.Errorf("acquire %s: %w", job, err)
		}
		if !lost {
			break
		}
		// Lost to an admission: its writer wakes this job again.
		if err := w.awaitNewer(ctx, w.cur.rev, true); err != nil {
			return ceilRun{}, fmt.Errorf("acquire %s: %w", job, err)
		}
	}
	run := ceilRun{Job: job, Acquired: w.cur.rev}
	if w.holder != nil && !w.holder.CompareAndSwap(0, int64(w.spec.ID)+1) {
		return ceilRun{}, fmt.Errorf("job %s acquired at revision %d while worker %d holds the slot", job, w.cur.rev, w.holder.Load()-1)
	}
	return run, nil
}

// release gives up the slot run holds.
func (w *ceilWorker) release(ctx context.Context, run ceilRun) error {
	job := run.Job
	if w.holder != nil && !w.holder.CompareAndSwap(int64(w.spec.ID)+1, 0) {
		return fmt.Errorf("job %s releasing while worker %d holds the slot", job, w.holder.Load()-1)
	}
	for {
		st := w.cur.st
		if st.Active == nil || *st.Active != job {
			return fmt.Errorf("job %s lost the slot at revision %d before its release", job, w.cur.rev)
		}
		lost, err := w.write(ctx, ceilState{Queue: st.Queue}, job)
		if err != nil {
			return fmt.Errorf("release %s: %w", job, err)
		}
		if !lost {
			break
		}
		if w.watch != nil {
			err = w.awaitNewer(ctx, w.cur.rev, false)
		} else {
			err = w.read(ctx)
		}
		if err != nil {
			return fmt.Errorf("release %s: %w", job, err)
		}
	}
	run.Released = w.cur.rev
	w.stats.Runs = append(w.stats.Runs, run)
	return nil
}

// ceilCheck checks a run of the protocol: cycles jobs each admitted and
// run once, the slot's turns in revision order never overlapping, and the
// final state empty.
func ceilCheck(total ceilStats, cycles int, final ceilState) error {
	if total.Cycles != cycles || total.Admitted != cycles || len(total.Runs) != cycles {
		return fmt.Errorf("ceiling: %d cycles, %d admitted, %d runs; want %d each", total.Cycles, total.Admitted, len(total.Runs), cycles)
	}
	runs := slices.Clone(total.Runs)
	slices.SortFunc(runs, func(a, b ceilRun) int { return cmp.Compare(a.Acquired, b.Acquired) })
	seen := make(map[string]bool, len(runs))
	for i, r := range runs {
		if seen[r.Job] {
			return fmt.Errorf("ceiling: job %s ran twice", r.Job)
		}
		seen[r.Job] = true
		if r.Released <= r.Acquired {
			return fmt.Errorf("ceiling: job %s released at revision %d, acquired at %d", r.Job, r.Released, r.Acquired)
		}
		if i > 0 && runs[i-1].Released >= r.Acquired {
			return fmt.Errorf("ceiling: job %s acquired at revision %d before job %s released (%d): MaxActive 1 exceeded",
				r.Job, r.Acquired, runs[i-1].Job, runs[i-1].Released)
		}
	}
	if final.Active != nil || len(final.Queue) != 0 {
		return fmt.Errorf("ceiling: the key ends as %s, want it empty", final.encode())
	}
	return nil
}

// ceilBucket creates a fresh memory bucket, as jobkeys' NATSStore creates
// its buckets, with the protocol's empty state at ceilKey (value for the
// raw row) and at ceilOtherKey; it is deleted when b ends.
func ceilBucket(b *testing.B, js jetstream.JetStream, value []byte) string {
	ctx := context.Background()
	bucket := "CEIL_" + strconv.FormatInt(benchSeq.Add(1), 10)
	kv, err := js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: bucket, History: 1, Storage: jetstream.MemoryStorage})
	require.NoError(b, err)
	b.Cleanup(func() { _ = js.DeleteKeyValue(context.Background(), bucket) })
	if value == nil {
		value = ceilState{}.encode()
	}
	_, err = kv.Put(ctx, ceilKey, value)
	require.NoError(b, err)
	_, err = kv.Put(ctx, ceilOtherKey, ceilState{}.encode())
	require.NoError(b, err)
	return bucket
}

// ceilRow describes a row: workers workers of mode, idle idle watchers of
// idleKey (headers only when metaOnly); procs runs each of them as a child
// process.
type ceilRow struct {
	mode     ceilMode
	workers  int
	idle     int
	idleKey  string
	metaOnly bool
	procs    bool
	// pipelined: each worker admits its next job while holding the slot
	// (no admission races the next acquisition).
	pipelined bool
}

func (r ceilRow) specs(url, bucket, wakes string, n int, value []byte) []ceilSpec {
	var specs []ceilSpec
	for i := range r.workers {
		c := n / r.workers
		if i < n%r.workers {
			c++
		}
		specs = append(specs, ceilSpec{URL: url, Bucket: bucket, Key: ceilKey, Mode: r.mode, ID: i, Cycles: c, Wakes: wakes, Value: value, Pipelined: r.pipelined})
	}
	for i := range r.idle {
		specs = append(specs, ceilSpec{URL: url, Bucket: bucket, Key: r.idleKey, Mode: ceilIdle, ID: r.workers + i, MetaOnly: r.metaOnly})
	}
	return specs
}

// BenchmarkCeiling is documented at the top of this file.
func BenchmarkCeiling(b *testing.B) {
	s := natstest.Run(b)
	value := benchStateBytes(b, 0)
	rows := []struct {
		name string
		row  ceilRow
	}{
		{"B1-watch-1conn", ceilRow{mode: ceilWatch, workers: 1}},
		{"B1-watch-4conns", ceilRow{mode: ceilWatch, workers: 4}},
		{"B1-watch-8conns", ceilRow{mode: ceilWatch, workers: 8}},
		{"B1-watch-16conns", ceilRow{mode: ceilWatch, workers: 16}},
		{"B2-wake-1conn", ceilRow{mode: ceilWake, workers: 1}},
		{"B2-wake-16conns", ceilRow{mode: ceilWake, workers: 16}},
		{"B1-watch-16conns-pipelined", ceilRow{mode: ceilWatch, workers: 16, pipelined: true}},
		{"B2-wake-16conns-pipelined", ceilRow{mode: ceilWake, workers: 16, pipelined: true}},
		{"B3-1worker+15watch-samekey", ceilRow{mode: ceilRaw, workers: 1, idle: 15, idleKey: ceilKey}},
		{"B3-1worker+15watch-samekey-metaonly", ceilRow{mode: ceilRaw, workers: 1, idle: 15, idleKey: ceilKey, metaOnly: true}},
		{"B3-1worker+15watch-otherkey", ceilRow{mode: ceilRaw, workers: 1, idle: 15, idleKey: ceilOtherKey}},
		{"P1-watch-4procs", ceilRow{mode: ceilWatch, workers: 4, procs: true}},
		{"P1-watch-8procs", ceilRow{mode: ceilWatch, workers: 8, procs: true}},
		{"P1-watch-16procs", ceilRow{mode: ceilWatch, workers: 16, procs: true}},
		{"P2-wake-16procs", ceilRow{mode: ceilWake, workers: 16, procs: true}},
		{"P1-watch-16procs-pipelined", ceilRow{mode: ceilWatch, workers: 16, procs: true, pipelined: true}},
		{"P2-wake-16procs-pipelined", ceilRow{mode: ceilWake, workers: 16, procs: true, pipelined: true}},
		{"P3-1proc+15watch-samekey", ceilRow{mode: ceilRaw, workers: 1, idle: 15, idleKey: ceilKey, procs: true}},
	}
	for _, r := range rows {
		b.Run(r.name, func(b *testing.B) {
			b.Run("base", func(b *testing.B) {
				benchCeilingRow(b, s, ceilRow{mode: ceilRaw, workers: 1, procs: r.row.procs}, value)
			})
			b.Run("row", func(b *testing.B) { benchCeilingRow(b, s, r.row, value) })
		})
	}
}

func benchCeilingRow(b *testing.B, s *server.Server, r ceilRow, value []byte) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	nc, js := natstest.ConnectURL(b, benchClientURL(s))
	var raw []byte
	if r.mode == ceilRaw {
		raw = value
	}
	bucket := ceilBucket(b, js, raw)
	wakes := "ceil." + bucket
	specs := r.specs(benchClientURL(s), bucket, wakes, b.N, raw)
	var total ceilStats
	if r.procs {
		total = ceilRunProcs(ctx, b, nc, specs)
	} else {
		total = ceilRunInProcess(ctx, b, specs)
	}
	benchReportRate(b, "cycles/s")
	n := float64(b.N)
	b.ReportMetric(float64(total.CPU)/1e3/n, "cpu-µs/cycle")
	b.ReportMetric(float64(total.Writes)/n, "writes/cycle")
	b.ReportMetric(float64(total.Failed)/n, "failed-cas/cycle")
	if r.mode == ceilWake {
		b.ReportMetric(float64(total.Reads)/n, "reads/cycle")
		b.ReportMetric(float64(total.FallbackReads)/n, "fallback-reads/cycle")
		b.ReportMetric(float64(total.Wakes)/n, "wakes/cycle")
	}
	if r.mode == ceilWatch || r.mode == ceilWake {
		b.ReportMetric(float64(total.Deliveries)/n, "deliveries/cycle")
		kv, err := js.KeyValue(ctx, bucket)
		require.NoError(b, err)
		e, err := kv.Get(ctx, ceilKey)
		require.NoError(b, err)
		final, err := decodeCeilState(e.Value())
		require.NoError(b, err)
		if err := ceilCheck(total, b.N, final); err != nil {
			b.Fatal(err)
		}
	} else if total.Cycles != b.N || total.Writes != 3*b.N {
		b.Fatalf("ceiling: %d cycles and %d writes, want %d and %d", total.Cycles, total.Writes, b.N, 3*b.N)
	}
}

// ceilRunInProcess runs the workers as goroutines, each on its own
// connection, and returns their stats.
func ceilRunInProcess(ctx context.Context, b *testing.B, specs []ceilSpec) ceilStats {
	var holder atomic.Int64
	var workers []*ceilWorker
	defer func() {
		for _, w := range workers {
			w.close()
		}
	}()
	for _, sp := range specs {
		w, err := newCeilWorker(ctx, sp, &holder)
		if err != nil {
			b.Fatal(err)
		}
		workers = append(workers, w)
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	errs := make(chan error, len(workers))
	var wg sync.WaitGroup
	b.ReportAllocs()
	cpu0 := ceilCPU(b)
	b.ResetTimer()
	for _, w := range workers {
		if w.spec.Mode == ceilIdle {
			continue
		}
		wg.Go(func() {
			if err := w.run(ctx); err != nil {
				errs <- err
				cancel()
			}
		})
	}
	wg.Wait()
	b.StopTimer()
	cpu := ceilCPU(b) - cpu0
	close(errs)
	for err := range errs {
		b.Error(err)
	}
	if b.Failed() {
		b.FailNow()
	}
	var total ceilStats
	for _, w := range workers {
		total.add(w.stats)
	}
	total.CPU = int64(cpu)
	return total
}

// ceilCPU returns the CPU time (user and system) the process has used.
func ceilCPU(tb testing.TB) time.Duration {
	var ru syscall.Rusage
	require.NoError(tb, syscall.Getrusage(syscall.RUSAGE_SELF, &ru))
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// ceilChildEnv carries a child process's spec (JSON).
const ceilChildEnv = "JOBKEYS_CEILING_CHILD"

// ceilRunProcs runs each worker as a child process (this test binary
// running TestCeilingChild), started together once all are ready, and
// returns their stats. nc is the parent's connection.
func ceilRunProcs(ctx context.Context, b *testing.B, nc *nats.Conn, specs []ceilSpec) ceilStats {
	exe, err := os.Executable()
	require.NoError(b, err)
	prefix := "ceil.ctl." + nats.NewInbox()[len("_INBOX."):]
	ready := make(chan *nats.Msg, len(specs))
	sub, err := nc.ChanSubscribe(prefix+".ready", ready)
	require.NoError(b, err)
	defer func() { _ = sub.Unsubscribe() }()
	require.NoError(b, nc.Flush())
	dir := b.TempDir()
	type child struct {
		cmd  *exec.Cmd
		out  string
		idle bool
		done chan error
	}
	children := make([]*child, len(specs))
	defer func() {
		_ = nc.Publish(prefix+".ctl", []byte("stop"))
		_ = nc.Flush()
		for _, c := range children {
			if c != nil {
				if err := <-c.done; err != nil {
					b.Error(err)
				}
			}
		}
	}()
	for i, sp := range specs {
		sp.Ready, sp.Ctl = prefix+".ready", prefix+".ctl"
		sp.Out = fmt.Sprintf("%s/%d.json", dir, i)
		spec, err := json.Marshal(sp)
		require.NoError(b, err)
		cmd := exec.Command(exe, "-test.run=^TestCeilingChild$", "-test.count=1", "-test.timeout=10m")
		cmd.Env = append(os.Environ(), ceilChildEnv+"="+string(spec))
		// The child's output, whole, for the error of a failed child (exec
		// copies it; Wait returns once it is all read).
		var output bytes.Buffer
		cmd.Stdout, cmd.Stderr = &output, &output
		require.NoError(b, cmd.Start())
		c := &child{cmd: cmd, out: sp.Out, idle: sp.Mode == ceilIdle, done: make(chan error, 1)}
		children[i] = c
		go func() {
			if err := cmd.Wait(); err != nil {
				c.done <- fmt.Errorf("ceiling: child %d: %w\n%s", sp.ID, err, output.String())
				return
			}
			c.done <- nil
		}()
	}
	t := time.NewTimer(time.Minute)
	defer t.Stop()
	for range specs {
		select {
		case <-ready:
		case <-t.C:
			b.Fatal("ceiling: the child processes were not ready within a minute")
		}
	}
	b.ReportAllocs()
	cpu0 := ceilCPU(b)
	b.ResetTimer()
	require.NoError(b, nc.Publish(prefix+".ctl", []byte("start")))
	require.NoError(b, nc.Flush())
	var total ceilStats
	for _, c := range children {
		if c.idle {
			continue
		}
		err := <-c.done
		c.done <- err // for the deferred wait
		if err != nil {
			b.StopTimer()
			b.Fatal(err)
		}
	}
	b.StopTimer()
	cpu := ceilCPU(b) - cpu0
	// The idle children report their CPU time once stopped.
	require.NoError(b, nc.Publish(prefix+".ctl", []byte("stop")))
	require.NoError(b, nc.Flush())
	for _, c := range children {
		if c.idle {
			err := <-c.done
			c.done <- err
			require.NoError(b, err)
		}
	}
	total.CPU = int64(cpu)
	for _, c := range children {
		data, err := os.ReadFile(c.out)
		require.NoError(b, err)
		var st ceilStats
		require.NoError(b, json.Unmarshal(data, &st))
		total.add(st)
	}
	return total
}

// TestCeilingChild is one worker process of BenchmarkCeiling's P rows; it
// skips unless the benchmark started it.
func TestCeilingChild(t *testing.T) {
	env := os.Getenv(ceilChildEnv)
	if env == "" {
		t.Skip("a child process of BenchmarkCeiling")
	}
	var sp ceilSpec
	require.NoError(t, json.Unmarshal([]byte(env), &sp))
	ctx := context.Background()
	ctl, err := nats.Connect(sp.URL)
	require.NoError(t, err)
	defer ctl.Close()
	cmds, err := ctl.SubscribeSync(sp.Ctl)
	require.NoError(t, err)
	require.NoError(t, ctl.Flush())
	w, err := newCeilWorker(ctx, sp, nil)
	require.NoError(t, err)
	defer w.close()
	require.NoError(t, ctl.Publish(sp.Ready, nil))
	require.NoError(t, ctl.Flush())
	m, err := cmds.NextMsg(5 * time.Minute)
	require.NoError(t, err, "the start")
	if string(m.Data) == "stop" {
		return // the benchmark failed before the start
	}
	cpu0 := ceilCPU(t)
	if sp.Mode == ceilIdle {
		_, err = cmds.NextMsg(10 * time.Minute)
		require.NoError(t, err, "the stop")
	} else {
		require.NoError(t, w.run(ctx))
	}
	w.stats.CPU = int64(ceilCPU(t) - cpu0)
	data, err := json.Marshal(w.stats)
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(sp.Out, data, 0o600))
}

// TestCeilingProtocols runs BenchmarkCeiling's two protocols briefly on a
// few connections and checks them as the benchmark does: the benchmark's
// checks must be able to pass, and its protocols must not deadlock.
func TestCeilingProtocols(t *testing.T) {
	t.Parallel()
	s := natstest.Run(t)
	for _, tc := range []struct {
		mode      ceilMode
		pipelined bool
	}{{ceilWatch, false}, {ceilWake, false}, {ceilWatch, true}, {ceilWake, true}} {
		mode := tc.mode
		t.Run(fmt.Sprintf("%s/pipelined=%v", mode, tc.pipelined), func(t *testing.T) {
			ctx := context.Background()
			_, js := natstest.Connect(t, s)
			bucket := "CEILT_" + strconv.FormatInt(benchSeq.Add(1), 10)
			kv, err := js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: bucket, History: 1, Storage: jetstream.MemoryStorage})
			require.NoError(t, err)
			_, err = kv.Put(ctx, ceilKey, ceilState{}.encode())
			require.NoError(t, err)
			const workers, cycles = 4, 25
			var holder atomic.Int64
			var ws []*ceilWorker
			for i := range workers {
				w, err := newCeilWorker(ctx, ceilSpec{URL: s.ClientURL(), Bucket: bucket, Key: ceilKey, Mode: mode, ID: i, Cycles: cycles, Wakes: "ceilt." + bucket, Pipelined: tc.pipelined}, &holder)
				require.NoError(t, err)
				t.Cleanup(w.close)
				ws = append(ws, w)
			}
			var wg sync.WaitGroup
			errs := make([]error, workers)
			rctx, cancel := context.WithCancel(ctx)
			defer cancel()
			for i, w := range ws {
				wg.Go(func() {
					if errs[i] = w.run(rctx); errs[i] != nil {
						cancel() // the others would wait for this worker
					}
				})
			}
			wg.Wait()
			var total ceilStats
			for i, w := range ws {
				require.NoError(t, errs[i])
				total.add(w.stats)
			}
			e, err := kv.Get(ctx, ceilKey)
			require.NoError(t, err)
			final, err := decodeCeilState(e.Value())
			require.NoError(t, err)
			require.NoError(t, ceilCheck(total, workers*cycles, final))
			require.Equal(t, 3*workers*cycles, total.Writes, "three revisions per cycle")
			require.Zero(t, total.FallbackReads, "every owed wake-up came")
		})
	}
}
