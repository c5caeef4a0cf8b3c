package main

import (
	"context"
	"fmt"
	"log/slog"

	"github.com/jobkeys/jobkeys/jobs"
)

// openNATSJobs opens the job store in the bucket --jobs-bucket, its
// requests bounded by --timeout; a missing bucket is an error naming it
// (exit code 3). The store's warnings (a
// background purge the server refuses, a corrupt record) go to stderr;
// the session's close closes the store.
func openNATSJobs(_ context.Context, s *session, o *options) (jobs.Store, error) {
	logger := slog.New(slog.NewTextHandler(s.stderr, &slog.HandlerOptions{Level: slog.LevelWarn, ReplaceAttr: dropTime}))
	st, err := jobs.NewNATSStore(s.js, &jobs.Config{Logger: logger}, jobs.WithBucket(o.jobsBucket), jobs.WithTimeout(o.timeout))
	if err != nil {
		return nil, fmt.Errorf("job store in KV bucket %q: %w", o.jobsBucket, err)
	}
	return st, nil
}

// dropTime leaves the time out of a log line: a command's lines are read
// as it runs.
func dropTime(groups []string, a slog.Attr) slog.Attr {
	if len(groups) == 0 && a.Key == slog.TimeKey {
		return slog.Attr{}
	}
	return a
}
