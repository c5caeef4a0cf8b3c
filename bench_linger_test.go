package jobkeys

// A diagnostic of group commit on a hot key (issue 11): the hot-key rows of
// BenchmarkCycle in one process (n workers, one connection, MaxActive 1)
// with probes on the key's lane (laneProbes, set through benchLaneProbes) that records, per batch, what
// it carried, and per operation that arrived while a batch was being
// written (and so missed it), how long after the batch was taken it came.
// It runs only with JOBKEYS_LANE_TRACE=1:
//
//	JOBKEYS_LANE_TRACE=1 go test -run '^$' -bench BenchmarkLaneProbe -benchtime 2s -v .
//
// Operations are named by kind: r a release (or renewal: a lease's), a an
// acquisition of a Runner (trusting the watch), m an admission (or any
// other).

import (
	"cmp"
	"fmt"
	"maps"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jobkeys/jobkeys/internal/lane"
	"github.com/jobkeys/jobkeys/internal/natstest"
)

// BenchmarkLingerHotKey is the NATS/1worker row and the one-process
// hot-key rows of BenchmarkCycle with the process's CPU time per cycle
// (cpu-µs/cycle, user and system, the embedded server's included, and
// each row's setup and warm-up too): on a machine too loaded for the
// rows' latency to mean much, what a cycle costs.
//
//	go test -run '^$' -bench BenchmarkLingerHotKey -benchtime 2s .
func BenchmarkLingerHotKey(b *testing.B) {
	s := natstest.Run(b)
	cpu := func(b *testing.B, run func()) {
		cpu0 := benchProcessCPU(b)
		run()
		b.ReportMetric(float64((benchProcessCPU(b)-cpu0).Microseconds())/float64(b.N), "cpu-µs/cycle")
	}
	b.Run("NATS/1worker", func(b *testing.B) { cpu(b, func() { benchOneWorker(b, s) }) })
	for _, n := range []int{16, 64} {
		b.Run(fmt.Sprintf("NATS/%dworkers-1conn-1key-watcher", n), func(b *testing.B) {
			cpu(b, func() { benchHotKey(b, s, n, 1) })
		})
	}
}

func BenchmarkLaneProbe(b *testing.B) {
	if os.Getenv("JOBKEYS_LANE_TRACE") != "1" {
		b.Skip("set JOBKEYS_LANE_TRACE=1 to run the lane probe")
	}
	s := natstest.Run(b)
	b.Run("NATS/1worker", func(b *testing.B) {
		p := newLaneRecorder()
		benchLaneProbes = p.probes()
		defer func() { benchLaneProbes = nil }()
		benchOneWorker(b, s)
		benchLaneProbes = nil
		p.report(b)
	})
	for _, n := range []int{16, 64} {
		b.Run(fmt.Sprintf("NATS/%dworkers-1conn-1key-watcher", n), func(b *testing.B) {
			p := newLaneRecorder()
			benchLaneProbes = p.probes()
			defer func() { benchLaneProbes = nil }()
			benchHotKey(b, s, n, 1)
			benchLaneProbes = nil
			p.report(b)
		})
	}
}

// benchLaneProbes, set by BenchmarkLaneProbe while it runs (its rows run
// one at a time, never in parallel), are the lane probes benchConnect
// gives the coordinators it makes (keyTable.probes).
var benchLaneProbes *laneProbes

// laneRecorder is a set of laneProbes that keeps its findings.
type laneRecorder struct {
	mu      sync.Mutex
	lanes   map[*opLane]*laneTrace
	shapes  map[string]int             // batches by the kinds of their operations, in order
	missed  map[byte][]time.Duration   // by kind: arrival after the take of the batch in flight
	late    map[byte][]time.Duration   // by kind: arrival after the write ended, the lane still held
	idle    map[byte][]time.Duration   // by kind: arrival at a free lane, after the last write ended
	joined  map[byte]int               // by kind: arrivals before the holder took its batch
	rtts    []time.Duration            // take to write's end
	lingers map[string][]time.Duration // by kind (release, acquisitions) and whether met
	ops     int                        // operations in batches that wrote
	log     []string                   // the first events, with times
	seen    int
	all     []laneEvent
	t0      time.Time
	writes  int // batches that wrote
}

// laneTrace is the recorder's view of one lane.
type laneTrace struct {
	taken, written time.Time // of the latest batch
	inFlight       bool
}

func newLaneRecorder() *laneRecorder {
	return &laneRecorder{t0: time.Now(), lanes: map[*opLane]*laneTrace{}, shapes: map[string]int{},
		missed: map[byte][]time.Duration{}, late: map[byte][]time.Duration{}, idle: map[byte][]time.Duration{}, lingers: map[string][]time.Duration{}, joined: map[byte]int{}}
}

func laneKind(op *laneOp) byte {
	switch {
	case op.rt.lease != nil:
		return 'r'
	case op.Trust:
		return 'a'
	}
	return 'm'
}

// note logs an event, for the first laneLogEvents events after the first
// 20,000 (past the warm-up). Called with p.mu held.
func (p *laneRecorder) note(now time.Time, format string, args ...any) {
	p.seen++
	if p.seen > 20000 && len(p.log) < laneLogEvents {
		p.log = append(p.log, fmt.Sprintf("%9.1fµs ", float64(now.Sub(p.t0).Nanoseconds())/1e3)+fmt.Sprintf(format, args...))
	}
	if len(p.all) < 1<<20 {
		p.all = append(p.all, laneEvent{at: now, what: fmt.Sprintf(format, args...)})
	}
}

type laneEvent struct {
	at   time.Time
	what string
}

const laneLogEvents = 120

func (p *laneRecorder) trace(l *opLane) *laneTrace {
	t := p.lanes[l]
	if t == nil {
		t = &laneTrace{}
		p.lanes[l] = t
	}
	return t
}

func (p *laneRecorder) probes() *laneProbes {
	return &laneProbes{lane: lane.Probes[*laneOp]{
		Arrive: func(l *opLane, op *laneOp, busy bool) {
			now := time.Now()
			k := laneKind(op)
			p.mu.Lock()
			defer p.mu.Unlock()
			t := p.trace(l)
			p.note(now, "arrive %c busy=%v inflight=%v", k, busy, t.inFlight)
			switch {
			case !busy:
				if !t.written.IsZero() {
					p.idle[k] = append(p.idle[k], now.Sub(t.written))
				}
			case t.inFlight:
				p.missed[k] = append(p.missed[k], now.Sub(t.taken))
			case !t.written.IsZero() && t.written.After(t.taken):
				p.late[k] = append(p.late[k], now.Sub(t.written))
			default:
				p.joined[k]++
			}
		},
		Linger: func(l *opLane, lease, met bool, d time.Duration) {
			p.mu.Lock()
			defer p.mu.Unlock()
			k := fmt.Sprintf("for acquisitions, met %v", met)
			if lease {
				k = fmt.Sprintf("for a release, met %v", met)
			}
			p.lingers[k] = append(p.lingers[k], d)
		},
	},
		batch: func(l *opLane, ops []*laneOp, writers int) {
			now := time.Now()
			var shape strings.Builder
			for _, op := range ops {
				shape.WriteByte(laneKind(op))
			}
			p.mu.Lock()
			defer p.mu.Unlock()
			t := p.trace(l)
			t.taken, t.inFlight = now, true
			p.note(now, "take [%s]", shape.String())
			p.shapes[shape.String()]++
			p.ops += len(ops)
			p.writes++
		},
		written: func(l *opLane, err error) {
			now := time.Now()
			p.mu.Lock()
			defer p.mu.Unlock()
			t := p.trace(l)
			t.written, t.inFlight = now, false
			p.note(now, "written err=%v", err)
			p.rtts = append(p.rtts, now.Sub(t.taken))
		},
	}
}

// report logs the findings.
func (p *laneRecorder) report(b *testing.B) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.writes == 0 {
		return
	}
	b.ReportMetric(float64(p.ops)/float64(p.writes), "ops/batch")
	var out strings.Builder
	fmt.Fprintf(&out, "%d batches that wrote, %.2f ops each; take->written %s\n", p.writes, float64(p.ops)/float64(p.writes), quantiles(p.rtts))
	shapes := slices.SortedFunc(maps.Keys(p.shapes), func(x, y string) int { return cmp.Compare(p.shapes[y], p.shapes[x]) })
	for i, s := range shapes {
		if i == 12 {
			break
		}
		fmt.Fprintf(&out, "  batch %-8s %5.1f%%\n", s, 100*float64(p.shapes[s])/float64(p.writes))
	}
	for _, k := range []byte("rma") {
		fmt.Fprintf(&out, "  %c: joined before take %d; missed (after take, in flight) %d %s; late (after write, lane held) %d %s; at a free lane %d %s\n",
			k, p.joined[k], len(p.missed[k]), quantiles(p.missed[k]), len(p.late[k]), quantiles(p.late[k]), len(p.idle[k]), quantiles(p.idle[k]))
	}
	for _, k := range slices.Sorted(maps.Keys(p.lingers)) {
		fmt.Fprintf(&out, "  lingers %s: %d %s\n", k, len(p.lingers[k]), quantiles(p.lingers[k]))
	}
	// Gaps from a write's end to the next batch's take: the lane not
	// writing.
	var gaps []time.Duration
	var gapAt []int
	for i, ev := range p.all {
		if !strings.HasPrefix(ev.what, "written") {
			continue
		}
		for j := i + 1; j < len(p.all); j++ {
			if strings.HasPrefix(p.all[j].what, "take") {
				gaps = append(gaps, p.all[j].at.Sub(ev.at))
				gapAt = append(gapAt, i)
				break
			}
		}
	}
	var sum, big time.Duration
	for _, g := range gaps {
		sum += g
		if g > 300*time.Microsecond {
			big += g
		}
	}
	fmt.Fprintf(&out, "  write end -> next take: %s, total %v, of it in gaps over 300µs %v; span %v\n", quantiles(gaps), sum.Round(time.Millisecond), big.Round(time.Millisecond), p.all[len(p.all)-1].at.Sub(p.all[0].at).Round(time.Millisecond))
	if os.Getenv("JOBKEYS_LANE_LOG") == "1" {
		order := make([]int, len(gaps))
		for i := range order {
			order[i] = i
		}
		slices.SortFunc(order, func(x, y int) int { return cmp.Compare(gaps[y], gaps[x]) })
		for _, g := range order[:min(4, len(order))] {
			i := gapAt[g]
			fmt.Fprintf(&out, "  gap of %v:\n", gaps[g])
			for j := max(i-8, 0); j < min(i+8, len(p.all)); j++ {
				fmt.Fprintf(&out, "    %+9.1fµs %s\n", float64(p.all[j].at.Sub(p.all[i].at).Nanoseconds())/1e3, p.all[j].what)
			}
		}
	}
	if os.Getenv("JOBKEYS_LANE_LOG") == "2" {
		out.WriteString(strings.Join(p.log, "\n"))
	}
	b.Log("\n" + out.String())
}

// quantiles formats the p10, p50, p90 of ds.
func quantiles(ds []time.Duration) string {
	if len(ds) == 0 {
		return "-"
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	q := func(f float64) time.Duration { return s[int(f*float64(len(s)-1))].Round(time.Microsecond) }
	return fmt.Sprintf("[p10 %v p50 %v p90 %v]", q(0.1), q(0.5), q(0.9))
}
