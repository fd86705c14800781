package hub

import "testing"

// matchCases are checked here and, when the Python reference is installed, against Python's fnmatch
// (which huggingface_hub's allow_patterns use).
var matchCases = []struct {
	pattern, path string
	want          bool
}{
	{"*.json", "config.json", true},
	{"*.json", "sub/dir/config.json", true}, // '*' crosses '/', unlike path.Match
	{"*.json", "config.jsonl", false},
	{"*.json", "config.json.bak", false},
	{"*.JSON", "config.json", false},
	{"*.safetensors", "model-00001-of-00002.safetensors", true},
	{"tokenizer.model", "tokenizer.model", true},
	{"tokenizer.model", "sub/tokenizer.model", false},
	{"tokenizer.model", "tokenizerXmodel", false}, // '.' is literal
	{"model-0000?-of-00002.safetensors", "model-00002-of-00002.safetensors", true},
	{"model-0000?-of-00002.safetensors", "model-000012-of-00002.safetensors", false},
	{"[!a]*.txt", "merges.txt", true},
	{"[!a]*.txt", "added.txt", false},
	{"[mv]*.txt", "vocab.txt", true},
	{"[a-c]x", "bx", true},
	{"[a-c]x", "dx", false},
	{"[]]x", "]x", true},
	{"[a", "[a", true},
	{"[^a]", "^", true},
	{"[^a]", "b", false},
	{"a+b(c)", "a+b(c)", true},
	{"extra/", "extra/notes.txt", true},
	{"extra/", "extra/deep/file.bin", true},
	{"extra/", "extra.txt", false},
	{"*", "anything/at/all", true},
}

func TestMatch(t *testing.T) {
	for _, tc := range matchCases {
		if got := Match(tc.pattern, tc.path); got != tc.want {
			t.Errorf("Match(%q, %q) = %v, want %v", tc.pattern, tc.path, got, tc.want)
		}
	}
}

func TestDefaultAllowPatterns(t *testing.T) {
	for path, want := range map[string]bool{
		"config.json": true, "generation_config.json": true, "model.safetensors.index.json": true,
		"model-00001-of-00004.safetensors": true, "tokenizer.json": true, "tokenizer_config.json": true,
		"tokenizer.model": true, "tiktoken.model": true, "qwen.tiktoken": true, "merges.txt": true, "vocab.txt": true,
		"chat_template.jinja": true, "special_tokens_map.json": true,
		"README.md": false, ".gitattributes": false, "pytorch_model.bin": false, "model.gguf": false,
		"images/logo.png": false, "onnx/model.onnx": false,
	} {
		if got := matchAny(DefaultAllowPatterns, path); got != want {
			t.Errorf("default patterns select %s = %v, want %v", path, got, want)
		}
	}
}
