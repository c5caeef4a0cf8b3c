package jobkeys

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// This file holds NATSStore's optional capabilities: watching and listing
// keys.

var (
	_ WatchableStore = (*NATSStore)(nil)
	_ ListableStore  = (*NATSStore)(nil)
)

// natsWatchDrainTimeout bounds how long stopping a KV watch waits for the
// client library to close its channel.
const natsWatchDrainTimeout = 10 * time.Second

// WatchKeys implements [WatchableStore] with one JetStream KV watch (an ordered
// push consumer) that delivers only new changes and no values. A watch the
// server refuses (no permission to create the consumer or to subscribe to
// its delivery subject) fails with an error wrapping [ErrPermission].
//
// The consumer is in place when WatchKeys returns, but the server's
// consumer reads the bucket's stream on its own, behind the writes. A
// bucket keeps only the latest revision of a key (history 1, as
// [WithCreateBuckets] makes them; a longer history only narrows this), so a
// change that a later change of the same key replaces before the consumer
// reads it is not reported: that key is reported for the later change.
// Under load this happens even to a key written twice right after
// WatchKeys returns.
func (s *NATSStore) WatchKeys(ctx context.Context, service, jobType string, changed func(kvKey string)) (<-chan struct{}, error) {
	prefix, err := keyFilter(service, jobType)
	if err != nil {
		return nil, err
	}
	if changed == nil {
		return nil, fmt.Errorf("%w: changed function is nil", ErrInvalidRequest)
	}
	return s.watch(ctx, service, prefix, true, func(e jetstream.KeyValueEntry) { changed(e.Key()) })
}

var _ ValueWatcher = (*NATSStore)(nil)

// WatchValues implements ValueWatcher with a watch that delivers values.
// The KV watch is an ordered consumer: it delivers in stream order, and
// recreates itself from the next sequence after a gap. As in WatchKeys, a
// revision replaced by a later one of the same key before the consumer
// reads it is not delivered; the later one is.
func (s *NATSStore) WatchValues(ctx context.Context, service string, changed func(ValueChange)) (<-chan struct{}, error) {
	prefix, err := keyFilter(service, "")
	if err != nil {
		return nil, err
	}
	return s.watch(ctx, service, prefix, false, func(e jetstream.KeyValueEntry) {
		op := e.Operation()
		changed(ValueChange{KVKey: e.Key(), Value: e.Value(), Revision: e.Revision(),
			Deleted: op == jetstream.KeyValueDelete || op == jetstream.KeyValuePurge})
	})
}

// watch runs the KV watch of the keys under prefix, with values unless
// metaOnly, and hands every entry to changed.
func (s *NATSStore) watch(ctx context.Context, service, prefix string, metaOnly bool, changed func(jetstream.KeyValueEntry)) (<-chan struct{}, error) {
	filter := prefix + ">"
	// The guard's context is the watch's for its whole life; the guard
	// itself is released once the watch has started.
	wctx, pg, err := s.begin(ctx, natsOpRead|natsOpWatch, service, "watch", filter)
	if err != nil {
		return nil, err
	}
	kw, err := s.startWatch(ctx, wctx, service, filter, metaOnly)
	if err != nil {
		pg.done()
		return nil, err
	}
	pg.release()
	clock := s.bucketClock(service) // see natskv_clock.go
	ended := make(chan struct{})
	go func() {
		defer close(ended)
		defer stopNATSWatch(kw, pg.done)
		for {
			select {
			case <-wctx.Done():
				return
			case e, ok := <-kw.Updates():
				if !ok {
					return // the subscription closed (connection closed)
				}
				if e != nil {
					clock.observeStamp(e.Created(), time.Now())
					changed(e)
				}
			}
		}
	}()
	return ended, nil
}

// startWatch starts the KV watch of WatchKeys on wctx, the guarded context
// derived from the caller's ctx, and makes sure the server accepted its
// subscription.
func (s *NATSStore) startWatch(ctx, wctx context.Context, service, filter string, metaOnly bool) (jetstream.KeyWatcher, error) {
	kv, err := s.keyValue(wctx, service)
	if err != nil {
		return nil, explainPermission(ctx, wctx, "watch", filter, err)
	}
	nc := s.js.Conn()
	before := nc.LastError()
	opts := []jetstream.WatchOpt{jetstream.UpdatesOnly()}
	if metaOnly {
		opts = append(opts, jetstream.MetaOnly())
	}
	kw, err := kv.Watch(wctx, filter, opts...)
	if err != nil {
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		return nil, explainPermission(ctx, wctx, "watch", filter,
			fmt.Errorf("jobkeys: watch %s in KV bucket %q: %w", filter, kv.Bucket(), err))
	}
	// The server refuses a delivery subscription without failing the
	// watch, which would then never deliver. The refusal reaches the
	// client before the answer to a flush, and nats.go sets it as the
	// connection's last error as soon as it arrives.
	fctx, cancel := context.WithTimeout(wctx, s.js.Options().DefaultTimeout)
	ferr := nc.FlushWithContext(fctx)
	cancel()
	if last := nc.LastError(); ferr == nil && last != nil && last != before {
		if v := parseViolation(nc, last); v != nil && needs(natsOpWatch, kv.Bucket(), inboxPrefix(nc), "", v.subject) {
			_ = kw.Stop()
			return nil, fmt.Errorf("%w: watch %s: %v", ErrPermission, filter, v)
		}
	}
	return kw, nil
}

// stopNATSWatch stops a KV watch and drains its channel until the client
// closes it: the client's delivery goroutine may be blocked sending to the
// channel, and would never exit otherwise.
func stopNATSWatch(kw jetstream.KeyWatcher, cancel func()) {
	_ = kw.Stop() // fails only when already stopped or the connection is closed; both end the watch
	cancel()
	t := time.NewTimer(natsWatchDrainTimeout)
	defer t.Stop()
	for {
		select {
		case _, ok := <-kw.Updates():
			if !ok {
				return
			}
		case <-t.C:
			return
		}
	}
}

// ListKeys implements [ListableStore]: it reads the last entry of every key of
// the selection (headers only) and leaves out deleted keys.
//
// It does not use jetstream's KeyValue.ListKeysFiltered, which runs the same
// kind of watch: that listing cannot tell a complete list from one cut
// short, since its channel closes the same way after the last key, when
// the connection closes mid-listing and when ctx ends. A Sweeper acting on
// a partial list would skip keys silently; this one fails instead.
func (s *NATSStore) ListKeys(ctx context.Context, service, jobType string) ([]string, error) {
	prefix, err := keyFilter(service, jobType)
	if err != nil {
		return nil, err
	}
	filter := prefix + ">"
	lctx, pg, err := s.begin(ctx, natsOpRead|natsOpWatch, service, "list", filter)
	if err != nil {
		return nil, err
	}
	defer pg.done()
	keys, err := s.listKeys(lctx, service, filter)
	if err != nil && ctx.Err() != nil {
		return nil, ctx.Err()
	}
	return keys, explainPermission(ctx, lctx, "list", filter, err)
}

// listKeys lists the keys matching filter on lctx, which ListKeys cancels
// when it returns.
func (s *NATSStore) listKeys(lctx context.Context, service, filter string) ([]string, error) {
	kv, err := s.keyValue(lctx, service)
	if err != nil {
		return nil, err
	}
	kw, err := kv.Watch(lctx, filter, jetstream.IgnoreDeletes(), jetstream.MetaOnly())
	if err != nil {
		return nil, fmt.Errorf("jobkeys: list %s in KV bucket %q: %w", filter, kv.Bucket(), err)
	}
	defer stopNATSWatch(kw, func() {})
	var keys []string
	for {
		select {
		case <-lctx.Done():
			return nil, lctx.Err()
		case e, ok := <-kw.Updates():
			if !ok {
				return nil, fmt.Errorf("jobkeys: list %s in KV bucket %q: the watch closed before the listing was complete", filter, kv.Bucket())
			}
			if e == nil { // all current keys delivered
				slices.Sort(keys)
				return slices.Compact(keys), nil
			}
			keys = append(keys, e.Key())
		}
	}
}
