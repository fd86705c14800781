package server_test

import (
	"net/http"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/dflash-mlx/dflash-mlx/server"
	"github.com/dflash-mlx/dflash-mlx/server/servertest"
)

// everyWordTagged checks that each word of a default fake answer carries marker.
func everyWordTagged(t *testing.T, text, marker string) {
	t.Helper()
	words := strings.Fields(text)
	if len(words) == 0 {
		t.Fatalf("empty answer, want words tagged %q", marker)
	}
	for _, w := range words {
		if !strings.HasPrefix(w, marker+"-") {
			t.Fatalf("word %q of %q is not tagged %q", w, text, marker)
		}
	}
}

func TestChatStreamingEqualsNonStreaming(t *testing.T) {
	fake := &servertest.Fake{}
	srv := newFakeServer(t, server.Config{}, fake)
	tests := []struct {
		name  string
		extra []any
	}{
		{"greedy defaults", nil},
		{"seeded sampling", []any{"temperature", 0.8, "seed", 1234}},
		{"other seed", []any{"temperature", 0.8, "seed", 99, "top_p", 0.9, "top_k", 20, "min_p", 0.1}},
		{"short max_tokens", []any{"max_tokens", 5}},
		{"max_completion_tokens", []any{"max_completion_tokens", 7}},
		{"include usage", []any{"stream_options", map[string]any{"include_usage": true}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			body := userChat("[[id:eq"+strings.ReplaceAll(tt.name, " ", "_")+"]] tell me a story", tt.extra...)
			full := chatOnce(t, srv.URL, body)
			streamed := chatStream(t, srv.URL, body)
			if _, ok := body["stream_options"]; !ok {
				streamed.Usage = full.Usage // a stream reports usage only when asked to
			}
			if !reflect.DeepEqual(full, streamed) {
				t.Fatalf("stream differs from the full answer:\nfull     %+v\nstreamed %+v", full, streamed)
			}
			everyWordTagged(t, full.Content, "eq"+strings.ReplaceAll(tt.name, " ", "_"))
			u := full.Usage
			if u.PromptTokens == 0 || u.CompletionTokens == 0 || u.TotalTokens != u.PromptTokens+u.CompletionTokens {
				t.Fatalf("usage %+v", u)
			}
			if got := len(strings.Fields(full.Content)); got != u.CompletionTokens {
				t.Fatalf("%d words but completion_tokens %d (the fake spends one token per word)", got, u.CompletionTokens)
			}
		})
	}
	if fake.MaxActive() != 1 {
		t.Errorf("backend ran %d generations at once, want 1", fake.MaxActive())
	}
}

func TestChatSeedChangesSampledAnswer(t *testing.T) {
	srv := newFakeServer(t, server.Config{}, &servertest.Fake{})
	a := chatOnce(t, srv.URL, userChat("story", "temperature", 1.0, "seed", 1))
	b := chatOnce(t, srv.URL, userChat("story", "temperature", 1.0, "seed", 2))
	again := chatOnce(t, srv.URL, userChat("story", "temperature", 1.0, "seed", 1))
	if a.Content == b.Content {
		t.Error("seeds 1 and 2 gave the same answer: the seed does not reach the backend")
	}
	if a.Content != again.Content {
		t.Error("the same seed gave different answers")
	}
}

func TestChatResponseShape(t *testing.T) {
	// A delay per delta makes the decode long enough to time, so tokens_per_second is set.
	srv := newFakeServer(t, server.Config{ModelAliases: []string{"qwen"}}, &servertest.Fake{Delay: time.Millisecond})
	for _, model := range []string{"dflash-fake", "qwen", ""} {
		body := userChat("hello", "model", model)
		resp, data := do(t, http.MethodPost, srv.URL+"/v1/chat/completions", body)
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("model %q: status %d: %s", model, resp.StatusCode, data)
		}
		if resp.Header.Get("X-Request-Id") == "" {
			t.Error("no X-Request-Id header")
		}
		var cr chatResponse
		decode(t, data, &cr)
		c := cr.Choices[0]
		if cr.Model != "dflash-fake" || cr.Created == 0 || c.Index != 0 || c.Message.Role != "assistant" ||
			c.Message.Content == nil || c.FinishReason != "stop" {
			t.Fatalf("model %q: response %s", model, data)
		}
		d := cr.DFlash
		if d.Tau < 1 || d.Cycles < 1 || d.TokensPerSecond <= 0 || d.DraftMS < 0 || d.VerifyMS < 0 {
			t.Fatalf("dflash stats %+v", *d)
		}
	}
}

func TestChatLengthFinish(t *testing.T) {
	srv := newFakeServer(t, server.Config{}, &servertest.Fake{})
	for _, stream := range []bool{false, true} {
		body := userChat("long story", "max_tokens", 3)
		var a chatAnswer
		if stream {
			body["stream_options"] = map[string]any{"include_usage": true}
			a = chatStream(t, srv.URL, body)
		} else {
			a = chatOnce(t, srv.URL, body)
		}
		if a.Finish != "length" || a.Usage.CompletionTokens != 3 || len(strings.Fields(a.Content)) != 3 {
			t.Errorf("stream=%v: %+v, want finish length after exactly 3 tokens", stream, a)
		}
	}
}

func TestStopSequencesAreNeverEmitted(t *testing.T) {
	script := func(in servertest.Input) []string {
		if strings.Contains(in.Prompt, "scripted") {
			return []string{"Hello wor", "ld, and", " then more", " text END here"}
		}
		return nil
	}
	for _, serverSide := range []bool{false, true} {
		fake := &servertest.Fake{Script: script, LeaveStopsToServer: serverSide}
		srv := newFakeServer(t, server.Config{}, fake)
		// A stop string from the middle of the default answer, split across words.
		plain := chatOnce(t, srv.URL, userChat("[[id:stp]] plain"))
		words := strings.Fields(plain.Content)
		midStop := words[3][len(words[3])-2:] + " " + words[4][:4]
		tests := []struct {
			name   string
			prompt string
			stop   any
			want   string
		}{
			{"stop spanning two deltas", "scripted", []string{"world"}, "Hello "},
			{"stop as a single string", "scripted", "then", "Hello world, and "},
			{"earliest of several", "scripted", []string{"END", ", and"}, "Hello world"},
			{"stop spanning three deltas", "scripted", []string{"and then more"}, "Hello world, "},
			{"stop never reached", "scripted", []string{"absent"}, "Hello world, and then more text END here"},
			{"stop inside the default answer", "[[id:stp]] plain", []string{midStop}, plain.Content[:strings.Index(plain.Content, midStop)]},
		}
		for _, tt := range tests {
			t.Run(tt.name, func(t *testing.T) {
				for _, stream := range []bool{false, true} {
					body := userChat(tt.prompt, "stop", tt.stop)
					var a chatAnswer
					if stream {
						a = chatStream(t, srv.URL, body)
					} else {
						a = chatOnce(t, srv.URL, body)
					}
					if a.Content != tt.want || a.Finish != "stop" {
						t.Fatalf("server-side=%v stream=%v: got %q (%s), want %q (stop)", serverSide, stream, a.Content, a.Finish, tt.want)
					}
				}
			})
		}
	}
}

func TestChatHistoryReachesTheTemplate(t *testing.T) {
	// The backend must receive the whole history: roles mapped, parts joined, tool calls
	// with null content kept. A script records the rendered prompt.
	var seen string
	fake := &servertest.Fake{Script: func(in servertest.Input) []string {
		seen = in.Prompt
		return []string{"ok"}
	}}
	srv := newFakeServer(t, server.Config{}, fake)
	body := map[string]any{"messages": []map[string]any{
		{"role": "developer", "content": "rules"},
		{"role": "user", "content": []map[string]any{{"type": "text", "text": "part one"}, {"type": "text", "text": "part two"}}},
		{"role": "assistant", "content": nil, "tool_calls": []map[string]any{{"id": "call_1", "type": "function",
			"function": map[string]any{"name": "lookup", "arguments": `{"q":"x"}`}}}},
		{"role": "tool", "tool_call_id": "call_1", "content": "result"},
	}}
	if a := chatOnce(t, srv.URL, body); a.Content != "ok" {
		t.Fatalf("answer %+v", a)
	}
	for _, want := range []string{"<|im_start|>system\nrules", "part one\npart two",
		`{"name": "lookup", "arguments": {"q":"x"}}`, "<|im_start|>tool\nresult"} {
		if !strings.Contains(seen, want) {
			t.Errorf("rendered prompt lacks %q:\n%s", want, seen)
		}
	}
}
