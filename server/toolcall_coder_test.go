package server

import (
	"encoding/json"
	"testing"
)

func TestDetectToolCallFormat(t *testing.T) {
	tests := []struct {
		name, template string
		want           ToolCallFormat
	}{
		{"qwen3 JSON instructions", `{{- "<tool_call>\n{\"name\": <function-name>, \"arguments\": <args-json-object>}\n</tool_call>" }}`, ToolCallJSON},
		{"coder, escaped newline", `{{- '<tool_call>\n<function=' + tool_call.name + '>\n' }}`, ToolCallQwen3Coder},
		{"coder, real newline", "<tool_call>\n<function=example_function_name>", ToolCallQwen3Coder},
		{"no tools at all", `{% for m in messages %}{{ m.content }}{% endfor %}`, ToolCallJSON},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := DetectToolCallFormat(tt.template); got != tt.want {
				t.Errorf("got %s, want %s", got, tt.want)
			}
		})
	}
}

func TestParseCoderToolCall(t *testing.T) {
	tools := []Tool{{Name: "f", Parameters: json.RawMessage(`{"type": "object", "properties": {
		"city": {"type": "string"}, "days": {"type": "integer"}, "temp": {"type": "number"},
		"metric": {"type": "boolean"}, "tags": {"type": "array"}, "opts": {"type": "object"},
		"maybe": {"type": ["null", "integer"]}, "either": {"anyOf": [{"type": "null"}, {"type": "number"}]},
		"free": {"description": "no type"}, "zip": {"type": "string"}}}`)}}
	schemas := newToolSchemas(tools)
	tests := []struct {
		name, body string
		want       []parsedCall
		ok         bool
	}{
		{"typed values", "\n<function=f>\n<parameter=city>\nParis\n</parameter>\n<parameter=days>\n3\n</parameter>\n" +
			"<parameter=temp>\n21.5\n</parameter>\n<parameter=metric>\nTrue\n</parameter>\n</function>\n",
			[]parsedCall{{"f", `{"city":"Paris","days":3,"temp":21.5,"metric":true}`}}, true},
		{"a string that looks like a number stays a string", "<function=f>\n<parameter=zip>\n01234\n</parameter>\n</function>",
			[]parsedCall{{"f", `{"zip":"01234"}`}}, true},
		{"JSON values for array and object", "<function=f>\n<parameter=tags>\n[\"a\", \"b\"]\n</parameter>\n" +
			"<parameter=opts>\n{\"x\": 1}\n</parameter>\n</function>", []parsedCall{{"f", `{"tags":["a","b"],"opts":{"x":1}}`}}, true},
		{"type lists and anyOf", "<function=f>\n<parameter=maybe>\n7\n</parameter>\n<parameter=either>\n2.0\n</parameter>\n</function>",
			[]parsedCall{{"f", `{"maybe":7,"either":2}`}}, true},
		{"null", "<function=f>\n<parameter=days>\nnull\n</parameter>\n</function>", []parsedCall{{"f", `{"days":null}`}}, true},
		{"bad integer stays text", "<function=f>\n<parameter=days>\nthree\n</parameter>\n</function>",
			[]parsedCall{{"f", `{"days":"three"}`}}, true},
		{"untyped JSON object", "<function=f>\n<parameter=free>\n{\"a\": [1]}\n</parameter>\n</function>",
			[]parsedCall{{"f", `{"free":{"a":[1]}}`}}, true},
		{"unknown parameter is text", "<function=f>\n<parameter=other>\n42\n</parameter>\n</function>",
			[]parsedCall{{"f", `{"other":"42"}`}}, true},
		{"multi-line string keeps inner newlines", "<function=f>\n<parameter=city>\nline 1\nline 2\n</parameter>\n</function>",
			[]parsedCall{{"f", `{"city":"line 1\nline 2"}`}}, true},
		{"missing </parameter> and </function>", "<function=f>\n<parameter=city>\nRome\n<parameter=days>\n2\n",
			[]parsedCall{{"f", `{"city":"Rome","days":2}`}}, true},
		{"no parameters", "<function=now>\n</function>", []parsedCall{{"now", `{}`}}, true},
		{"two functions", "<function=now>\n</function>\n<function=f>\n<parameter=days>\n1\n</parameter>\n</function>",
			[]parsedCall{{"now", `{}`}, {"f", `{"days":1}`}}, true},
		{"JSON body is not this format", `{"name": "f", "arguments": {}}`, nil, false},
		{"text outside the tags", "<function=f>\n</function> and more", nil, false},
		{"no name", "<function=>\n</function>", nil, false},
		{"empty", "  \n", nil, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, ok := parseCoderToolCall(tt.body, schemas)
			if ok != tt.ok || len(got) != len(tt.want) {
				t.Fatalf("got %v, %v; want %v, %v", got, ok, tt.want, tt.ok)
			}
			for i := range got {
				if got[i] != tt.want[i] {
					t.Errorf("call %d: got %+v, want %+v", i, got[i], tt.want[i])
				}
				if !json.Valid([]byte(got[i].Arguments)) {
					t.Errorf("call %d: arguments %s are not JSON", i, got[i].Arguments)
				}
			}
		})
	}
}

// A forced call's prefix opens the function in the model's own format, and the parser reads
// the completed block back.
func TestCoderToolCallPrefixParses(t *testing.T) {
	prefix := toolCallPrefix(ToolCallQwen3Coder, toolChoice{Mode: "function", Function: "get_weather"})
	if prefix != "<tool_call>\n<function=get_weather>\n" {
		t.Fatalf("prefix %q", prefix)
	}
	p := newChatOutputParser(true, 0, false)
	p.parseCall = toolCallParser(ToolCallQwen3Coder, []Tool{{Name: "get_weather",
		Parameters: json.RawMessage(`{"properties": {"days": {"type": "integer"}}}`)}})
	events := append([]chatEvent(nil), p.feed(prefix)...)
	for _, piece := range []string{"<parameter=days>\n", "4\n</param", "eter>\n</function>\n</tool", "_call>"} {
		events = append(events, p.feed(piece)...)
	}
	events = append(events, p.finish()...)
	if len(events) != 1 || events[0].ToolCall == nil {
		t.Fatalf("events %+v, want one tool call", events)
	}
	if c := events[0].ToolCall; c.Name != "get_weather" || c.Arguments != `{"days":4}` {
		t.Errorf("call %+v", c)
	}
}
