package eventsource

import "bytes"

// textSize returns an upper bound of the length of the text that
// PostgreSQL gives back for the valid JSON b stored as jsonb, which is
// what a read returns: white space outside strings goes, a space follows
// every ',' and ':', a string prints no longer than it was given (escapes
// only shrink: "\u00e9" prints as "é"), and a number prints in full,
// without an exponent ("1e6" prints as "1000000", "1e131071" as 131,072
// digits). The check that bounds it (see Store.append) is what keeps a
// few bytes in from becoming a gigabyte out.
func textSize(b []byte) int64 {
	var n int64
	for i := 0; i < len(b); {
		switch c := b[i]; {
		case c == '"':
			j := i + 1
			for ; b[j] != '"'; j++ {
				if b[j] == '\\' {
					j++
				}
			}
			n += int64(j + 1 - i)
			i = j + 1
		case c == ',' || c == ':':
			n += 2
			i++
		case c == ' ' || c == '\t' || c == '\n' || c == '\r':
			i++
		case c == '-' || (c >= '0' && c <= '9'):
			j := i + 1
			for j < len(b) && isNumberByte(b[j]) {
				j++
			}
			n += numberTextSize(b[i:j])
			i = j
		default: // {, }, [, ] and the letters of true, false and null
			n++
			i++
		}
	}
	return n
}

// hugeText stands for the text of a number whose exponent does not even
// fit PostgreSQL's numeric (which refuses it): more than any MaxEventSize.
const hugeText = 1 << 40

// numberTextSize returns the length of a valid JSON number as PostgreSQL's
// numeric prints it: the sign, the integer digits (at least one), and, if
// its display scale (the fraction's digits less the exponent) is positive,
// a point and that many digits.
func numberTextSize(num []byte) int64 {
	var size int64
	if num[0] == '-' {
		size, num = 1, num[1:]
	}
	mant, exp := num, int64(0)
	if k := bytes.IndexAny(num, "eE"); k >= 0 {
		mant = num[:k]
		e, sign := num[k+1:], int64(1)
		switch e[0] {
		case '-':
			sign, e = -1, e[1:]
		case '+':
			e = e[1:]
		}
		e = bytes.TrimLeft(e, "0")
		if len(e) > 9 {
			return hugeText
		}
		for _, d := range e {
			exp = exp*10 + int64(d-'0')
		}
		exp *= sign
	}
	intPart, frac, _ := bytes.Cut(mant, []byte("."))
	// The power of ten of the first significant digit decides the integer
	// digits; a value below 1 (or zero) prints one, "0".
	lead := bytes.IndexFunc(intPart, nonZero)
	if lead < 0 {
		if k := bytes.IndexFunc(frac, nonZero); k >= 0 {
			lead = len(intPart) + k
		}
	}
	if lead >= 0 {
		size += max(int64(len(intPart)-lead)+exp, 1)
	} else {
		size++ // zero
	}
	if scale := int64(len(frac)) - exp; scale > 0 {
		size += 1 + scale
	}
	return size
}

func isNumberByte(c byte) bool {
	return (c >= '0' && c <= '9') || c == '.' || c == 'e' || c == 'E' || c == '+' || c == '-'
}

func nonZero(r rune) bool { return r != '0' }
