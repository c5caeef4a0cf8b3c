// Command jobkeys looks at and repairs the state of a jobkeys deployment in
// NATS JetStream: the key state of each service's job types (the jobs that
// run and wait per key) and the job records of the job store.
//
// Install it with
//
//	go install github.com/jobkeys/jobkeys/cmd/jobkeys@latest
//
// and run "jobkeys --help" for the commands. It connects like the nats CLI:
// --server (or NATS_URL), --creds, and --context (or NATS_CONTEXT) naming a
// nats CLI context; with none of them, the selected nats CLI context, else
// nats://127.0.0.1:4222.
//
// Exit codes: 0 done; 1 an error (connection, I/O, an unexpected answer);
// 2 usage (unknown command, bad flag or argument); 3 not found (bucket, KV
// key, queue entry, channel or job); 4 conflict (the state changed since it
// was read, or the operation does not apply to it); 5 corrupt state shown
// or in the way; 6 not confirmed (the answer was not yes, or stdin is not a
// terminal and -f was not given); 7 permission denied.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/jobkeys/jobkeys/jobs"
)

// Exit codes, documented in the package comment and the README.
const (
	exitOK           = 0
	exitError        = 1
	exitUsage        = 2
	exitNotFound     = 3
	exitConflict     = 4
	exitCorrupt      = 5
	exitNotConfirmed = 6
	exitPermission   = 7
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], os.Stdin, os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

// run runs the command line args and returns the exit code.
func run(ctx context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	c := &cli{stdin: stdin, stdout: stdout, stderr: stderr, getenv: os.Getenv, isTerminal: isTerminal}
	return c.run(ctx, args)
}

// cli is one run of the command: its streams and environment.
type cli struct {
	stdin          io.Reader
	stdout, stderr io.Writer
	getenv         func(string) string
	isTerminal     func(io.Reader) bool
	// jobStore opens the job store; nil: the NATS job store (openNATSJobs).
	jobStore func(ctx context.Context, s *session, o *options) (jobs.Store, error)
	// now is the clock; nil: time.Now. Tests skew it.
	now func() time.Time
}

// clock returns c.now, time.Now when it is nil.
func (c *cli) clock() func() time.Time {
	if c.now == nil {
		return time.Now
	}
	return c.now
}

// command is a leaf of the command tree.
type command struct {
	name  string // "keys ls"
	args  string // the positional arguments, for the usage line
	short string // one line
	long  string // more, for "jobkeys <command> --help"
	// flags adds the command's own flags.
	flags func(fs *flagSet)
	// run runs the command with its positional arguments.
	run func(ctx context.Context, c *cli, o *options, args []string) error
	// min and max bound the number of positional arguments.
	min, max int
	// check, when set, checks the positional arguments before run (and
	// before connecting); its error is a usage error.
	check func(args []string) error
}

// commands lists every command; see keys.go, jobs.go and ui.go.
func commands() []*command { return append(append(keyCommands(), jobCommands()...), uiCommand()) }

func (c *cli) run(ctx context.Context, args []string) int {
	if len(args) == 0 {
		c.usage(c.stderr)
		return exitUsage
	}
	if args[0] == "-h" || args[0] == "--help" || args[0] == "help" {
		c.usage(c.stdout)
		return exitOK
	}
	// Global flags may come before the command words.
	o := &options{}
	fs := newFlagSet("jobkeys", o)
	if err := fs.fs.Parse(args); err != nil {
		return c.usageError(err)
	}
	words := fs.fs.Args()
	if fs.help {
		c.usage(c.stdout)
		return exitOK
	}
	var cmd *command
	for _, k := range commands() {
		parts := strings.Fields(k.name)
		if len(words) >= len(parts) && strings.Join(words[:len(parts)], " ") == k.name {
			cmd = k
			words = words[len(parts):]
			break
		}
	}
	if cmd == nil {
		if len(words) == 0 {
			return c.usageError(errors.New("no command"))
		}
		return c.usageError(fmt.Errorf("unknown command %q", strings.Join(words[:min(2, len(words))], " ")))
	}
	// The command's flags, the global ones included, anywhere among its
	// arguments.
	cfs := newFlagSet("jobkeys "+cmd.name, o)
	if cmd.flags != nil {
		cmd.flags(cfs)
	}
	pos, err := cfs.parse(words)
	if err != nil {
		return c.usageError(fmt.Errorf("%s: %w", cmd.name, err))
	}
	if fs.help || cfs.help {
		c.commandUsage(c.stdout, cmd, cfs)
		return exitOK
	}
	if err := o.validate(); err != nil {
		return c.usageError(fmt.Errorf("%s: %w", cmd.name, err))
	}
	if cmd.check != nil {
		if err := cmd.check(pos); err != nil {
			return c.usageError(fmt.Errorf("%s: %w", cmd.name, err))
		}
	}
	if len(pos) < cmd.min || len(pos) > cmd.max {
		fmt.Fprintf(c.stderr, "jobkeys %s: wrong number of arguments\n", cmd.name)
		c.commandUsage(c.stderr, cmd, cfs)
		return exitUsage
	}
	if err := cmd.run(ctx, c, o, pos); err != nil {
		var u usageError
		if errors.As(err, &u) {
			return c.usageError(fmt.Errorf("%s: %w", cmd.name, err))
		}
		fmt.Fprintf(c.stderr, "jobkeys %s: %v\n", cmd.name, err)
		return exitCode(err)
	}
	return exitOK
}

func (c *cli) usageError(err error) int {
	fmt.Fprintf(c.stderr, "jobkeys: %v\nRun 'jobkeys --help' for the commands.\n", err)
	return exitUsage
}

func (c *cli) usage(w io.Writer) {
	fmt.Fprint(w, `jobkeys: look at and repair jobkeys state in NATS JetStream.

Usage: jobkeys [global flags] <command> [flags] [arguments]

Commands:
`)
	for _, k := range commands() {
		fmt.Fprintf(w, "  %-52s %s\n", k.name+" "+k.args, k.short)
	}
	fmt.Fprint(w, `
Global flags (before or after the command):
`)
	fs := newFlagSet("jobkeys", &options{})
	fs.printDefaults(w)
	fmt.Fprint(w, exitCodesText)
}

func (c *cli) commandUsage(w io.Writer, cmd *command, fs *flagSet) {
	fmt.Fprintf(w, "Usage: jobkeys %s [flags] %s\n\n%s\n", cmd.name, cmd.args, cmd.short)
	if cmd.long != "" {
		fmt.Fprintf(w, "\n%s\n", strings.TrimSpace(cmd.long))
	}
	fmt.Fprint(w, "\nFlags:\n")
	fs.printDefaults(w)
	fmt.Fprint(w, exitCodesText)
}

const exitCodesText = `
Connection: --server or NATS_URL; --creds; --context or NATS_CONTEXT names a
nats CLI context (~/.config/nats/context/<name>.json). With none of them, the
selected nats CLI context, else nats://127.0.0.1:4222.

Exit codes: 0 ok, 1 error, 2 usage, 3 not found, 4 conflict (changed since
read, or not allowed in this state), 5 corrupt state, 6 not confirmed,
7 permission denied.
`

// usageError is a bad argument found by a command.
type usageError struct{ msg string }

func (e usageError) Error() string { return e.msg }

func usagef(format string, args ...any) error { return usageError{fmt.Sprintf(format, args...)} }

// isTerminal reports whether r is a terminal (a character device).
func isTerminal(r io.Reader) bool {
	f, ok := r.(*os.File)
	if !ok {
		return false
	}
	fi, err := f.Stat()
	return err == nil && fi.Mode()&os.ModeCharDevice != 0
}
