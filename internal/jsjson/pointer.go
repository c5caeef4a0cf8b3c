package jsjson

import (
	"fmt"
	"strconv"
	"strings"
)

// This file resolves RFC 6901 JSON pointers over JSON text (see text.go for
// how the text is read), with the rules of the TypeScript original's
// resolveJsonPointer, so that Go and TypeScript workers derive the same keys:
//
//   - a pointer starts with "/"; its tokens are split on "/", then "~1" reads
//     as "/" and "~0" as "~";
//   - an array is indexed only by a token matching ^0$|^[1-9][0-9]*$, and an
//     index past its end does not resolve;
//   - an object is indexed by member name; with duplicate names the last one
//     counts, as with JSON.parse;
//   - a token applied to a string, number, boolean or null does not resolve.
//
// JavaScript's obj[token] also finds Object.prototype members ("constructor",
// "__proto__", "toString", ...) of an object that lacks them. None of those is
// a string, finite number or boolean, nor leads to one, so treating them as
// absent derives the same keys and refuses the same payloads.

// CheckPointer reports whether pointer is a well-formed JSON pointer: it
// starts with "/", and every "~" in it is followed by "0" or "1". The error
// starts "pointer" and names the pointer ("pointer \"/a~\": ..."), so that a
// caller can say whose pointer it is in front of it. The pointer "/" has the
// one token "" (the member with the empty name).
func CheckPointer(pointer string) error {
	if pointer == "" || pointer[0] != '/' {
		return fmt.Errorf("pointer %q does not start with \"/\"", pointer)
	}
	for i := 0; i < len(pointer); i++ {
		if pointer[i] != '~' {
			continue
		}
		if i+1 == len(pointer) || (pointer[i+1] != '0' && pointer[i+1] != '1') {
			return fmt.Errorf("pointer %q: \"~\" at byte %d is not followed by \"0\" or \"1\" (write \"~0\" for \"~\" and \"~1\" for \"/\")",
				pointer, i)
		}
		i++
	}
	return nil
}

// arrayIndex parses an array index token, "0" or a decimal without a leading
// zero. An index too large for an int is reported as not an index: no array
// is that long.
func arrayIndex(tok string) (int, bool) {
	if tok == "" || (tok[0] == '0' && len(tok) > 1) {
		return 0, false
	}
	for i := 0; i < len(tok); i++ {
		if tok[i] < '0' || tok[i] > '9' {
			return 0, false
		}
	}
	n, err := strconv.Atoi(tok)
	if err != nil {
		return 0, false
	}
	return n, true
}

// Resolve resolves pointer, well formed as [CheckPointer] requires, in text,
// which [CheckText] accepted. It returns the offset of the value reached and
// whether one was reached.
//
// The cost is linear in len(text): each value is either skipped once or
// descended into once. (With duplicate member names the last one counts, so
// an object is always read to its end; descending into a matching member
// instead of skipping it and then reading it again keeps a deep document
// from costing its depth times its size.) The recursion is as deep as the
// text's nesting, which CheckText bounds.
func Resolve(text []byte, pointer string) (int, bool) {
	r := resolver{text: text}
	pos, ok, _ := r.descend(SkipWS(text, 0), pointer[1:])
	return pos, ok
}

type resolver struct{ text []byte }

// descend applies the pointer tokens rest (at least one, "/"-separated and
// still escaped) to the value at text[pos]. It returns the offset of the
// value reached, whether one was, and the offset after the value at pos.
func (r *resolver) descend(pos int, rest string) (int, bool, int) {
	tok, next, last := rest, "", true
	if slash := strings.IndexByte(rest, '/'); slash >= 0 {
		tok, next, last = rest[:slash], rest[slash+1:], false
	}
	switch r.text[pos] {
	case '{':
		return r.member(pos, tok, next, last)
	case '[':
		return r.element(pos, tok, next, last)
	}
	return 0, false, ValueEnd(r.text, pos)
}

// member resolves the token tok in the object at text[pos]; see descend.
func (r *resolver) member(pos int, tok, next string, last bool) (int, bool, int) {
	text := r.text
	escaped := strings.IndexByte(tok, '~') >= 0
	var nameBuf [32]byte // for names with escapes or non-ASCII bytes
	scratch := nameBuf[:0]
	found, ok := 0, false
	i, closed := FirstMember(text, pos)
	for i >= 0 {
		var name []byte
		var v, end int
		name, v, scratch = NextMember(text, i, scratch)
		var match bool
		if escaped {
			match = tokenEquals(name, tok)
		} else {
			match = string(name) == tok
		}
		switch {
		case !match:
			end = ValueEnd(text, v)
		case last:
			found, ok, end = v, true, ValueEnd(text, v)
		default: // the last member of that name counts, whatever it resolves to
			found, ok, end = r.descend(v, next)
		}
		i, closed = AfterValue(text, end)
	}
	return found, ok, closed
}

// element resolves the token tok in the array at text[pos]; see descend.
func (r *resolver) element(pos int, tok, next string, last bool) (int, bool, int) {
	text := r.text
	idx, isIndex := arrayIndex(tok)
	if !isIndex {
		return 0, false, ValueEnd(text, pos)
	}
	found, ok := 0, false
	i, closed := FirstMember(text, pos)
	for n := 0; i >= 0; n++ {
		var end int
		switch {
		case n != idx:
			end = ValueEnd(text, i)
		case last:
			found, ok, end = i, true, ValueEnd(text, i)
		default:
			found, ok, end = r.descend(i, next)
		}
		i, closed = AfterValue(text, end)
	}
	return found, ok, closed
}

// tokenEquals reports whether name equals the escaped pointer token tok.
func tokenEquals(name []byte, tok string) bool {
	k := 0
	for j := 0; j < len(tok); j++ {
		c := tok[j]
		if c == '~' {
			j++
			c = '~'
			if tok[j] == '1' {
				c = '/'
			}
		}
		if k >= len(name) || name[k] != c {
			return false
		}
		k++
	}
	return k == len(name)
}
