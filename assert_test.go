package jobkeys

// Small assertion helpers shared by the package's tests. Failures print
// both sides as JSON (states in wire form).

import (
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"regexp"
	"testing"
)

func jkDump(v any) string {
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return fmt.Sprintf("%+v", v)
	}
	return string(b)
}

func jkMsg(msgAndArgs []any) string {
	if len(msgAndArgs) == 0 {
		return ""
	}
	if f, ok := msgAndArgs[0].(string); ok {
		return fmt.Sprintf(f, msgAndArgs[1:]...) + ": "
	}
	return fmt.Sprint(msgAndArgs...) + ": "
}

// jkEqual fails t unless want and got are deeply equal.
func jkEqual(t testing.TB, want, got any, msgAndArgs ...any) {
	t.Helper()
	if !reflect.DeepEqual(want, got) {
		t.Fatalf("%snot equal\nwant: %s\n got: %s", jkMsg(msgAndArgs), jkDump(want), jkDump(got))
	}
}

// jkNotEqual fails t if a and b are deeply equal.
func jkNotEqual(t testing.TB, a, b any, msgAndArgs ...any) {
	t.Helper()
	if reflect.DeepEqual(a, b) {
		t.Fatalf("%sunexpectedly equal: %s", jkMsg(msgAndArgs), jkDump(a))
	}
}

// jkTrue fails t unless cond holds.
func jkTrue(t testing.TB, cond bool, msgAndArgs ...any) {
	t.Helper()
	if !cond {
		t.Fatalf("%scondition false", jkMsg(msgAndArgs))
	}
}

// jkNoErr fails t if err is not nil.
func jkNoErr(t testing.TB, err error, msgAndArgs ...any) {
	t.Helper()
	if err != nil {
		t.Fatalf("%sunexpected error: %v", jkMsg(msgAndArgs), err)
	}
}

// jkMatch fails t unless s matches the regular expression re.
func jkMatch(t testing.TB, re, s string, msgAndArgs ...any) {
	t.Helper()
	if !regexp.MustCompile(re).MatchString(s) {
		t.Fatalf("%s%q does not match %s", jkMsg(msgAndArgs), s, re)
	}
}

// jkCheck reports an error (without stopping the test, so it may be called
// from other goroutines) unless ok holds.
func jkCheck(t testing.TB, ok bool, format string, args ...any) {
	t.Helper()
	if !ok {
		t.Errorf(format, args...)
	}
}

// jkErrorIs reports an error (without stopping the test) unless err wraps
// target.
func jkErrorIs(t testing.TB, err, target error) {
	t.Helper()
	if !errors.Is(err, target) {
		t.Errorf("error %v, want one wrapping %v", err, target)
	}
}
