package server_test

import (
	"reflect"
	"strings"
	"testing"

	"github.com/dflash-mlx/dflash-mlx/server"
	"github.com/dflash-mlx/dflash-mlx/server/servertest"
)

var weatherTools = []map[string]any{
	{"type": "function", "function": map[string]any{"name": "get_weather", "description": "Weather for a city",
		"parameters": map[string]any{"type": "object", "properties": map[string]any{"city": map[string]any{"type": "string"}}}}},
	{"type": "function", "function": map[string]any{"name": "get_time"}},
}

// twoCallsScript answers like Qwen calling two tools, with markers split across deltas,
// when the prompt declares tools; without tools it answers with the same text, which must
// then come back as plain content.
func twoCallsScript(in servertest.Input) []string {
	if strings.HasSuffix(in.Prompt, `"arguments": `) || strings.HasSuffix(in.Prompt, "<tool_call>\n") {
		return servertest.ToolCallScript("get_weather", `{"city": "Paris"}`)(in)
	}
	return []string{"Let me check.", "\n\n<tool", "_call>\n{\"name\": \"get_", "weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>",
		"\n<tool_call>\n{\"name\": \"get_time\", \"arguments\": {}}\n</tool", "_call>\n"}
}

func TestToolCalls(t *testing.T) {
	srv := newFakeServer(t, server.Config{}, &servertest.Fake{Script: twoCallsScript})
	tests := []struct {
		name  string
		extra []any
		want  chatAnswer
	}{
		{"auto parses both calls", []any{"tools", weatherTools},
			chatAnswer{Content: "Let me check.\n\n", ToolCalls: []string{`get_weather {"city":"Paris"}`, "get_time {}"}, Finish: "tool_calls"}},
		{"parallel_tool_calls false keeps the first", []any{"tools", weatherTools, "parallel_tool_calls", false},
			chatAnswer{Content: "Let me check.\n\n", ToolCalls: []string{`get_weather {"city":"Paris"}`}, Finish: "tool_calls"}},
		{"tool_choice none gives text", []any{"tools", weatherTools, "tool_choice", "none"},
			chatAnswer{Content: "Let me check.\n\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>\n" +
				"<tool_call>\n{\"name\": \"get_time\", \"arguments\": {}}\n</tool_call>\n", Finish: "stop"}},
		{"required forces a call", []any{"tools", weatherTools, "tool_choice", "required"},
			chatAnswer{ToolCalls: []string{`get_weather {"city":"Paris"}`}, Finish: "tool_calls"}},
		{"named function forces that call", []any{"tools", weatherTools,
			"tool_choice", map[string]any{"type": "function", "function": map[string]any{"name": "get_weather"}}},
			chatAnswer{ToolCalls: []string{`get_weather {"city":"Paris"}`}, Finish: "tool_calls"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			body := userChat("weather in Paris?", tt.extra...)
			body["stream_options"] = map[string]any{"include_usage": true}
			full := chatOnce(t, srv.URL, body)
			streamed := chatStream(t, srv.URL, body)
			full.Usage, streamed.Usage = usageJSON{}, usageJSON{}
			if !reflect.DeepEqual(full, tt.want) {
				t.Errorf("non-streaming:\n got %+v\nwant %+v", full, tt.want)
			}
			if !reflect.DeepEqual(streamed, tt.want) {
				t.Errorf("streaming:\n got %+v\nwant %+v", streamed, tt.want)
			}
		})
	}
}

func TestToolCallOnlyAnswerHasNullContent(t *testing.T) {
	srv := newFakeServer(t, server.Config{}, &servertest.Fake{Script: twoCallsScript})
	_, data := do(t, "POST", srv.URL+"/v1/chat/completions",
		userChat("x", "tools", weatherTools, "tool_choice", "required"))
	var cr chatResponse
	decode(t, data, &cr)
	if m := cr.Choices[0].Message; m.Content != nil || len(m.ToolCalls) != 1 {
		t.Fatalf("want content null and one tool call: %s", data)
	}
}

func TestReasoningContent(t *testing.T) {
	tests := []struct {
		name  string
		fake  *servertest.Fake
		want  chatAnswer
		extra []any
	}{
		{"think block at the start", &servertest.Fake{Script: func(servertest.Input) []string {
			return []string{"<thi", "nk>\nFirst, 2+2.", "\n</think>", "\n\nIt is 4."}
		}}, chatAnswer{Reasoning: "First, 2+2.\n", Content: "It is 4.", Finish: "stop"}, nil},
		{"template opened the block", &servertest.Fake{OpensInThinking: true, Script: func(servertest.Input) []string {
			return []string{"Hmm.", "\n</think>\n\n", "Yes."}
		}}, chatAnswer{Reasoning: "Hmm.\n", Content: "Yes.", Finish: "stop"}, nil},
		{"thinking disabled by chat_template_kwargs", &servertest.Fake{OpensInThinking: true, Script: func(in servertest.Input) []string {
			if strings.HasSuffix(in.Prompt, "<think>\n\n</think>\n\n") {
				return []string{"Direct answer."}
			}
			return []string{"thinking..."}
		}}, chatAnswer{Content: "Direct answer.", Finish: "stop"},
			[]any{"chat_template_kwargs", map[string]any{"enable_thinking": false}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			srv := newFakeServer(t, server.Config{}, tt.fake)
			body := userChat("2+2?", tt.extra...)
			full := chatOnce(t, srv.URL, body)
			streamed := chatStream(t, srv.URL, body)
			full.Usage = usageJSON{}
			if !reflect.DeepEqual(full, tt.want) || !reflect.DeepEqual(streamed, tt.want) {
				t.Fatalf("\nfull     %+v\nstreamed %+v\nwant     %+v", full, streamed, tt.want)
			}
		})
	}
}
