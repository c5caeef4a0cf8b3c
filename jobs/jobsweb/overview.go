package jobsweb

import (
	"context"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/jobkeys/jobkeys/jobs"
)

// statsChannelsLimit is how many channels the overview samples at most.
const statsChannelsLimit = 20

// sparkMinutes is how many minutes a sparkline covers.
const sparkMinutes = 30

// typeStats is one job type on the overview.
type typeStats struct {
	Type        string
	Running     int // slots held on its keys
	Waiting     int // jobs queued on its keys
	Keys        int
	KeysAtLimit int
	// Of the sampled jobs: counts by state, and jobs finished (completed
	// or failed) per minute over the last sparkMinutes, oldest first.
	States   map[jobs.State]int
	Finished []int
	Spark    string // SVG polyline points of Finished
	SparkMax int
}

// sample is the overview's reading of the newest jobs of each channel.
type sample struct {
	at       time.Time
	types    map[string]*typeStats
	channels int
	jobs     int
	err      error
}

// statsCache keeps the last sample for StatsInterval; one reader at a time
// takes a new one.
type statsCache struct {
	mu   sync.Mutex
	last *sample
}

func (h *Handler) sampleJobs(ctx context.Context, now time.Time) *sample {
	h.stats.mu.Lock()
	defer h.stats.mu.Unlock()
	if s := h.stats.last; s != nil && now.Sub(s.at) < StatsIntervalDefault && now.Sub(s.at) >= 0 {
		return s
	}
	s := &sample{at: now, types: map[string]*typeStats{}}
	channels := h.hub.knownChannels()
	if len(channels) > statsChannelsLimit {
		channels = channels[:statsChannelsLimit]
	}
	s.channels = len(channels)
	for _, ch := range channels {
		list, _, _, err := h.scanJobs(ctx, ch, jobFilter{}, nil, h.cfg.StatsSample, h.cfg.StatsSample)
		if err != nil {
			s.err = fmt.Errorf("list the jobs of channel %q: %w", ch, err)
			continue
		}
		for _, j := range list {
			s.jobs++
			t := s.typ(j.Type)
			t.States[j.State]++
			if j.State == jobs.StateCompleted || j.State == jobs.StateFailed {
				ago := int(now.Sub(j.UpdatedAt) / time.Minute)
				if ago >= 0 && ago < sparkMinutes {
					t.Finished[sparkMinutes-1-ago]++
				}
			}
		}
	}
	h.stats.last = s
	return s
}

func (s *sample) typ(name string) *typeStats {
	t := s.types[name]
	if t == nil {
		t = &typeStats{Type: name, States: map[jobs.State]int{}, Finished: make([]int, sparkMinutes)}
		s.types[name] = t
	}
	return t
}

// sparkline returns the points of a 120×24 polyline of counts and their
// largest value.
func sparkline(counts []int) (string, int) {
	top := slices.Max(counts)
	var b strings.Builder
	for i, c := range counts {
		x := float64(i) * 120 / float64(len(counts)-1)
		y := 23.0
		if top > 0 {
			y = 23 - float64(c)*22/float64(top)
		}
		fmt.Fprintf(&b, "%.1f,%.1f ", x, y)
	}
	return strings.TrimSpace(b.String()), top
}

// overviewData is the overview page.
type overviewData struct {
	Types       []*typeStats
	AtLimit     []keyRow
	MoreAtLimit int
	Keys        int
	Sampled     int
	Channels    int
	SampleErr   string
	SampledAt   time.Time
}

// overviewAtLimit is how many keys at their limit the overview lists.
const overviewAtLimit = 20

func (h *Handler) overview(r *http.Request, v *view) (string, int, error) {
	s := h.sampleJobs(r.Context(), v.Now)
	types := map[string]*typeStats{}
	for name, t := range s.types {
		c := *t
		types[name] = &c
	}
	get := func(name string) *typeStats {
		t := types[name]
		if t == nil {
			t = &typeStats{Type: name, States: map[jobs.State]int{}, Finished: make([]int, sparkMinutes)}
			types[name] = t
		}
		return t
	}
	d := overviewData{Sampled: s.jobs, Channels: s.channels, SampledAt: s.at}
	if s.err != nil {
		d.SampleErr = s.err.Error()
	}
	for _, k := range h.hub.snapshot() {
		d.Keys++
		row := rowOf(*k, v.Now, v.Base)
		t := get(row.Type)
		t.Keys++
		t.Running += row.Active
		t.Waiting += row.Queued
		if row.atLimit() {
			t.KeysAtLimit++
			if len(d.AtLimit) < overviewAtLimit {
				d.AtLimit = append(d.AtLimit, row)
			} else {
				d.MoreAtLimit++
			}
		}
	}
	for _, t := range types {
		t.Spark, t.SparkMax = sparkline(t.Finished)
		d.Types = append(d.Types, t)
	}
	slices.SortFunc(d.Types, func(a, b *typeStats) int { return strings.Compare(a.Type, b.Type) })
	v.Title, v.Nav, v.Data = "Overview", "overview", d
	v.Live = v.Base + r.URL.RequestURI()
	return "overview", http.StatusOK, nil
}
