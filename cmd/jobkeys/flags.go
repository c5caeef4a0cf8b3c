package main

import (
	"flag"
	"fmt"
	"io"
	"strings"
	"time"
)

// options are the global flags, accepted before and after the command words.
type options struct {
	server       string
	creds        string
	context      string
	json         bool
	force        bool
	timeout      time.Duration
	bucketPrefix string
	jobsBucket   string
}

// validate checks the global flags a command needs before it connects:
// what a NATS client or store would refuse only later, with an error that
// does not name the flag.
func (o *options) validate() error {
	if o.timeout <= 0 {
		return fmt.Errorf("--timeout %v is not positive", o.timeout)
	}
	if n := o.jobsBucket; n == "" || len(n) > 64 || strings.Trim(n, bucketNameChars) != "" {
		return fmt.Errorf("--jobs-bucket %q is not a KV bucket name: 1 to 64 letters, digits, '-' or '_'", n)
	}
	return nil
}

// bucketNameChars are the characters of a KV bucket name (jobs.WithBucket).
const bucketNameChars = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_"

// flagSet is a flag.FlagSet that accepts flags among the positional
// arguments ("keys ls billing --json"), as the nats CLI does. The standard
// flag package serves: subcommands are words matched before parsing.
type flagSet struct {
	fs   *flag.FlagSet
	help bool
}

func newFlagSet(name string, o *options) *flagSet {
	f := &flagSet{fs: flag.NewFlagSet(name, flag.ContinueOnError)}
	f.fs.SetOutput(io.Discard)
	f.fs.StringVar(&o.server, "server", o.server, "NATS server URLs, comma separated (default $NATS_URL)")
	f.fs.StringVar(&o.server, "s", o.server, "short for --server")
	f.fs.StringVar(&o.creds, "creds", o.creds, "NATS user credentials file")
	f.fs.StringVar(&o.context, "context", o.context, "nats CLI context to connect with (default $NATS_CONTEXT, else the selected one)")
	f.fs.BoolVar(&o.json, "json", o.json, "print JSON for scripts instead of tables")
	f.fs.BoolVar(&o.force, "force", o.force, "do not ask before changing state")
	f.fs.BoolVar(&o.force, "f", o.force, "short for --force")
	if o.timeout == 0 {
		o.timeout = 10 * time.Second
	}
	f.fs.DurationVar(&o.timeout, "timeout", o.timeout, "bound on connecting and on each step of a command (a listing, a write)")
	if o.bucketPrefix == "" {
		o.bucketPrefix = "JOBS_KEYS"
	}
	f.fs.StringVar(&o.bucketPrefix, "bucket-prefix", o.bucketPrefix, "prefix of the key state buckets (<prefix>_<service>)")
	if o.jobsBucket == "" {
		o.jobsBucket = jobsBucketDefault
	}
	f.fs.StringVar(&o.jobsBucket, "jobs-bucket", o.jobsBucket, "KV bucket of the job store")
	f.fs.BoolVar(&f.help, "help", false, "show help")
	f.fs.BoolVar(&f.help, "h", false, "short for --help")
	return f
}

func (f *flagSet) String(name, value, usage string) *string { return f.fs.String(name, value, usage) }
func (f *flagSet) Bool(name string, value bool, usage string) *bool {
	return f.fs.Bool(name, value, usage)
}
func (f *flagSet) Int(name string, value int, usage string) *int { return f.fs.Int(name, value, usage) }
func (f *flagSet) Uint64(name string, value uint64, usage string) *uint64 {
	return f.fs.Uint64(name, value, usage)
}
func (f *flagSet) Duration(name string, value time.Duration, usage string) *time.Duration {
	return f.fs.Duration(name, value, usage)
}

// parse parses args, flags anywhere ("--" ends them), and returns the
// positional arguments.
func (f *flagSet) parse(args []string) ([]string, error) {
	var pos []string
	for {
		if err := f.fs.Parse(args); err != nil {
			return nil, err
		}
		rest := f.fs.Args()
		if len(rest) == 0 {
			return pos, nil
		}
		// flag stops at the first non-flag and consumes a "--".
		consumedDashes := len(args) > len(rest) && args[len(args)-len(rest)-1] == "--"
		if consumedDashes {
			return append(pos, rest...), nil
		}
		pos = append(pos, rest[0])
		args = rest[1:]
	}
}

// printDefaults prints the flags, long ones with two dashes.
func (f *flagSet) printDefaults(w io.Writer) {
	f.fs.VisitAll(func(fl *flag.Flag) {
		if len(fl.Name) == 1 || fl.Name == "help" {
			return // the short forms are named in the long ones' usage
		}
		name := "--" + fl.Name
		if short := shortOf(fl.Name); short != "" {
			name = "-" + short + ", " + name
		}
		typ, usage := flag.UnquoteUsage(fl)
		if typ != "" {
			name += " " + typ
		}
		def := ""
		if fl.DefValue != "" && fl.DefValue != "false" && fl.DefValue != "0" {
			def = fmt.Sprintf(" (default %s)", fl.DefValue)
		}
		fmt.Fprintf(w, "  %-30s %s%s\n", name, usage, def)
	})
}

func shortOf(long string) string {
	switch long {
	case "server":
		return "s"
	case "force":
		return "f"
	}
	return ""
}
