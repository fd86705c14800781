package tokenizer

import (
	"math/rand/v2"
	"strings"
	"testing"
)

// EncodeUpTo counts long text in chunks: the chunks' counts equal the whole text's with
// the real Qwen3 tokenizer (prose, code, CJK, runs of spaces and newlines, special
// tokens), it returns Encode's ids when the text fits, and it refuses text over the
// limit with a lower bound that never exceeds the true count.
func TestEncodeUpToCountsLikeEncode(t *testing.T) {
	tok := loadQwen3(t)
	r := rand.New(rand.NewPCG(3, 4))
	pieces := []string{"The quick brown fox", " jumps", "  over\n\nthe", "\tlazy dog.", " 你好，世界", " func main() { return x+1 }",
		" <|im_start|>user\n", "<|im_end|>", "   ", "\n", " naïve café", " 1234567", " émoji 🙂🙂", "aaaaaaaaaaaaaaaaaaaa"}
	var b strings.Builder
	for b.Len() < 600_000 {
		b.WriteString(pieces[r.IntN(len(pieces))])
	}
	text := b.String()
	full, err := tok.Encode(text, false)
	if err != nil {
		t.Fatal(err)
	}
	n := len(full)
	cases := []struct {
		name  string
		text  string
		limit int
		over  bool
	}{
		{"fits exactly", text, n, false},
		{"one over", text, n - 1, true},
		{"far over", text, 1000, true},
		{"short text", "hello world", 10, false},
		{"short text over", "hello world", 1, true},
		// One 300 KB word: no clean cut, chunks cut at character boundaries.
		{"no spaces", strings.Repeat("日本語", 100_000), 10, true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			want, err := tok.Encode(c.text, false)
			if err != nil {
				t.Fatal(err)
			}
			ids, atLeast, over, err := tok.EncodeUpTo(c.text, false, c.limit)
			if err != nil {
				t.Fatal(err)
			}
			if over != c.over {
				t.Fatalf("over = %v, want %v (%d tokens, limit %d)", over, c.over, len(want), c.limit)
			}
			if over {
				if ids != nil || atLeast <= c.limit || atLeast > len(want) {
					t.Errorf("over the limit %d: ids %d, atLeast %d; the text has %d tokens", c.limit, len(ids), atLeast, len(want))
				}
				return
			}
			if len(ids) != len(want) || atLeast != len(want) {
				t.Fatalf("%d ids (atLeast %d), Encode gives %d", len(ids), atLeast, len(want))
			}
			for i := range ids {
				if ids[i] != want[i] {
					t.Fatalf("id %d: %d, Encode gives %d", i, ids[i], want[i])
				}
			}
		})
	}
	// The chunks' counts add up to the whole text's (clean cuts only, here).
	sum, cuts := 0, 0
	for rest := text; rest != ""; {
		end, clean := chunkEnd(rest, boundedChunk)
		if !clean {
			cuts++
		}
		ids, err := tok.Encode(rest[:end], false)
		if err != nil {
			t.Fatal(err)
		}
		sum += len(ids)
		rest = rest[end:]
	}
	if cuts != 0 || sum != n {
		t.Errorf("chunks count %d tokens with %d unclean cuts; the whole text has %d", sum, cuts, n)
	}
}
