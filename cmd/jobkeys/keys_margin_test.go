package main

import (
	"encoding/json"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// "keys ls" and "keys show" say what "keys sweep" would do with an
// expired slot: with this host 40s ahead, short-1's lease (20s) expired
// about 20s ago, less than the default margin (90s): the sweep keeps it,
// and ls and show say so; exp-1's expired two hours ago: sweepable. A
// smaller --skew-margin makes short-1 sweepable, as it does for the sweep.
func TestKeysLsAndShowSayWhatASweepWouldDo(t *testing.T) {
	t.Parallel()
	f := newFixture(t, 1)
	short := liveShortLease(t, f)
	r := newRunner(t, f.srv.ClientURL())
	r.now = func() time.Time { return time.Now().Add(40 * time.Second) }

	res := r.run("keys", "ls", "svc", "render")
	require.Equal(t, exitCorrupt, res.code, res.stderr)
	rows := map[string][]string{}
	for _, l := range strings.Split(strings.TrimSpace(res.stdout), "\n") {
		if fields := strings.Fields(l); len(fields) > 0 {
			rows[fields[0]] = fields
		}
	}
	require.Contains(t, rows, "short", res.stdout)
	assert.Equal(t, []string{"1", "(1", "kept)", "0", short}, rows["short"][len(rows["short"])-5:], res.stdout)
	require.Contains(t, rows, "expired", res.stdout)
	assert.Equal(t, []string{"1", "0", f.kv["expired"]}, rows["expired"][len(rows["expired"])-3:], res.stdout)
	assert.Contains(t, res.stdout, "(1 slot kept: expired less than --skew-margin 1m30s ago by this host's clock, which 'keys sweep' with that margin keeps)")

	res = r.run("keys", "ls", "svc", "render", "--json")
	require.Equal(t, exitCorrupt, res.code, res.stderr)
	var keys []keyJSON
	require.NoError(t, json.Unmarshal([]byte(res.stdout), &keys), res.stdout)
	by := map[string]keyJSON{}
	for _, k := range keys {
		by[k.KVKey] = k
	}
	assert.Equal(t, [3]int{1, 0, 1}, [3]int{by[short].ExpiredSlots, by[short].SweepableSlots, by[short].KeptSlots})
	assert.Equal(t, [3]int{1, 1, 0}, [3]int{by[f.kv["expired"]].ExpiredSlots, by[f.kv["expired"]].SweepableSlots, by[f.kv["expired"]].KeptSlots})
	assert.Equal(t, 90.0, by[short].SkewMarginSeconds)

	res = r.run("keys", "show", short)
	require.Equal(t, exitOK, res.code, res.stderr)
	assert.Regexp(t, `(?m)^Active: +1/1 \(1 expired, kept by --skew-margin 1m30s\)$`, res.stdout)
	assert.Regexp(t, `(?m)^  short-1 +worker-2 .* EXPIRED \d+s ago, kept by --skew-margin 1m30s +0 +`, res.stdout)
	res = r.run("keys", "show", f.kv["expired"])
	require.Equal(t, exitOK, res.code, res.stderr)
	assert.Regexp(t, `(?m)^Active: +1/1 \(1 expired, sweepable\)$`, res.stdout)
	assert.Regexp(t, `(?m)^  exp-1 +worker-1 .* EXPIRED 1h59m\d+s ago, sweepable +0 +`, res.stdout)

	// What the sweep would do agrees.
	res = r.run("keys", "sweep", "svc", "render", "--dry-run")
	require.Equal(t, exitOK, res.code, res.stderr)
	assert.Regexp(t, `(?m)^1 slot expired less than --skew-margin 1m30s ago \(kept\):$`, res.stdout)

	// A margin of 10s: short-1 is sweepable too.
	res = r.run("keys", "show", "--skew-margin", "10s", "--json", short)
	require.Equal(t, exitOK, res.code, res.stderr)
	var shown keyJSON
	require.NoError(t, json.Unmarshal([]byte(res.stdout), &shown), res.stdout)
	assert.Equal(t, [2]int{1, 0}, [2]int{shown.SweepableSlots, shown.KeptSlots})
	assert.Equal(t, 10.0, shown.SkewMarginSeconds)
	res = r.run("keys", "ls", "--skew-margin", "10s", "svc", "render")
	require.Equal(t, exitCorrupt, res.code, res.stderr)
	assert.NotContains(t, res.stdout, "kept")
	assert.Regexp(t, `(?m)^short +1/1 .* 1 +0 +`+regexp.QuoteMeta(short)+` *$`, res.stdout)

	for _, cmd := range [][]string{{"keys", "ls", "svc"}, {"keys", "show", short}} {
		res = r.run(append(cmd, "--skew-margin", "-1s")...)
		assert.Equal(t, exitUsage, res.code, "%v", cmd)
		assert.Contains(t, res.stderr, "--skew-margin -1s is negative")
	}
}
