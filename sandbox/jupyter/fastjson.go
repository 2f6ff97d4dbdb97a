package jupyter

import (
	"encoding/binary"
	"encoding/json"
	"unicode/utf16"
	"unicode/utf8"
)

// decodeStream decodes the content of a stream message. A flooding cell
// sends its whole output limit through here, and encoding/json decodes
// strings at well under 100 MB/s, which made the host spend about a
// second of CPU per 64 MiB flood (see docs/DECISIONS.md, "Output is
// delivered message by message"). The fast path reads the object ipykernel
// sends, {"name": "...", "text": "..."}, copying runs of plain bytes whole;
// anything else it does not expect (another key, invalid UTF-8, a control
// character) falls back to encoding/json, so the result is always
// encoding/json's.
func decodeStream(content []byte) (streamContent, error) {
	if c, ok := fastStream(content); ok {
		return c, nil
	}
	var c streamContent
	err := json.Unmarshal(content, &c)
	return c, err
}

// fastStream parses content as an object of string members "name" and
// "text" only; ok is false when it is anything else.
func fastStream(b []byte) (c streamContent, ok bool) {
	i := skipSpace(b, 0)
	if i >= len(b) || b[i] != '{' {
		return c, false
	}
	i = skipSpace(b, i+1)
	if i < len(b) && b[i] == '}' {
		return c, skipSpace(b, i+1) == len(b)
	}
	for {
		var key, val string
		key, i, ok = unquote(b, i)
		if !ok {
			return c, false
		}
		i = skipSpace(b, i)
		if i >= len(b) || b[i] != ':' {
			return c, false
		}
		val, i, ok = unquote(b, skipSpace(b, i+1))
		if !ok {
			return c, false
		}
		switch key {
		case "name":
			c.Name = val
		case "text":
			c.Text = val
		default:
			return c, false
		}
		i = skipSpace(b, i)
		if i >= len(b) {
			return c, false
		}
		switch b[i] {
		case ',':
			i = skipSpace(b, i+1)
		case '}':
			return c, skipSpace(b, i+1) == len(b)
		default:
			return c, false
		}
	}
}

func skipSpace(b []byte, i int) int {
	for i < len(b) && (b[i] == ' ' || b[i] == '\t' || b[i] == '\n' || b[i] == '\r') {
		i++
	}
	return i
}

// unquote decodes the JSON string starting at b[i] and returns it with
// the index just past it. ok is false for anything encoding/json would
// reject or decode differently (invalid UTF-8, which it replaces).
func unquote(b []byte, i int) (s string, next int, ok bool) {
	if i >= len(b) || b[i] != '"' {
		return "", i, false
	}
	i++
	start := i
	var buf []byte // nil until the first escape
	for i < len(b) {
		// Runs of printable ASCII, the bulk of any output, eight bytes at
		// a time.
		for i+8 <= len(b) && plain8(binary.LittleEndian.Uint64(b[i:])) {
			i += 8
		}
		if i == len(b) {
			break
		}
		switch c := b[i]; {
		case c == '"':
			if buf == nil {
				return string(b[start:i]), i + 1, true
			}
			return string(append(buf, b[start:i]...)), i + 1, true
		case c == '\\':
			buf = append(buf, b[start:i]...)
			if i+1 >= len(b) {
				return "", i, false
			}
			switch b[i+1] {
			case '"', '\\', '/':
				buf = append(buf, b[i+1])
			case 'b':
				buf = append(buf, '\b')
			case 'f':
				buf = append(buf, '\f')
			case 'n':
				buf = append(buf, '\n')
			case 'r':
				buf = append(buf, '\r')
			case 't':
				buf = append(buf, '\t')
			case 'u':
				r, n := unicodeEscape(b[i:])
				if n == 0 {
					return "", i, false
				}
				buf = utf8.AppendRune(buf, r)
				i += n
				start = i
				continue
			default:
				return "", i, false
			}
			i += 2
			start = i
		case c < 0x20:
			return "", i, false
		case c < utf8.RuneSelf:
			i++
		default:
			r, size := utf8.DecodeRune(b[i:])
			if r == utf8.RuneError && size == 1 {
				return "", i, false
			}
			i += size
		}
	}
	return "", i, false
}

// plain8 reports whether the eight bytes of w are all printable ASCII
// other than '"' and '\\': no byte below 0x20 or from 0x80, none equal to
// either. The tests for a byte below n and for a zero byte are the usual
// SWAR ones (a borrow reaches the byte's high bit only from a byte that
// is less than n, or zero).
func plain8(w uint64) bool {
	const ones, highs = 0x0101010101010101, 0x8080808080808080
	below := func(x uint64, n uint64) uint64 { return (x - ones*n) & ^x & highs }
	quote, backslash := w^(ones*'"'), w^(ones*'\\')
	return (w&highs)|below(w, 0x20)|below(quote, 1)|below(backslash, 1) == 0
}

// unicodeEscape decodes a \uXXXX escape at the start of b, with the low
// half of a surrogate pair when one follows, as encoding/json does (a lone
// surrogate becomes U+FFFD). n is the bytes read, 0 when malformed.
func unicodeEscape(b []byte) (r rune, n int) {
	r = hex4(b)
	if r < 0 {
		return 0, 0
	}
	if !utf16.IsSurrogate(r) {
		return r, 6
	}
	if len(b) >= 12 && b[6] == '\\' && b[7] == 'u' {
		if lo := hex4(b[6:]); lo >= 0 {
			if dec := utf16.DecodeRune(r, lo); dec != utf8.RuneError {
				return dec, 12
			}
		}
	}
	return utf8.RuneError, 6
}

// hex4 reads the four hex digits of \uXXXX at the start of b, or -1.
func hex4(b []byte) rune {
	if len(b) < 6 || b[0] != '\\' || b[1] != 'u' {
		return -1
	}
	var r rune
	for _, c := range b[2:6] {
		switch {
		case '0' <= c && c <= '9':
			c -= '0'
		case 'a' <= c && c <= 'f':
			c = c - 'a' + 10
		case 'A' <= c && c <= 'F':
			c = c - 'A' + 10
		default:
			return -1
		}
		r = r<<4 | rune(c)
	}
	return r
}
