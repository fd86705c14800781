package tokenizer

import (
	"strings"
	"unicode/utf8"
)

// The Rust tokenizers library turns decoded bytes into text with
// String::from_utf8_lossy, and Python's bytes.decode(errors="replace") does the
// same: every maximal subpart of an ill-formed sequence becomes one U+FFFD
// (Unicode §3.9, "substitution of maximal subparts"). Go's own conversions
// replace byte by byte, which gives a different count of U+FFFD for a
// truncated sequence, so parity needs this implementation.

const replacementChar = "\uFFFD"

// lossyUTF8 returns b as valid UTF-8, with each maximal ill-formed subpart
// replaced by U+FFFD.
func lossyUTF8(b []byte) string {
	if utf8.Valid(b) {
		return string(b)
	}
	var sb strings.Builder
	sb.Grow(len(b) + 8)
	for i := 0; i < len(b); {
		r, size := utf8.DecodeRune(b[i:])
		if r != utf8.RuneError || size > 1 {
			sb.Write(b[i : i+size])
			i += size
			continue
		}
		sb.WriteString(replacementChar)
		i += maximalSubpartLen(b[i:])
	}
	return sb.String()
}

// maximalSubpartLen returns how many bytes at the start of b form the
// longest prefix of some well-formed UTF-8 sequence (at least 1). It is only
// called where a full character does not decode.
func maximalSubpartLen(b []byte) int {
	need, lo, hi := sequenceShape(b[0])
	if need == 0 {
		return 1
	}
	n := 1
	for n < len(b) && n <= need {
		c := b[n]
		if n == 1 {
			if c < lo || c > hi {
				break
			}
		} else if c < 0x80 || c > 0xBF {
			break
		}
		n++
	}
	return n
}

// sequenceShape tells, for a lead byte, how many continuation bytes follow
// and the allowed range of the first one (which excludes overlong forms,
// surrogates and code points above U+10FFFF). need == 0 means the byte can
// never start a multi-byte sequence.
func sequenceShape(lead byte) (need int, lo, hi byte) {
	switch {
	case lead >= 0xC2 && lead <= 0xDF:
		return 1, 0x80, 0xBF
	case lead == 0xE0:
		return 2, 0xA0, 0xBF
	case lead >= 0xE1 && lead <= 0xEC, lead == 0xEE, lead == 0xEF:
		return 2, 0x80, 0xBF
	case lead == 0xED:
		return 2, 0x80, 0x9F
	case lead == 0xF0:
		return 3, 0x90, 0xBF
	case lead >= 0xF1 && lead <= 0xF3:
		return 3, 0x80, 0xBF
	case lead == 0xF4:
		return 3, 0x80, 0x8F
	}
	return 0, 0, 0
}

// incompleteTailLen returns the length of the suffix of b that is a proper
// prefix of a well-formed UTF-8 sequence: bytes that more input could still
// complete. Everything before that suffix decodes the same whatever follows,
// which is what lets the streaming decoder emit it.
func incompleteTailLen(b []byte) int {
	// A sequence is at most 4 bytes, so an incomplete one starts within the
	// last 3.
	for back := 1; back <= 3 && back <= len(b); back++ {
		start := len(b) - back
		need, _, _ := sequenceShape(b[start])
		if need == 0 {
			if b[start] >= 0x80 && b[start] <= 0xBF {
				continue // a continuation byte: the lead may be further back
			}
			return 0
		}
		if back > need {
			return 0 // the sequence starting here is already complete
		}
		if maximalSubpartLen(b[start:]) == back {
			return back
		}
		return 0
	}
	return 0
}
