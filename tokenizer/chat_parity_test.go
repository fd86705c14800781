package tokenizer

import (
	"encoding/json"
	"testing"
)

func strPtr(s string) *string { return &s }
func boolPtr(b bool) *bool    { return &b }

func toolCall(id, name, args string) ToolCall {
	return ToolCall{ID: id, Type: "function", Function: FunctionCall{Name: name, Arguments: json.RawMessage(args)}}
}

var (
	weatherTool = json.RawMessage(`{"type": "function", "function": {"name": "get_weather", "description": "Get the weather for a city — in °C.", "parameters": {"type": "object", "properties": {"city": {"type": "string", "description": "City name, e.g. Zürich"}, "days": {"type": "integer", "minimum": 1, "maximum": 7.5}}, "required": ["city"]}}}`)
	searchTool  = json.RawMessage(`{"type": "function", "function": {"name": "search", "description": "Search the web.\nReturns \"snippets\".", "parameters": {"type": "object", "properties": {"q": {"type": "string"}, "lang": {"enum": ["en", "中文", null], "default": null}, "safe": {"type": "boolean", "default": true}, "ratio": {"type": "number", "default": 1e-7}}}}}`)
)

type chatCase struct {
	name     string
	messages []Message
	opts     ChatOptions
}

// chatParityCases are the conversations rendered by both transformers and
// our renderer with the real Qwen3 template.
func chatParityCases() []chatCase {
	user := func(s string) Message { return NewMessage("user", s) }
	assistant := func(s string) Message { return NewMessage("assistant", s) }
	system := func(s string) Message { return NewMessage("system", s) }
	tool := func(s string) Message { return NewMessage("tool", s) }
	gen := ChatOptions{AddGenerationPrompt: true}
	return []chatCase{
		{"single user", []Message{user("Hello!")}, gen},
		{"no generation prompt", []Message{user("Hello!")}, ChatOptions{}},
		{"system and user", []Message{system("You are terse."), user("Hi")}, gen},
		{"multi turn", []Message{system("Be nice."), user("2+2?"), assistant("4"), user("and 3+3?")}, gen},
		{"thinking off", []Message{user("Quick answer please")}, ChatOptions{AddGenerationPrompt: true, EnableThinking: boolPtr(false)}},
		{"thinking on", []Message{user("Think hard")}, ChatOptions{AddGenerationPrompt: true, EnableThinking: boolPtr(true)}},
		{"inline think in history", []Message{user("q1"), assistant("<think>\nreasoning one\n</think>\n\nanswer one"), user("q2")}, gen},
		{"inline think after last query", []Message{user("q1"), assistant("<think>\nplan\n</think>\n\nfinal")}, ChatOptions{}},
		{"reasoning_content last turn", []Message{user("q"), {Role: "assistant", Content: strPtr("the answer"), ReasoningContent: strPtr("\nstep 1\nstep 2\n")}}, ChatOptions{}},
		{"reasoning_content earlier turn dropped", []Message{user("q1"), {Role: "assistant", Content: strPtr("a1"), ReasoningContent: strPtr("r1")}, user("q2")}, gen},
		{"empty reasoning_content wins over inline", []Message{user("q"), {Role: "assistant", Content: strPtr("<think>x</think>y"), ReasoningContent: strPtr("")}}, ChatOptions{}},
		{"tools without system", []Message{user("Weather in Paris?")}, ChatOptions{Tools: []json.RawMessage{weatherTool}, AddGenerationPrompt: true}},
		{"tools with system", []Message{system("Use tools."), user("Find cats")}, ChatOptions{Tools: []json.RawMessage{weatherTool, searchTool}, AddGenerationPrompt: true}},
		{"tool call string arguments", []Message{user("Weather?"), {Role: "assistant", Content: strPtr(""), ToolCalls: []ToolCall{toolCall("c1", "get_weather", `"{\"city\": \"Paris\"}"`)}}, {Role: "tool", Content: strPtr(`{"temp": 21}`), ToolCallID: "c1"}}, ChatOptions{Tools: []json.RawMessage{weatherTool}, AddGenerationPrompt: true}},
		{"tool call object arguments", []Message{user("Weather?"), {Role: "assistant", Content: strPtr("Let me check."), ToolCalls: []ToolCall{toolCall("c1", "get_weather", `{"city": "Zürich", "days": 3, "opts": {"z": [1, 2.5, true, null], "a": "é\n\"q\""}, "f": 1e21, "g": 0.0001, "h": 1.5e-7}`)}}}, ChatOptions{Tools: []json.RawMessage{weatherTool}}},
		{"parallel tool calls and results", []Message{system("sys"), user("Compare weather"), {Role: "assistant", Content: strPtr(""), ToolCalls: []ToolCall{toolCall("a", "get_weather", `{"city": "Oslo"}`), toolCall("b", "get_weather", `{"city": "Rome"}`)}}, {Role: "tool", Content: strPtr("cold"), ToolCallID: "a", Name: "get_weather"}, {Role: "tool", Content: strPtr("warm"), ToolCallID: "b", Name: "get_weather"}}, ChatOptions{Tools: []json.RawMessage{weatherTool}, AddGenerationPrompt: true}},
		{"multi step with final answer", []Message{user("Plan a trip"), {Role: "assistant", Content: strPtr(""), ReasoningContent: strPtr("need weather"), ToolCalls: []ToolCall{toolCall("1", "get_weather", `{"city": "Lima"}`)}}, tool("sunny"), {Role: "assistant", Content: strPtr("Go!"), ReasoningContent: strPtr("it is sunny")}}, ChatOptions{Tools: []json.RawMessage{weatherTool}}},
		{"user message that looks like tool response", []Message{user("q"), assistant("a"), user("<tool_response>\nfake\n</tool_response>")}, gen},
		{"system in the middle", []Message{user("hi"), system("new rules"), user("ok")}, gen},
		{"ends with assistant", []Message{system("s"), user("u"), assistant("done")}, ChatOptions{}},
		{"unicode and special text", []Message{user("emoji 👨‍👩‍👧 CJK 你好 <|im_start|> json {\"a\":1}\n\ttabs  "), assistant("ok ✓"), user("Ελληνικά\r\nline")}, ChatOptions{AddGenerationPrompt: true, EnableThinking: boolPtr(false)}},
		{"empty contents", []Message{system(""), user(""), assistant(""), user("")}, gen},
		{"extra variables", []Message{user("x")}, ChatOptions{AddGenerationPrompt: true, Variables: map[string]json.RawMessage{"custom_flag": json.RawMessage(`{"a": [1, 2]}`), "enable_thinking": json.RawMessage(`false`)}}},
		{"tools thinking off", []Message{system("Tools ahead."), user("search cats")}, ChatOptions{Tools: []json.RawMessage{searchTool}, AddGenerationPrompt: true, EnableThinking: boolPtr(false)}},
		{"assistant without content fails", []Message{user("q"), {Role: "assistant", ToolCalls: []ToolCall{toolCall("1", "search", `{"q": "x"}`)}}}, ChatOptions{}},
		{"content parts", []Message{{Role: "user", ContentParts: []json.RawMessage{json.RawMessage(`{"type": "text", "text": "hi"}`)}}}, gen},
		{"tool call without function wrapper id", []Message{user("q"), {Role: "assistant", Content: strPtr("x"), ToolCalls: []ToolCall{{Function: FunctionCall{Name: "search", Arguments: json.RawMessage(`{}`)}}}}}, ChatOptions{}},
	}
}

type chatReference struct {
	Version   string            `json:"version"`
	Chats     []referenceResult `json:"chats"`
	Templates []referenceResult `json:"templates"`
}

type referenceResult struct {
	Text  *string `json:"text"`
	Error string  `json:"error"`
}

func (c chatCase) referenceRequest() map[string]any {
	kwargs := map[string]any{}
	for k, v := range c.opts.Variables {
		kwargs[k] = v
	}
	if c.opts.EnableThinking != nil {
		kwargs["enable_thinking"] = *c.opts.EnableThinking
	}
	return map[string]any{
		"messages":              c.messages,
		"tools":                 c.opts.Tools,
		"add_generation_prompt": c.opts.AddGenerationPrompt,
		"kwargs":                kwargs,
	}
}

// TestQwen3ChatTemplateParityWithTransformers renders each conversation
// with the real Qwen3 template and requires byte-identical output to
// transformers' apply_chat_template, or an error where it raises one.
func TestQwen3ChatTemplateParityWithTransformers(t *testing.T) {
	pythonReference(t) // skip early, before the slow setup
	tok := loadQwen3(t)
	cases := chatParityCases()
	req := make([]map[string]any, len(cases))
	for i, c := range cases {
		req[i] = c.referenceRequest()
	}
	var ref chatReference
	runPythonReference(t, "pyref_chat.py", []string{qwen3Dir(t)}, map[string]any{"chats": req}, &ref)
	if len(ref.Chats) != len(cases) {
		t.Fatalf("reference answered %d chats, want %d", len(ref.Chats), len(cases))
	}
	t.Logf("transformers %s: %d conversations", ref.Version, len(cases))
	rendered := 0
	for i, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got, err := tok.ApplyChatTemplate(c.messages, c.opts)
			want := ref.Chats[i]
			switch {
			case want.Text == nil && err == nil:
				t.Fatalf("rendered %q, transformers failed: %s", got, want.Error)
			case want.Text == nil:
				t.Logf("both fail; ours: %v; transformers: %s", err, want.Error)
			case err != nil:
				t.Fatalf("error %v, transformers rendered %q", err, *want.Text)
			case got != *want.Text:
				t.Fatalf("mismatch\n got: %q\nwant: %q\nfirst difference at byte %d", got, *want.Text, firstDifference(got, *want.Text))
			default:
				rendered++
			}
		})
	}
	if rendered < 20 {
		t.Errorf("only %d conversations rendered successfully on both sides, want at least 20", rendered)
	}
}

func firstDifference(a, b string) int {
	n := min(len(a), len(b))
	for i := 0; i < n; i++ {
		if a[i] != b[i] {
			return i
		}
	}
	return n
}
