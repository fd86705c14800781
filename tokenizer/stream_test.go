package tokenizer

import (
	"math/rand"
	"testing"
	"unicode/utf8"
)

// TestStreamDecoderHoldsSplitCharacters feeds characters byte token by byte
// token and checks exactly when text comes out.
func TestStreamDecoderHoldsSplitCharacters(t *testing.T) {
	tok := loadSynthetic(t, byteLevelTokenizerJSON(t), nil)
	s := tok.NewStreamDecoder(false)
	steps := []struct {
		id   int32
		want string
	}{
		{'a', "a"},
		{0xF0, ""}, {0x9F, ""}, {0x98, ""}, {0x80, "😀"}, // 4-byte emoji arrives whole
		{0xC3, ""}, {'x', "\uFFFDx"}, // a lead byte broken by ASCII: settled as U+FFFD
		{0xE2, ""}, {0x82, ""}, {0xAC, "€"},
		{0xE0, ""}, {0x80, "\uFFFD\uFFFD"}, // invalid second byte settles at once
		{261, "<|end|>"},
		{0xE4, ""}, {0xBD, ""},
	}
	for i, st := range steps {
		if got := s.Add(st.id); got != st.want {
			t.Fatalf("step %d: Add(%d) = %q, want %q", i, st.id, got, st.want)
		}
	}
	if got := s.Flush(); got != "\uFFFD" {
		t.Fatalf("Flush = %q, want one U+FFFD for the cut 3-byte sequence", got)
	}
	if got := s.Add('z'); got != "z" {
		t.Fatalf("after Flush, Add = %q: the decoder must start over", got)
	}
}

func TestStreamDecoderSkipsSpecialTokens(t *testing.T) {
	tok := loadSynthetic(t, byteLevelTokenizerJSON(t), nil)
	ids := []int32{'h', 261, 262, 'i', 261}
	if got, want := streamDecode(t, tok, ids, true), "h<think>i"; got != want {
		t.Errorf("skip special: %q, want %q", got, want)
	}
	if got, want := streamDecode(t, tok, ids, false), "h<|end|><think>i<|end|>"; got != want {
		t.Errorf("keep special: %q, want %q", got, want)
	}
}

// TestStreamDecoderStateStaysSmall checks the work per token is constant:
// the byte-level path never holds more than an incomplete character, and
// the generic path never holds more than a short window of ids.
func TestStreamDecoderStateStaysSmall(t *testing.T) {
	rng := rand.New(rand.NewSource(3))
	bl := loadSynthetic(t, byteLevelTokenizerJSON(t), nil)
	s := bl.NewStreamDecoder(false)
	var all []int32
	var out []byte
	for i := 0; i < 50000; i++ {
		id := int32(rng.Intn(264))
		all = append(all, id)
		out = append(out, s.Add(id)...)
		if len(s.pending) > 3 {
			t.Fatalf("byte-level decoder holds %d bytes after %d tokens", len(s.pending), i+1)
		}
	}
	out = append(out, s.Flush()...)
	if string(out) != bl.Decode(all, false) {
		t.Fatal("50k-token stream differs from Decode")
	}

	sp := loadSynthetic(t, sentencePieceTokenizerJSON(t), nil)
	g := sp.NewStreamDecoder(false)
	for i := 0; i < 5000; i++ {
		g.Add(int32(rng.Intn(sp.VocabSize())))
		if len(g.ids) > 2*maxHeldTokens {
			t.Fatalf("generic decoder holds %d ids after %d tokens", len(g.ids), i+1)
		}
	}
}

// TestStreamDecoderGenericPath streams a SentencePiece-style tokenizer
// (byte fallback, leading-space strip) through the library decoder. Where
// every byte-fallback run is valid UTF-8 the deltas must add up to Decode.
// Where a run is broken, the library's ByteFallback decoder turns the whole
// run into U+FFFDs, including characters a stream has already shown, which
// no streaming decoder can anticipate; there the deltas must still be valid
// UTF-8 and the decoder must not stall.
func TestStreamDecoderGenericPath(t *testing.T) {
	tok := loadSynthetic(t, sentencePieceTokenizerJSON(t), nil)
	if tok.byteLevel {
		t.Fatal("SentencePiece tokenizer must take the generic path")
	}
	ids, err := tok.Encode("hi a é😀", true)
	if err != nil {
		t.Fatal(err)
	}
	if got := tok.Decode(ids, true); got != "hi a é😀" {
		t.Fatalf("Decode(Encode) = %q (ids %v)", got, ids)
	}
	rng := rand.New(rand.NewSource(11))
	pieceIDs := []int32{0, 1, 2}
	for id := int32(259); id < int32(tok.VocabSize()); id++ {
		pieceIDs = append(pieceIDs, id)
	}
	sequence := func(cut bool) []int32 {
		var seq []int32
		for j := rng.Intn(20); j >= 0; j-- {
			if rng.Intn(2) == 0 {
				seq = append(seq, pieceIDs[rng.Intn(len(pieceIDs))])
				continue
			}
			var buf [4]byte
			w := utf8.EncodeRune(buf[:], randomScalar(rng))
			if cut && rng.Intn(3) == 0 {
				w = 1 + rng.Intn(w)
			}
			for _, b := range buf[:w] {
				seq = append(seq, 3+int32(b))
			}
		}
		return seq
	}
	exact := [][]int32{ids}
	for i := 0; i < 300; i++ {
		exact = append(exact, sequence(false))
	}
	for _, seq := range exact {
		for _, skip := range []bool{false, true} {
			if got, want := streamDecode(t, tok, seq, skip), tok.Decode(seq, skip); got != want {
				t.Fatalf("stream of %v (skip=%v) = %q, Decode = %q", seq, skip, got, want)
			}
		}
	}
	for i := 0; i < 300; i++ {
		seq := sequence(true)
		if got := streamDecode(t, tok, seq, false); got == "" && tok.Decode(seq, false) != "" {
			t.Fatalf("stream of %v produced nothing, Decode = %q", seq, tok.Decode(seq, false))
		}
	}
}

func TestIncompleteTailLen(t *testing.T) {
	cases := []struct {
		in   []byte
		want int
	}{
		{nil, 0},
		{[]byte("abc"), 0},
		{[]byte{0xC3}, 1},
		{[]byte{'a', 0xE2, 0x82}, 2},
		{[]byte{0xF0, 0x9F, 0x98}, 3},
		{[]byte{0xF0, 0x9F, 0x98, 0x80}, 0},
		{[]byte{0xE0, 0x80}, 0}, // 0x80 cannot follow 0xE0
		{[]byte{0xED, 0xA0}, 0}, // surrogate range
		{[]byte{0xF4, 0x90}, 0}, // above U+10FFFF
		{[]byte{0x80}, 0},
		{[]byte{0xC0}, 0}, // never valid
		{[]byte{0x80, 0x80, 0x80}, 0},
	}
	for _, c := range cases {
		if got := incompleteTailLen(c.in); got != c.want {
			t.Errorf("incompleteTailLen(% x) = %d, want %d", c.in, got, c.want)
		}
	}
}
