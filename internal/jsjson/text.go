package jsjson

import (
	"encoding/json"
	"errors"
	"fmt"
	"unicode/utf8"
)

// This file reads JSON text as JavaScript reads a message body with
// JSON.parse(new TextDecoder().decode(bytes)), which is how payloads and key
// states written by the TypeScript original are read:
//
//   - a leading UTF-8 byte order mark is dropped ([TrimBOM]);
//   - the grammar is strict RFC 8259, which [json.Valid] checks; invalid UTF-8
//     inside a string reads as U+FFFD, anywhere else it is a syntax error;
//   - numbers are IEEE doubles: an out-of-range literal such as 1e400 is
//     Infinity (strconv.ParseFloat's value on a range error);
//   - a "\ud800" escape not part of a surrogate pair is kept as a lone
//     surrogate, encoded as WTF-8, where encoding/json would write U+FFFD;
//     each maximal invalid UTF-8 subsequence in a string is one U+FFFD, as
//     the WHATWG decoder reads it ([AppendStringValue]);
//   - with duplicate member names the last one counts.
//
// JSON.parse has no nesting limit; this package reads JSON text nested at
// most [MaxDepth] deep.

// MaxDepth is the deepest nesting of arrays and objects this package reads
// or lets a Go value have ([CheckText], [Scanner], [CheckValueDepth]). It is
// the root package's MaxPayloadDepth, which a compile-time check there
// keeps equal to it.
const MaxDepth = 10000

// TrimBOM drops a leading UTF-8 byte order mark, as TextDecoder does.
func TrimBOM(text []byte) []byte {
	if len(text) >= 3 && text[0] == 0xEF && text[1] == 0xBB && text[2] == 0xBF {
		return text[3:]
	}
	return text
}

// CheckText reports whether text (without a byte order mark) is one JSON
// value, nested at most MaxDepth deep, that JSON.parse accepts. The
// error says what is wrong and at which byte; callers wrap it.
func CheckText(text []byte) error {
	if err := checkDepth(text, MaxDepth); err != nil {
		return err
	}
	if json.Valid(text) {
		return nil
	}
	return syntaxError(text)
}

// syntaxError describes why json.Valid refused text.
func syntaxError(text []byte) error {
	var raw json.RawMessage
	err := json.Unmarshal(text, &raw)
	var syn *json.SyntaxError
	if errors.As(err, &syn) {
		return fmt.Errorf("%w (at byte %d)", err, syn.Offset-1)
	}
	if err != nil {
		return err
	}
	return errors.New("not a JSON value")
}

// ErrTooDeep reports JSON text, or a Go value, nested deeper than
// [MaxDepth]. Its text names the root package's MaxPayloadDepth, the name
// users know the limit by.
var ErrTooDeep = fmt.Errorf("arrays and objects nested deeper than %d levels (MaxPayloadDepth)", MaxDepth)

// checkDepth reports ErrTooDeep if text opens more than limit arrays and
// objects that are not closed before the next opens; it does not check the
// rest of the grammar. Text shorter than 2*limit+2 bytes cannot hold a valid
// value that deep and is not scanned.
func checkDepth(text []byte, limit int) error {
	if len(text) < 2*limit+2 {
		return nil
	}
	depth := 0
	for i := 0; i < len(text); i++ {
		switch text[i] {
		case '"':
			for i++; i < len(text) && text[i] != '"'; i++ {
				if text[i] == '\\' {
					i++
				}
			}
		case '{', '[':
			depth++
			if depth > limit {
				return ErrTooDeep
			}
		case '}', ']':
			depth--
		}
	}
	return nil
}

// The functions below read JSON text that [CheckText] accepted.

// SkipWS returns the offset of the first byte at or after i that is not JSON
// whitespace.
func SkipWS(text []byte, i int) int {
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

// StringEnd returns the offset after the string literal whose opening quote
// is text[i].
func StringEnd(text []byte, i int) int {
	for i++; ; i++ {
		switch text[i] {
		case '"':
			return i + 1
		case '\\':
			i++
		}
	}
}

// ValueEnd returns the offset after the value that starts at text[i].
func ValueEnd(text []byte, i int) int {
	switch text[i] {
	case '"':
		return StringEnd(text, i)
	case '{', '[':
		depth := 0
		for {
			switch text[i] {
			case '"':
				i = StringEnd(text, i)
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

// NextMember reads the object member at text[i], the offset of its name's
// opening quote, and returns its name as JSON.parse reads it (decoded into
// scratch when it has escapes or non-ASCII bytes), the offset of its value
// and the scratch buffer for reuse.
func NextMember(text []byte, i int, scratch []byte) (name []byte, value int, _ []byte) {
	end := StringEnd(text, i)
	name = text[i+1 : end-1]
	if NeedsDecoding(name) {
		scratch = AppendStringValue(scratch[:0], name)
		name = scratch
	}
	i = SkipWS(text, end)                   // at ':'
	return name, SkipWS(text, i+1), scratch // at the value
}

// AfterValue returns the offset of what follows the member or element that
// ends at text[end]: the next member name or element, or -1 after the
// closing bracket, with the offset after that bracket.
func AfterValue(text []byte, end int) (next, closed int) {
	i := SkipWS(text, end)
	if text[i] == '}' || text[i] == ']' {
		return -1, i + 1
	}
	return SkipWS(text, i+1), 0
}

// FirstMember returns the offset of the first member name or element of the
// object or array at text[pos], or -1 if it is empty, with the offset after
// its closing bracket.
func FirstMember(text []byte, pos int) (first, closed int) {
	i := SkipWS(text, pos+1)
	if text[i] == '}' || text[i] == ']' {
		return -1, i + 1
	}
	return i, 0
}

// AppendStringValue appends the value of the string literal body raw (the
// bytes between the quotes) as JSON.parse reads it, in WTF-8: escapes are
// decoded, a surrogate pair of escapes is one character, any other surrogate
// escape is kept as a lone surrogate, and each maximal invalid UTF-8
// subsequence becomes U+FFFD.
func AppendStringValue(dst, raw []byte) []byte {
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

// NeedsDecoding reports whether the string literal body raw differs from its
// value: it has an escape or bytes that are not plain ASCII (checking those
// for validity costs about as much as decoding them).
func NeedsDecoding(raw []byte) bool {
	for _, c := range raw {
		if c == '\\' || c >= utf8.RuneSelf {
			return true
		}
	}
	return false
}
