package jobsweb

import (
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/jobkeys/jobkeys"
)

// keyRow is one key as the keys page and the overview show it.
type keyRow struct {
	KVKey      string
	Type       string
	DisplayKey string
	Active     int
	MaxActive  int
	Queued     int
	MaxQueued  int
	QueueLimit int
	Holders    []holderRow
	OldestWait time.Time // zero when nothing waits
	Status     string    // "ok", "limit", "full", "stale", "corrupt": a CSS class
	Why        string    // why the key is blocked; empty when it is not
	Problem    string
}

// holderRow is one slot of a key.
type holderRow struct {
	JobID    string // the key-layer job id
	Label    string // the job id, or the key-layer job id when it is not the runtime's
	Link     string // the job's page; empty when the id is not the runtime's
	Instance string
	Started  time.Time
	Expires  time.Time
	Expired  bool
}

// rowOf derives what the pages show of a key at now; base prefixes the
// links.
func rowOf(k jobkeys.KeyInfo, now time.Time, base string) keyRow {
	r := keyRow{KVKey: k.KVKey, Type: typeOf(k.KVKey), DisplayKey: k.DisplayKey, Active: k.Active, MaxActive: k.MaxActive,
		Queued: k.Queued, MaxQueued: k.MaxQueued, QueueLimit: k.QueueLimit, OldestWait: k.OldestQueuedAt, Status: "ok"}
	if k.Problem != nil {
		r.Status, r.Problem = "corrupt", k.Problem.Error()
		r.Why = "its value is not usable key state: " + r.Problem
		return r
	}
	expired := 0
	for _, s := range k.State.Active {
		hr := holderRow{JobID: s.JobID, Instance: s.InstanceID, Started: s.StartedAt, Expires: s.LeaseExpiresAt,
			Expired: !s.LeaseExpiresAt.After(now)}
		if hr.Expired {
			expired++
		}
		hr.Label = s.JobID
		if ch, id, ok := parseKeyJobID(s.JobID); ok {
			hr.Link, hr.Label = jobURL(base, ch, id), id
		}
		r.Holders = append(r.Holders, hr)
	}
	switch {
	case r.Active >= r.MaxActive && expired > 0:
		r.Status = "stale"
		r.Why = fmt.Sprintf("at its limit (%d of %d slots held); %d of them expired: their holders stopped renewing, and a sweep or the next acquisition takes them over (or they block the key, by policy)",
			r.Active, r.MaxActive, expired)
	case r.Active >= r.MaxActive && r.Queued >= r.MaxQueued && r.MaxQueued > 0:
		r.Status = "full"
		r.Why = fmt.Sprintf("at its limit (%d of %d slots held) and its queue is full (%d of %d waiting): a new job is rejected, coalesced or replaces the oldest waiting one, by policy",
			r.Active, r.MaxActive, r.Queued, r.MaxQueued)
	case r.Active >= r.MaxActive:
		r.Status = "limit"
		r.Why = fmt.Sprintf("at its limit: %d of %d slots held", r.Active, r.MaxActive)
		if r.Queued > 0 {
			r.Why += fmt.Sprintf("; %d waiting for a slot", r.Queued)
		}
	}
	return r
}

// atLimit reports whether a key has no free slot (or is corrupt).
func (r keyRow) atLimit() bool { return r.Status != "ok" }

// blocked is atLimit of the row a key makes, without making it.
func blocked(k *jobkeys.KeyInfo) bool { return k.Problem != nil || k.Active >= k.MaxActive }

// keysData is the keys page.
type keysData struct {
	Rows    []keyRow
	Types   []string
	Type    string
	Query   string
	Blocked bool
	Total   int // keys matching the filter
	All     int // keys in the service
	Page    int // 1-based
	Pages   int
	Prev    string
	Next    string
	Service string
}

func (h *Handler) keysPage(r *http.Request, v *view) (string, int, error) {
	q := r.URL.Query()
	d := keysData{Type: q.Get("type"), Query: q.Get("q"), Blocked: q.Get("blocked") == "1", Page: 1, Service: h.cfg.Service}
	if p := q.Get("page"); p != "" {
		n, err := strconv.Atoi(p)
		if err != nil || n < 1 {
			return "", http.StatusBadRequest, badRequestf("page %q is not a page number (1, 2, …)", p)
		}
		d.Page = n
	}
	all := h.hub.snapshot()
	d.All = len(all)
	types := map[string]bool{}
	var match []*jobkeys.KeyInfo
	for _, k := range all {
		typ := typeOf(k.KVKey)
		types[typ] = true
		if d.Type != "" && typ != d.Type {
			continue
		}
		if d.Query != "" && !strings.Contains(k.DisplayKey, d.Query) && !strings.Contains(k.KVKey, d.Query) {
			continue
		}
		if d.Blocked && !blocked(k) {
			continue
		}
		match = append(match, k)
	}
	for t := range types {
		d.Types = append(d.Types, t)
	}
	slices.Sort(d.Types)
	// The keys that hold jobs back first, the longest queues first.
	slices.SortStableFunc(match, func(a, b *jobkeys.KeyInfo) int {
		if blocked(a) != blocked(b) {
			if blocked(a) {
				return -1
			}
			return 1
		}
		return b.Queued - a.Queued
	})
	size := h.cfg.PageSize
	d.Total = len(match)
	d.Pages = max(1, (len(match)+size-1)/size)
	if d.Page > d.Pages {
		d.Page = d.Pages
	}
	from := (d.Page - 1) * size
	for _, k := range match[from:min(from+size, len(match))] {
		d.Rows = append(d.Rows, rowOf(*k, v.Now, v.Base))
	}
	link := func(page int) string {
		u := url.Values{}
		for _, kv := range [][2]string{{"type", d.Type}, {"q", d.Query}} {
			if kv[1] != "" {
				u.Set(kv[0], kv[1])
			}
		}
		if d.Blocked {
			u.Set("blocked", "1")
		}
		u.Set("page", strconv.Itoa(page))
		return v.Base + "/keys?" + u.Encode()
	}
	if d.Page > 1 {
		d.Prev = link(d.Page - 1)
	}
	if d.Page < d.Pages {
		d.Next = link(d.Page + 1)
	}
	v.Title, v.Nav, v.Data = "Keys", "keys", d
	v.Live = v.Base + r.URL.RequestURI()
	return "keys", http.StatusOK, nil
}

// jobURL is the page of a job.
func jobURL(base, channel, id string) string {
	return base + "/job?" + url.Values{"channel": {channel}, "id": {id}}.Encode()
}
