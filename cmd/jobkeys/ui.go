package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/jobkeys/jobkeys/jobs"
	"github.com/jobkeys/jobkeys/jobs/jobsweb"
)

// uiListenDefault is where "jobkeys ui" listens unless --listen says
// otherwise: loopback only.
const uiListenDefault = "127.0.0.1:8080"

// uiShutdownGrace bounds how long "jobkeys ui" waits for requests in
// flight when it is interrupted.
const uiShutdownGrace = 5 * time.Second

func uiCommand() *command {
	var (
		listen   *string
		readOnly *bool
		service  *string
		channels *string
	)
	return &command{name: "ui", min: 0, max: 0,
		short: "serve the web dashboard: keys and jobs, live, with cancel/pause/resume/retry",
		long: `ui serves the web dashboard (package jobs/jobsweb) until interrupted: an
overview per job type, the keys of --service with their holders and waiting
jobs (live), a channel's jobs, one job with its input, progress and
artifact, and the actions cancel, pause, resume and retry, each after a
confirmation, through the runtime's client (as "jobkeys jobs cancel" does).

It listens on loopback (` + uiListenDefault + `) unless --listen names another
address; anyone who reaches the address can act on jobs unless --read-only
is given. The jobs pages offer the channels of the jobs running or waiting
on a key, and those of --channels.`,
		flags: func(fs *flagSet) {
			listen = fs.String("listen", uiListenDefault, "address to serve on (host:port; port 0 picks a free one)")
			readOnly = fs.Bool("read-only", false, "show no actions and refuse them")
			service = fs.String("service", jobs.ServiceDefault, "key-layer service of the runtime (ClientConfig.Service), whose keys the dashboard shows")
			channels = fs.String("channels", "", "job channels to offer on the jobs pages, comma separated (besides those seen on keys)")
		},
		run: func(ctx context.Context, c *cli, o *options, _ []string) error {
			return ui(ctx, c, o, *listen, *readOnly, *service, *channels)
		}}
}

func ui(ctx context.Context, c *cli, o *options, listen string, readOnly bool, service, channels string) error {
	if service == "" {
		return usagef("--service is empty")
	}
	host, _, err := net.SplitHostPort(listen)
	if err != nil {
		return usagef("--listen %q is not host:port: %v", listen, err)
	}
	var chans []string
	for _, ch := range strings.Split(channels, ",") {
		if ch = strings.TrimSpace(ch); ch != "" {
			chans = append(chans, ch)
		}
	}
	s, _, client, err := c.openClient(ctx, o, service)
	if err != nil {
		return err
	}
	defer s.close(ctx)
	h, err := jobsweb.New(&jobsweb.Config{Client: client, ReadOnly: readOnly, Channels: chans})
	if err != nil {
		return err
	}
	defer h.Close()
	ln, err := net.Listen("tcp", listen)
	if err != nil {
		return fmt.Errorf("listen on %s: %w", listen, err)
	}
	if ip := net.ParseIP(host); host != "localhost" && (ip == nil || !ip.IsLoopback()) {
		fmt.Fprintf(c.stderr, "jobkeys ui: warning: listening on %s, which is not loopback: anyone who reaches it sees every job%s\n",
			ln.Addr(), map[bool]string{false: " and can act on them (--read-only turns actions off)", true: ""}[readOnly])
	}
	mode := ""
	if readOnly {
		mode = " (read-only)"
	}
	fmt.Fprintf(c.stdout, "jobkeys ui: serving the dashboard of service %s on http://%s/%s; interrupt to stop\n", service, ln.Addr(), mode)
	// The CLI's connection does not reconnect: when it closes, the
	// dashboard would serve errors only, so the command ends with an error
	// instead (for a supervisor to restart it).
	lost := make(chan struct{})
	var once sync.Once
	s.nc.SetClosedHandler(func(*nats.Conn) { once.Do(func() { close(lost) }) })
	hs := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second}
	served := make(chan error, 1)
	go func() { served <- hs.Serve(ln) }()
	var end error
	select {
	case err := <-served:
		return fmt.Errorf("serve on %s: %w", ln.Addr(), err)
	case <-lost:
		end = errors.New("the NATS connection closed (the CLI does not reconnect): the dashboard stopped; start it again")
	case <-ctx.Done():
	}
	h.Close() // ends the live streams, which Shutdown would wait for
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), uiShutdownGrace)
	defer cancel()
	if err := hs.Shutdown(sctx); err != nil && !errors.Is(err, context.DeadlineExceeded) {
		return errors.Join(end, err)
	}
	return end
}
