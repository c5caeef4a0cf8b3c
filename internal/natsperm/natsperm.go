package natsperm

import (
	"errors"
	"regexp"

	"github.com/nats-io/nats.go"
)

// violationRe matches the server's violation messages (nats-server
// client.go): `Permissions Violation for Publish to "subj"`, `… for
// Subscription to "subj"` (maybe `using queue …`), `… for Publish with
// Reply of "subj"`.
var violationRe = regexp.MustCompile(`Permissions Violation for (Publish to|Subscription to|Publish with Reply of) "([^"]+)"`)

// Violation is one refusal the server reported.
type Violation struct {
	// What was refused, as the server words it: "Publish to",
	// "Subscription to" or "Publish with Reply of".
	What string
	// Subject is the refused subject.
	Subject string
}

// Parse returns the refusal err reports: an error that wraps
// nats.ErrPermissionViolation and carries the server's message. ok is
// false for any other error, nil included.
func Parse(err error) (v Violation, ok bool) {
	if err == nil || !errors.Is(err, nats.ErrPermissionViolation) {
		return Violation{}, false
	}
	m := violationRe.FindStringSubmatch(err.Error())
	if m == nil {
		return Violation{}, false
	}
	return Violation{What: m[1], Subject: m[2]}, true
}

// InboxPrefix returns the prefix, ending in ".", of nc's inbox subjects
// (nats.InboxPrefix unless the connection was given a custom one); nil
// has the default.
func InboxPrefix(nc *nats.Conn) string {
	if nc == nil || nc.Opts.InboxPrefix == "" {
		return nats.InboxPrefix
	}
	return nc.Opts.InboxPrefix + "."
}
