package jobsweb

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/url"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/jobkeys/jobkeys"
)

// keyHub keeps the key state of a service as the key watch reports it, and
// hands each change to the live streams of open pages. Pages read its
// copy, never the store.
type keyHub struct {
	coord   *jobkeys.KeyCoordinator
	service string
	logger  *slog.Logger

	mu       sync.Mutex
	keys     map[string]*jobkeys.KeyInfo // by KV key; a value is never changed once stored
	byJob    map[string]string           // the KV key each key-layer job id holds or waits on
	channels map[string]bool             // job channels configured or seen in key state
	err      error                       // why the watch is not running; nil while it runs
	subs     map[chan []byte]bool
	closed   bool          // the watch loop ended: no new subscribers
	done     chan struct{} // closed when the watch loop ended
}

// retryWatchDelay is how long the hub waits before it watches again after
// the watch ended with an error.
const retryWatchDelay = time.Second

// subscriberBuffer is how many events a live stream may fall behind by
// before it is sent a resync instead.
const subscriberBuffer = 64

func newKeyHub(coord *jobkeys.KeyCoordinator, service string, channels []string, logger *slog.Logger) *keyHub {
	h := &keyHub{coord: coord, service: service, logger: logger,
		keys: make(map[string]*jobkeys.KeyInfo), byJob: make(map[string]string), channels: make(map[string]bool),
		subs: make(map[chan []byte]bool), done: make(chan struct{})}
	for _, c := range channels {
		h.channels[c] = true
	}
	return h
}

// start runs the watch until ctx ends, watching again after a failure.
func (h *keyHub) start(ctx context.Context) {
	go func() {
		defer close(h.done)
		defer h.closeSubs()
		for {
			err := h.watchOnce(ctx)
			if ctx.Err() != nil {
				return
			}
			h.mu.Lock()
			h.err = fmt.Errorf("the watch of the keys of service %q stopped (%v); watching again", h.service, err)
			h.mu.Unlock()
			h.logger.Warn("jobsweb: key watch ended; watching again", "service", h.service, "err", err)
			select {
			case <-ctx.Done():
				return
			case <-time.After(retryWatchDelay):
			}
		}
	}()
}

// wait waits for the watch loop to end (after its ctx ended).
func (h *keyHub) wait() { <-h.done }

// watchOnce runs one watch: the keys it lists replace the copy, and each
// change updates it and goes to the subscribers.
func (h *keyHub) watchOnce(ctx context.Context) error {
	w, err := h.coord.WatchOccupancy(ctx, h.service, "")
	if err != nil {
		return err
	}
	h.mu.Lock()
	h.keys = make(map[string]*jobkeys.KeyInfo)
	h.byJob = make(map[string]string)
	h.err = nil
	h.mu.Unlock()
	for ch := range w.Changes() {
		h.apply(ch)
	}
	if err := w.Err(); err != nil {
		return err
	}
	return fmt.Errorf("the watch of service %q ended", h.service)
}

// keyEvent is one change as the live streams send it (JSON).
type keyEvent struct {
	KVKey      string   `json:"kvKey"`
	Type       string   `json:"type"`
	DisplayKey string   `json:"displayKey,omitempty"`
	Active     int      `json:"active"`
	MaxActive  int      `json:"maxActive"`
	Queued     int      `json:"queued"`
	MaxQueued  int      `json:"maxQueued"`
	Deleted    bool     `json:"deleted,omitempty"`
	Jobs       []string `json:"jobs"` // the key-layer job ids before and after the change
}

func (h *keyHub) apply(ch jobkeys.KeyChange) {
	h.mu.Lock()
	var ids []string
	if before := h.keys[ch.KVKey]; before != nil {
		ids = jobIDsOf(*before)
	}
	for _, id := range ids {
		if h.byJob[id] == ch.KVKey {
			delete(h.byJob, id)
		}
	}
	switch {
	case ch.Deleted:
		delete(h.keys, ch.KVKey)
	case ch.Err != nil:
		// The key changed and could not be read: keep what was known; the
		// next change reads it again.
		for _, id := range ids {
			h.byJob[id] = ch.KVKey
		}
		h.mu.Unlock()
		h.logger.Warn("jobsweb: a changed key could not be read", "kvKey", ch.KVKey, "err", ch.Err)
		return
	default:
		info := ch.Info
		h.keys[ch.KVKey] = &info
		for _, id := range jobIDsOf(ch.Info) {
			h.byJob[id] = ch.KVKey
			if !slices.Contains(ids, id) {
				ids = append(ids, id)
			}
		}
		for _, id := range ids {
			if c, _, ok := parseKeyJobID(id); ok {
				h.channels[c] = true
			}
		}
	}
	if ch.Initial {
		h.mu.Unlock()
		return // the listing a (re)started watch begins with: no change to push
	}
	ev := keyEvent{KVKey: ch.KVKey, Type: typeOf(ch.KVKey), DisplayKey: ch.Info.DisplayKey,
		Active: ch.Info.Active, MaxActive: ch.Info.MaxActive, Queued: ch.Info.Queued, MaxQueued: ch.Info.MaxQueued,
		Deleted: ch.Deleted, Jobs: ids}
	data, _ := json.Marshal(ev)
	for sub := range h.subs {
		select {
		case sub <- data:
		default:
			// Behind: an event makes room for a resync (its page reloads,
			// which shows what the events it missed would have). Only the
			// hub sends, under h.mu: after the receive there is room.
			select {
			case <-sub:
			default:
			}
			sub <- nil
		}
	}
	h.mu.Unlock()
}

// subscribe returns a channel of changes (JSON; nil means "resync") and
// its cancel. The channel is closed when the hub stops.
func (h *keyHub) subscribe() (<-chan []byte, func()) {
	sub := make(chan []byte, subscriberBuffer)
	h.mu.Lock()
	if h.closed {
		close(sub)
		h.mu.Unlock()
		return sub, func() {}
	}
	h.subs[sub] = true
	h.mu.Unlock()
	return sub, func() {
		h.mu.Lock()
		if h.subs[sub] {
			delete(h.subs, sub)
			close(sub)
		}
		h.mu.Unlock()
	}
}

func (h *keyHub) closeSubs() {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.closed = true
	for sub := range h.subs {
		delete(h.subs, sub)
		close(sub)
	}
	h.err = fmt.Errorf("the dashboard was closed: key state is not watched")
}

// snapshot returns the keys as last seen, sorted by KV key. The caller
// must not change them.
func (h *keyHub) snapshot() []*jobkeys.KeyInfo {
	h.mu.Lock()
	out := make([]*jobkeys.KeyInfo, 0, len(h.keys))
	for _, k := range h.keys {
		out = append(out, k)
	}
	h.mu.Unlock()
	slices.SortFunc(out, func(a, b *jobkeys.KeyInfo) int { return strings.Compare(a.KVKey, b.KVKey) })
	return out
}

// keyOfJob returns the key whose slots or queue hold the key-layer job id
// kid, if one does.
func (h *keyHub) keyOfJob(kid string) (jobkeys.KeyInfo, bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	k := h.keys[h.byJob[kid]]
	if k == nil {
		return jobkeys.KeyInfo{}, false
	}
	return *k, true
}

// knownChannels returns the channels configured and seen, sorted.
func (h *keyHub) knownChannels() []string {
	h.mu.Lock()
	out := make([]string, 0, len(h.channels))
	for c := range h.channels {
		out = append(out, c)
	}
	h.mu.Unlock()
	slices.Sort(out)
	return out
}

func (h *keyHub) watchErr() error {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.err
}

// jobIDsOf lists the key-layer job ids holding or waiting on a key.
func jobIDsOf(k jobkeys.KeyInfo) []string {
	if k.State == nil {
		return nil
	}
	ids := make([]string, 0, len(k.State.Active)+len(k.State.Queued))
	for _, s := range k.State.Active {
		ids = append(ids, s.JobID)
	}
	for _, q := range k.State.Queued {
		ids = append(ids, q.JobID)
	}
	return ids
}

// typeOf is the job type of a KV key "<service>.<jobType>.<keyHash>".
func typeOf(kvKey string) string {
	parts := strings.Split(kvKey, ".")
	if len(parts) != 3 {
		return ""
	}
	return parts[1]
}

// keyJobID is the id the runtime gives a job in the key layer: its
// channel, path-escaped, a slash and its id (as package jobs writes it).
func keyJobID(channel, id string) string { return url.PathEscape(channel) + "/" + id }

// parseKeyJobID reverses keyJobID; a key-layer job id the runtime did not
// write (a job of the key layer used alone) is not ok.
func parseKeyJobID(kid string) (channel, id string, ok bool) {
	esc, id, found := strings.Cut(kid, "/")
	if !found || esc == "" || id == "" {
		return "", "", false
	}
	channel, err := url.PathUnescape(esc)
	if err != nil {
		return "", "", false
	}
	return channel, id, true
}
