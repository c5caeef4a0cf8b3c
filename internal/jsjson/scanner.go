package jsjson

import (
	"encoding/binary"
	"strconv"
)

// A Scanner reads JSON text in one pass, checking its grammar and its
// nesting as it goes, for a decoder that knows which members it wants:
// [Scanner.Object] and [Scanner.Array] walk containers and hand each member
// or element to the caller, which reads it with [Scanner.ScanString],
// [Scanner.Number] or [Scanner.SkipValue]. Strings and numbers are read as
// JSON.parse reads them (see text.go). A method returns false at a syntax
// error, leaving I where it stopped; [CheckText] then describes the error
// as encoding/json would. The zero Scanner with Text set is ready; its
// buffers are reused across documents. A Scanner is not safe for
// concurrent use.
type Scanner struct {
	Text  []byte // the text being read
	I     int    // the next byte to read
	name  []byte // a member name with escapes, decoded
	stack []byte // the closing brackets of the containers SkipValue is in
}

// Reset makes sc read text, from its first value on.
func (sc *Scanner) Reset(text []byte) {
	sc.Text, sc.I = text, SkipWS(text, 0)
}

// DescribeByte names the byte at text[i] for an error message: the quoted
// character, or "end of text".
func DescribeByte(text []byte, i int) string {
	if i >= len(text) {
		return "end of text"
	}
	return strconv.QuoteRune(rune(text[i]))
}

// KindName names the kind of JSON value that starts with the byte c.
func KindName(c byte) string {
	switch c {
	case '"':
		return "a string"
	case '{':
		return "an object"
	case '[':
		return "an array"
	case 't', 'f':
		return "a boolean"
	case 'n':
		return "null"
	}
	return "a number"
}

// IsNumberStart reports whether a JSON value starting with c is a number.
func IsNumberStart(c byte) bool { return c == '-' || c >= '0' && c <= '9' }

// MemberNames returns names as [Scanner.Object] takes them: each quoted and
// followed by a colon, as JSON.stringify writes a member's name.
func MemberNames(names ...string) []string {
	q := make([]string, len(names))
	for i, n := range names {
		q[i] = strconv.Quote(n) + ":"
	}
	return q
}

// Object reads the object at sc.I, calling member with sc.I at each
// member's value and the member's index in names (see [MemberNames]), or -1
// for a name not in names; member must move sc.I past the value, and return
// false at a syntax error. Names match exactly, after unescaping, as
// JSON.parse matches them. The names are expected in their order: a name
// where it is expected (names[k+1] after names[k], names[0] first) is
// recognised without decoding it, so a document written in that order is
// read fastest. It returns false at a syntax error.
func (sc *Scanner) Object(names []string, member func(k int) bool) bool {
	t := sc.Text
	sc.I = SkipWS(t, sc.I+1)
	if sc.I < len(t) && t[sc.I] == '}' {
		sc.I++
		return true
	}
	next := 0 // the member the wire format writes next
	for {
		k := -1
		if q := names[next%len(names)]; len(t)-sc.I >= len(q) && string(t[sc.I:sc.I+len(q)]) == q {
			k = next % len(names)
			if sc.I = SkipWS(t, sc.I+len(q)); sc.I >= len(t) {
				return false
			}
		} else {
			name, ok := sc.MemberName()
			if !ok {
				return false
			}
			for j, q := range names {
				if string(name) == q[1:len(q)-2] {
					k = j
					break
				}
			}
		}
		if !member(k) {
			return false
		}
		if k >= 0 {
			next = k + 1
		}
		if sc.I = SkipWS(t, sc.I); sc.I >= len(t) {
			return false
		}
		switch t[sc.I] {
		case ',':
			sc.I = SkipWS(t, sc.I+1)
		case '}':
			sc.I++
			return true
		default:
			return false
		}
	}
}

// Array reads the array at sc.I, calling element with the index of each
// element and sc.I at it; element must move sc.I past the element, and
// return false at a syntax error. It returns false at a syntax error.
func (sc *Scanner) Array(element func(n int) bool) bool {
	t := sc.Text
	sc.I = SkipWS(t, sc.I+1)
	if sc.I < len(t) && t[sc.I] == ']' {
		sc.I++
		return true
	}
	for n := 0; ; n++ {
		if sc.I >= len(t) || !element(n) {
			return false
		}
		if sc.I = SkipWS(t, sc.I); sc.I >= len(t) {
			return false
		}
		switch t[sc.I] {
		case ',':
			sc.I = SkipWS(t, sc.I+1)
		case ']':
			sc.I++
			return true
		default:
			return false
		}
	}
}

// MemberName reads a member name and the colon after it, and returns the
// name as JSON.parse reads it (valid until the next call), with sc.I at the
// member's value.
func (sc *Scanner) MemberName() ([]byte, bool) {
	t := sc.Text
	if sc.I >= len(t) || t[sc.I] != '"' {
		return nil, false
	}
	start, end, plain, ok := sc.ScanString()
	if !ok {
		return nil, false
	}
	name := t[start:end]
	if !plain {
		sc.name = AppendStringValue(sc.name[:0], name)
		name = sc.name
	}
	if sc.I = SkipWS(t, sc.I); sc.I >= len(t) || t[sc.I] != ':' {
		return nil, false
	}
	if sc.I = SkipWS(t, sc.I+1); sc.I >= len(t) {
		return nil, false
	}
	return name, true
}

// Number moves past the number literal at sc.I and returns its value as
// JSON.parse reads it: the nearest double, and ±Infinity for a literal
// beyond the doubles. ok is false at a syntax error.
func (sc *Scanner) Number() (f float64, ok bool) {
	start, simple, ok := sc.scanNumber()
	if !ok {
		return 0, false
	}
	lit := sc.Text[start:sc.I]
	if simple { // digits only, at most 15: exact in an int64 and a double
		neg := lit[0] == '-'
		if neg {
			lit = lit[1:]
		}
		n := int64(0)
		for _, c := range lit {
			n = n*10 + int64(c-'0')
		}
		f = float64(n)
		if neg {
			f = -f
		}
		return f, true
	}
	// A literal beyond the doubles is ±Infinity, as JSON.parse reads it:
	// ParseFloat's value with its range error.
	f, _ = strconv.ParseFloat(string(lit), 64)
	return f, true
}

// scanNumber moves past the number literal at sc.I and returns where it
// starts, and whether it is at most 15 digits with no fraction or exponent.
func (sc *Scanner) scanNumber() (start int, simple, ok bool) {
	t := sc.Text
	i := sc.I
	start = i
	if i < len(t) && t[i] == '-' {
		i++
	}
	digits := i
	switch {
	case i < len(t) && t[i] == '0':
		i++
	case i < len(t) && t[i] >= '1' && t[i] <= '9':
		i = skipDigits(t, i+1)
	default:
		return start, false, false
	}
	simple = i-digits <= 15
	if i < len(t) && t[i] == '.' {
		simple = false
		if i, ok = scanDigits(t, i+1); !ok {
			return start, false, false
		}
	}
	if i < len(t) && (t[i] == 'e' || t[i] == 'E') {
		simple = false
		if i++; i < len(t) && (t[i] == '+' || t[i] == '-') {
			i++
		}
		if i, ok = scanDigits(t, i); !ok {
			return start, false, false
		}
	}
	sc.I = i
	return start, simple, true
}

// skipDigits returns the index past the decimal digits at t[i:].
func skipDigits(t []byte, i int) int {
	for i < len(t) && t[i] >= '0' && t[i] <= '9' {
		i++
	}
	return i
}

// scanDigits returns the index past the decimal digits at t[i:], of which
// there must be at least one (a fraction's, an exponent's).
func scanDigits(t []byte, i int) (int, bool) {
	if i >= len(t) || t[i] < '0' || t[i] > '9' {
		return i, false
	}
	return skipDigits(t, i+1), true
}

// plainStringByte tells the bytes a string literal holds as they are:
// printable ASCII other than '"' and '\\'.
var plainStringByte = func() (p [256]bool) {
	for c := 0x20; c < 0x80; c++ {
		p[c] = c != '"' && c != '\\'
	}
	return p
}()

// ScanString moves past the string literal whose opening quote is at sc.I
// and returns where its body is in sc.Text, and whether the body is its
// value (it has no escape and only ASCII bytes); otherwise
// [AppendStringValue] decodes it. ok is false at a syntax error.
func (sc *Scanner) ScanString() (start, end int, plain, ok bool) {
	t := sc.Text
	i := sc.I + 1
	start = i
	// Eight bytes at a time while none of them is special: a byte of
	// m has its high bit set where the byte is below 0x20, a quote or a
	// backslash (each a byte minus one wrapping past zero), or not ASCII.
	// A borrow can mark a byte above a special one, never a word without
	// one.
	const ones, highs = 0x0101010101010101, 0x8080808080808080
	for i+8 <= len(t) {
		x := binary.LittleEndian.Uint64(t[i:])
		m := (x - ones*0x20) | (x ^ ones*'"' - ones) | (x ^ ones*'\\' - ones) | x
		if m&highs != 0 {
			break
		}
		i += 8
	}
	for i < len(t) && plainStringByte[t[i]] {
		i++
	}
	plain = true
	for i < len(t) {
		switch c := t[i]; {
		case c == '"':
			sc.I = i + 1
			return start, i, plain, true
		case c == '\\':
			plain = false
			if i+1 >= len(t) {
				return 0, 0, false, false
			}
			switch t[i+1] {
			case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
				i += 2
			case 'u':
				if i+6 > len(t) || hexValue(t[i+2]) < 0 || hexValue(t[i+3]) < 0 || hexValue(t[i+4]) < 0 || hexValue(t[i+5]) < 0 {
					return 0, 0, false, false
				}
				i += 6
			default:
				return 0, 0, false, false
			}
		case c < 0x20:
			return 0, 0, false, false
		default:
			if c >= 0x80 {
				plain = false
			}
			i++
		}
	}
	return 0, 0, false, false
}

// SkipValue moves past the value at sc.I, checking its grammar and that it
// nests at most [MaxDepth] deep with the depth containers around it. It
// returns false at a syntax error or nesting too deep.
func (sc *Scanner) SkipValue(depth int) bool {
	t := sc.Text
	stack := sc.stack[:0]
	for {
		if sc.I >= len(t) {
			return false
		}
		switch c := t[sc.I]; c {
		case '{', '[':
			if depth++; depth > MaxDepth {
				return false
			}
			closer := c + 2 // '}' or ']'
			if sc.I = SkipWS(t, sc.I+1); sc.I < len(t) && t[sc.I] == closer {
				sc.I++
				depth--
				break
			}
			stack = append(stack, closer)
			if c == '{' {
				if _, ok := sc.MemberName(); !ok {
					return false
				}
			}
			continue
		case '"':
			if _, _, _, ok := sc.ScanString(); !ok {
				return false
			}
		case 't':
			if !sc.literal("true") {
				return false
			}
		case 'f':
			if !sc.literal("false") {
				return false
			}
		case 'n':
			if !sc.literal("null") {
				return false
			}
		default:
			if _, _, ok := sc.scanNumber(); !ok {
				return false
			}
		}
		// After a value: close the containers it ends, up to the next value.
		for {
			if len(stack) == 0 {
				sc.stack = stack
				return true
			}
			if sc.I = SkipWS(t, sc.I); sc.I >= len(t) {
				return false
			}
			closer := stack[len(stack)-1]
			if t[sc.I] == ',' {
				sc.I = SkipWS(t, sc.I+1)
				if closer == '}' {
					if _, ok := sc.MemberName(); !ok {
						return false
					}
				}
				break
			}
			if t[sc.I] != closer {
				return false
			}
			sc.I++
			depth--
			stack = stack[:len(stack)-1]
		}
	}
}

// literal moves past lit (true, false or null) at sc.I.
func (sc *Scanner) literal(lit string) bool {
	if len(sc.Text)-sc.I < len(lit) || string(sc.Text[sc.I:sc.I+len(lit)]) != lit {
		return false
	}
	sc.I += len(lit)
	return true
}
