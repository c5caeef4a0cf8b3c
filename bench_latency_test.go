package jobkeys

// The hot-key benchmarks over a simulated network: every client connection
// reaches the embedded nats-server through a delay line, a local TCP proxy
// that delivers each chunk of bytes it reads no earlier than a fixed delay
// after it read it, in both directions (one-way delay D: each round trip
// takes 2D more than on loopback). Run with the delay in
// JOBKEYS_BENCH_DELAY, and with JOBKEYS_BENCH_NOBATCH=1 to turn atomic
// batches off in the same binary (benchNoBatch). The line's sleeps end
// late by the kernel's timer slack and a wake-up: here a round trip
// through a 250µs line took 0.69-0.72ms (TestDelayLine), and the 1-worker
// cycle's three writes 0.42, 0.83 and 2.4ms each at 100µs, 250µs and 1ms
// (60µs on loopback).
//
//	go test -c -o /tmp/jobkeys.test .
//	JOBKEYS_BENCH_DELAY=250us /tmp/jobkeys.test -test.run '^$' -test.bench BenchmarkCycleDelayed -test.benchtime 2s
//	JOBKEYS_BENCH_DELAY=250us JOBKEYS_BENCH_NOBATCH=1 /tmp/jobkeys.test -test.run '^$' -test.bench BenchmarkCycleDelayed -test.benchtime 2s

import (
	"bytes"
	"context"
	"fmt"
	"io"
	mrand "math/rand/v2"
	"net"
	"net/url"
	"os"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"

	"github.com/jobkeys/jobkeys/internal/natstest"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// benchURL, when set, is the URL benchConnect connects its workers to
// instead of the server's own (a delay line's, see BenchmarkCycleDelayed).
var benchURL string

// benchClientURL is the URL benchConnect connects to s by: benchURL, or
// JOBKEYS_BENCH_NATS_URL (a standalone nats-server with JetStream, as in
// BenchmarkUncontended: the process's CPU and heap are then the clients'
// alone), or s's own.
func benchClientURL(s *server.Server) string {
	if benchURL != "" {
		return benchURL
	}
	if u := os.Getenv("JOBKEYS_BENCH_NATS_URL"); u != "" {
		return u
	}
	return s.ClientURL()
}

// benchDelay is the one-way delay of JOBKEYS_BENCH_DELAY (a Go duration,
// "250us"); ok is false when the variable is unset.
func benchDelay(tb testing.TB) (d time.Duration, ok bool) {
	v := os.Getenv("JOBKEYS_BENCH_DELAY")
	if v == "" {
		return 0, false
	}
	d, err := time.ParseDuration(v)
	require.NoError(tb, err, "JOBKEYS_BENCH_DELAY")
	require.Positive(tb, d, "JOBKEYS_BENCH_DELAY")
	return d, true
}

// benchBatchesOff reports whether JOBKEYS_BENCH_NOBATCH=1 turns atomic
// batches off in the benchmarks (benchNoBatch).
func benchBatchesOff() bool { return os.Getenv("JOBKEYS_BENCH_NOBATCH") == "1" }

// benchNoBatch turns atomic batches off on the buckets the connections'
// stores have opened when JOBKEYS_BENCH_NOBATCH=1: their coordinators then
// write one state per round trip (groupWriters), as over a bucket whose
// stream does not allow atomic publish, with everything else the same. It
// runs after the warm-up cycles, which open the buckets.
func benchNoBatch(conns []*benchConn) {
	if !benchBatchesOff() {
		return
	}
	for _, c := range conns {
		c.store.mu.Lock()
		for _, b := range c.store.buckets {
			b.batches.Store(false)
		}
		c.store.mu.Unlock()
	}
}

// BenchmarkCycleDelayed runs the 1-worker row and the hot-key rows of
// BenchmarkCycle with every client connection behind a delay line of
// JOBKEYS_BENCH_DELAY one way; skipped when it is unset. The sub-benchmark
// names carry the delay and whether atomic batches are on (batch) or off
// (nobatch, JOBKEYS_BENCH_NOBATCH=1).
func BenchmarkCycleDelayed(b *testing.B) {
	d, ok := benchDelay(b)
	if !ok {
		b.Skip("set JOBKEYS_BENCH_DELAY (one-way delay, e.g. 250us) to run")
	}
	s := natstest.Run(b)
	line := startDelayLine(b, benchHostPort(b, s.ClientURL()), d)
	benchURL = line.URL()
	b.Cleanup(func() { benchURL = "" })
	mode := "batch"
	if benchBatchesOff() {
		mode = "nobatch"
	}
	prefix := fmt.Sprintf("delay=%dus/%s/NATS/", d.Microseconds(), mode)
	b.Run(prefix+"1worker", func(b *testing.B) {
		benchOneWorker(b, s)
	})
	// Each -wake row is the -watcher row with targeted wake-ups (see
	// BenchmarkCycle); 64 workers on one connection have no -wake row.
	for _, r := range []struct {
		name string
		row  hotKeyRow
	}{
		{"16workers-1conn-1key-watcher", hotKeyRow{workers: 16, conns: 1}},
		{"16workers-1conn-1key-wake", hotKeyRow{workers: 16, conns: 1, wake: true}},
		{"64workers-1conn-1key-watcher", hotKeyRow{workers: 64, conns: 1}},
		{"64workers-4conns-1key-watcher", hotKeyRow{workers: 64, conns: 4}},
		{"64workers-4conns-1key-wake", hotKeyRow{workers: 64, conns: 4, wake: true}},
		{"16workers-16conns-1key-watcher", hotKeyRow{workers: 16, conns: 16}},
		{"16workers-16conns-1key-wake", hotKeyRow{workers: 16, conns: 16, wake: true}},
		{"16workers-16conns-1key-wake-pipelined", hotKeyRow{workers: 16, conns: 16, wake: true, pipelined: true}},
		{"64workers-16conns-1key-wake", hotKeyRow{workers: 64, conns: 16, wake: true}},
		{"64workers-64conns-1key-wake", hotKeyRow{workers: 64, conns: 64, wake: true}},
		{"64workers-64conns-1key-wake-pipelined", hotKeyRow{workers: 64, conns: 64, wake: true, pipelined: true}},
	} {
		b.Run(prefix+r.name, func(b *testing.B) { benchHotKeyRow(b, s, r.row) })
	}
}

// benchOneWorker is the NATS/1worker row of BenchmarkCycle and BenchmarkCycleDelayed: one worker's
// admit → acquire → release cycles on one key.
func benchOneWorker(b *testing.B, s *server.Server) {
	w := benchConnect(b, s)
	ctx, service, payload := context.Background(), benchService(), benchPayload(0)
	if err := benchCycle(ctx, w.coord, service, benchPolicy, payload, "warmup"); err != nil {
		b.Fatal(err) // opens the bucket; leaves a delete marker as steady state does
	}
	benchNoBatch([]*benchConn{w})
	b.ReportAllocs()
	start := w.requests()
	reads, writes := w.totals.reads.Load(), w.totals.writes.Load()
	b.ResetTimer()
	for i := range b.N {
		if err := benchCycle(ctx, w.coord, service, benchPolicy, payload, "job-"+strconv.Itoa(i)); err != nil {
			b.Fatal(err)
		}
	}
	b.StopTimer()
	benchReportRate(b, "cycles/s")
	b.ReportMetric(float64(w.requests()-start)/float64(b.N), "rt/op")
	b.ReportMetric(float64(w.totals.reads.Load()-reads)/float64(b.N), "reads/cycle")
	b.ReportMetric(float64(w.totals.writes.Load()-writes)/float64(b.N), "writes/cycle")
}

// benchHostPort is the host:port of a nats:// URL.
func benchHostPort(tb testing.TB, raw string) string {
	u, err := url.Parse(raw)
	require.NoError(tb, err)
	return u.Host
}

// delayLine is a TCP proxy to one address that delays what it forwards: a
// chunk of bytes read from either side at t is written to the other at
// t+delay or later, in order, while the chunks read after it are already
// on their way (a delay line, not a rate limit). Close ends it and every
// connection through it.
type delayLine struct {
	ln     net.Listener
	target string
	delay  time.Duration

	mu     sync.Mutex
	closed bool
	conns  map[net.Conn]struct{}
	wg     sync.WaitGroup
}

// delayChunk is bytes read at due-delay, to write at due.
type delayChunk struct {
	due time.Time
	b   []byte
}

// delayQueue bounds the chunks in flight in one direction; a reader that
// gets this far ahead of its writer waits (back pressure, as TCP would).
const delayQueue = 4096

// startDelayLine listens on a loopback port and forwards to target with
// the one-way delay; it closes when tb ends.
func startDelayLine(tb testing.TB, target string, delay time.Duration) *delayLine {
	tb.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(tb, err)
	l := &delayLine{ln: ln, target: target, delay: delay, conns: map[net.Conn]struct{}{}}
	l.wg.Go(l.accept)
	tb.Cleanup(l.Close)
	return l
}

// URL is the nats:// URL of the line's end that clients connect to.
func (l *delayLine) URL() string { return "nats://" + l.ln.Addr().String() }

// Addr is the address of the line's end that clients connect to.
func (l *delayLine) Addr() string { return l.ln.Addr().String() }

// Close stops accepting, closes every connection through the line and
// waits for its goroutines.
func (l *delayLine) Close() {
	l.mu.Lock()
	l.closed = true
	for c := range l.conns {
		c.Close()
	}
	l.mu.Unlock()
	l.ln.Close()
	l.wg.Wait()
}

// track records conns for Close; false when the line is closed (conns
// are closed then).
func (l *delayLine) track(conns ...net.Conn) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		for _, c := range conns {
			c.Close()
		}
		return false
	}
	for _, c := range conns {
		l.conns[c] = struct{}{}
	}
	return true
}

// untrack closes conns and forgets them.
func (l *delayLine) untrack(conns ...net.Conn) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, c := range conns {
		c.Close()
		delete(l.conns, c)
	}
}

func (l *delayLine) accept() {
	for {
		client, err := l.ln.Accept()
		if err != nil {
			return // closed
		}
		if !l.track(client) {
			return
		}
		up, err := net.Dial("tcp", l.target)
		if err != nil {
			l.untrack(client)
			continue
		}
		if !l.track(up) {
			l.untrack(client)
			return
		}
		l.wg.Go(func() {
			var wg sync.WaitGroup
			wg.Go(func() { l.forward(up, client) })
			wg.Go(func() { l.forward(client, up) })
			wg.Wait()
			l.untrack(client, up)
		})
	}
}

// forward copies src to dst through the delay: one goroutine reads and
// stamps each chunk, another writes it when due. When either side fails
// both connections close (the other direction then ends too).
func (l *delayLine) forward(dst, src net.Conn) {
	q := make(chan delayChunk, delayQueue)
	var wg sync.WaitGroup
	wg.Go(func() {
		defer close(q)
		buf := make([]byte, 64<<10)
		for {
			n, err := src.Read(buf)
			if n > 0 {
				q <- delayChunk{due: time.Now().Add(l.delay), b: bytes.Clone(buf[:n])}
			}
			if err != nil {
				return
			}
		}
	})
	wg.Go(func() {
		failed := false
		for c := range q {
			if failed {
				continue // drain, so that the reader never blocks
			}
			delayUntil(c.due)
			if _, err := dst.Write(c.b); err != nil {
				failed = true
				l.untrack(dst, src)
			}
		}
		// The source ended: deliver its end to the other side.
		l.untrack(dst, src)
	})
	wg.Wait()
}

// TestDelayLine checks the benchmarks' delay line: bytes arrive intact and
// in order both ways, and a round trip through it takes at least twice the
// one-way delay (a lower bound: the tool, not the code under test). The
// delay is JOBKEYS_BENCH_DELAY's, or 2ms.
func TestDelayLine(t *testing.T) {
	d, ok := benchDelay(t)
	if !ok {
		d = 2 * time.Millisecond
	}
	echo := startEchoServer(t)
	line := startDelayLine(t, echo, d)

	c, err := net.Dial("tcp", line.Addr())
	require.NoError(t, err)
	defer c.Close()
	one := make([]byte, 1)
	for range 5 {
		start := time.Now()
		_, err := c.Write([]byte{'x'})
		require.NoError(t, err)
		_, err = io.ReadFull(c, one)
		require.NoError(t, err)
		rtt := time.Since(start)
		assert.GreaterOrEqual(t, rtt, 2*d, "echo round trip through the delay line")
		t.Logf("echo round trip %v (one-way delay %v)", rtt, d)
	}

	// Chunks written D/4 apart are in flight together: the last comes
	// back about 2D after it was written, not after the earlier ones' 2D
	// each (logged, not asserted: timings on a loaded machine).
	const pipelined = 8
	start := time.Now()
	for i := range pipelined {
		_, err := c.Write([]byte{byte('a' + i)})
		require.NoError(t, err)
		delayUntil(time.Now().Add(d / 4))
	}
	got := make([]byte, pipelined)
	_, err = io.ReadFull(c, got)
	require.NoError(t, err)
	assert.Equal(t, "abcdefgh", string(got))
	t.Logf("%d one-byte writes %v apart echoed in %v (serial: >= %v)", pipelined, d/4, time.Since(start), pipelined*2*d)

	// A stream of random bytes in random-sized writes comes back intact.
	payload := make([]byte, 1<<20)
	rng := mrand.New(mrand.NewPCG(1, 2))
	for i := range payload {
		payload[i] = byte(rng.Uint32())
	}
	werr := make(chan error, 1)
	go func() {
		rest := payload
		for len(rest) > 0 {
			n := min(len(rest), 1+rng.IntN(32<<10))
			if _, err := c.Write(rest[:n]); err != nil {
				werr <- err
				return
			}
			rest = rest[n:]
		}
		werr <- nil
	}()
	back := make([]byte, len(payload))
	_, err = io.ReadFull(c, back)
	require.NoError(t, err)
	require.NoError(t, <-werr)
	assert.True(t, bytes.Equal(payload, back), "the stream came back changed")

	// A NATS round trip (PING/PONG) through the line.
	s := natstest.Run(t)
	nline := startDelayLine(t, benchHostPort(t, s.ClientURL()), d)
	nc, _ := natstest.ConnectURL(t, nline.URL())
	rtt, err := nc.RTT()
	require.NoError(t, err)
	assert.GreaterOrEqual(t, rtt, 2*d, "NATS round trip through the delay line")
	t.Logf("NATS round trip %v (one-way delay %v)", rtt, d)

	// Close ends the connections through the line and the line itself.
	line.Close()
	_, err = c.Read(one)
	assert.Error(t, err, "a connection through a closed line stays open")
	_, err = net.DialTimeout("tcp", line.Addr(), time.Second)
	assert.Error(t, err, "a closed line still accepts")
}

// startEchoServer listens on a loopback port and writes back whatever each
// connection sends; it closes when t ends. It returns its address.
func startEchoServer(t *testing.T) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	var (
		mu    sync.Mutex
		conns []net.Conn
		wg    sync.WaitGroup
	)
	wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
			wg.Go(func() {
				defer c.Close()
				_, _ = io.Copy(c, c) // until either side closes
			})
		}
	})
	t.Cleanup(func() {
		ln.Close()
		mu.Lock()
		for _, c := range conns {
			c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
	return ln.Addr().String()
}
