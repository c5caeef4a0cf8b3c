package jobs

import (
	"context"
	"encoding/json"
	"fmt"
	"time"
)

// config is a Config with its defaults applied; both stores hold one. Its
// zero value is usable.
type config struct {
	nowFn    func() time.Time
	channels ChannelRegistry
	guardFn  func(ctx context.Context) error
	subject  func(jobType string, input json.RawMessage) string
	obs      *storeObserver // metrics and logs; nil: none
}

// newConfig copies cfg (nil: defaults). Its error is one of
// Config.MeterProvider's.
func newConfig(cfg *Config) (config, error) {
	if cfg == nil {
		return config{}, nil
	}
	obs, err := newStoreObserver(cfg.MeterProvider, cfg.Logger)
	if err != nil {
		return config{}, err
	}
	return config{nowFn: cfg.Now, channels: cfg.Channels, guardFn: cfg.Guard, subject: cfg.Subject, obs: obs}, nil
}

// now returns the store's clock reading, normalised as stored times are
// (UTC, no monotonic reading).
func (c config) now() time.Time {
	if c.nowFn == nil {
		return normTime(time.Now())
	}
	return normTime(c.nowFn())
}

// guard runs Config.Guard before a write: a cancelled ctx returns ctx.Err()
// unchanged; a guard error becomes ErrConflict wrapping it.
func (c config) guard(ctx context.Context, op string) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if c.guardFn == nil {
		return nil
	}
	if err := c.guardFn(ctx); err != nil {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		return fmt.Errorf("%w: %s: guard refused the write: %w", ErrConflict, op, err)
	}
	return nil
}

// channelExists asks the registry; an unknown channel is ErrNotFound, a
// registry error ErrUnavailable.
func (c config) channelExists(ctx context.Context, op, channelID string) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if c.channels == nil {
		return nil
	}
	ok, err := c.channels.ChannelExists(ctx, channelID)
	if err != nil {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		return fmt.Errorf("%w: %s: channel registry: ChannelExists(%q): %w", ErrUnavailable, op, channelID, err)
	}
	if !ok {
		return notFoundf("%s: ChannelID %q: channel does not exist", op, channelID)
	}
	return nil
}

// channelActive asks the registry; an archived channel is ErrConflict, a
// registry error ErrUnavailable.
func (c config) channelActive(ctx context.Context, op, channelID string) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if c.channels == nil {
		return nil
	}
	ok, err := c.channels.ChannelActive(ctx, channelID)
	if err != nil {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		return fmt.Errorf("%w: %s: channel registry: ChannelActive(%q): %w", ErrUnavailable, op, channelID, err)
	}
	if !ok {
		return conflictf("%s: ChannelID %q: channel is archived (set AllowArchived)", op, channelID)
	}
	return nil
}

// guardCancel is what a cancel checks before it reads the job: the guard
// (as before every write), then that the channel is active unless
// req.AllowArchived.
func (c config) guardCancel(ctx context.Context, req CancelRequest) error {
	if err := c.guard(ctx, "cancel"); err != nil {
		return err
	}
	if req.AllowArchived {
		return nil
	}
	return c.channelActive(ctx, "cancel", req.ChannelID)
}

// summarize gives j's summary with its subject.
func (c config) summarize(j *Job) Summary {
	s := summary(j)
	if c.subject != nil {
		s.Subject = c.subject(j.Type, cloneRaw(j.Input))
	}
	return s
}
