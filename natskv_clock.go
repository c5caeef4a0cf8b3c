package jobkeys

import (
	"context"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// NATSStore's side of clock skew detection (see clock.go): each bucket
// keeps a clockEstimate of the offset between this host's clock and the
// clock of the server that stamps the bucket's messages (its stream's
// leader, on a replicated bucket).
//
// It is fed by what the store sees anyway: the server time in the stream
// info read when the bucket is opened (a round trip: both bounds), the
// stamp of every value Get reads and of every change a watch delivers (a
// lower bound each; one time.Now per message). Writes add nothing: a
// publish acknowledgement carries no time. The upper bound therefore
// comes from stream info alone, and when a check finds the estimate older
// than clockProbeAfter it probes: one STREAM.INFO request (which every
// worker may make: see [NATSStore]'s permissions) per bucket and store
// every ten seconds at most, made by the call that finds it due, bounded
// by clockProbeTimeout; concurrent calls go on with what is known.

var _ ClockSource = (*NATSStore)(nil)

// ServerClockOffset implements [ClockSource].
func (s *NATSStore) ServerClockOffset(ctx context.Context, service string) (ClockOffset, time.Time) {
	b, at := s.clockOffset(ctx, service)
	return b.offset(), at
}

// clockOffset is ServerClockOffset with the bounds as clock.go keeps them.
func (s *NATSStore) clockOffset(ctx context.Context, service string) (clockBounds, time.Time) {
	s.mu.Lock()
	b := s.buckets[service]
	s.mu.Unlock()
	if b == nil {
		// Opening the bucket measures the offset.
		gctx, pg, err := s.begin(ctx, natsOpRead, service, "open the bucket of service", service)
		if err != nil {
			return clockBounds{}, time.Now()
		}
		b, err = s.bucket(gctx, service)
		pg.done()
		if err != nil {
			return clockBounds{}, time.Now()
		}
	}
	now := time.Now()
	bounds, probe := b.clock.bounds(now)
	if !probe || !b.clock.startProbe(now) {
		return bounds, now
	}
	defer b.clock.endProbe()
	s.probeClock(ctx, service, b)
	now = time.Now()
	bounds, _ = b.clock.bounds(now)
	return bounds, now
}

// bucketClock returns the clock estimate of service's bucket, or nil when
// the bucket is not open.
func (s *NATSStore) bucketClock(service string) *clockEstimate {
	s.mu.Lock()
	defer s.mu.Unlock()
	if b := s.buckets[service]; b != nil {
		return &b.clock
	}
	return nil
}

// probeClock reads the stream info of b, the bucket of service, for the
// server's time, and records it in b's estimate. Failures are not
// reported: the estimate then knows less.
func (s *NATSStore) probeClock(ctx context.Context, service string, b *natsBucket) {
	pctx, cancel := context.WithTimeout(ctx, clockProbeTimeout)
	defer cancel()
	gctx, pg, err := s.begin(pctx, natsOpRead, service, "read the clock of the bucket of service", service)
	if err != nil {
		return
	}
	defer pg.done()
	sent := time.Now()
	status, err := b.kv.Status(gctx)
	if err != nil {
		return
	}
	b.observeStatus(status, sent, time.Now())
}

// observeStatus records the server time in status, a bucket status read
// by a request sent at sent whose reply came at replied.
func (b *natsBucket) observeStatus(status jetstream.KeyValueStatus, sent, replied time.Time) {
	if info := bucketStreamInfo(status); info != nil {
		b.clock.observeRoundTrip(info.TimeStamp, sent, replied)
	}
}
