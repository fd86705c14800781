package tokenizer

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"testing"
)

// Small tokenizers written by the tests, for behaviour that does not need
// the real Qwen3 vocabulary and for decoders Qwen does not use.

// writeModelDir writes files into a fresh directory and returns it.
func writeModelDir(t testing.TB, files map[string]string) string {
	t.Helper()
	dir := t.TempDir()
	for name, content := range files {
		path := filepath.Join(dir, name)
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

func addedTokenJSON(id int, content string, special bool) map[string]any {
	return map[string]any{"id": id, "content": content, "single_word": false, "lstrip": false,
		"rstrip": false, "normalized": false, "special": special}
}

func mustJSON(t testing.TB, v any) string {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// byteLevelTokenizerJSON is a GPT-2 style byte-level BPE: the 256 byte
// characters as ids 0..255 (in byte order), a few merges, and added tokens
// <|end|> (special, 261) and <think> / </think> (not special, 262/263).
func byteLevelTokenizerJSON(t testing.TB) string {
	t.Helper()
	byteRune := map[byte]rune{}
	for r, b := range byteLevelRuneToByte {
		byteRune[b] = r
	}
	vocab := map[string]int{}
	for b := 0; b < 256; b++ {
		vocab[string(byteRune[byte(b)])] = b
	}
	space := string(byteRune[' '])
	merged := []string{"h e", "he l", "hel l", "hell o", space + " w"}
	for i, m := range merged {
		var a, b string
		fmt.Sscanf(m, "%s %s", &a, &b)
		vocab[a+b] = 256 + i
	}
	return mustJSON(t, map[string]any{
		"version": "1.0", "truncation": nil, "padding": nil,
		"added_tokens": []any{
			addedTokenJSON(261, "<|end|>", true),
			addedTokenJSON(262, "<think>", false),
			addedTokenJSON(263, "</think>", false),
		},
		"normalizer":     nil,
		"pre_tokenizer":  map[string]any{"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": true},
		"post_processor": nil,
		"decoder":        map[string]any{"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": true},
		"model": map[string]any{"type": "BPE", "dropout": nil, "unk_token": nil, "continuing_subword_prefix": nil,
			"end_of_word_suffix": nil, "fuse_unk": false, "byte_fallback": false, "ignore_merges": false,
			"vocab": vocab, "merges": merged},
	})
}

// sentencePieceTokenizerJSON is a Llama-style BPE with byte fallback: a
// Metaspace pre-tokenizer and the decoder sequence Replace(▁→space),
// ByteFallback, Fuse, Strip(one leading space), which the Go side decodes
// through the native library.
func sentencePieceTokenizerJSON(t testing.TB) string {
	t.Helper()
	vocab := map[string]int{"<unk>": 0, "<s>": 1, "</s>": 2}
	for b := 0; b < 256; b++ {
		vocab[fmt.Sprintf("<0x%02X>", b)] = 3 + b
	}
	pieces := []string{"▁", "a", "b", "c", "h", "i", "▁h", "▁hi", "é", "▁a"}
	for i, p := range pieces {
		vocab[p] = 259 + i
	}
	keys := make([]string, 0, len(vocab))
	for k := range vocab {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return mustJSON(t, map[string]any{
		"version": "1.0", "truncation": nil, "padding": nil,
		"added_tokens":  []any{addedTokenJSON(0, "<unk>", true), addedTokenJSON(1, "<s>", true), addedTokenJSON(2, "</s>", true)},
		"normalizer":    nil,
		"pre_tokenizer": map[string]any{"type": "Metaspace", "replacement": "▁", "prepend_scheme": "first", "split": false},
		"post_processor": map[string]any{"type": "TemplateProcessing",
			"single":         []any{map[string]any{"SpecialToken": map[string]any{"id": "<s>", "type_id": 0}}, map[string]any{"Sequence": map[string]any{"id": "A", "type_id": 0}}},
			"pair":           []any{map[string]any{"Sequence": map[string]any{"id": "A", "type_id": 0}}, map[string]any{"Sequence": map[string]any{"id": "B", "type_id": 1}}},
			"special_tokens": map[string]any{"<s>": map[string]any{"id": "<s>", "ids": []int{1}, "tokens": []string{"<s>"}}}},
		"decoder": map[string]any{"type": "Sequence", "decoders": []any{
			map[string]any{"type": "Replace", "pattern": map[string]any{"String": "▁"}, "content": " "},
			map[string]any{"type": "ByteFallback"},
			map[string]any{"type": "Fuse"},
			map[string]any{"type": "Strip", "content": " ", "start": 1, "stop": 0},
		}},
		"model": map[string]any{"type": "BPE", "dropout": nil, "unk_token": "<unk>", "continuing_subword_prefix": nil,
			"end_of_word_suffix": nil, "fuse_unk": true, "byte_fallback": true, "ignore_merges": false,
			"vocab": vocab, "merges": []string{"▁ h", "▁h i", "▁ a"}},
	})
}

// loadSynthetic loads a model dir made of tokenizer.json plus extra files.
func loadSynthetic(t testing.TB, tokenizerJSON string, extra map[string]string) *Tokenizer {
	t.Helper()
	files := map[string]string{"tokenizer.json": tokenizerJSON}
	for k, v := range extra {
		files[k] = v
	}
	tok, err := Load(writeModelDir(t, files))
	if err != nil {
		t.Fatalf("Load: %v", err)
	}
	t.Cleanup(func() { tok.Close() })
	return tok
}
