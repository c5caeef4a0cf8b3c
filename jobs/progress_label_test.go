package jobs

import (
	"strings"
	"testing"
	"unicode"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A progress label is trimmed and counted as the seed does: JavaScript's
// String.prototype.trim and String length (UTF-16 code units), not Go's
// strings.TrimSpace and runes. Each case's outcome is the seed's,
// label.trim() then 1 <= length <= 160, as node v20 computes it.

func TestProgressLabelAsTheSeed(t *testing.T) {
	cases := []struct {
		name  string
		label string
		want  string // the stored label; "" when the seed refuses it (conflict)
	}{
		{"spaces", "  l  ", "l"},
		{"U+FEFF is trimmed (TrimSpace keeps it)", "\uFEFFl\uFEFF", "l"},
		{"U+0085 is kept (TrimSpace trims it)", "\u0085l\u0085", "\u0085l\u0085"},
		{"U+0085 alone is a label", "\u0085", "\u0085"},
		{"U+FEFF alone is empty", "\uFEFF", ""},
		{"every JavaScript space", "\u00A0\u1680\u2000\u200A\u2028\u2029\u202F\u205F\u3000 l \t\n\v\f\r", "l"},
		{"U+180E is not a space", "\u180El", "\u180El"},
		{"U+200B is not a space", "\u200Bl", "\u200Bl"},
		{"80 emoji are 160 code units", strings.Repeat("🙂", 80), strings.Repeat("🙂", 80)},
		{"81 emoji are 162 code units", strings.Repeat("🙂", 81), ""},
		{"160 é", strings.Repeat("é", 160), strings.Repeat("é", 160)},
		{"161 é", strings.Repeat("é", 161), ""},
		{"158 letters and an emoji are 160", strings.Repeat("a", 158) + "🙂", strings.Repeat("a", 158) + "🙂"},
		{"159 letters and an emoji are 161", strings.Repeat("a", 159) + "🙂", ""},
		{"160 letters inside U+FEFF", "\uFEFF" + strings.Repeat("a", 160) + "\uFEFF", strings.Repeat("a", 160)},
	}
	j := runningJob(t)
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			req, err := prepareProgress(ProgressRequest{Claim: ClaimOf(j), Stage: "s", Label: tc.label, State: ProgressStarted})
			require.NoError(t, err, "prepare checks only encodings")
			got, err := progressJob(&j, req, j.TargetGeneration, testNow, 9)
			if tc.want == "" {
				require.ErrorIs(t, err, ErrConflict)
				assert.Contains(t, err.Error(), "Label")
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tc.want, got.Progress[len(got.Progress)-1].Label)
			require.NoError(t, validateJob(&got), "the validator accepts what the rule wrote")
		})
	}
}

// isJSSpace is exactly the set JavaScript's trim removes: every code point
// for which node v20 finds String.fromCodePoint(cp).trim() === "".
func TestIsJSSpaceIsJavaScriptsTrimSet(t *testing.T) {
	js := []rune{
		0x0009, 0x000A, 0x000B, 0x000C, 0x000D, 0x0020, 0x00A0, 0x1680,
		0x2000, 0x2001, 0x2002, 0x2003, 0x2004, 0x2005, 0x2006, 0x2007, 0x2008, 0x2009, 0x200A,
		0x2028, 0x2029, 0x202F, 0x205F, 0x3000, 0xFEFF,
	}
	var got []rune
	for r := rune(0); r <= unicode.MaxRune; r++ {
		if isJSSpace(r) {
			got = append(got, r)
		}
	}
	assert.Equal(t, js, got)
}

// A label written before the rules matched the seed (trimmed by
// strings.TrimSpace, up to LabelLimit runes) stays valid: the validator
// must not turn such records into ErrCorrupt.
func TestValidateAcceptsLabelsOfTheEarlierRule(t *testing.T) {
	for _, label := range []string{
		"\uFEFFl",                       // TrimSpace kept U+FEFF
		"\uFEFF",                        // and so wrote it alone
		strings.Repeat("🙂", 81),         // 81 runes, 162 code units
		strings.Repeat("🙂", LabelLimit), // the most runes
	} {
		j := runningJob(t)
		j.Progress = []Progress{j.Progress[0]}
		j.Progress[0].Label = label
		assert.NoError(t, validateJob(&j), "label %q", label)
	}
	for _, label := range []string{"", " l", "l\u0085 ", "\u0085l\uFEFF", strings.Repeat("é", LabelLimit+1)} {
		j := runningJob(t)
		j.Progress = []Progress{j.Progress[0]}
		j.Progress[0].Label = label
		assert.ErrorIs(t, validateJob(&j), ErrCorrupt, "label %q", label)
	}
}
