package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/jobkeys/jobkeys"
)

func keyCommands() []*command {
	var (
		showKey     *string
		lsMargin    *time.Duration
		showMargin  *time.Duration
		sweepDry    *bool
		sweepMargin *time.Duration
		repairRev   *uint64
		repairWith  *string
		historySize *int
	)
	return []*command{
		{name: "keys ls", args: "SERVICE [JOBTYPE]", min: 1, max: 2,
			short: "list keys with occupancy: active/max, queued/limit, oldest queued, next lease expiry, expired slots",
			long: `Lists the keys of one job type (or of every job type of the service) in
the bucket <bucket-prefix>_<SERVICE>. A key whose value is corrupt is listed
with its problem; the exit code is then 5 (after the whole listing).
EXPIRED counts the slots whose lease expired by this host's clock; those
expired less than --skew-margin ago, which "keys sweep" with that margin
keeps, are counted again as "(N kept)".`,
			flags: func(fs *flagSet) { lsMargin = marginFlag(fs) },
			run: func(ctx context.Context, c *cli, o *options, args []string) error {
				return keysLs(ctx, c, o, args, *lsMargin)
			}},
		{name: "keys show", args: "KVKEY | SERVICE JOBTYPE --key DISPLAYKEY", min: 1, max: 2,
			short: "show one key: its slots, its queue, or why its value is corrupt",
			long: `KVKEY is "<service>.<jobType>.<keyHash>" as "keys ls" prints it. With
--key, the keys of SERVICE JOBTYPE whose display key is DISPLAYKEY are shown.
An expired slot is shown as sweepable, or as kept by --skew-margin when its
lease expired less than that ago ("keys sweep" with that margin keeps it).
Exit code 5 when the value is corrupt.`,
			flags: func(fs *flagSet) {
				showKey = fs.String("key", "", "display key to look up (with SERVICE JOBTYPE)")
				showMargin = marginFlag(fs)
			},
			run: func(ctx context.Context, c *cli, o *options, args []string) error {
				return keysShow(ctx, c, o, args, *showKey, *showMargin)
			}},
		{name: "keys watch", args: "SERVICE [JOBTYPE]", min: 1, max: 2, run: keysWatch,
			short: "follow occupancy changes live (renewals are not shown); Ctrl-C ends",
			long: `Prints the keys as they are, then one line per change of a key's
occupancy: a slot taken, released or taken over, a job queued or removed, the
value becoming corrupt, the key deleted. Heartbeats that only renew leases
are not shown. With --json, one JSON object per line.`},
		{name: "keys history", args: "KVKEY", min: 1, max: 1,
			short: "the revisions of a KV key the bucket keeps (its history setting)",
			flags: func(fs *flagSet) { historySize = fs.Int("last", 0, "show only the last N revisions (0: all kept)") },
			run: func(ctx context.Context, c *cli, o *options, args []string) error {
				return keysHistory(ctx, c, o, args[0], *historySize)
			}},
		{name: "keys sweep", args: "SERVICE JOBTYPE", min: 2, max: 2,
			short: "remove expired slots (crashed workers) so that queued jobs can run; asks first",
			long:  sweepHelp,
			flags: func(fs *flagSet) {
				sweepDry = fs.Bool("dry-run", false, "only list the expired slots")
				sweepMargin = fs.Duration("skew-margin", skewMarginDefault, sweepMarginUsage)
			},
			run: func(ctx context.Context, c *cli, o *options, args []string) error {
				return keysSweep(ctx, c, o, args[0], args[1], *sweepDry, *sweepMargin)
			}},
		{name: "keys remove-queued", args: "KVKEY JOBID", min: 2, max: 2, run: keysRemoveQueued,
			short: "remove one queue entry (a job that never arrived); asks first",
			long: `Removes the queued job JOBID from the key stored at KVKEY and nothing
else, for an entry whose job will never come to take its slot (its producer
died between admission and publishing it). Exit code 3 when it is not queued.`},
		{name: "keys repair", args: "KVKEY", min: 1, max: 1,
			short: "delete (or replace) the value of a KV key, e.g. corrupt state; asks first",
			long: `Shows the value of KVKEY and, once confirmed, deletes it (or writes the
key state in --replace FILE instead) with a compare-and-swap on the revision
shown, or on --revision N, the revision you inspected: if the key changed since,
nothing is written (exit code 4). Deleting state that holds live slots lets
their key run more jobs than MaxActive until those jobs finish.`,
			flags: func(fs *flagSet) {
				repairRev = fs.Uint64("revision", 0, "the revision you inspected (default: the one shown now)")
				repairWith = fs.String("replace", "", "file holding the key state JSON to write instead of deleting")
			},
			run: func(ctx context.Context, c *cli, o *options, args []string) error {
				return keysRepair(ctx, c, o, args[0], *repairRev, *repairWith)
			}},
	}
}

// sweepMarginUsage is the usage of "keys sweep --skew-margin".
const sweepMarginUsage = "sweep a slot only once its lease expired this long ago by this host's clock: the clock skew between this host and the workers the sweep tolerates"

// marginFlag adds --skew-margin to the flags of a command that says what
// "keys sweep" would do.
func marginFlag(fs *flagSet) *time.Duration {
	return fs.Duration("skew-margin", skewMarginDefault, `count an expired slot sweepable only once its lease expired this long ago, as "keys sweep --skew-margin" does`)
}

// marginCounts returns how many of k's slots a sweep with margin would
// remove (sweepable) and keep although their lease expired (kept), at
// k.ReadAt.
func marginCounts(k jobkeys.KeyInfo, margin time.Duration) (sweepableSlots, kept int) {
	if k.State == nil {
		return 0, 0
	}
	for _, sl := range k.State.Active {
		switch {
		case sweepable(sl, k.ReadAt, margin):
			sweepableSlots++
		case !sl.LeaseExpiresAt.After(k.ReadAt):
			kept++
		}
	}
	return sweepableSlots, kept
}

// keyJSON is a key in JSON output.
type keyJSON struct {
	KVKey              string          `json:"kvKey"`
	Revision           uint64          `json:"revision"`
	Key                string          `json:"key"`
	Corrupt            bool            `json:"corrupt"`
	Problem            string          `json:"problem,omitempty"`
	Active             int             `json:"active"`
	MaxActive          int             `json:"maxActive"`
	Queued             int             `json:"queued"`
	MaxQueuedPerKey    int             `json:"maxQueuedPerKey"`
	QueueLimit         int             `json:"queueLimit"`
	OldestQueuedAt     *string         `json:"oldestQueuedAt"`
	OldestQueuedAgeSec float64         `json:"oldestQueuedAgeSeconds"`
	NextLeaseExpiry    *string         `json:"nextLeaseExpiry"`
	ExpiredSlots       int             `json:"expiredSlots"`
	SweepableSlots     int             `json:"sweepableSlots"`    // expired skewMarginSeconds ago or more
	KeptSlots          int             `json:"keptSlots"`         // expired less than skewMarginSeconds ago
	SkewMarginSeconds  float64         `json:"skewMarginSeconds"` // the sweep's margin the two counts are for
	StaleTakeoverCount int             `json:"staleTakeoverCount"`
	UpdatedAt          *string         `json:"updatedAt"`
	ReadAt             *string         `json:"readAt"`
	State              json.RawMessage `json:"state,omitempty"` // show: the stored state
	Value              *string         `json:"value,omitempty"` // show: the stored bytes when corrupt
}

// toKeyJSON returns k in JSON output, its expired slots counted for a
// sweep with margin.
func toKeyJSON(k jobkeys.KeyInfo, withValue bool, margin time.Duration) keyJSON {
	j := keyJSON{KVKey: k.KVKey, Revision: k.Revision, Key: k.DisplayKey, Corrupt: k.Corrupt(),
		Active: k.Active, MaxActive: k.MaxActive, Queued: k.Queued, MaxQueuedPerKey: k.MaxQueued, QueueLimit: k.QueueLimit,
		OldestQueuedAt: jsonTime(k.OldestQueuedAt), OldestQueuedAgeSec: k.OldestQueuedAge().Seconds(),
		NextLeaseExpiry: jsonTime(k.NextLeaseExpiry), ExpiredSlots: k.ExpiredSlots, StaleTakeoverCount: k.StaleCount,
		UpdatedAt: jsonTime(k.UpdatedAt), ReadAt: jsonTime(k.ReadAt)}
	j.SweepableSlots, j.KeptSlots = marginCounts(k, margin)
	j.SkewMarginSeconds = margin.Seconds()
	if k.Problem != nil {
		j.Problem = k.Problem.Error()
	}
	if withValue {
		if k.Problem == nil && json.Valid(k.Value) {
			j.State = json.RawMessage(k.Value)
		} else if k.Value != nil {
			s := string(k.Value)
			j.Value = &s
		}
	}
	return j
}

// serviceOf returns the service of a KV key, its first token.
func serviceOf(kvKey string) (string, error) {
	service, rest, ok := strings.Cut(kvKey, ".")
	if !ok || service == "" || rest == "" {
		return "", usagef("KV key %q is not <service>.<jobType>.<keyHash>", kvKey)
	}
	return service, nil
}

func keysLs(ctx context.Context, c *cli, o *options, args []string, margin time.Duration) error {
	if margin < 0 {
		return usagef("--skew-margin %v is negative", margin)
	}
	service, jobType := args[0], ""
	if len(args) > 1 {
		jobType = args[1]
	}
	s, err := c.connect(ctx, o)
	if err != nil {
		return err
	}
	defer s.close(ctx)
	rctx, cancel := withTimeout(ctx, o)
	defer cancel()
	infos, err := s.coord.InspectKeys(rctx, service, jobType)
	if err != nil {
		return err
	}
	var corrupt []jobkeys.KeyInfo
	for _, k := range infos {
		if k.Corrupt() {
			corrupt = append(corrupt, k)
		}
	}
	if o.json {
		out := make([]keyJSON, 0, len(infos))
		for _, k := range infos {
			out = append(out, toKeyJSON(k, false, margin))
		}
		if err := c.printJSON(out); err != nil {
			return err
		}
	} else {
		printKeyTable(c, infos, margin)
	}
	if len(corrupt) > 0 {
		return fmt.Errorf("%w: %d of %d keys hold a value that is not usable key state (see PROBLEM; 'jobkeys keys repair KVKEY' deletes one)",
			errCorrupt, len(corrupt), len(infos))
	}
	return nil
}

func printKeyTable(c *cli, infos []jobkeys.KeyInfo, margin time.Duration) {
	if len(infos) == 0 {
		fmt.Fprintln(c.stdout, "no keys")
		return
	}
	kept := 0
	tw := c.table()
	fmt.Fprintln(tw, "KEY\tACTIVE\tQUEUED\tOLDEST QUEUED\tNEXT EXPIRY\tEXPIRED\tSTALE\tKV KEY\tPROBLEM")
	for _, k := range infos {
		if k.Corrupt() {
			fmt.Fprintf(tw, "(corrupt)\t-\t-\t-\t-\t-\t-\t%s\t%s\n", k.KVKey, oneLine(k.Problem.Error()))
			continue
		}
		oldest := "-"
		if k.Queued > 0 {
			oldest = ago(k.ReadAt, k.OldestQueuedAt)
		}
		expired := fmt.Sprint(k.ExpiredSlots)
		if _, n := marginCounts(k, margin); n > 0 {
			expired = fmt.Sprintf("%d (%d kept)", k.ExpiredSlots, n)
			kept += n
		}
		fmt.Fprintf(tw, "%s\t%d/%d\t%d/%d\t%s\t%s\t%s\t%d\t%s\t\n", k.DisplayKey, k.Active, k.MaxActive, k.Queued, k.QueueLimit,
			oldest, until(k.ReadAt, k.NextLeaseExpiry), expired, k.StaleCount, k.KVKey)
	}
	tw.Flush()
	if kept > 0 {
		fmt.Fprintf(c.stdout, "(%s kept: expired less than --skew-margin %v ago by this host's clock, which 'keys sweep' with that margin keeps)\n",
			plural(kept, "slot"), margin)
	}
}

func oneLine(s string) string { return strings.Join(strings.Fields(s), " ") }

func keysShow(ctx context.Context, c *cli, o *options, args []string, displayKey string, margin time.Duration) error {
	var service string
	switch {
	case margin < 0:
		return usagef("--skew-margin %v is negative", margin)
	case displayKey != "" && len(args) != 2:
		return usagef("--key needs SERVICE JOBTYPE")
	case displayKey == "" && len(args) != 1:
		return usagef("give a KVKEY, or SERVICE JOBTYPE --key DISPLAYKEY")
	case displayKey == "":
		var err error
		if service, err = serviceOf(args[0]); err != nil {
			return err
		}
	}
	s, err := c.connect(ctx, o)
	if err != nil {
		return err
	}
	defer s.close(ctx)
	rctx, cancel := withTimeout(ctx, o)
	defer cancel()
	var infos []jobkeys.KeyInfo
	if displayKey == "" {
		info, err := s.coord.InspectKey(rctx, service, args[0])
		if err != nil {
			return err
		}
		infos = append(infos, info)
	} else {
		all, err := s.coord.InspectKeys(rctx, args[0], args[1])
		if err != nil {
			return err
		}
		for _, k := range all {
			if !k.Corrupt() && k.DisplayKey == displayKey {
				infos = append(infos, k)
			}
		}
		if len(infos) == 0 {
			return fmt.Errorf("%w: no key of job type %q of service %q has display key %q (of %d keys)", errNotFound, args[1], args[0], displayKey, len(all))
		}
	}
	if o.json {
		out := make([]keyJSON, 0, len(infos))
		for _, k := range infos {
			out = append(out, toKeyJSON(k, true, margin))
		}
		if displayKey == "" {
			err = c.printJSON(out[0])
		} else {
			err = c.printJSON(out)
		}
		if err != nil {
			return err
		}
	} else {
		for i, k := range infos {
			if i > 0 {
				fmt.Fprintln(c.stdout)
			}
			printKey(c, k, margin)
		}
	}
	for _, k := range infos {
		if k.Corrupt() {
			return k.Problem // names the KV key and the revision; exit code 5
		}
	}
	return nil
}

func printKey(c *cli, k jobkeys.KeyInfo, margin time.Duration) {
	tw := c.table()
	fmt.Fprintf(tw, "KV key:\t%s\n", k.KVKey)
	fmt.Fprintf(tw, "Revision:\t%d\n", k.Revision)
	if k.Corrupt() {
		fmt.Fprintf(tw, "Problem:\t%s\n", k.Problem)
		tw.Flush()
		fmt.Fprintf(c.stdout, "Value (%d bytes):\n%s\n", len(k.Value), printable(k.Value))
		fmt.Fprintf(c.stdout, "Repair: jobkeys keys repair %s --revision %d\n", k.KVKey, k.Revision)
		return
	}
	fmt.Fprintf(tw, "Key:\t%s\n", k.DisplayKey)
	fmt.Fprintf(tw, "Active:\t%d/%d (%s)\n", k.Active, k.MaxActive, expiredText(k, margin))
	fmt.Fprintf(tw, "Queued:\t%d/%d (MaxQueuedPerKey %d)\n", k.Queued, k.QueueLimit, k.MaxQueued)
	fmt.Fprintf(tw, "Stale takeovers:\t%d\n", k.StaleCount)
	fmt.Fprintf(tw, "Updated:\t%s (%s ago)\n", stamp(k.UpdatedAt), ago(k.ReadAt, k.UpdatedAt))
	tw.Flush()
	st := k.State
	if len(st.Active) > 0 {
		fmt.Fprintln(c.stdout, "\nSlots:")
		tw = c.table()
		fmt.Fprintln(tw, "  JOB\tINSTANCE\tSTARTED\tHEARTBEAT\tLEASE\tTRIES\tSLOT TOKEN")
		for _, sl := range st.Active {
			fmt.Fprintf(tw, "  %s\t%s\t%s ago\t%s ago\t%s\t%d\t%s\n", sl.JobID, sl.InstanceID, ago(k.ReadAt, sl.StartedAt),
				ago(k.ReadAt, sl.HeartbeatAt), leaseText(k.ReadAt, sl, margin), sl.Tries, sl.SlotToken)
		}
		tw.Flush()
	}
	if len(st.Queued) > 0 {
		fmt.Fprintln(c.stdout, "\nQueued:")
		tw = c.table()
		fmt.Fprintln(tw, "  JOB\tADMITTED\tWAITING\tREQUEST")
		for _, q := range st.Queued {
			fmt.Fprintf(tw, "  %s\t%s\t%s\t%s\n", q.JobID, stamp(q.CreatedAt), ago(k.ReadAt, q.CreatedAt), q.RequestID)
		}
		tw.Flush()
	}
}

// leaseText says when sl's lease expires, or when it expired and what a
// sweep with margin would do with the slot.
func leaseText(now time.Time, sl jobkeys.ActiveSlot, margin time.Duration) string {
	exp := sl.LeaseExpiresAt
	switch {
	case sweepable(sl, now, margin):
		return "EXPIRED " + roundDur(now.Sub(exp)).String() + " ago, sweepable"
	case !exp.After(now):
		return fmt.Sprintf("EXPIRED %v ago, kept by --skew-margin %v", roundDur(now.Sub(exp)), margin)
	}
	return "expires in " + roundDur(exp.Sub(now)).String()
}

// expiredText counts k's expired slots, and says which a sweep with margin
// would remove and keep.
func expiredText(k jobkeys.KeyInfo, margin time.Duration) string {
	n, kept := marginCounts(k, margin)
	switch {
	case n+kept == 0:
		return fmt.Sprintf("%d expired", k.ExpiredSlots)
	case kept == 0:
		return fmt.Sprintf("%d expired, sweepable", n)
	case n == 0:
		return fmt.Sprintf("%d expired, kept by --skew-margin %v", kept, margin)
	}
	return fmt.Sprintf("%d expired: %d sweepable, %d kept by --skew-margin %v", n+kept, n, kept, margin)
}

// printable returns value as text when it is valid UTF-8 without control
// characters other than newlines and tabs, else quoted.
func printable(value []byte) string {
	const limit = 4096
	v, more := value, ""
	if len(v) > limit {
		v, more = v[:limit], fmt.Sprintf("\n… (%d more bytes)", len(value)-limit)
	}
	if utf8.Valid(v) && !strings.ContainsFunc(string(v), func(r rune) bool { return r < 0x20 && r != '\n' && r != '\t' }) {
		return string(v) + more
	}
	return fmt.Sprintf("%q", v) + more
}

// watchJSON is one line of "keys watch --json".
type watchJSON struct {
	Event string `json:"event"` // initial, changed, deleted, error
	keyJSON
	Error string `json:"error,omitempty"`
}

func keysWatch(ctx context.Context, c *cli, o *options, args []string) error {
	service, jobType := args[0], ""
	if len(args) > 1 {
		jobType = args[1]
	}
	s, err := c.connect(ctx, o)
	if err != nil {
		return err
	}
	defer s.close(ctx)
	// The watch ends with the command, whichever way it returns.
	wctx, stop := context.WithCancel(ctx)
	defer stop()
	w, err := s.coord.WatchOccupancy(wctx, service, jobType)
	if err != nil {
		return err
	}
	enc := json.NewEncoder(c.stdout)
	for ch := range w.Changes() {
		event := "changed"
		switch {
		case ch.Initial:
			event = "initial"
		case ch.Deleted:
			event = "deleted"
		case ch.Err != nil:
			event = "error"
		}
		if o.json {
			line := watchJSON{Event: event, keyJSON: toKeyJSON(ch.Info, false, skewMarginDefault)}
			line.KVKey = ch.KVKey
			if ch.Err != nil {
				line.Error = ch.Err.Error()
			}
			if err := enc.Encode(line); err != nil {
				return err
			}
			continue
		}
		k := ch.Info
		now := time.Now().UTC().Format("15:04:05.000")
		switch {
		case ch.Deleted:
			fmt.Fprintf(c.stdout, "%s  deleted   %s\n", now, ch.KVKey)
		case ch.Err != nil:
			fmt.Fprintf(c.stdout, "%s  error     %s: %v\n", now, ch.KVKey, ch.Err)
		case k.Corrupt():
			fmt.Fprintf(c.stdout, "%s  %-8s  %s CORRUPT: %s\n", now, event, ch.KVKey, oneLine(k.Problem.Error()))
		default:
			fmt.Fprintf(c.stdout, "%s  %-8s  %s  active %d/%d  queued %d/%d  expired %d  %s\n", now, event, k.DisplayKey,
				k.Active, k.MaxActive, k.Queued, k.QueueLimit, k.ExpiredSlots, ch.KVKey)
		}
	}
	if err := w.Err(); err != nil && ctx.Err() == nil {
		return err
	}
	return nil // interrupted: the normal end of a watch
}

// historyJSON is one revision in "keys history --json".
type historyJSON struct {
	Revision  uint64          `json:"revision"`
	Time      *string         `json:"time"`
	Operation string          `json:"operation"` // PUT, DEL, PURGE
	Corrupt   bool            `json:"corrupt"`
	Problem   string          `json:"problem,omitempty"`
	Active    int             `json:"active"`
	Queued    int             `json:"queued"`
	State     json.RawMessage `json:"state,omitempty"`
	Value     *string         `json:"value,omitempty"`
}

func keysHistory(ctx context.Context, c *cli, o *options, kvKey string, last int) error {
	service, err := serviceOf(kvKey)
	if err != nil {
		return err
	}
	if last < 0 {
		return usagef("--last %d is negative", last)
	}
	s, err := c.connect(ctx, o)
	if err != nil {
		return err
	}
	defer s.close(ctx)
	rctx, cancel := withTimeout(ctx, o)
	defer cancel()
	kv, err := s.keys.KeyValue(rctx, service)
	if err != nil {
		return err
	}
	entries, err := kv.History(rctx, kvKey)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return fmt.Errorf("%w: KV key %q has no history in bucket %q", errNotFound, kvKey, kv.Bucket())
	}
	if err != nil {
		return fmt.Errorf("history of KV key %q in bucket %q: %w", kvKey, kv.Bucket(), err)
	}
	if last > 0 && len(entries) > last {
		entries = entries[len(entries)-last:]
	}
	rows := make([]historyJSON, 0, len(entries))
	for _, e := range entries {
		h := historyJSON{Revision: e.Revision(), Time: jsonTime(e.Created()), Operation: opName(e.Operation())}
		if e.Operation() == jetstream.KeyValuePut {
			if st, err := jobkeys.ParseState(e.Value()); err != nil {
				h.Corrupt, h.Problem = true, err.Error()
				v := string(e.Value())
				h.Value = &v
			} else {
				h.Active, h.Queued = len(st.Active), len(st.Queued)
				h.State = json.RawMessage(e.Value())
			}
		}
		rows = append(rows, h)
	}
	if o.json {
		return c.printJSON(rows)
	}
	tw := c.table()
	fmt.Fprintln(tw, "REVISION\tTIME\tOP\tACTIVE\tQUEUED\tDETAIL")
	for i, h := range rows {
		detail := ""
		switch {
		case h.Corrupt:
			detail = "CORRUPT: " + oneLine(h.Problem)
		case h.State != nil:
			st, _ := jobkeys.ParseState(entries[i].Value())
			detail = historyDetail(st)
		}
		active, queued := fmt.Sprint(h.Active), fmt.Sprint(h.Queued)
		if h.Operation != "PUT" {
			active, queued = "-", "-"
		}
		fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%s\t%s\n", h.Revision, stamp(entries[i].Created()), h.Operation, active, queued, detail)
	}
	tw.Flush()
	if st, err := kv.Status(rctx); err == nil && st.History() == 1 {
		fmt.Fprintf(c.stdout, "(bucket %q keeps 1 revision per key: only the latest is shown)\n", kv.Bucket())
	}
	return nil
}

func opName(op jetstream.KeyValueOp) string {
	switch op {
	case jetstream.KeyValuePut:
		return "PUT"
	case jetstream.KeyValueDelete:
		return "DEL"
	case jetstream.KeyValuePurge:
		return "PURGE"
	}
	return op.String()
}

func historyDetail(st *jobkeys.KeyState) string {
	var parts []string
	for _, a := range st.Active {
		parts = append(parts, "slot "+a.JobID)
	}
	for _, q := range st.Queued {
		parts = append(parts, "queued "+q.JobID)
	}
	return strings.Join(parts, ", ")
}

func plural(n int, noun string) string {
	if n == 1 {
		return "1 " + noun
	}
	return fmt.Sprintf("%d %ss", n, noun)
}

func nonNil[T any](s []T) []T {
	if s == nil {
		return []T{}
	}
	return s
}

func keysRemoveQueued(ctx context.Context, c *cli, o *options, args []string) error {
	kvKey, jobID := args[0], args[1]
	service, err := serviceOf(kvKey)
	if err != nil {
		return err
	}
	s, err := c.connect(ctx, o)
	if err != nil {
		return err
	}
	defer s.close(ctx)
	rctx, cancel := withTimeout(ctx, o)
	defer cancel()
	info, err := s.coord.InspectKey(rctx, service, kvKey)
	if err != nil {
		return err
	}
	if info.Corrupt() {
		return fmt.Errorf("%w: KV key %q at revision %d: %v; nothing removed (see 'jobkeys keys repair')", errCorrupt, kvKey, info.Revision, info.Problem)
	}
	var entry *jobkeys.QueuedJob
	var ids []string
	for i, q := range info.State.Queued {
		ids = append(ids, q.JobID)
		if q.JobID == jobID {
			entry = &info.State.Queued[i]
		}
	}
	if entry == nil {
		return fmt.Errorf("%w: job %q is not queued at KV key %q (queued: %s)", errNotFound, jobID, kvKey, orNone(ids))
	}
	if !o.json {
		fmt.Fprintf(c.stdout, "Queued job %s of key %s (KV key %s, revision %d): admitted %s, waiting %s.\n",
			jobID, info.DisplayKey, kvKey, info.Revision, stamp(entry.CreatedAt), ago(info.ReadAt, entry.CreatedAt))
	}
	if err := c.confirm(o, fmt.Sprintf("Remove queued job %s from key %s?", jobID, info.DisplayKey)); err != nil {
		return err
	}
	rctx2, cancel2 := withTimeout(ctx, o)
	defer cancel2()
	rem, err := s.coord.RemoveQueuedEntry(rctx2, jobkeys.QueueEntryRef{Service: service, KVKey: kvKey, JobID: jobID})
	if err != nil {
		return err
	}
	if rem.Kind != jobkeys.KindRemoved {
		return fmt.Errorf("%w: job %q is no longer queued at KV key %q (removed or started meanwhile)", errNotFound, jobID, kvKey)
	}
	left := 0
	if rem.State != nil {
		left = len(rem.State.Queued)
	}
	if o.json {
		return c.printJSON(map[string]any{"removed": true, "kvKey": kvKey, "jobId": jobID, "queuedLeft": left})
	}
	fmt.Fprintf(c.stdout, "removed queued job %s from key %s; %d still queued\n", jobID, info.DisplayKey, left)
	return nil
}

func orNone(ids []string) string {
	if len(ids) == 0 {
		return "none"
	}
	return strings.Join(ids, ", ")
}

func keysRepair(ctx context.Context, c *cli, o *options, kvKey string, revision uint64, replaceFile string) error {
	service, err := serviceOf(kvKey)
	if err != nil {
		return err
	}
	var replacement *jobkeys.KeyState
	if replaceFile != "" {
		data, err := os.ReadFile(replaceFile)
		if err != nil {
			return usagef("--replace: %v", err)
		}
		if replacement, err = jobkeys.ParseState(data); err != nil {
			return usagef("--replace %s is not valid key state: %v", replaceFile, err)
		}
	}
	s, err := c.connect(ctx, o)
	if err != nil {
		return err
	}
	defer s.close(ctx)
	rctx, cancel := withTimeout(ctx, o)
	defer cancel()
	in, err := s.coord.Inspect(rctx, service, kvKey)
	if err != nil {
		return err
	}
	if in.Revision == 0 {
		return fmt.Errorf("%w: KV key %q in the bucket of service %q: nothing to repair", errNotFound, kvKey, service)
	}
	if revision == 0 {
		revision = in.Revision
	} else if revision != in.Revision {
		return fmt.Errorf("%w: KV key %q is at revision %d, not %d as given: inspect it again; nothing written", errConflict, kvKey, in.Revision, revision)
	}
	info := jobkeys.KeyInfo{KVKey: kvKey, Inspection: in}
	if !o.json {
		switch {
		case in.Problem != nil:
			fmt.Fprintf(c.stdout, "KV key %s, revision %d: %v\nValue (%d bytes):\n%s\n", kvKey, in.Revision, in.Problem, len(in.Value), printable(in.Value))
		default:
			fmt.Fprintf(c.stdout, "KV key %s, revision %d holds usable key state (key %s: %d slots, %d queued); repairing it is not needed.\n",
				kvKey, in.Revision, in.State.DisplayKey, len(in.State.Active), len(in.State.Queued))
		}
	}
	action := fmt.Sprintf("Delete the value of %s at revision %d?", kvKey, revision)
	if replacement != nil {
		action = fmt.Sprintf("Replace the value of %s at revision %d with the state in %s?", kvKey, revision, replaceFile)
	}
	if in.State != nil && len(in.State.Active) > 0 && (replacement == nil || len(replacement.Active) == 0) {
		action = fmt.Sprintf("It holds %d slots: their key may then run more jobs than MaxActive. %s", len(in.State.Active), action)
	}
	if err := c.confirm(o, action); err != nil {
		return err
	}
	rctx2, cancel2 := withTimeout(ctx, o)
	defer cancel2()
	out, err := s.coord.Repair(rctx2, jobkeys.RepairRequest{Service: service, KVKey: kvKey, Revision: revision, Replacement: replacement})
	if err != nil {
		return err
	}
	if o.json {
		j := toKeyJSON(info, true, skewMarginDefault)
		return c.printJSON(map[string]any{"kvKey": kvKey, "repairedRevision": revision, "deleted": out.Deleted, "revision": out.Revision, "previous": j})
	}
	if out.Deleted {
		fmt.Fprintf(c.stdout, "deleted the value of %s (was revision %d)\n", kvKey, revision)
	} else {
		fmt.Fprintf(c.stdout, "replaced the value of %s: revision %d (was %d)\n", kvKey, out.Revision, revision)
	}
	return nil
}
