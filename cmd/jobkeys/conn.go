package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"path/filepath"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/nats-io/jsm.go/natscontext"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jobkeys/jobkeys"
	"github.com/jobkeys/jobkeys/jobs"
)

// session is an open connection and the stores over it.
type session struct {
	nc    *nats.Conn
	js    jetstream.JetStream
	keys  *jobkeys.NATSStore
	coord *jobkeys.KeyCoordinator
	// closeJobs closes the job store opened over the connection (see
	// cli.openJobs); nil when none was, or when it needs no closing.
	closeJobs func(context.Context) error
	timeout   time.Duration // --timeout
	stderr    io.Writer     // where close reports what it could not finish
}

// closeGrace is how much longer than --timeout the close of a job store
// waits for its purges in flight, each of which times out --timeout after
// it was sent.
const closeGrace = time.Second

// close closes the job store, if one was opened, then the connection. A
// job store's Close waits (until ctx ends, or --timeout and closeGrace
// pass) for the answers of the purges that a write finishing a job sent in
// the background, so that none is left in flight and a purge the server
// refused is reported (through the store's logger, on stderr). The
// command's outcome is decided by then: what Close could not finish is a
// warning on stderr, not an exit code.
func (s *session) close(ctx context.Context) {
	if s.closeJobs != nil {
		// A purge times out --timeout after it was sent, before this.
		cctx, cancel := context.WithTimeout(ctx, s.timeout+closeGrace)
		if err := s.closeJobs(cctx); err != nil {
			fmt.Fprintf(s.stderr, "jobkeys: warning: %v\n", err)
		}
		cancel()
		s.closeJobs = nil
	}
	s.nc.Close()
}

// loadContext returns the nats CLI context named by --context or
// NATS_CONTEXT, else the selected one; nil when none is named or selected.
// Contexts are read from $XDG_CONFIG_HOME/nats/context (or
// $HOME/.config/nats/context), as the nats CLI keeps them.
func (c *cli) loadContext(ctx context.Context, o *options) (*natscontext.Context, error) {
	name := o.context
	if name == "" {
		name = c.getenv("NATS_CONTEXT")
	}
	root := c.getenv("XDG_CONFIG_HOME")
	if root == "" {
		home := c.getenv("HOME")
		if home == "" {
			if name != "" {
				return nil, fmt.Errorf("nats context %q: neither XDG_CONFIG_HOME nor HOME is set", name)
			}
			return nil, nil
		}
		root = filepath.Join(home, ".config")
	}
	reg := natscontext.NewRegistry(natscontext.NewFileBackendAt(root))
	if name == "" {
		selected, err := reg.Selected(ctx)
		if err != nil || selected == "" {
			return nil, nil // no selected context: connect without one
		}
		name = selected
	}
	nctx, err := reg.Load(ctx, name)
	if err != nil {
		return nil, fmt.Errorf("%w: nats context %q (in %s): %w", errNotFound, name, filepath.Join(root, "nats", "context"), err)
	}
	return nctx, nil
}

// connect opens a connection as the flags, the environment and the nats
// context say: --server, else NATS_URL, else the context's servers, else
// nats://127.0.0.1:4222; --creds over the context's credentials.
func (c *cli) connect(ctx context.Context, o *options) (*session, error) {
	nctx, err := c.loadContext(ctx, o)
	if err != nil {
		return nil, err
	}
	url := o.server
	if url == "" {
		url = c.getenv("NATS_URL")
	}
	var opts []nats.Option
	if nctx != nil {
		if url == "" {
			url = nctx.ServerURL()
		}
		if opts, err = nctx.NATSOptions(); err != nil {
			return nil, fmt.Errorf("nats context %q: %w", nctx.Name, err)
		}
	}
	if url == "" {
		url = nats.DefaultURL
	}
	if o.creds != "" {
		opts = append(opts, nats.UserCredentials(o.creds))
	}
	opts = append(opts, nats.Name("jobkeys CLI"), nats.Timeout(o.timeout), nats.MaxReconnects(0), nats.NoCallbacksAfterClientClose(),
		nats.ErrorHandler(func(*nats.Conn, *nats.Subscription, error) {})) // errors are reported by the calls that meet them
	nc, err := nats.Connect(url, opts...)
	if err != nil {
		return nil, fmt.Errorf("connect to %s: %w", url, err)
	}
	var js jetstream.JetStream
	switch {
	case nctx != nil && nctx.JSDomain() != "":
		js, err = jetstream.NewWithDomain(nc, nctx.JSDomain(), jetstream.WithDefaultTimeout(o.timeout))
	case nctx != nil && nctx.JSAPIPrefix() != "":
		js, err = jetstream.NewWithAPIPrefix(nc, nctx.JSAPIPrefix(), jetstream.WithDefaultTimeout(o.timeout))
	default:
		js, err = jetstream.New(nc, jetstream.WithDefaultTimeout(o.timeout))
	}
	if err != nil {
		nc.Close()
		return nil, fmt.Errorf("JetStream on %s: %w", url, err)
	}
	keys, err := jobkeys.NewNATSStore(js, jobkeys.WithBucketPrefix(o.bucketPrefix))
	if err != nil {
		nc.Close()
		return nil, usagef("--bucket-prefix: %v", err)
	}
	coord, err := jobkeys.NewCoordinator(keys, &jobkeys.Config{InstanceID: "jobkeys-cli", Now: c.clock()})
	if err != nil {
		nc.Close()
		return nil, err
	}
	return &session{nc: nc, js: js, keys: keys, coord: coord, timeout: o.timeout, stderr: c.stderr}, nil
}

// The CLI's own error kinds, mapped to exit codes by exitCode.
var (
	errNotFound     = errors.New("not found")
	errConflict     = errors.New("conflict")
	errNotConfirmed = errors.New("not confirmed")
	errCorrupt      = errors.New("corrupt state")
)

// exitCode maps an error to the exit code scripts branch on.
func exitCode(err error) int {
	switch {
	case isPermission(err):
		return exitPermission
	case errors.Is(err, errNotConfirmed):
		return exitNotConfirmed
	case errors.Is(err, errCorrupt), errors.Is(err, jobkeys.ErrCorruptState), errors.Is(err, jobkeys.ErrForeignState),
		errors.Is(err, jobs.ErrCorrupt):
		return exitCorrupt
	case errors.Is(err, errNotFound), errors.Is(err, jobkeys.ErrBucketNotFound), errors.Is(err, jobkeys.ErrKeyNotFound),
		errors.Is(err, jobs.ErrNotFound), errors.Is(err, jetstream.ErrBucketNotFound), errors.Is(err, jetstream.ErrKeyNotFound):
		return exitNotFound
	case errors.Is(err, errConflict), errors.Is(err, jobkeys.ErrRevisionConflict), errors.Is(err, jobs.ErrConflict):
		return exitConflict
	case errors.Is(err, jobkeys.ErrInvalidName), errors.Is(err, jobkeys.ErrInvalidRequest):
		return exitUsage // a service, job type or KV key that cannot be one
	}
	return exitError
}

// isPermission reports whether the server refused the CLI's user.
func isPermission(err error) bool {
	if errors.Is(err, jobkeys.ErrPermission) || errors.Is(err, nats.ErrPermissionViolation) || errors.Is(err, nats.ErrAuthorization) {
		return true
	}
	var apiErr *jetstream.APIError
	return errors.As(err, &apiErr) && apiErr.Code == 403
}

// confirm asks question on stderr and reads the answer from stdin, unless
// --force. Without a terminal on stdin it refuses rather than guess.
func (c *cli) confirm(o *options, question string) error {
	if o.force {
		return nil
	}
	if !c.isTerminal(c.stdin) {
		return fmt.Errorf("%w: %s: stdin is not a terminal; pass -f to do it without asking", errNotConfirmed, question)
	}
	fmt.Fprintf(c.stderr, "%s [y/N] ", question)
	line, err := bufio.NewReader(c.stdin).ReadString('\n')
	if err != nil && !errors.Is(err, io.EOF) {
		return fmt.Errorf("read the answer: %w", err)
	}
	switch strings.ToLower(strings.TrimSpace(line)) {
	case "y", "yes":
		return nil
	}
	return fmt.Errorf("%w: nothing changed", errNotConfirmed)
}

// printJSON prints v as indented JSON.
func (c *cli) printJSON(v any) error {
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return err
	}
	_, err = fmt.Fprintf(c.stdout, "%s\n", b)
	return err
}

// table returns an aligned table writer on stdout; call Flush.
func (c *cli) table() *tabwriter.Writer {
	return tabwriter.NewWriter(c.stdout, 0, 0, 2, ' ', 0)
}

// jsonTime is a time for JSON output: RFC 3339 with milliseconds, null
// when zero.
func jsonTime(t time.Time) *string {
	if t.IsZero() {
		return nil
	}
	s := t.UTC().Format("2006-01-02T15:04:05.000Z07:00")
	return &s
}

// ago formats how long before now t was, "-" when t is zero.
func ago(now, t time.Time) string {
	if t.IsZero() {
		return "-"
	}
	return roundDur(now.Sub(t)).String()
}

// until formats how long after now t is, "-" when t is zero.
func until(now, t time.Time) string {
	if t.IsZero() {
		return "-"
	}
	d := t.Sub(now)
	if d < 0 {
		return roundDur(-d).String() + " ago"
	}
	return "in " + roundDur(d).String()
}

func roundDur(d time.Duration) time.Duration {
	if d > time.Second {
		return d.Round(time.Second)
	}
	return d.Round(time.Millisecond)
}

func stamp(t time.Time) string {
	if t.IsZero() {
		return "-"
	}
	return t.UTC().Format("2006-01-02 15:04:05.000Z")
}

// withTimeout bounds one request by --timeout.
func withTimeout(ctx context.Context, o *options) (context.Context, context.CancelFunc) {
	return context.WithTimeout(ctx, o.timeout)
}
