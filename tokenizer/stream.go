package tokenizer

import (
	"strings"
	"unicode/utf8"
)

// StreamDecoder turns token ids, fed one at a time, into text deltas.
//
// Guarantees: every delta is valid UTF-8; bytes of a character split across
// tokens are held until the character is complete; and, for byte-level
// vocabularies (Qwen, GPT-2 style), the concatenation of all deltas plus
// Flush equals Decode(all ids, skipSpecialTokens) exactly. The work per
// token is constant: only the bytes not yet emitted are kept.
//
// Other decoders go through the native library with a short sliding window
// of ids. The same equality holds there as long as every run of
// byte-fallback tokens is valid UTF-8; a broken run makes the library turn
// the whole run into U+FFFDs, characters already shown included, which a
// stream cannot anticipate.
//
// A StreamDecoder is not safe for concurrent use; use one per sequence.
type StreamDecoder struct {
	t           *Tokenizer
	skipSpecial bool

	// ByteLevel path: bytes not yet emitted, at most an incomplete UTF-8
	// sequence (3 bytes) between calls.
	pending []byte

	// Other decoders: the ids since the last emitted text's start. The
	// window [prefix:read) decodes to prefixText, which was already emitted;
	// decoding [prefix:] and removing prefixText gives the new text. This
	// keeps decoders that treat the first token specially (SentencePiece's
	// leading-space strip) consistent with a full decode.
	ids        []int32
	prefix     int
	read       int
	prefixText string
}

// maxHeldTokens bounds how many ids the generic path holds while their text
// ends in U+FFFD. A UTF-8 character spans at most 4 byte tokens, so text
// still unresolved after this many is final and is emitted as it is.
const maxHeldTokens = 8

// NewStreamDecoder starts a stream. skipSpecialTokens must match the Decode
// call the stream should reproduce.
func (t *Tokenizer) NewStreamDecoder(skipSpecialTokens bool) *StreamDecoder {
	return &StreamDecoder{t: t, skipSpecial: skipSpecialTokens}
}

// Add feeds one id and returns the text it settles, possibly "".
func (s *StreamDecoder) Add(id int32) string {
	if s.t.byteLevel {
		s.pending = s.t.appendTokenBytes(s.pending, id, s.skipSpecial)
		return s.emitSettledBytes()
	}
	return s.addGeneric(id)
}

// Flush ends the stream: it returns whatever is still held (an incomplete
// UTF-8 sequence becomes U+FFFD, exactly as Decode renders it) and resets
// the decoder for a new sequence.
func (s *StreamDecoder) Flush() string {
	var out string
	if s.t.byteLevel {
		out = lossyUTF8(s.pending)
	} else {
		text := s.t.libDecode(s.ids[s.prefix:], s.skipSpecial)
		out = strings.TrimPrefix(text, s.prefixText)
	}
	s.Reset()
	return out
}

// Reset drops all state, for reuse on a new sequence.
func (s *StreamDecoder) Reset() {
	s.pending = s.pending[:0]
	s.ids = s.ids[:0]
	s.prefix, s.read = 0, 0
	s.prefixText = ""
}

// emitSettledBytes returns the pending bytes except a trailing incomplete
// UTF-8 sequence, which stays pending. Bytes before that point decode the
// same way whatever comes next, so the deltas add up to the full decode.
func (s *StreamDecoder) emitSettledBytes() string {
	hold := incompleteTailLen(s.pending)
	if hold == len(s.pending) {
		return ""
	}
	out := lossyUTF8(s.pending[:len(s.pending)-hold])
	n := copy(s.pending, s.pending[len(s.pending)-hold:])
	s.pending = s.pending[:n]
	return out
}

// addGeneric is the sliding-window path for decoders other than ByteLevel.
func (s *StreamDecoder) addGeneric(id int32) string {
	s.ids = append(s.ids, id)
	text := s.t.libDecode(s.ids[s.prefix:], s.skipSpecial)
	held := len(s.ids) - s.read
	settled := len(text) > len(s.prefixText) && strings.HasPrefix(text, s.prefixText) &&
		!strings.HasSuffix(text, replacementChar)
	if !settled && held < maxHeldTokens {
		return "" // nothing new yet, or probably a character split over byte tokens
	}
	delta := text[commonPrefixLen(text, s.prefixText):]
	// Slide the window: the ids just emitted become the new prefix.
	s.ids = append(s.ids[:0], s.ids[s.read:]...)
	s.prefix, s.read = 0, len(s.ids)
	s.prefixText = s.t.libDecode(s.ids, s.skipSpecial)
	return delta
}

// commonPrefixLen returns the length of the longest common prefix of a and
// b that ends on a character boundary.
func commonPrefixLen(a, b string) int {
	n := 0
	for n < len(a) && n < len(b) && a[n] == b[n] {
		n++
	}
	for n > 0 && n < len(a) && !utf8.RuneStart(a[n]) {
		n--
	}
	return n
}
