package jobkeys

import (
	"fmt"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// recordedWakes is a wakeStore that records the targets of the wake-ups
// a coordinator sends.
type recordedWakes struct {
	targets []string
	free    int
}

func (*recordedWakes) wakeUps() bool { return true }

func (r *recordedWakes) publishWakes(_, _ string, _ []byte, _ uint64, targets []string, free int) {
	r.targets, r.free = append([]string(nil), targets...), free
}

func (*recordedWakes) subscribeWake(string, string, string, func([]byte, uint64)) (func(), error) {
	return func() {}, nil
}

// wakeQueue returns a queue of the jobs ids, in order.
func wakeQueue(ids ...string) []QueuedJob {
	q := make([]QueuedJob, len(ids))
	for i, id := range ids {
		q[i].JobID = id
	}
	return q
}

// wakeJobs returns the ids prefix-0 … prefix-(n-1).
func wakeJobs(prefix string, n int) []string {
	ids := make([]string, n)
	for i := range ids {
		ids[i] = fmt.Sprintf("%s-%d", prefix, i)
	}
	return ids
}

// newRecordedWakes returns a coordinator whose wake-ups are recorded.
func newRecordedWakes(t testing.TB) (*KeyCoordinator, *recordedWakes) {
	c, err := NewCoordinator(NewMemoryStore(), nil)
	require.NoError(t, err)
	rec := &recordedWakes{}
	c.wakes = rec
	return c, rec
}

// TestWakeUpsTargetsOfLongQueues: the targets of a write's wake-up are the
// jobs of its state's queue, in order, that were queued before it, at most
// the free slots plus wakeTargetsMax, on short and long queues, whether
// the jobs the write queued come last, in the middle, or the queue's
// order changed.
func TestWakeUpsTargetsOfLongQueues(t *testing.T) {
	key := JobKey{Service: "svc", JobType: "render", KVKey: "svc.render.h"}
	cases := []struct {
		name       string
		prev, next []string
		free       int
		want       []string
	}{
		{name: "short, one admitted", prev: []string{"a", "b"}, next: []string{"a", "b", "new"}, free: 1, want: []string{"a", "b"}},
		{name: "short, admitted in the middle", prev: []string{"a", "b"}, next: []string{"a", "new", "b"}, free: 1, want: []string{"a", "b"}},
		{name: "short, reordered", prev: []string{"a", "b", "c"}, next: []string{"c", "a", "new", "b"}, free: 2, want: []string{"c", "a", "b"}},
		{name: "long, head acquired, one admitted", prev: wakeJobs("q", 1000), next: append(wakeJobs("q", 1000)[1:], "new"), free: 1,
			want: wakeJobs("q", 1000)[1 : 1+1+wakeTargetsMax]},
		{name: "long, admitted in the middle", prev: wakeJobs("q", 40), next: append(append(wakeJobs("q", 40)[:20:20], "new-0", "new-1"), wakeJobs("q", 40)[20:]...), free: 1,
			want: wakeJobs("q", 40)},
		{name: "long, reordered", prev: wakeJobs("q", 40), next: append([]string{"q-39", "new"}, wakeJobs("q", 39)...), free: 3,
			want: append([]string{"q-39"}, wakeJobs("q", 39)...)},
		{name: "long, all admitted after", prev: wakeJobs("q", 30), next: append(wakeJobs("q", 30)[5:], wakeJobs("new", 100)...), free: 2,
			want: wakeJobs("q", 30)[5:]},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c, rec := newRecordedWakes(t)
			prev := &KeyState{MaxActive: tc.free, Queued: wakeQueue(tc.prev...)}
			next := &KeyState{MaxActive: tc.free, Queued: wakeQueue(tc.next...)}
			c.publishWakes(key, prev, next, 7, []byte("v"))
			assert.Equal(t, tc.want, rec.targets, "targets")
			assert.Equal(t, tc.free, rec.free, "free")
		})
	}
}

// BenchmarkPublishWakesTargets: the choice of a wake-up's targets after a
// write that took one queued job and queued one, on queues of growing
// length, one slot free.
func BenchmarkPublishWakesTargets(b *testing.B) {
	key := JobKey{Service: "svc", JobType: "render", KVKey: "svc.render.h"}
	for _, n := range []int{8, 65, 1000, 10000} {
		ids := wakeJobs("job-0123456789abcdef", n)
		prev := &KeyState{MaxActive: 1, Queued: wakeQueue(ids...)}
		next := &KeyState{MaxActive: 1, Queued: wakeQueue(append(ids[1:n:n], "new")...)}
		b.Run(fmt.Sprintf("queued=%d", n), func(b *testing.B) {
			c, rec := newRecordedWakes(b)
			b.ReportAllocs()
			for b.Loop() {
				c.publishWakes(key, prev, next, 7, []byte("v"))
			}
			require.NotEmpty(b, rec.targets)
		})
	}
}
