package grammar

import (
	"slices"
	"testing"

	hftokenizers "github.com/daulet/tokenizers"
)

// TestWithHFTokenizers links both Rust static libraries (llguidance and Hugging Face
// tokenizers) into one binary, as the server does, and checks that the test vocabulary is
// a real tokenizer: Hugging Face's encoding is the one the tests use, and the matcher
// takes it.
func TestWithHFTokenizers(t *testing.T) {
	hf, err := hftokenizers.FromBytes(loadTestTokenizerJSON(t))
	if err != nil {
		t.Fatal(err)
	}
	defer hf.Close()
	if n := hf.VocabSize(); n != testVocab {
		t.Fatalf("Hugging Face vocabulary size %d, want %d", n, testVocab)
	}
	tk := newTestTokenizer(t, testVocab)
	for _, text := range []string{`{"name":"Al","age":42}`, `{"name":"true name","age":-7}`} {
		ids, _ := hf.Encode(text, false)
		got := make([]int32, len(ids))
		for i, id := range ids {
			got[i] = int32(id)
		}
		if want := encode(text); !slices.Equal(got, want) {
			t.Fatalf("%q: Hugging Face encodes %v, the tests %v", text, got, want)
		}
		m := openMatcher(t, tk, personGrammar)
		if n := m.ValidPrefix(got); n != len(got) {
			t.Fatalf("%q: the matcher takes %d of %d tokens", text, n, len(got))
		}
		if err := m.Consume(append(got, tokImEnd)...); err != nil {
			t.Fatal(err)
		}
	}
}
