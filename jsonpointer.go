package jobkeys

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"unicode/utf8"
)

// This file resolves RFC 6901 JSON pointers the way the TS original's
// resolveJsonPointer does, over a decoded document (resolvePointer) and,
// without decoding it, over JSON text (resolveText, used by DeriveKey):
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
//
// JSON text is read as JavaScript reads a message body with
// JSON.parse(new TextDecoder().decode(bytes)): a leading UTF-8 byte order mark
// is dropped, each maximal invalid UTF-8 subsequence reads as U+FFFD, the
// grammar is strict RFC 8259 (no comments, trailing commas or leading zeros;
// whitespace is space, tab, CR and LF), numbers are IEEE doubles (an
// out-of-range literal such as 1e400 is Infinity), and a "\ud800" escape not
// part of a surrogate pair is kept as a lone surrogate, encoded as WTF-8 (see
// jsformat.go), so that it hashes as JavaScript hashes it.

// parsePointer splits an RFC 6901 JSON pointer into its reference tokens.
// The pointer must start with "/"; in each token "~1" stands for "/" and "~0"
// for "~". A "~" followed by anything else is an error wrapping
// [ErrInvalidPolicy] that names the pointer. The pointer "/" has the one
// token "" (the member with the empty name).
func parsePointer(pointer string) ([]string, error) {
	if err := checkPointer(pointer); err != nil {
		return nil, err
	}
	tokens := strings.Split(pointer[1:], "/")
	for i, tok := range tokens {
		if strings.IndexByte(tok, '~') >= 0 {
			tokens[i] = string(appendUnescapedToken(nil, tok))
		}
	}
	return tokens, nil
}

// checkPointer reports whether pointer is a well-formed JSON pointer, as
// parsePointer does, without splitting it.
func checkPointer(pointer string) error {
	if pointer == "" || pointer[0] != '/' {
		return fmt.Errorf("%w: key pointer %q does not start with \"/\"", ErrInvalidPolicy, pointer)
	}
	for i := 0; i < len(pointer); i++ {
		if pointer[i] != '~' {
			continue
		}
		if i+1 == len(pointer) || (pointer[i+1] != '0' && pointer[i+1] != '1') {
			return fmt.Errorf("%w: key pointer %q: \"~\" at byte %d is not followed by \"0\" or \"1\" (write \"~0\" for \"~\" and \"~1\" for \"/\")",
				ErrInvalidPolicy, pointer, i)
		}
		i++
	}
	return nil
}

// appendUnescapedToken appends the pointer token tok, well formed as
// checkPointer requires, with "~1" read as "/" and "~0" as "~".
func appendUnescapedToken(dst []byte, tok string) []byte {
	for i := 0; i < len(tok); i++ {
		c := tok[i]
		if c == '~' {
			i++
			if tok[i] == '1' {
				c = '/'
			}
		}
		dst = append(dst, c)
	}
	return dst
}

// resolvePointer follows tokens (as parsePointer returns them) through a
// decoded JSON document made of map[string]any, []any and scalars, as
// encoding/json decodes into an any, and reports the value it reaches and
// whether it reached one. See the top of this file for the rules.
func resolvePointer(doc any, tokens []string) (any, bool) {
	cur := doc
	for _, tok := range tokens {
		switch v := cur.(type) {
		case []any:
			i, ok := arrayIndex(tok)
			if !ok || i >= len(v) {
				return nil, false
			}
			cur = v[i]
		case map[string]any:
			next, ok := v[tok]
			if !ok {
				return nil, false
			}
			cur = next
		default:
			return nil, false
		}
	}
	return cur, true
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

// trimBOM drops a leading UTF-8 byte order mark, as TextDecoder does.
func trimBOM(text []byte) []byte {
	if len(text) >= 3 && text[0] == 0xEF && text[1] == 0xBB && text[2] == 0xBF {
		return text[3:]
	}
	return text
}

// checkJSONText reports whether text (without a byte order mark) is one JSON
// value that JSON.parse accepts. The error describes the first problem and
// its byte offset; callers wrap it. Invalid UTF-8 inside strings is accepted
// (it reads as U+FFFD); anywhere else it is a syntax error, as U+FFFD is.
// Nesting depth is limited only by memory: the check does not recurse.
func checkJSONText(text []byte) error {
	var stackBuf [64]byte
	stack := stackBuf[:0] // '{' or '[' per open container
	i := skipWS(text, 0)
value:
	if i >= len(text) {
		return errJSONEnd
	}
	switch c := text[i]; {
	case c == '{':
		stack = append(stack, '{')
		i = skipWS(text, i+1)
		if i < len(text) && text[i] == '}' {
			stack = stack[:len(stack)-1]
			i++
			break
		}
		var err error
		if i, err = checkMemberName(text, i); err != nil {
			return err
		}
		goto value
	case c == '[':
		stack = append(stack, '[')
		i = skipWS(text, i+1)
		if i < len(text) && text[i] == ']' {
			stack = stack[:len(stack)-1]
			i++
			break
		}
		goto value
	case c == '"':
		var err error
		if i, err = checkString(text, i); err != nil {
			return err
		}
	case c == '-' || (c >= '0' && c <= '9'):
		end := numberEnd(text, i)
		if end < 0 {
			return syntaxErrorAt(text, -end)
		}
		i = end
	case c == 't':
		if !hasPrefixAt(text, i, "true") {
			return syntaxErrorAt(text, i)
		}
		i += 4
	case c == 'f':
		if !hasPrefixAt(text, i, "false") {
			return syntaxErrorAt(text, i)
		}
		i += 5
	case c == 'n':
		if !hasPrefixAt(text, i, "null") {
			return syntaxErrorAt(text, i)
		}
		i += 4
	default:
		return syntaxErrorAt(text, i)
	}
	// After a value: close containers, or go on to the next member or element.
	for {
		i = skipWS(text, i)
		if len(stack) == 0 {
			if i < len(text) {
				return syntaxErrorAt(text, i)
			}
			return nil
		}
		if i >= len(text) {
			return errJSONEnd
		}
		top := stack[len(stack)-1]
		switch c := text[i]; {
		case c == ',':
			i = skipWS(text, i+1)
			if top == '{' {
				var err error
				if i, err = checkMemberName(text, i); err != nil {
					return err
				}
			}
			goto value
		case c == '}' && top == '{', c == ']' && top == '[':
			stack = stack[:len(stack)-1]
			i++
		default:
			return syntaxErrorAt(text, i)
		}
	}
}

// errJSONEnd reports JSON text that ends inside a value.
var errJSONEnd = errors.New("unexpected end of JSON input")

// syntaxErrorAt describes the unexpected byte at text[i].
func syntaxErrorAt(text []byte, i int) error {
	if i >= len(text) {
		return errJSONEnd
	}
	if c := text[i]; c >= 0x20 && c < 0x7F {
		return fmt.Errorf("unexpected %q at byte %d", c, i)
	}
	return fmt.Errorf("unexpected byte 0x%02x at byte %d", text[i], i)
}

// checkMemberName checks the member name at text[i] and the colon after it
// and returns the offset of the member's value.
func checkMemberName(text []byte, i int) (int, error) {
	if i >= len(text) || text[i] != '"' {
		return 0, syntaxErrorAt(text, i)
	}
	i, err := checkString(text, i)
	if err != nil {
		return 0, err
	}
	i = skipWS(text, i)
	if i >= len(text) || text[i] != ':' {
		return 0, syntaxErrorAt(text, i)
	}
	return skipWS(text, i+1), nil
}

// checkString checks the string literal whose opening quote is text[i] and
// returns the offset after its closing quote.
func checkString(text []byte, i int) (int, error) {
	for i++; i < len(text); i++ {
		switch c := text[i]; {
		case c == '"':
			return i + 1, nil
		case c < 0x20:
			return 0, fmt.Errorf("control character 0x%02x in string at byte %d", c, i)
		case c == '\\':
			i++
			if i >= len(text) {
				return 0, errJSONEnd
			}
			switch text[i] {
			case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
			case 'u':
				for k := 1; k <= 4; k++ {
					if i+k >= len(text) {
						return 0, errJSONEnd
					}
					if hexValue(text[i+k]) < 0 {
						return 0, fmt.Errorf("bad \\u escape in string at byte %d", i-1)
					}
				}
				i += 4
			default:
				return 0, fmt.Errorf("bad escape \\%c in string at byte %d", text[i], i-1)
			}
		}
	}
	return 0, errJSONEnd
}

// numberEnd returns the offset after the number literal at text[i], or minus
// the offset of the byte that makes it malformed (never 0: text[i] starts it).
func numberEnd(text []byte, i int) int {
	start := i
	if text[i] == '-' {
		i++
	}
	switch {
	case i < len(text) && text[i] == '0':
		i++
	case i < len(text) && text[i] >= '1' && text[i] <= '9':
		i = digitsEnd(text, i)
	default:
		return -max(i, start+1)
	}
	if i < len(text) && text[i] == '.' {
		i++
		if i >= len(text) || text[i] < '0' || text[i] > '9' {
			return -i
		}
		i = digitsEnd(text, i)
	}
	if i < len(text) && (text[i] == 'e' || text[i] == 'E') {
		i++
		if i < len(text) && (text[i] == '+' || text[i] == '-') {
			i++
		}
		if i >= len(text) || text[i] < '0' || text[i] > '9' {
			return -i
		}
		i = digitsEnd(text, i)
	}
	return i
}

func digitsEnd(text []byte, i int) int {
	for i < len(text) && text[i] >= '0' && text[i] <= '9' {
		i++
	}
	return i
}

func hasPrefixAt(text []byte, i int, lit string) bool {
	return len(text)-i >= len(lit) && string(text[i:i+len(lit)]) == lit
}

func hexValue(c byte) int {
	switch {
	case c >= '0' && c <= '9':
		return int(c - '0')
	case c >= 'a' && c <= 'f':
		return int(c-'a') + 10
	case c >= 'A' && c <= 'F':
		return int(c-'A') + 10
	}
	return -1
}

// skipWS returns the offset of the first byte at or after i that is not JSON
// whitespace.
func skipWS(text []byte, i int) int {
	for i < len(text) {
		switch text[i] {
		case ' ', '\t', '\n', '\r':
			i++
		default:
			return i
		}
	}
	return i
}

// The functions below read JSON text that checkJSONText accepted.

// stringEnd returns the offset after the string literal whose opening quote
// is text[i].
func stringEnd(text []byte, i int) int {
	for i++; ; i++ {
		switch text[i] {
		case '"':
			return i + 1
		case '\\':
			i++
		}
	}
}

// valueEnd returns the offset after the value that starts at text[i].
func valueEnd(text []byte, i int) int {
	switch text[i] {
	case '"':
		return stringEnd(text, i)
	case '{', '[':
		depth := 0
		for {
			switch text[i] {
			case '"':
				i = stringEnd(text, i)
				continue
			case '{', '[':
				depth++
			case '}', ']':
				depth--
				if depth == 0 {
					return i + 1
				}
			}
			i++
		}
	default: // number, true, false, null
		for i < len(text) {
			switch text[i] {
			case ',', '}', ']', ' ', '\t', '\n', '\r':
				return i
			}
			i++
		}
		return i
	}
}

// appendStringValue appends the value of the string literal body raw (the
// bytes between the quotes) as JSON.parse reads it, in WTF-8: escapes are
// decoded, a surrogate pair of escapes is one character, any other surrogate
// escape is kept as a lone surrogate, and each maximal invalid UTF-8
// subsequence becomes U+FFFD.
func appendStringValue(dst, raw []byte) []byte {
	start := 0
	for i := 0; i < len(raw); {
		c := raw[i]
		if c >= utf8.RuneSelf {
			n, kind := utf8Seq(raw, i)
			if kind == seqValid {
				i += n
				continue
			}
			if kind == seqSurrogate {
				n = 1 // WTF-8 in the text is invalid UTF-8: ED is one subpart
			}
			dst = append(dst, raw[start:i]...)
			dst = append(dst, "\uFFFD"...)
			i += n
			start = i
			continue
		}
		if c != '\\' {
			i++
			continue
		}
		dst = append(dst, raw[start:i]...)
		switch e := raw[i+1]; e {
		case 'b':
			dst = append(dst, '\b')
		case 'f':
			dst = append(dst, '\f')
		case 'n':
			dst = append(dst, '\n')
		case 'r':
			dst = append(dst, '\r')
		case 't':
			dst = append(dst, '\t')
		case 'u':
			r := hex4(raw, i+2)
			switch {
			case r < 0xD800 || r > 0xDFFF:
				dst = utf8.AppendRune(dst, r)
			case r < 0xDC00 && i+12 <= len(raw) && raw[i+6] == '\\' && raw[i+7] == 'u':
				if r2 := hex4(raw, i+8); r2 >= 0xDC00 && r2 <= 0xDFFF {
					dst = utf8.AppendRune(dst, 0x10000+(r-0xD800)<<10+(r2-0xDC00))
					i += 6
					break
				}
				dst = appendSurrogate(dst, r)
			default:
				dst = appendSurrogate(dst, r)
			}
			i += 4
		default: // '"', '\\', '/'
			dst = append(dst, e)
		}
		i += 2
		start = i
	}
	return append(dst, raw[start:]...)
}

// hex4 decodes the four hex digits at raw[i:i+4].
func hex4(raw []byte, i int) rune {
	return rune(hexValue(raw[i])<<12 | hexValue(raw[i+1])<<8 | hexValue(raw[i+2])<<4 | hexValue(raw[i+3]))
}

// resolveText resolves pointer, well formed as checkPointer requires, in text,
// which checkJSONText accepted. It returns the offset of the value reached and
// whether one was reached. scratch is reused to decode member names and
// tokens that need it; resolveText returns it for reuse.
//
// Each token scans the rest of its object or array, since with duplicate
// member names the last one counts, so the cost is at most the number of
// tokens times len(text); templates are short.
func resolveText(text []byte, pointer string, scratch []byte) (int, bool, []byte) {
	pos := skipWS(text, 0)
	rest := pointer[1:]
	for {
		tok := rest
		slash := strings.IndexByte(rest, '/')
		if slash >= 0 {
			tok = rest[:slash]
		}
		var ok bool
		switch text[pos] {
		case '{':
			pos, ok, scratch = memberValue(text, pos, tok, scratch)
		case '[':
			pos, ok = elementValue(text, pos, tok)
		}
		if !ok {
			return 0, false, scratch
		}
		if slash < 0 {
			return pos, true, scratch
		}
		rest = rest[slash+1:]
	}
}

// memberValue returns the offset of the value of the last member of the
// object at text[pos] named by the pointer token tok (still escaped).
func memberValue(text []byte, pos int, tok string, scratch []byte) (int, bool, []byte) {
	escaped := strings.IndexByte(tok, '~') >= 0
	found := -1
	i := skipWS(text, pos+1)
	if text[i] == '}' {
		return 0, false, scratch
	}
	for {
		end := stringEnd(text, i)
		name := text[i+1 : end-1]
		if needsDecoding(name) {
			scratch = appendStringValue(scratch[:0], name)
			name = scratch
		}
		var match bool
		if escaped {
			match = tokenEquals(name, tok)
		} else {
			match = string(name) == tok
		}
		i = skipWS(text, end) // at ':'
		i = skipWS(text, i+1) // at the value
		if match {
			found = i
		}
		i = skipWS(text, valueEnd(text, i))
		if text[i] == '}' {
			break
		}
		i = skipWS(text, i+1) // after ','
	}
	return found, found >= 0, scratch
}

// needsDecoding reports whether the string literal body raw differs from its
// value: it has an escape or bytes that are not plain ASCII (checking those
// for validity costs about as much as decoding them).
func needsDecoding(raw []byte) bool {
	for _, c := range raw {
		if c == '\\' || c >= utf8.RuneSelf {
			return true
		}
	}
	return false
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

// elementValue returns the offset of the element of the array at text[pos]
// that the pointer token tok indexes.
func elementValue(text []byte, pos int, tok string) (int, bool) {
	idx, ok := arrayIndex(tok)
	if !ok {
		return 0, false
	}
	i := skipWS(text, pos+1)
	if text[i] == ']' {
		return 0, false
	}
	for n := 0; ; n++ {
		if n == idx {
			return i, true
		}
		i = skipWS(text, valueEnd(text, i))
		if text[i] == ']' {
			return 0, false
		}
		i = skipWS(text, i+1)
	}
}
