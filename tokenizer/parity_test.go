package tokenizer

import (
	"math/rand"
	"path/filepath"
	"slices"
	"testing"
	"unicode/utf8"
)

// byteTokenIDs returns, for each byte, the id of the single-byte token of a
// byte-level vocabulary.
func byteTokenIDs(t testing.TB, tok *Tokenizer) [256]int32 {
	t.Helper()
	var ids [256]int32
	for r, b := range byteLevelRuneToByte {
		id, ok := tok.TokenID(string(r))
		if !ok {
			t.Fatalf("byte token for 0x%02x (%q) missing from the vocabulary", b, string(r))
		}
		ids[b] = id
	}
	return ids
}

// decodeTestInputs builds id sequences that stress decoding: random ids
// (some past the vocabulary), raw byte tokens forming broken UTF-8, and
// special tokens between text.
func decodeTestInputs(t testing.TB, tok *Tokenizer, seed int64, n int) [][]int32 {
	rng := rand.New(rand.NewSource(seed))
	bytesIDs := byteTokenIDs(t, tok)
	added := tok.AddedTokens()
	var out [][]int32
	for i := 0; i < n; i++ {
		length := 1 + rng.Intn(24)
		ids := make([]int32, 0, length)
		for j := 0; j < length; j++ {
			switch mode := i % 4; {
			case mode == 0:
				ids = append(ids, int32(rng.Intn(tok.VocabSize()+64)))
			case mode == 1:
				ids = append(ids, bytesIDs[rng.Intn(256)])
			case mode == 2 && rng.Intn(4) == 0:
				ids = append(ids, added[rng.Intn(len(added))].ID)
			default:
				// Bytes of a real multi-byte character, sometimes cut short.
				var buf [4]byte
				w := utf8.EncodeRune(buf[:], randomScalar(rng))
				if rng.Intn(3) == 0 {
					w = rng.Intn(w) + 1
				}
				for _, b := range buf[:w] {
					ids = append(ids, bytesIDs[b])
				}
			}
		}
		out = append(out, ids)
	}
	return out
}

type tokenizerReference struct {
	Version       string    `json:"version"`
	Encode        [][]int32 `json:"encode"`
	EncodeSpecial [][]int32 `json:"encode_special"`
	Decode        []string  `json:"decode"`
	DecodeSkip    []string  `json:"decode_skip"`
}

// streamDecode feeds ids one by one and checks every delta is valid UTF-8.
func streamDecode(t testing.TB, tok *Tokenizer, ids []int32, skipSpecial bool) string {
	t.Helper()
	s := tok.NewStreamDecoder(skipSpecial)
	var out []byte
	for _, id := range ids {
		d := s.Add(id)
		if !utf8.ValidString(d) {
			t.Fatalf("stream delta %q is not valid UTF-8 (ids %v)", d, ids)
		}
		out = append(out, d...)
	}
	d := s.Flush()
	if !utf8.ValidString(d) {
		t.Fatalf("stream flush %q is not valid UTF-8 (ids %v)", d, ids)
	}
	return string(append(out, d...))
}

// TestQwen3ParityWithPythonTokenizers encodes and decodes thousands of
// strings with the real Qwen3 tokenizer and requires ids and text identical
// to the Python tokenizers package, and stream deltas that add up to the
// same text.
func TestQwen3ParityWithPythonTokenizers(t *testing.T) {
	pythonReference(t) // skip early, before the slow setup
	tok := loadQwen3(t)
	texts := generateTestTexts(20260514, 2100)

	encoded := make([][]int32, len(texts))
	for i, text := range texts {
		ids, err := tok.Encode(text, false)
		if err != nil {
			t.Fatalf("Encode(%q): %v", text, err)
		}
		encoded[i] = ids
	}
	decodeInputs := append(append([][]int32{}, encoded...), decodeTestInputs(t, tok, 99, 1200)...)

	var ref tokenizerReference
	runPythonReference(t, "pyref_tokenizer.py",
		[]string{filepath.Join(qwen3Dir(t), "tokenizer.json")},
		map[string]any{"encode": texts, "decode": decodeInputs}, &ref)
	if len(ref.Encode) != len(texts) || len(ref.Decode) != len(decodeInputs) {
		t.Fatalf("reference answered %d encodings and %d decodings, want %d and %d",
			len(ref.Encode), len(ref.Decode), len(texts), len(decodeInputs))
	}
	t.Logf("python tokenizers %s: %d texts, %d id sequences", ref.Version, len(texts), len(decodeInputs))

	failures := 0
	fail := func(format string, args ...any) {
		t.Helper()
		failures++
		if failures <= 20 {
			t.Errorf(format, args...)
		}
	}
	for i, text := range texts {
		if !slices.Equal(encoded[i], ref.Encode[i]) {
			fail("Encode(%q, false) = %v, python %v", text, encoded[i], ref.Encode[i])
		}
		withSpecial, err := tok.Encode(text, true)
		if err != nil {
			t.Fatalf("Encode(%q, true): %v", text, err)
		}
		if !slices.Equal(withSpecial, ref.EncodeSpecial[i]) {
			fail("Encode(%q, true) = %v, python %v", text, withSpecial, ref.EncodeSpecial[i])
		}
	}
	for i, ids := range decodeInputs {
		for _, skip := range []bool{false, true} {
			want := ref.Decode[i]
			if skip {
				want = ref.DecodeSkip[i]
			}
			if got := tok.Decode(ids, skip); got != want {
				fail("Decode(%v, skip=%v) = %q, python %q", ids, skip, got, want)
			}
			if got := streamDecode(t, tok, ids, skip); got != want {
				fail("stream decode of %v (skip=%v) = %q, python %q", ids, skip, got, want)
			}
		}
	}
	if failures > 0 {
		t.Fatalf("%d mismatches with python tokenizers", failures)
	}
}
