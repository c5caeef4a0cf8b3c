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
	_ KeyWatcher = (*NATSStore)(nil)
	_ KeyLister  = (*NATSStore)(nil)
)

// natsWatchDrainTimeout bounds how long stopping a KV watch waits for the
// client library to close its channel.
const natsWatchDrainTimeout = 10 * time.Second

// WatchKeys implements [KeyWatcher] with one JetStream KV watch (an ordered
// push consumer) that delivers only new changes and no values.
func (s *NATSStore) WatchKeys(ctx context.Context, service, jobType string, changed func(kvKey string)) (<-chan struct{}, error) {
	prefix, err := keyFilter(service, jobType)
	if err != nil {
		return nil, err
	}
	if changed == nil {
		return nil, fmt.Errorf("%w: changed function is nil", ErrInvalidRequest)
	}
	kv, err := s.KeyValue(ctx, service)
	if err != nil {
		return nil, err
	}
	wctx, cancel := context.WithCancel(ctx)
	kw, err := kv.Watch(wctx, prefix+">", jetstream.UpdatesOnly(), jetstream.MetaOnly())
	if err != nil {
		cancel()
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		return nil, fmt.Errorf("jobkeys: watch %s> in KV bucket %q: %w", prefix, kv.Bucket(), err)
	}
	ended := make(chan struct{})
	go func() {
		defer close(ended)
		defer stopNATSWatch(kw, cancel)
		for {
			select {
			case <-wctx.Done():
				return
			case e, ok := <-kw.Updates():
				if !ok {
					return // the subscription closed (connection closed)
				}
				if e != nil {
					changed(e.Key())
				}
			}
		}
	}()
	return ended, nil
}

// stopNATSWatch stops a KV watch and drains its channel until the client
// closes it: the client's delivery goroutine may be blocked sending to the
// channel, and would never exit otherwise.
func stopNATSWatch(kw jetstream.KeyWatcher, cancel context.CancelFunc) {
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

// ListKeys implements [KeyLister]: it reads the last entry of every key of
// the selection (headers only) and leaves out deleted keys.
func (s *NATSStore) ListKeys(ctx context.Context, service, jobType string) ([]string, error) {
	prefix, err := keyFilter(service, jobType)
	if err != nil {
		return nil, err
	}
	kv, err := s.KeyValue(ctx, service)
	if err != nil {
		return nil, err
	}
	lctx, cancel := context.WithCancel(ctx)
	kw, err := kv.Watch(lctx, prefix+">", jetstream.IgnoreDeletes(), jetstream.MetaOnly())
	if err != nil {
		cancel()
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		return nil, fmt.Errorf("jobkeys: list %s> in KV bucket %q: %w", prefix, kv.Bucket(), err)
	}
	defer stopNATSWatch(kw, cancel)
	var keys []string
	for {
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case e, ok := <-kw.Updates():
			if !ok {
				return nil, fmt.Errorf("jobkeys: list %s> in KV bucket %q: the watch closed before the listing was complete", prefix, kv.Bucket())
			}
			if e == nil { // all current keys delivered
				slices.Sort(keys)
				return slices.Compact(keys), nil
			}
			keys = append(keys, e.Key())
		}
	}
}
