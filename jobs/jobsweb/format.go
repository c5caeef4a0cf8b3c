package jobsweb

import (
	"fmt"
	"html/template"
	"strings"
	"time"

	"github.com/jobkeys/jobkeys/jobs"
)

// stamp is a time as the pages show it: relative to the page's now, with
// the exact time on hover (the script keeps the relative text current).
type stamp struct {
	ISO   string // RFC 3339, UTC, milliseconds
	Exact string // for the title
	Rel   string // "3s ago", "in 2m"
	Zero  bool
}

func stampOf(t, now time.Time) stamp {
	if t.IsZero() {
		return stamp{Zero: true, Rel: "-"}
	}
	t = t.UTC()
	return stamp{ISO: t.Format("2006-01-02T15:04:05.000Z07:00"), Exact: t.Format("2006-01-02 15:04:05.000 MST"), Rel: relative(t, now)}
}

// relative says how far t is from now: "now", "5s ago", "in 3m", "2h ago",
// "4d ago".
func relative(t, now time.Time) string {
	d := t.Sub(now)
	future := d > 0
	if d < 0 {
		d = -d
	}
	var s string
	switch {
	case d < time.Second:
		return "now"
	case d < time.Minute:
		s = fmt.Sprintf("%ds", int(d/time.Second))
	case d < time.Hour:
		s = fmt.Sprintf("%dm", int(d/time.Minute))
	case d < 48*time.Hour:
		s = fmt.Sprintf("%dh", int(d/time.Hour))
	default:
		s = fmt.Sprintf("%dd", int(d/(24*time.Hour)))
	}
	if future {
		return "in " + s
	}
	return s + " ago"
}

// age is how long ago t was, without "ago" ("3s", "2m"); "-" when zero.
func age(t, now time.Time) string {
	if t.IsZero() {
		return "-"
	}
	return strings.TrimSuffix(relative(t, now), " ago")
}

var templateFuncs = template.FuncMap{
	"at":  stampOf,
	"age": age,
	"active": func(s jobs.State) bool {
		return s.Active()
	},
	"stateCount": func(m map[jobs.State]int, s string) int { return m[jobs.State(s)] },
	"plural": func(n int, word string) string {
		if n == 1 {
			return fmt.Sprintf("%d %s", n, word)
		}
		return fmt.Sprintf("%d %ss", n, word)
	},
	"bytes": func(n int) string {
		switch {
		case n < 1<<10:
			return fmt.Sprintf("%d B", n)
		case n < 1<<20:
			return fmt.Sprintf("%.1f KiB", float64(n)/(1<<10))
		}
		return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20))
	},
	"add": func(a, b int) int { return a + b },
}
