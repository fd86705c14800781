package tokenizer

import (
	"fmt"
	"strings"
	"unicode/utf8"
)

// boundedChunk is how much text EncodeUpTo hands the native tokenizer at once while it
// counts a long text: the tokenizer's memory for one call grows with its input (several
// times the text's size in per-token records), so counting in chunks bounds it whatever
// the text's length.
const boundedChunk = 64 << 10

// EncodeUpTo is Encode for text that may be far longer than a model can take: when the
// text has more than limit tokens it returns over = true and a lower bound on the count
// (atLeast), having tokenized only about as much text as limit tokens span, in chunks;
// otherwise it returns the ids as Encode does. Chunks end before a space that follows a
// non-space, where the byte-level pre-tokenizers of the Qwen tokenizers always split
// (a space starts a new piece, added tokens contain none), so the chunks' counts add up
// to the whole text's; a chunk with no such place is cut at a character boundary, and the
// count then allows one token per cut.
func (t *Tokenizer) EncodeUpTo(text string, addSpecialTokens bool, limit int) (ids []int32, atLeast int, over bool, err error) {
	if i := strings.IndexByte(text, 0); i >= 0 {
		return nil, 0, false, fmt.Errorf("encode: text contains a NUL byte at offset %d", i)
	}
	if len(text) > 2*boundedChunk {
		n, cuts := 0, 0
		for rest := text; rest != "" && n-cuts <= limit; {
			end, clean := chunkEnd(rest, boundedChunk)
			if !clean {
				cuts++
			}
			n += len(t.lib.EncodeWithOptions(rest[:end], false).IDs)
			rest = rest[end:]
		}
		if n-cuts > limit {
			return nil, n - cuts, true, nil
		}
	}
	ids, err = t.Encode(text, addSpecialTokens)
	if err != nil {
		return nil, 0, false, err
	}
	if len(ids) > limit {
		return nil, len(ids), true, nil
	}
	return ids, len(ids), false, nil
}

// chunkEnd is where the chunk of s that starts at 0 ends, at most size bytes in (all of s
// when shorter): before the last space within it that follows a non-space (clean), or
// else at the last character boundary.
func chunkEnd(s string, size int) (end int, clean bool) {
	if len(s) <= size {
		return len(s), true
	}
	for i := size; i > size/2; i-- {
		if s[i] == ' ' && s[i-1] != ' ' && !isSpaceByte(s[i-1]) {
			return i, true
		}
	}
	end = size
	for end > 0 && !utf8.RuneStart(s[end]) {
		end--
	}
	if end == 0 {
		end = size // not UTF-8 here; any cut will do for a count that allows for it
	}
	return end, false
}

func isSpaceByte(b byte) bool { return b == '\t' || b == '\n' || b == '\r' || b == '\v' || b == '\f' }
