package tokenizer

import (
	"encoding/binary"
	"encoding/json"
	"strings"
	"testing"
	"unicode/utf8"
)

// FuzzStreamDecoder feeds arbitrary id sequences (two bytes per id, some past
// the vocabulary) to the byte-level stream decoder: every delta must be
// valid UTF-8, the held state at most one incomplete character, and the
// deltas must add up to Decode.
func FuzzStreamDecoder(f *testing.F) {
	tok := loadSynthetic(f, byteLevelTokenizerJSON(f), nil)
	f.Fuzz(func(t *testing.T, data []byte) {
		ids := make([]int32, 0, len(data)/2)
		for i := 0; i+1 < len(data); i += 2 {
			ids = append(ids, int32(binary.LittleEndian.Uint16(data[i:]))%int32(tok.VocabSize()+8))
		}
		for _, skip := range []bool{false, true} {
			s := tok.NewStreamDecoder(skip)
			var out strings.Builder
			for _, id := range ids {
				d := s.Add(id)
				if !utf8.ValidString(d) {
					t.Fatalf("delta %q is not valid UTF-8", d)
				}
				if len(s.pending) > 3 {
					t.Fatalf("holding %d bytes", len(s.pending))
				}
				out.WriteString(d)
			}
			out.WriteString(s.Flush())
			if want := tok.Decode(ids, skip); out.String() != want {
				t.Fatalf("stream %q != Decode %q for %v (skip=%v)", out.String(), want, ids, skip)
			}
		}
	})
}

// FuzzQwen3ChatTemplate renders the real Qwen3 template with arbitrary
// message text: it must never fail or panic on text alone, and the user's
// text must appear in the prompt exactly as given.
func FuzzQwen3ChatTemplate(f *testing.F) {
	cfg, err := loadTokenizerConfig(qwen3Dir(f))
	if err != nil {
		f.Fatalf("load Qwen3 config: %v", err)
	}
	tpl, err := ParseChatTemplate(cfg.templates["default"])
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, user, reasoning, answer string, thinking bool) {
		// Messages travel as JSON, which holds only valid UTF-8.
		user = strings.ToValidUTF8(user, "\uFFFD")
		msgs := []Message{
			NewMessage("system", "sys"),
			NewMessage("user", user),
			{Role: "assistant", Content: &answer, ReasoningContent: &reasoning},
			NewMessage("user", user),
		}
		out, err := tpl.Render(msgs, ChatOptions{AddGenerationPrompt: true, EnableThinking: &thinking}, cfg.named)
		if err != nil {
			t.Fatalf("render failed on text input: %v", err)
		}
		if !strings.HasPrefix(out, "<|im_start|>system\nsys<|im_end|>\n") {
			t.Fatalf("prompt starts wrong: %q", out)
		}
		if !strings.Contains(out, "<|im_start|>user\n"+user+"<|im_end|>") {
			t.Fatalf("user text not rendered verbatim in %q", out)
		}
	})
}

// FuzzParseChatTemplate throws arbitrary template source at the engine:
// parsing and rendering may fail, but only with an error, never a panic.
// Sources with range() or macros are skipped: range(10**9) only measures
// patience, and a macro that calls itself without end overflows the Go
// stack, which is fatal rather than a panic (see template_env.go).
func FuzzParseChatTemplate(f *testing.F) {
	msgs := []Message{NewMessage("user", "hi"), {Role: "assistant", Content: strPtr("ok"), ToolCalls: []ToolCall{toolCall("1", "f", `{"a": [1, 2.5]}`)}}}
	f.Fuzz(func(t *testing.T, source string) {
		if strings.Contains(source, "range") || strings.Contains(source, "macro") {
			return
		}
		tpl, err := ParseChatTemplate(source)
		if err != nil {
			return
		}
		_, _ = tpl.Render(msgs, ChatOptions{AddGenerationPrompt: true, Tools: []json.RawMessage{weatherTool}}, map[string]string{"eos_token": "</s>"})
	})
}
