package natsperm

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/jobkeys/jobkeys/internal/natstest"
)

// Parse reads the refusals a real server reports to the connection's
// async error handler: of a publish and of a subscription, each naming
// the subject.
func TestParseServerRefusals(t *testing.T) {
	t.Parallel()
	s := natstest.RunWith(t, natstest.Options{Configure: func(o *server.Options) {
		o.Users = append(o.Users, &server.User{Username: "u", Password: "u", Permissions: &server.Permissions{
			Publish:   &server.SubjectPermission{Allow: []string{"ok.>"}},
			Subscribe: &server.SubjectPermission{Allow: []string{"ok.>"}},
		}})
	}})
	errs := make(chan error, 16)
	nc, _ := natstest.Connect(t, s, nats.UserInfo("u", "u"), nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) {
		errs <- err
	}))
	next := func() error {
		t.Helper()
		select {
		case err := <-errs:
			return err
		case <-time.After(30 * time.Second): // a guard against a hang, not a timing assertion
			t.Fatal("no error reported")
			return nil
		}
	}

	require.NoError(t, nc.Publish("denied.pub", nil))
	require.NoError(t, nc.Flush())
	v, ok := Parse(next())
	require.True(t, ok)
	assert.Equal(t, Violation{What: "Publish to", Subject: "denied.pub"}, v)

	_, err := nc.SubscribeSync("denied.sub")
	require.NoError(t, err)
	require.NoError(t, nc.Flush())
	v, ok = Parse(next())
	require.True(t, ok)
	assert.Equal(t, Violation{What: "Subscription to", Subject: "denied.sub"}, v)
	v, ok = Parse(nc.LastError())
	require.True(t, ok, "the connection's last error too")
	assert.Equal(t, "denied.sub", v.Subject)
}

func TestParseOtherErrors(t *testing.T) {
	t.Parallel()
	for _, err := range []error{
		nil,
		errors.New(`Permissions Violation for Publish to "x"`), // the text alone, without nats' error
		nats.ErrTimeout,
		fmt.Errorf("%w: something else", nats.ErrPermissionViolation),
	} {
		_, ok := Parse(err)
		assert.False(t, ok, "%v", err)
	}
}

func TestInboxPrefix(t *testing.T) {
	t.Parallel()
	assert.Equal(t, nats.InboxPrefix, InboxPrefix(nil))
	s := natstest.Run(t)
	plain, _ := natstest.Connect(t, s)
	assert.Equal(t, "_INBOX.", InboxPrefix(plain))
	custom, _ := natstest.Connect(t, s, nats.CustomInboxPrefix("_I.tenant"))
	assert.Equal(t, "_I.tenant.", InboxPrefix(custom))
	assert.True(t, strings.HasPrefix(custom.NewInbox(), InboxPrefix(custom)), "the prefix nats.go's inboxes start with")
}
