package jsjson

import (
	"math"
	"strconv"
	"unicode/utf8"
	"unsafe"
)

// This file writes values the way JavaScript prints them: strings as
// JSON.stringify quotes them and numbers as Number.prototype.toString (and so
// String(v) and JSON.stringify for finite numbers) writes them. Go strings
// are read as WTF-8 (see the package documentation).

const hexDigits = "0123456789abcdef"

// Kinds of byte sequence utf8Seq reports.
const (
	seqValid     = iota // a valid UTF-8 encoding of a scalar value
	seqSurrogate        // a WTF-8 encoded surrogate: 3 bytes ED A0..BF 80..BF
	seqInvalid          // a maximal invalid subsequence, read as one U+FFFD
)

// utf8Seq reports the length and kind of the byte sequence that starts at
// s[i], which must be at least 0x80. For seqInvalid the length is that of the
// maximal subpart the WHATWG UTF-8 decoder replaces with one U+FFFD. A
// complete WTF-8 surrogate is reported as seqSurrogate with length 3; to the
// WHATWG decoder it is invalid and its first byte alone is one maximal subpart.
func utf8Seq[S ~string | ~[]byte](s S, i int) (int, int) {
	c := s[i]
	lo, hi := byte(0x80), byte(0xBF)
	var need int
	switch {
	case c >= 0xC2 && c <= 0xDF:
		need = 1
	case c >= 0xE0 && c <= 0xEF:
		need = 2
		if c == 0xE0 {
			lo = 0xA0
		}
	case c >= 0xF0 && c <= 0xF4:
		need = 3
		if c == 0xF0 {
			lo = 0x90
		} else if c == 0xF4 {
			hi = 0x8F
		}
	default:
		return 1, seqInvalid
	}
	if i+1 >= len(s) || s[i+1] < lo || s[i+1] > hi {
		return 1, seqInvalid
	}
	surrogate := c == 0xED && s[i+1] >= 0xA0
	n := 2
	for ; n <= need; n++ {
		if i+n >= len(s) || s[i+n] < 0x80 || s[i+n] > 0xBF {
			if surrogate {
				return 1, seqInvalid
			}
			return n, seqInvalid
		}
	}
	if surrogate {
		return 3, seqSurrogate
	}
	return n, seqValid
}

// surrogateAt decodes the WTF-8 surrogate at s[i:i+3] (see utf8Seq).
func surrogateAt[S ~string | ~[]byte](s S, i int) rune {
	return rune(s[i]&0x0F)<<12 | rune(s[i+1]&0x3F)<<6 | rune(s[i+2]&0x3F)
}

// appendSurrogate appends the WTF-8 encoding of the surrogate code point r.
func appendSurrogate(dst []byte, r rune) []byte {
	return append(dst, 0xE0|byte(r>>12), 0x80|byte(r>>6)&0x3F, 0x80|byte(r)&0x3F)
}

// AppendString appends s as a JSON string literal exactly as JavaScript's
// JSON.stringify writes it: only '"', '\\' and control characters below
// U+0020 are escaped (\b \f \n \r \t, else \u00xx), and so are lone
// surrogates (\udxxx, lowercase hex); everything else, including U+007F,
// U+2028, U+2029, '<', '>' and '&', is written as is.
//
// s is read as WTF-8 (see the package documentation): a WTF-8 lone surrogate is
// written as its escape, a WTF-8 high surrogate directly followed by a WTF-8
// low surrogate as the character the pair encodes (as a JavaScript string
// holding the pair would be), and each maximal invalid UTF-8 subsequence as
// U+FFFD.
//
// AppendString is not generic, and AppendStringBytes calls it: a caller in
// another package that reaches a generic function of this one (inlined)
// gets no escape analysis of it, and a stack buffer it passes as dst moves
// to the heap.
func AppendString(dst []byte, s string) []byte {
	dst = append(dst, '"')
	start := 0
	for i := 0; ; {
		// Bytes written as they are are copied a run at a time.
		if i = plainRunEnd(s, i); i >= len(s) {
			break
		}
		c := s[i]
		if c < utf8.RuneSelf {
			dst = append(dst, s[start:i]...)
			switch c {
			case '"':
				dst = append(dst, '\\', '"')
			case '\\':
				dst = append(dst, '\\', '\\')
			case '\b':
				dst = append(dst, '\\', 'b')
			case '\f':
				dst = append(dst, '\\', 'f')
			case '\n':
				dst = append(dst, '\\', 'n')
			case '\r':
				dst = append(dst, '\\', 'r')
			case '\t':
				dst = append(dst, '\\', 't')
			default:
				dst = append(dst, '\\', 'u', '0', '0', hexDigits[c>>4], hexDigits[c&0xf])
			}
			i++
			start = i
			continue
		}
		n, kind := utf8Seq(s, i)
		switch kind {
		case seqValid:
			i += n
			continue
		case seqSurrogate:
			dst = append(dst, s[start:i]...)
			r := surrogateAt(s, i)
			if r < 0xDC00 && i+3 < len(s) {
				if m, k := utf8Seq(s, i+3); m == 3 && k == seqSurrogate {
					if r2 := surrogateAt(s, i+3); r2 >= 0xDC00 {
						dst = utf8.AppendRune(dst, 0x10000+(r-0xD800)<<10+(r2-0xDC00))
						i += 6
						start = i
						continue
					}
				}
			}
			dst = append(dst, '\\', 'u', hexDigits[r>>12], hexDigits[r>>8&0xf], hexDigits[r>>4&0xf], hexDigits[r&0xf])
		default:
			dst = append(dst, s[start:i]...)
			dst = append(dst, "\uFFFD"...)
		}
		i += n
		start = i
	}
	dst = append(dst, s[start:]...)
	return append(dst, '"')
}

// AppendStringBytes is [AppendString] for a byte slice, which it reads in
// place (AppendString keeps no reference to its s).
func AppendStringBytes(dst, s []byte) []byte {
	return AppendString(dst, unsafe.String(unsafe.SliceData(s), len(s)))
}

// plainRunEnd returns the offset of the first byte at or after s[i] that
// AppendString does not write as it is (a control character, '"', '\\' or
// a byte of a non-ASCII sequence), or len(s). It reads eight bytes at a time,
// and the last eight at once when fewer are left.
func plainRunEnd[S ~string | ~[]byte](s S, i int) int {
	for ; i+8 <= len(s); i += 8 {
		if !plainWord(load64(s[i : i+8])) {
			return plainBytesEnd(s, i)
		}
	}
	if i < len(s) && len(s) >= 8 && plainWord(load64(s[len(s)-8:])) {
		return len(s) // s[i:] lies within the last eight bytes
	}
	return plainBytesEnd(s, i)
}

// load64 returns the first eight bytes of w, little-endian.
func load64[S ~string | ~[]byte](w S) uint64 {
	_ = w[7]
	return uint64(w[0]) | uint64(w[1])<<8 | uint64(w[2])<<16 | uint64(w[3])<<24 |
		uint64(w[4])<<32 | uint64(w[5])<<40 | uint64(w[6])<<48 | uint64(w[7])<<56
}

// plainWord reports whether the eight bytes of x are all written as they
// are. A byte of m has its high bit set where the byte is below 0x20, a
// quote or a backslash (each a byte minus one wrapping past zero), or not
// ASCII. A borrow can mark a byte above a special one, never a word without
// one.
func plainWord(x uint64) bool {
	const ones, highs = 0x0101010101010101, 0x8080808080808080
	m := (x - ones*0x20) | (x ^ ones*'"' - ones) | (x ^ ones*'\\' - ones) | x
	return m&highs == 0
}

// plainBytesEnd is plainRunEnd a byte at a time.
func plainBytesEnd[S ~string | ~[]byte](s S, i int) int {
	for ; i < len(s); i++ {
		if c := s[i]; c < 0x20 || c >= utf8.RuneSelf || c == '"' || c == '\\' {
			break
		}
	}
	return i
}

// AppendNumber appends f as JavaScript's Number.prototype.toString (and so
// String(f)) writes it: the shortest digits that read back as f, in decimal
// notation when 1e-6 <= |f| < 1e21 and in exponent notation ("1e+21",
// "1.5e-7") otherwise; -0 is written "0", non-finite values "NaN",
// "Infinity" and "-Infinity". For finite f this is also what JSON.stringify
// writes (JSON.stringify writes null for non-finite numbers).
func AppendNumber(dst []byte, f float64) []byte {
	switch {
	case f != f:
		return append(dst, "NaN"...)
	case math.IsInf(f, 1):
		return append(dst, "Infinity"...)
	case math.IsInf(f, -1):
		return append(dst, "-Infinity"...)
	case f == 0:
		return append(dst, '0')
	case f < 0:
		dst = append(dst, '-')
		f = -f
	}
	// Shortest round-trip digits: "d.ddde±xx" or "de±xx".
	var buf [32]byte
	e := strconv.AppendFloat(buf[:0], f, 'e', -1, 64)
	var digitsBuf [24]byte
	digits := append(digitsBuf[:0], e[0])
	i := 1
	if e[1] == '.' {
		for i = 2; e[i] != 'e'; i++ {
			digits = append(digits, e[i])
		}
	}
	// e[i] == 'e', followed by the sign and at least two digits.
	exp := 0
	for _, c := range e[i+2:] {
		exp = exp*10 + int(c-'0')
	}
	if e[i+1] == '-' {
		exp = -exp
	}
	// In the terms of ECMA-262 Number::toString: f = digits × 10^(n−k).
	k, n := len(digits), exp+1
	switch {
	case k <= n && n <= 21:
		dst = append(dst, digits...)
		for ; k < n; k++ {
			dst = append(dst, '0')
		}
	case 0 < n && n <= 21:
		dst = append(dst, digits[:n]...)
		dst = append(dst, '.')
		dst = append(dst, digits[n:]...)
	case -6 < n && n <= 0:
		dst = append(dst, '0', '.')
		for ; n < 0; n++ {
			dst = append(dst, '0')
		}
		dst = append(dst, digits...)
	default:
		dst = append(dst, digits[0])
		if k > 1 {
			dst = append(dst, '.')
			dst = append(dst, digits[1:]...)
		}
		dst = append(dst, 'e')
		if x := n - 1; x < 0 {
			dst = append(dst, '-')
			dst = strconv.AppendInt(dst, int64(-x), 10)
		} else {
			dst = append(dst, '+')
			dst = strconv.AppendInt(dst, int64(x), 10)
		}
	}
	return dst
}
