package tokenizer

import (
	"math/rand"
	"strings"
	"unicode/utf8"
)

// Deterministic test strings covering what tokenizers get wrong: scripts
// with different pre-tokenizer classes, emoji sequences, combining marks
// (the Qwen normalizer is NFC), code, whitespace runs, and special tokens
// written in the text.

var textFragments = [][]string{
	{"Hello", "world", "the", "quick brown fox", "don't", "I'll", "we're", "IT'S", "Tokenizer", "a", "Z"},
	{"café", "naïve", "Ångström", "Straße", "œuvre", "Ελληνικά", "Русский текст", "Українська", "עברית", "العربية", "हिन्दी", "ภาษาไทย", "Tiếng Việt"},
	{"你好，世界", "机器学习模型", "日本語のテキスト", "カタカナ", "한국어 문장", "中文标点：“引号”。", "漢字と ひらがな"},
	{"😀", "👍🏽", "👨‍👩‍👧‍👦", "🇫🇷🇯🇵", "❤️", "🧑🏿‍💻", "✨🔥", "🫠", "☃︎"},
	{"func main() {\n\tfmt.Println(\"hi\")\n}", "def f(x):\n    return x ** 2\n", "{\"key\": [1, 2.5, null]}", "if (a && b) { c++; }", "SELECT * FROM t WHERE id=42;", "<div class=\"x\">&amp;</div>", "#include <stdio.h>", "x := []int{1,2,3}"},
	{"   ", "\t\t", "\n\n\n", "\r\n", " \n ", "\u00a0\u00a0", "\u3000", "  \t \n", "\v\f", "         "},
	{"<|im_start|>", "<|im_end|>", "<|endoftext|>", "<think>", "</think>", "<tool_call>", "</tool_call>", "<|im_start", "im_end|>", "<|fim_prefix|>", "<tool_response>"},
	{"0", "42", "3.14159", "1,000,000", "2024-01-31", "0x1F", "1e-9", "１２３", "٣٤٥", "Ⅻ"},
	{"e\u0301", "a\u0308", "\u212b", "\uFB01", "n\u0303o", "\u1e9b\u0323", "\u0041\u030a"},
	{"!!!", "...", "???", "---", "***", "@#$%^&*", "«»", "—", "…", "''", "``"},
}

// randomScalar returns a random valid Unicode scalar value other than NUL
// (which the native encoder cannot carry) and the surrogates.
func randomScalar(rng *rand.Rand) rune {
	for {
		var r rune
		switch rng.Intn(4) {
		case 0:
			r = rune(1 + rng.Intn(0x7F))
		case 1:
			r = rune(0x80 + rng.Intn(0x800-0x80))
		case 2:
			r = rune(0x800 + rng.Intn(0x10000-0x800))
		default:
			r = rune(0x10000 + rng.Intn(0x110000-0x10000))
		}
		if utf8.ValidRune(r) {
			return r
		}
	}
}

// generateTestTexts returns n deterministic strings for seed.
func generateTestTexts(seed int64, n int) []string {
	rng := rand.New(rand.NewSource(seed))
	out := make([]string, 0, n)
	for len(out) < n {
		var sb strings.Builder
		parts := 1 + rng.Intn(8)
		for i := 0; i < parts; i++ {
			switch k := rng.Intn(12); {
			case k < len(textFragments):
				group := textFragments[k]
				sb.WriteString(group[rng.Intn(len(group))])
			case k == 10:
				for j := rng.Intn(6); j >= 0; j-- {
					sb.WriteRune(randomScalar(rng))
				}
			default:
				sb.WriteString(strings.Repeat(" ", rng.Intn(4)))
			}
			if rng.Intn(3) == 0 {
				sb.WriteByte(' ')
			}
		}
		out = append(out, sb.String())
	}
	// Edge cases that random composition may miss.
	out = append(out, "", " ", "a", "\n", "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n",
		"<think>\n\n</think>\n\n", strings.Repeat("ab", 500), strings.Repeat("😀", 64), strings.Repeat(" ", 100)+"x")
	return out
}
