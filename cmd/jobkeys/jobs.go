package main

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/jobkeys/jobkeys/jobs"
)

// jobsBucketDefault is the job store's bucket unless --jobs-bucket says
// otherwise (jobs.NATSBucketDefault).
const jobsBucketDefault = jobs.NATSBucketDefault

func jobCommands() []*command {
	var (
		lsLimit       *int
		lsAll         *bool
		lsState       *string
		lsType        *string
		cancelArchive *bool
		cancelService *string
		pauseReason   *string
		pauseRev      *uint64
		resumeRev     *uint64
		resumeIn      *time.Duration
		resumeService *string
		retryRev      *uint64
		retryService  *string
	)
	cmds := []*command{
		{name: "jobs ls", args: "[CHANNEL]", min: 0, max: 1,
			short: "list a channel's jobs (every channel's without CHANNEL), newest first",
			long: `ls lists jobs newest first: those of CHANNEL, or of every channel when
CHANNEL is left out. --state and --type keep only the jobs in those states
or of those types (comma-separated lists); the job store filters, page by
page, so --limit counts the jobs that pass.`,
			flags: func(fs *flagSet) {
				lsLimit = fs.Int("limit", 50, "at most this many jobs")
				lsAll = fs.Bool("all", false, "every job that passes (follows the pages)")
				lsState = fs.String("state", "", "only jobs in these states, comma-separated (pending, paused, running, completed, failed, cancelled, superseded)")
				lsType = fs.String("type", "", "only jobs of these types, comma-separated")
			},
			run: func(ctx context.Context, c *cli, o *options, args []string) error {
				channel := ""
				if len(args) > 0 {
					channel = args[0]
				}
				return jobsLs(ctx, c, o, channel, *lsLimit, *lsAll, *lsState, *lsType)
			}},
		{name: "jobs show", args: "CHANNEL JOBID", min: 2, max: 2, run: jobsShow,
			short: "show one job: its state, claim, progress, target and artifact"},
		{name: "jobs cancel", args: "CHANNEL JOBID", min: 2, max: 2,
			short: "cancel a pending, paused or running job (final) and remove its queue entry; asks first",
			long: `cancel cancels the job in the job store and removes its queue entry from
its key at once (as the runtime's Client.Cancel does), so that the key has
room for another job without waiting for reconciliation. The entry is found
by reading the keys of the job's type in the key-layer service --service
(the runtime's ClientConfig.Service); a failure to remove it is a warning on
stderr, and reconciliation removes the entry later.`,
			flags: func(fs *flagSet) {
				cancelArchive = fs.Bool("allow-archived", false, "cancel a job of an archived channel")
				cancelService = fs.String("service", jobs.ServiceDefault, "key-layer service of the runtime (ClientConfig.Service), whose keys hold the job's queue entry")
			},
			run: func(ctx context.Context, c *cli, o *options, args []string) error {
				return jobsCancel(ctx, c, o, args[0], args[1], *cancelArchive, *cancelService)
			}},
		{name: "jobs pause", args: "CHANNEL JOBID", min: 2, max: 2,
			short: "pause a pending or running job (a running one loses its claim)",
			flags: func(fs *flagSet) {
				pauseReason = fs.String("reason", "paused by an operator", "why, recorded in the job")
				pauseRev = fs.Uint64("revision", 0, "the job revision you saw (default: the one read now)")
			},
			run: func(ctx context.Context, c *cli, o *options, args []string) error {
				return jobsPause(ctx, c, o, args[0], args[1], *pauseReason, *pauseRev)
			}},
		{name: "jobs resume", args: "CHANNEL JOBID", min: 2, max: 2,
			short: "make a paused job pending again, and tell the workers",
			long: `resume makes a paused job pending again through the runtime's client, which
announces it to the workers of the key-layer service --service (the runtime's
ClientConfig.Service) at its due time.`,
			flags: func(fs *flagSet) {
				resumeIn = fs.Duration("in", 0, "due this long from now (default: now)")
				resumeRev = fs.Uint64("revision", 0, "the job revision you saw (default: the one read now)")
				resumeService = fs.String("service", jobs.ServiceDefault, "key-layer service of the runtime (ClientConfig.Service), whose workers are told")
			},
			run: func(ctx context.Context, c *cli, o *options, args []string) error {
				return jobsResume(ctx, c, o, args[0], args[1], *resumeIn, *resumeRev, *resumeService)
			}},
		{name: "jobs retry", args: "CHANNEL JOBID", min: 2, max: 2,
			short: "run a failed, cancelled or superseded job again as a new job; make a paused or backing-off job due now",
			long: `retry runs a job again or makes it due now.

A failed, cancelled or superseded job runs again as a new job of the same
type, input and target (the runtime's Client.Retry): the old job stays as
it is, and the new one's origin is "retry:" and the old job's id. Being its
target's newest job, the new job supersedes an active job of the target. A
second retry of the same job makes nothing and shows the job the first
made. The new job is admitted to its key by a worker of its type (the
runtime's checker) AdmitGrace (30s by default) after it is written; --service
is the key-layer service of those workers (ClientConfig.Service).

A paused job is resumed (due now); a pending job whose AvailableAt is in
the future (waiting out a retry backoff) is paused and resumed at once,
which makes it due now and keeps its attempts and failures, and is resumed
through the runtime's client, which announces it to the workers of
--service. A pending job already due, a running one or a completed one has
nothing to retry (exit code 4).`,
			flags: func(fs *flagSet) {
				retryRev = fs.Uint64("revision", 0, "the job revision you saw (default: the one read now)")
				retryService = fs.String("service", jobs.ServiceDefault, "key-layer service of the runtime (ClientConfig.Service) whose workers admit a job run again, or are told of a job made due")
			},
			run: func(ctx context.Context, c *cli, o *options, args []string) error {
				return jobsRetry(ctx, c, o, args[0], args[1], *retryRev, *retryService)
			}},
	}
	for _, cmd := range cmds {
		cmd.check = checkJobArgs
	}
	return cmds
}

// checkJobArgs checks CHANNEL and JOBID against what the job store holds:
// non-empty UTF-8 of at most jobs.IdentifierSizeLimit bytes.
func checkJobArgs(args []string) error {
	for i, name := range []string{"CHANNEL", "JOBID"} {
		if i >= len(args) {
			break
		}
		if err := checkText(name, args[i], jobs.IdentifierSizeLimit); err != nil {
			return err
		}
		if args[i] == "" {
			return fmt.Errorf("%s is empty", name)
		}
	}
	return nil
}

// checkText says what is wrong with a text argument the job store would
// refuse: over limit bytes, or not UTF-8.
func checkText(name, v string, limit int) error {
	switch {
	case len(v) > limit:
		return fmt.Errorf("%s is %d bytes, over the limit of %d", name, len(v), limit)
	case !utf8.ValidString(v):
		return fmt.Errorf("%s is not valid UTF-8", name)
	}
	return nil
}

// openJobs opens the job store over the session's connection; the
// session's close closes the store too.
func (c *cli) openJobs(ctx context.Context, o *options) (*session, jobs.Store, error) {
	s, err := c.connect(ctx, o)
	if err != nil {
		return nil, nil, err
	}
	open := c.jobStore
	if open == nil {
		open = openNATSJobs
	}
	st, err := open(ctx, s, o)
	if err != nil {
		s.close(ctx)
		return nil, nil, err
	}
	if closer, ok := st.(interface{ Close(context.Context) error }); ok {
		s.closeJobs = closer.Close // by s.close, on every path
	}
	return s, st, nil
}

// summaryJSON is a job in "jobs ls --json".
type summaryJSON struct {
	ChannelID        string     `json:"channelId"`
	ID               string     `json:"id"`
	Type             string     `json:"type"`
	Version          int        `json:"version"`
	State            jobs.State `json:"state"`
	TargetKey        string     `json:"targetKey"`
	TargetGeneration uint64     `json:"targetGeneration"`
	Revision         uint64     `json:"revision"`
	Attempts         int        `json:"attempts"`
	Failures         int        `json:"failures"`
	ClaimOwner       string     `json:"claimOwner,omitempty"`
	ClaimExpiresAt   *string    `json:"claimExpiresAt,omitempty"`
	AvailableAt      *string    `json:"availableAt"`
	Reason           string     `json:"reason,omitempty"`
	Subject          string     `json:"subject,omitempty"`
	CreatedAt        *string    `json:"createdAt"`
	UpdatedAt        *string    `json:"updatedAt"`
}

// splitList splits a comma-separated flag value; empty: none.
func splitList(v string) []string {
	if v == "" {
		return nil
	}
	return strings.Split(v, ",")
}

func jobsLs(ctx context.Context, c *cli, o *options, channel string, limit int, all bool, stateList, typeList string) error {
	if limit < 1 {
		return usagef("--limit %d is not positive", limit)
	}
	var states []jobs.State
	for _, v := range splitList(stateList) {
		st := jobs.State(strings.TrimSpace(v))
		if !st.Valid() {
			return usagef("--state %q is not a job state (pending, paused, running, completed, failed, cancelled, superseded)", v)
		}
		states = append(states, st)
	}
	var types []string
	for _, v := range splitList(typeList) {
		typ := strings.TrimSpace(v)
		if err := checkText("--type", typ, jobs.IdentifierSizeLimit); err != nil {
			return usagef("%v", err)
		}
		if typ == "" {
			return usagef("--type %q names an empty type", typeList)
		}
		types = append(types, typ)
	}
	s, st, err := c.openJobs(ctx, o)
	if err != nil {
		return err
	}
	defer s.close(ctx)
	var list []jobs.Summary
	var after *jobs.Cursor
	for {
		size := jobs.ListLimit
		if !all {
			size = min(limit-len(list), jobs.ListLimit)
		}
		rctx, cancel := withTimeout(ctx, o)
		page, err := st.List(rctx, jobs.ListRequest{ChannelID: channel, States: states, Types: types, Limit: size, After: after})
		cancel()
		if err != nil {
			return err
		}
		list = append(list, page.Jobs...)
		if page.Next == nil || (!all && len(list) >= limit) {
			break
		}
		after = page.Next
	}
	if o.json {
		out := make([]summaryJSON, 0, len(list))
		for _, j := range list {
			out = append(out, summaryJSON{ChannelID: j.ChannelID, ID: j.ID, Type: j.Type, Version: j.Version, State: j.State, TargetKey: j.TargetKey,
				TargetGeneration: j.TargetGeneration, Revision: j.Revision, Attempts: j.Attempts, Failures: j.Failures,
				ClaimOwner: j.ClaimOwner, ClaimExpiresAt: jsonTime(j.ClaimExpiresAt), AvailableAt: jsonTime(j.AvailableAt),
				Reason: j.Reason, Subject: j.Subject, CreatedAt: jsonTime(j.CreatedAt), UpdatedAt: jsonTime(j.UpdatedAt)})
		}
		return c.printJSON(out)
	}
	if len(list) == 0 {
		where := "in channel " + channel
		if channel == "" {
			where = "in any channel"
		}
		if len(states) > 0 || len(types) > 0 {
			where += " that pass --state/--type"
		}
		fmt.Fprintf(c.stdout, "no jobs %s\n", where)
		return nil
	}
	now := time.Now()
	tw := c.table()
	if channel == "" {
		fmt.Fprint(tw, "CHANNEL\t")
	}
	fmt.Fprintln(tw, "ID\tTYPE\tSTATE\tTARGET\tATTEMPTS\tFAILURES\tDUE\tUPDATED\tREASON")
	for _, j := range list {
		if channel == "" {
			fmt.Fprintf(tw, "%s\t", j.ChannelID)
		}
		due := "-"
		switch j.State {
		case jobs.StatePending:
			due = until(now, j.AvailableAt)
		case jobs.StateRunning:
			due = "claim " + until(now, j.ClaimExpiresAt)
		}
		fmt.Fprintf(tw, "%s\t%s/v%d\t%s\t%s#%d\t%d\t%d\t%s\t%s ago\t%s\n", j.ID, j.Type, j.Version, j.State, j.TargetKey, j.TargetGeneration,
			j.Attempts, j.Failures, due, ago(now, j.UpdatedAt), oneLine(j.Reason))
	}
	return tw.Flush()
}

// detailJSON is "jobs show --json".
type detailJSON struct {
	Revision uint64         `json:"channelRevision"`
	Job      jobs.Job       `json:"job"`
	Target   jobs.Target    `json:"target"`
	Artifact *jobs.Artifact `json:"artifact,omitempty"`
}

func jobsShow(ctx context.Context, c *cli, o *options, args []string) error {
	s, st, err := c.openJobs(ctx, o)
	if err != nil {
		return err
	}
	defer s.close(ctx)
	rctx, cancel := withTimeout(ctx, o)
	defer cancel()
	d, err := st.Get(rctx, args[0], args[1])
	if err != nil {
		return err
	}
	if o.json {
		return c.printJSON(detailJSON{Revision: d.Revision, Job: d.Job, Target: d.Target, Artifact: d.Artifact})
	}
	printJob(c, d)
	return nil
}

func printJob(c *cli, d jobs.Detail) {
	j, now := d.Job, time.Now()
	tw := c.table()
	fmt.Fprintf(tw, "Job:\t%s (channel %s)\n", j.ID, j.ChannelID)
	fmt.Fprintf(tw, "Type:\t%s v%d (origin %s)\n", j.Type, j.Version, orDash(j.Origin))
	fmt.Fprintf(tw, "State:\t%s\n", j.State)
	if j.Reason != "" {
		fmt.Fprintf(tw, "Reason:\t%s\n", j.Reason)
	}
	fmt.Fprintf(tw, "Revision:\t%d (channel at %d)\n", j.Revision, d.Revision)
	gen := fmt.Sprintf("%d", j.TargetGeneration)
	if d.Target.Generation != j.TargetGeneration {
		gen += fmt.Sprintf(" (the target is at generation %d: a newer job supersedes this one)", d.Target.Generation)
	}
	fmt.Fprintf(tw, "Target:\t%s, generation %s\n", j.TargetKey, gen)
	fmt.Fprintf(tw, "Attempts:\t%d (%d failures)\n", j.Attempts, j.Failures)
	if j.State == jobs.StateRunning {
		fmt.Fprintf(tw, "Claim:\t%s, generation %d, expires %s (%s)\n", j.ClaimOwner, j.ClaimGeneration, stamp(j.ClaimExpiresAt), until(now, j.ClaimExpiresAt))
	}
	fmt.Fprintf(tw, "Available at:\t%s (%s)\n", stamp(j.AvailableAt), until(now, j.AvailableAt))
	fmt.Fprintf(tw, "Created:\t%s\n", stamp(j.CreatedAt))
	fmt.Fprintf(tw, "Updated:\t%s (%s ago)\n", stamp(j.UpdatedAt), ago(now, j.UpdatedAt))
	fmt.Fprintf(tw, "Idempotency key:\t%s\n", j.IdempotencyKey)
	fmt.Fprintf(tw, "Input:\t%s\n", printable(j.Input))
	if d.Artifact != nil {
		fmt.Fprintf(tw, "Artifact:\t%s (revision %d)\n", printable(d.Artifact.Value), d.Artifact.Revision)
	}
	tw.Flush()
	if len(j.Progress) > 0 {
		fmt.Fprintln(c.stdout, "\nProgress:")
		tw = c.table()
		fmt.Fprintln(tw, "  ATTEMPT\tSTAGE\tSTATE\tLABEL\tREASON\tAT")
		for _, p := range j.Progress {
			fmt.Fprintf(tw, "  %d\t%s\t%s\t%s\t%s\t%s\n", p.Attempt, p.Stage, p.State, p.Label, orDash(p.Reason), stamp(p.CreatedAt))
		}
		tw.Flush()
	}
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// changed prints the job after a control call.
func (c *cli) changed(o *options, verb string, j jobs.Job) error {
	if o.json {
		b, err := json.Marshal(j)
		if err != nil {
			return err
		}
		return c.printJSON(json.RawMessage(b))
	}
	extra := ""
	if j.State == jobs.StatePending {
		extra = ", due now"
		if now := time.Now(); j.AvailableAt.After(now) {
			extra = ", due " + until(now, j.AvailableAt)
		}
	}
	fmt.Fprintf(c.stdout, "%s job %s of channel %s: now %s at revision %d%s\n", verb, j.ID, j.ChannelID, j.State, j.Revision, extra)
	return nil
}

// current reads the job and checks that it is at the revision the operator
// gave (0: any).
func current(ctx context.Context, o *options, st jobs.Store, channel, id string, rev uint64) (jobs.Job, error) {
	rctx, cancel := withTimeout(ctx, o)
	defer cancel()
	d, err := st.Get(rctx, channel, id)
	if err != nil {
		return jobs.Job{}, err
	}
	if rev != 0 && d.Job.Revision != rev {
		return jobs.Job{}, fmt.Errorf("%w: job %q of channel %q is at revision %d, not %d as given: look at it again; nothing changed",
			errConflict, id, channel, d.Job.Revision, rev)
	}
	return d.Job, nil
}

// openClient opens the job store and the key layer (openJobs) and a
// runtime client over them, with no kinds: its control calls end a job's
// run in its worker at the worker's next heartbeat and remove its queue
// entry, found by reading the keys of the job's type in service. What it
// cannot do is a warning on stderr. The caller closes the session.
func (c *cli) openClient(ctx context.Context, o *options, service string) (*session, jobs.Store, *jobs.Client, error) {
	s, st, err := c.openJobs(ctx, o)
	if err != nil {
		return nil, nil, nil, err
	}
	logger := slog.New(slog.NewTextHandler(s.stderr, &slog.HandlerOptions{Level: slog.LevelWarn, ReplaceAttr: dropTime}))
	client, err := jobs.NewClient(st, s.coord, &jobs.ClientConfig{KeyStore: s.keys, Service: service, Logger: logger})
	if err != nil {
		s.close(ctx)
		return nil, nil, nil, err
	}
	return s, st, client, nil
}

func jobsCancel(ctx context.Context, c *cli, o *options, channel, id string, allowArchived bool, service string) error {
	if service == "" {
		return usagef("--service is empty")
	}
	s, st, client, err := c.openClient(ctx, o, service)
	if err != nil {
		return err
	}
	defer s.close(ctx)
	j, err := current(ctx, o, st, channel, id, 0)
	if err != nil {
		return err
	}
	if !j.State.Active() {
		return fmt.Errorf("%w: job %q of channel %q is %s, which is final: nothing to cancel", errConflict, id, channel, j.State)
	}
	if !o.json {
		fmt.Fprintf(c.stdout, "Job %s (%s/v%d, target %s) is %s, %s.\n", j.ID, j.Type, j.Version, j.TargetKey, j.State, plural(j.Attempts, "attempt"))
	}
	if err := c.confirm(o, fmt.Sprintf("Cancel job %s of channel %s? This is final.", id, channel)); err != nil {
		return err
	}
	rctx, cancel := withTimeout(ctx, o)
	defer cancel()
	j, err = client.Cancel(rctx, jobs.CancelRequest{ChannelID: channel, JobID: id, AllowArchived: allowArchived})
	if err != nil {
		return err
	}
	return c.changed(o, "cancelled", j)
}

func jobsPause(ctx context.Context, c *cli, o *options, channel, id, reason string, rev uint64) error {
	if err := checkText("--reason", reason, jobs.ReasonSizeLimit); err != nil {
		return usagef("%v", err)
	}
	s, st, err := c.openJobs(ctx, o)
	if err != nil {
		return err
	}
	defer s.close(ctx)
	j, err := current(ctx, o, st, channel, id, rev)
	if err != nil {
		return err
	}
	rctx, cancel := withTimeout(ctx, o)
	defer cancel()
	j, err = st.Pause(rctx, jobs.PauseRequest{ChannelID: channel, JobID: id, ExpectedRevision: j.Revision, Reason: reason})
	if err != nil {
		return err
	}
	return c.changed(o, "paused", j)
}

func jobsResume(ctx context.Context, c *cli, o *options, channel, id string, in time.Duration, rev uint64, service string) error {
	if in < 0 {
		return usagef("--in %v is negative", in)
	}
	if service == "" {
		return usagef("--service is empty")
	}
	s, st, client, err := c.openClient(ctx, o, service)
	if err != nil {
		return err
	}
	defer s.close(ctx)
	j, err := current(ctx, o, st, channel, id, rev)
	if err != nil {
		return err
	}
	var at time.Time
	if in > 0 {
		at = time.Now().Add(in)
	}
	rctx, cancel := withTimeout(ctx, o)
	defer cancel()
	j, err = client.Resume(rctx, jobs.ResumeRequest{ChannelID: channel, JobID: id, ExpectedRevision: j.Revision, AvailableAt: at})
	if err != nil {
		return err
	}
	return c.changed(o, "resumed", j)
}

func jobsRetry(ctx context.Context, c *cli, o *options, channel, id string, rev uint64, service string) error {
	if service == "" {
		return usagef("--service is empty")
	}
	s, st, client, err := c.openClient(ctx, o, service)
	if err != nil {
		return err
	}
	defer s.close(ctx)
	j, err := current(ctx, o, st, channel, id, rev)
	if err != nil {
		return err
	}
	rctx, cancel := withTimeout(ctx, o)
	defer cancel()
	pausedHere := false
	switch j.State {
	case jobs.StatePaused:
	case jobs.StatePending:
		if !j.AvailableAt.After(time.Now()) {
			return fmt.Errorf("%w: job %q is pending and already due (since %s): nothing to retry", errConflict, id, stamp(j.AvailableAt))
		}
		// Pause and resume at once: due now, attempts and failures kept.
		if j, err = st.Pause(rctx, jobs.PauseRequest{ChannelID: channel, JobID: id, ExpectedRevision: j.Revision, Reason: "retry by an operator"}); err != nil {
			return err
		}
		pausedHere = true
	case jobs.StateRunning:
		return fmt.Errorf("%w: job %q is running (claimed by %s until %s): nothing to retry; pause it first to stop it",
			errConflict, id, j.ClaimOwner, stamp(j.ClaimExpiresAt))
	case jobs.StateFailed, jobs.StateCancelled, jobs.StateSuperseded:
		again, err := client.Retry(rctx, channel, id)
		if err != nil {
			return err
		}
		if o.json {
			return c.changed(o, "", again)
		}
		fmt.Fprintf(c.stdout, "job %s of channel %s (%s) runs again as job %s: now %s at revision %d\n",
			id, channel, j.State, again.ID, again.State, again.Revision)
		return nil
	default:
		return fmt.Errorf("%w: job %q is %s: it did its work, there is nothing to retry; enqueue the work anew through the application to run it once more",
			errConflict, id, j.State)
	}
	resumed, err := client.Resume(rctx, jobs.ResumeRequest{ChannelID: channel, JobID: id, ExpectedRevision: j.Revision})
	if err != nil {
		if !pausedHere {
			return err
		}
		return fmt.Errorf("job %q was paused for the retry but not resumed (resume it with 'jobkeys jobs resume %s %s'): %w", id, channel, id, err)
	}
	return c.changed(o, "retried", resumed)
}
