package jobsweb

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/jobkeys/jobkeys/jobs"
)

// jobsLiveGap is the least milliseconds between two live reloads of a jobs
// page.
const jobsLiveGap = 5000

// jobFilter is what a jobs page lists of a channel.
type jobFilter struct {
	Type  string
	State jobs.State
}

func (f jobFilter) match(j jobs.Summary) bool {
	return (f.Type == "" || j.Type == f.Type) && (f.State == "" || j.State == f.State)
}

// scanJobs lists the jobs of channel after the cursor that match f, newest
// first: up to want of them, reading at most limit jobs. next continues
// the list (nil at its end). Every listing of the dashboard is this
// function: when jobs.ListRequest filters by state and type itself
// (DESIGN §6.2), the filter moves into the request here.
func (h *Handler) scanJobs(ctx context.Context, channel string, f jobFilter, after *jobs.Cursor, want, limit int) (out []jobs.Summary, next *jobs.Cursor, scanned int, err error) {
	for {
		n := jobs.ListLimit
		if f == (jobFilter{}) {
			n = min(n, want-len(out)) // every job read is shown
		}
		page, err := h.jobs.List(ctx, jobs.ListRequest{ChannelID: channel, Limit: n, After: after})
		if err != nil {
			return nil, nil, scanned, err
		}
		for i, j := range page.Jobs {
			scanned++
			if f.match(j) {
				out = append(out, j)
			}
			if len(out) == want || scanned >= limit {
				if i == len(page.Jobs)-1 && page.Next == nil {
					return out, nil, scanned, nil
				}
				return out, &jobs.Cursor{CreatedAt: j.CreatedAt, ID: j.ID}, scanned, nil
			}
		}
		if page.Next == nil {
			return out, nil, scanned, nil
		}
		after = page.Next
	}
}

// encodeCursor and decodeCursor carry a list position in a URL.
func encodeCursor(c *jobs.Cursor) string {
	return base64.RawURLEncoding.EncodeToString([]byte(c.CreatedAt.UTC().Format(time.RFC3339Nano) + "|" + c.ID))
}

func decodeCursor(s string) (*jobs.Cursor, error) {
	b, err := base64.RawURLEncoding.DecodeString(s)
	if err != nil {
		return nil, badRequestf("cursor %q is not one this dashboard made", s)
	}
	at, id, ok := strings.Cut(string(b), "|")
	t, err := time.Parse(time.RFC3339Nano, at)
	if !ok || err != nil || id == "" {
		return nil, badRequestf("cursor %q is not one this dashboard made", s)
	}
	return &jobs.Cursor{CreatedAt: t, ID: id}, nil
}

// jobsData is the jobs page.
type jobsData struct {
	Channel  string
	Channels []string
	Type     string
	State    string
	States   []jobs.State
	Jobs     []jobRow
	Scanned  int
	Filtered bool
	First    string // the list from its start; empty on the first page
	Next     string
}

type jobRow struct {
	jobs.Summary
	Link string
	Due  time.Time // pending: AvailableAt; running: the claim's expiry
}

var allStates = []jobs.State{jobs.StatePending, jobs.StatePaused, jobs.StateRunning, jobs.StateCompleted,
	jobs.StateFailed, jobs.StateCancelled, jobs.StateSuperseded}

// searchJob sends a search by id (?channel=…&id=…) to the job's page, and
// anything else to the jobs page.
func (h *Handler) searchJob(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	if id := strings.TrimSpace(q.Get("id")); id != "" {
		ch := q.Get("channel")
		if ch == "" {
			h.fail(w, r, http.StatusBadRequest, badRequestf("a search by id needs a channel"))
			return
		}
		http.Redirect(w, r, jobURL(basePath(r), ch, id), http.StatusSeeOther)
		return
	}
	h.page(h.jobsPage)(w, r)
}

func (h *Handler) jobsPage(r *http.Request, v *view) (string, int, error) {
	q := r.URL.Query()
	d := jobsData{Channel: q.Get("channel"), Type: q.Get("type"), State: q.Get("state"), States: allStates,
		Channels: h.hub.knownChannels()}
	if d.State != "" && !jobs.State(d.State).Valid() {
		return "", http.StatusBadRequest, badRequestf("state %q is not a job state", d.State)
	}
	if d.Channel == "" && len(d.Channels) > 0 {
		d.Channel = d.Channels[0]
	}
	v.Title, v.Nav = "Jobs", "jobs"
	if d.Channel == "" {
		v.Data = d
		return "jobs", http.StatusOK, nil
	}
	var after *jobs.Cursor
	if a := q.Get("after"); a != "" {
		var err error
		if after, err = decodeCursor(a); err != nil {
			return "", http.StatusBadRequest, err
		}
		d.First = v.Base + "/jobs?" + d.query().Encode()
	}
	f := jobFilter{Type: d.Type, State: jobs.State(d.State)}
	d.Filtered = f != jobFilter{}
	size := min(h.cfg.PageSize, jobs.ListLimit)
	list, next, scanned, err := h.scanJobs(r.Context(), d.Channel, f, after, size, max(h.cfg.ScanLimit, size))
	if err != nil {
		return "", 0, fmt.Errorf("list the jobs of channel %q: %w", d.Channel, err)
	}
	d.Scanned = scanned
	for _, j := range list {
		row := jobRow{Summary: j, Link: jobURL(v.Base, j.ChannelID, j.ID)}
		switch j.State {
		case jobs.StatePending:
			row.Due = j.AvailableAt
		case jobs.StateRunning:
			row.Due = j.ClaimExpiresAt
		}
		d.Jobs = append(d.Jobs, row)
	}
	if next != nil {
		u := d.query()
		u.Set("after", encodeCursor(next))
		d.Next = v.Base + "/jobs?" + u.Encode()
	}
	v.Data = d
	v.Live = v.Base + r.URL.RequestURI()
	// A jobs page reads up to ScanLimit jobs: it follows changes less often.
	v.LiveGap = jobsLiveGap
	return "jobs", http.StatusOK, nil
}

func (d jobsData) query() url.Values {
	u := url.Values{"channel": {d.Channel}}
	if d.Type != "" {
		u.Set("type", d.Type)
	}
	if d.State != "" {
		u.Set("state", d.State)
	}
	return u
}

// jobData is the job page.
type jobData struct {
	D          jobs.Detail
	Input      field
	Artifact   *field
	Attempts   []attemptRow
	Key        *keyRow
	KeyPlace   string // where the job is on its key
	Actions    []actionLink
	Done       string // the action just done, from the redirect
	Superseded bool   // a newer job of the target exists
	RetryOf    string // the page of the job this one runs again, when it is a retry
	RetryOfID  string // that job's id
}

// field is an input or artifact as shown: pretty JSON, cut at the field
// limit, with the link that downloads all of it.
type field struct {
	Text     string
	Size     int
	Cut      bool
	Download string
}

type attemptRow struct {
	Attempt  int
	Progress []jobs.Progress
}

func (h *Handler) readJob(r *http.Request) (jobs.Detail, error) {
	q := r.URL.Query()
	ch, id := q.Get("channel"), q.Get("id")
	if ch == "" || id == "" {
		return jobs.Detail{}, badRequestf("a job is named by its channel and id (?channel=…&id=…)")
	}
	d, err := h.jobs.Get(r.Context(), ch, id)
	if err != nil {
		return jobs.Detail{}, fmt.Errorf("job %q of channel %q: %w", id, ch, err)
	}
	return d, nil
}

func (h *Handler) jobPage(r *http.Request, v *view) (string, int, error) {
	det, err := h.readJob(r)
	if err != nil {
		return "", 0, err
	}
	j := det.Job
	d := jobData{D: det, Superseded: det.Target.Generation > j.TargetGeneration}
	if a := Action(r.URL.Query().Get("done")); validAction(a) {
		d.Done = string(a)
	}
	if of, ok := strings.CutPrefix(j.Origin, jobs.RetryOriginPrefix); ok && !strings.HasPrefix(of, "sha256:") {
		d.RetryOf, d.RetryOfID = jobURL(v.Base, j.ChannelID, of), of
	}
	d.Input = h.field(j.Input, v.Base+"/job/input?"+url.Values{"channel": {j.ChannelID}, "id": {j.ID}}.Encode())
	if det.Artifact != nil {
		f := h.field(det.Artifact.Value, v.Base+"/job/artifact?"+url.Values{"channel": {j.ChannelID}, "id": {j.ID}}.Encode())
		d.Artifact = &f
	}
	for _, p := range j.Progress {
		if n := len(d.Attempts); n == 0 || d.Attempts[n-1].Attempt != p.Attempt {
			d.Attempts = append(d.Attempts, attemptRow{Attempt: p.Attempt})
		}
		a := &d.Attempts[len(d.Attempts)-1]
		a.Progress = append(a.Progress, p)
	}
	kid := keyJobID(j.ChannelID, j.ID)
	if k, ok := h.hub.keyOfJob(kid); ok {
		row := rowOf(k, v.Now, v.Base)
		d.Key = &row
		for _, s := range k.State.Active {
			if s.JobID == kid {
				d.KeyPlace = "holds a slot"
			}
		}
		for i, q := range k.State.Queued {
			if q.JobID == kid {
				d.KeyPlace = fmt.Sprintf("waits for a slot: %d of %d in the queue", i+1, len(k.State.Queued))
			}
		}
	}
	if !h.cfg.ReadOnly {
		for _, a := range actionsFor(j.State) {
			u := url.Values{"action": {string(a)}, "channel": {j.ChannelID}, "id": {j.ID}}
			d.Actions = append(d.Actions, actionLink{Action: a, URL: v.Base + "/job/confirm?" + u.Encode()})
		}
	}
	v.Title, v.Nav, v.Data = "Job "+j.ID, "jobs", d
	v.Live = v.Base + r.URL.RequestURI()
	v.LiveJob = kid
	return "job", http.StatusOK, nil
}

// actionLink is an action's button: the link to its confirmation.
type actionLink struct {
	Action Action
	URL    string
}

// actionsFor lists the actions that apply to a job in state s.
func actionsFor(s jobs.State) []Action {
	switch s {
	case jobs.StatePending, jobs.StateRunning:
		return []Action{ActionPause, ActionCancel}
	case jobs.StatePaused:
		return []Action{ActionResume, ActionCancel}
	case jobs.StateFailed, jobs.StateCancelled, jobs.StateSuperseded:
		return []Action{ActionRetry}
	}
	return nil
}

// field shows raw JSON: indented when it is JSON, cut at FieldLimit bytes
// (at a rune boundary).
func (h *Handler) field(raw json.RawMessage, download string) field {
	f := field{Size: len(raw), Download: download}
	if len(raw) == 0 {
		f.Text = "null"
		return f
	}
	text := readableJSON(raw)
	if len(text) <= h.cfg.FieldLimit {
		var b bytes.Buffer
		if json.Indent(&b, text, "", "  ") == nil && b.Len() <= h.cfg.FieldLimit {
			text = b.Bytes()
		}
	}
	if len(text) > h.cfg.FieldLimit {
		cut := h.cfg.FieldLimit
		for cut > 0 && !utf8Start(text[cut]) {
			cut--
		}
		text, f.Cut = text[:cut], true
	}
	f.Text = string(bytes.ToValidUTF8(text, []byte("\uFFFD")))
	return f
}

// readableJSON undoes the \u003c, \u003e and \u0026 escapes Go's
// encoder writes for '<', '>' and '&' (the same JSON), so that a page
// shows the text as it was meant; the template escapes it for HTML.
func readableJSON(raw []byte) []byte {
	if !bytes.Contains(raw, []byte(`\u00`)) {
		return raw
	}
	out := make([]byte, 0, len(raw))
	for i := 0; i < len(raw); i++ {
		c := raw[i]
		if c != '\\' || i+1 >= len(raw) {
			out = append(out, c)
			continue
		}
		if raw[i+1] == 'u' && i+5 < len(raw) {
			switch strings.ToLower(string(raw[i+2 : i+6])) {
			case "003c":
				out, i = append(out, '<'), i+5
				continue
			case "003e":
				out, i = append(out, '>'), i+5
				continue
			case "0026":
				out, i = append(out, '&'), i+5
				continue
			}
		}
		out, i = append(out, c, raw[i+1]), i+1 // an escape pair, kept
	}
	return out
}

func utf8Start(b byte) bool { return b&0xC0 != 0x80 }

// download serves a job's input or artifact as a JSON attachment.
func (h *Handler) download(artifact bool) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		det, err := h.readJob(r)
		if err != nil {
			h.fail(w, r, 0, err)
			return
		}
		body, name := []byte(det.Job.Input), "input"
		if artifact {
			if det.Artifact == nil {
				h.fail(w, r, http.StatusNotFound, fmt.Errorf("job %q of channel %q has no artifact: it is %s", det.Job.ID, det.Job.ChannelID, det.Job.State))
				return
			}
			body, name = det.Artifact.Value, "artifact"
		}
		if len(body) == 0 {
			body = []byte("null")
		}
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Content-Disposition", fmt.Sprintf("attachment; filename=%q", safeFileName(det.Job.ID)+"."+name+".json"))
		w.Header().Set("Cache-Control", "no-store")
		_, _ = w.Write(body)
	}
}

// safeFileName keeps the letters, digits, '-', '_' and '.' of s.
func safeFileName(s string) string {
	b := []byte(s)
	out := b[:0]
	for _, c := range b {
		if c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_' || c == '.' {
			out = append(out, c)
		}
	}
	if len(out) == 0 {
		return "job"
	}
	return string(out)
}

// confirmData is the page that asks before an action.
type confirmData struct {
	Action   Action
	Job      jobs.Job
	Question string
	Cancel   string // back to the job
}

func (h *Handler) confirmPage(r *http.Request, v *view) (string, int, error) {
	a := Action(r.URL.Query().Get("action"))
	if !validAction(a) {
		return "", http.StatusBadRequest, badRequestf("action %q is not cancel, pause, resume or retry", a)
	}
	if h.cfg.ReadOnly {
		return "", http.StatusForbidden, errReadOnly
	}
	if err := h.authorize(r, a); err != nil {
		return "", http.StatusForbidden, err
	}
	det, err := h.readJob(r)
	if err != nil {
		return "", 0, err
	}
	j := det.Job
	questions := map[Action]string{
		ActionCancel: "Cancel job %s? This is final: the job will not run again, and its place on its key is freed.",
		ActionPause:  "Pause job %s? A running attempt is stopped at its next heartbeat; the job keeps its place on its key.",
		ActionResume: "Resume job %s? It becomes pending, due now.",
		ActionRetry:  "Retry job %s? It runs again as a new job.",
	}
	d := confirmData{Action: a, Job: j, Question: fmt.Sprintf(questions[a], j.ID), Cancel: jobURL(v.Base, j.ChannelID, j.ID)}
	v.Title, v.Nav, v.Data = "Confirm "+string(a), "jobs", d
	return "confirm", http.StatusOK, nil
}

func validAction(a Action) bool {
	return a == ActionCancel || a == ActionPause || a == ActionResume || a == ActionRetry
}

var errReadOnly = errors.New("the dashboard is read-only: actions are turned off")

// action runs a confirmed action (a POST from the confirmation page) and
// sends the browser back to the job's page.
func (h *Handler) action(w http.ResponseWriter, r *http.Request) {
	r.Body = http.MaxBytesReader(w, r.Body, 64<<10)
	if err := r.ParseForm(); err != nil {
		h.fail(w, r, http.StatusBadRequest, fmt.Errorf("the action's form could not be read: %w", err))
		return
	}
	a := Action(r.PostFormValue("action"))
	if h.cfg.ReadOnly {
		h.fail(w, r, http.StatusForbidden, errReadOnly)
		return
	}
	if err := h.csrf.check(r); err != nil {
		h.fail(w, r, http.StatusForbidden, fmt.Errorf("refused: %w", err))
		return
	}
	if !validAction(a) {
		h.fail(w, r, http.StatusBadRequest, badRequestf("action %q is not cancel, pause, resume or retry", a))
		return
	}
	if err := h.authorize(r, a); err != nil {
		h.fail(w, r, http.StatusForbidden, err)
		return
	}
	ch, id := r.PostFormValue("channel"), r.PostFormValue("id")
	if ch == "" || id == "" {
		h.fail(w, r, http.StatusBadRequest, badRequestf("the action's form names no job (channel and id)"))
		return
	}
	var rev uint64
	if s := r.PostFormValue("revision"); s != "" {
		if _, err := fmt.Sscan(s, &rev); err != nil {
			h.fail(w, r, http.StatusBadRequest, badRequestf("revision %q is not a number", s))
			return
		}
	}
	j, err := h.run(r.Context(), a, ch, id, rev)
	if err != nil {
		h.fail(w, r, 0, fmt.Errorf("%s job %q of channel %q: %w", a, id, ch, err))
		return
	}
	base := basePath(r)
	http.Redirect(w, r, jobURL(base, j.ChannelID, j.ID)+"&done="+string(a), http.StatusSeeOther)
}

// changedSince explains a conflict of an action made at revision rev.
func changedSince(err error, rev uint64) error {
	if errors.Is(err, jobs.ErrConflict) {
		return fmt.Errorf("%w (the job may have changed since revision %d, which the confirmation showed: a running job changes at every heartbeat; look at it again)", err, rev)
	}
	return err
}

// run runs action a on a job through the client. rev is the job revision
// the operator saw: pause and resume refuse (ErrConflict) a job that
// changed since. It returns the job the operator should see next.
func (h *Handler) run(ctx context.Context, a Action, ch, id string, rev uint64) (jobs.Job, error) {
	switch a {
	case ActionCancel:
		return h.jobs.Cancel(ctx, jobs.CancelRequest{ChannelID: ch, JobID: id})
	case ActionPause:
		j, err := h.jobs.Pause(ctx, jobs.PauseRequest{ChannelID: ch, JobID: id, ExpectedRevision: rev, Reason: "paused from the dashboard"})
		return j, changedSince(err, rev)
	case ActionResume:
		j, err := h.jobs.Resume(ctx, jobs.ResumeRequest{ChannelID: ch, JobID: id, ExpectedRevision: rev})
		return j, changedSince(err, rev)
	default: // ActionRetry: the new job
		return h.jobs.Retry(ctx, ch, id)
	}
}
