package grammar

import (
	"bytes"
	"encoding/json"
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// The test vocabulary: a byte-level BPE small enough to reason about. Ids 0-255 are the
// single bytes (id = byte value), then a few merges, then two special end tokens.
// testdata/tokenizer.json is generated from it (go test ./grammar -run TestTestdataTokenizer
// -update rewrites it).

var updateTestdata = flag.Bool("update", false, "rewrite grammar/testdata/tokenizer.json")

// testMerges are the merged tokens, in id order from 256, as the pairs they merge.
var testMerges = [][2]string{
	{`{`, `"`},   // 256 {"
	{`"`, `:`},   // 257 ":
	{`"`, `,`},   // 258 ",
	{`"`, `}`},   // 259 "}
	{`n`, `a`},   // 260 na
	{`m`, `e`},   // 261 me
	{`na`, `me`}, // 262 name
	{`a`, `g`},   // 263 ag
	{`ag`, `e`},  // 264 age
	{`t`, `r`},   // 265 tr
	{`u`, `e`},   // 266 ue
	{`tr`, `ue`}, // 267 true
	{` `, `"`},   // 268 ␠"
}

const (
	tokEndOfText = 269 // <|endoftext|>
	tokImEnd     = 270 // <|im_end|>
	testVocab    = 271 // tokens in the test tokenizer
	idTrue       = 267
)

var testSpecials = []string{"<|endoftext|>", "<|im_end|>"}

// testTokenBytes is every non-special token's bytes, by id.
func testTokenBytes() [][]byte {
	toks := make([][]byte, 0, 256+len(testMerges))
	for b := 0; b < 256; b++ {
		toks = append(toks, []byte{byte(b)})
	}
	for _, m := range testMerges {
		toks = append(toks, []byte(m[0]+m[1]))
	}
	return toks
}

// byteLevelChars is GPT-2's byte → printable character map (Hugging Face's ByteLevel).
func byteLevelChars() [256]rune {
	var m [256]rune
	next := rune(256)
	for b := 0; b < 256; b++ {
		r := rune(b)
		if (r >= '!' && r <= '~') || (r >= 0xA1 && r <= 0xAC) || (r >= 0xAE && r <= 0xFF) {
			m[b] = r
		} else {
			m[b] = next
			next++
		}
	}
	return m
}

func byteLevel(s string) string {
	chars := byteLevelChars()
	var sb strings.Builder
	for _, b := range []byte(s) {
		sb.WriteRune(chars[b])
	}
	return sb.String()
}

// genTokenizerJSON renders the test vocabulary as a Hugging Face tokenizer.json.
func genTokenizerJSON() []byte {
	type addedToken struct {
		ID         int    `json:"id"`
		Content    string `json:"content"`
		SingleWord bool   `json:"single_word"`
		LStrip     bool   `json:"lstrip"`
		RStrip     bool   `json:"rstrip"`
		Normalized bool   `json:"normalized"`
		Special    bool   `json:"special"`
	}
	byteLevelCfg := map[string]any{"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": true}
	vocab := map[string]int{}
	for id, b := range testTokenBytes() {
		vocab[byteLevel(string(b))] = id
	}
	var merges []string
	for _, m := range testMerges {
		merges = append(merges, byteLevel(m[0])+" "+byteLevel(m[1]))
	}
	var added []addedToken
	for i, s := range testSpecials {
		added = append(added, addedToken{ID: 256 + len(testMerges) + i, Content: s, Special: true})
	}
	doc := map[string]any{
		"version":        "1.0",
		"truncation":     nil,
		"padding":        nil,
		"added_tokens":   added,
		"normalizer":     nil,
		"pre_tokenizer":  byteLevelCfg,
		"post_processor": nil,
		"decoder":        byteLevelCfg,
		"model": map[string]any{
			"type": "BPE", "dropout": nil, "unk_token": nil, "continuing_subword_prefix": nil,
			"end_of_word_suffix": nil, "fuse_unk": false, "byte_fallback": false, "ignore_merges": false,
			"vocab": vocab, "merges": merges,
		},
	}
	var out bytes.Buffer
	enc := json.NewEncoder(&out)
	enc.SetEscapeHTML(false)
	enc.SetIndent("", " ")
	if err := enc.Encode(doc); err != nil {
		panic(err)
	}
	return out.Bytes()
}

func TestTestdataTokenizer(t *testing.T) {
	path := filepath.Join("testdata", "tokenizer.json")
	want := genTokenizerJSON()
	if *updateTestdata {
		if err := os.WriteFile(path, want, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	got, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Fatalf("%s is stale: run go test ./grammar -run TestTestdataTokenizer -update", path)
	}
	// The merged tokens sit between the bytes and the specials.
	if n := 256 + len(testMerges); n != tokEndOfText {
		t.Fatalf("%d merges, the constants assume %d", len(testMerges), tokEndOfText-256)
	}
}

// encode tokenizes s greedily, longest token first (the test vocabulary's merges make
// this the BPE result for the strings the tests use).
func encode(s string) []int32 {
	toks := testTokenBytes()
	var out []int32
	for b := []byte(s); len(b) > 0; {
		best, bestLen := -1, 0
		for id, tb := range toks {
			if len(tb) > bestLen && bytes.HasPrefix(b, tb) {
				best, bestLen = id, len(tb)
			}
		}
		out = append(out, int32(best))
		b = b[bestLen:]
	}
	return out
}

func loadTestTokenizerJSON(t testing.TB) []byte {
	t.Helper()
	data, err := os.ReadFile(filepath.Join("testdata", "tokenizer.json"))
	if err != nil {
		t.Fatal(err)
	}
	return data
}

// newTestTokenizer is the test tokenizer for a model of vocabSize tokens, both specials end tokens.
func newTestTokenizer(t testing.TB, vocabSize int) *Tokenizer {
	t.Helper()
	tok, err := NewTokenizer(loadTestTokenizerJSON(t), vocabSize, []int32{tokEndOfText, tokImEnd})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(tok.Close)
	return tok
}
