package server

import "testing"

func TestParseToolCallBody(t *testing.T) {
	tests := []struct {
		name     string
		body     string
		wantName string
		wantArgs string
		ok       bool
	}{
		{"qwen format", "\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"days\": 3}}\n",
			"get_weather", `{"city":"Paris","days":3}`, true},
		{"no arguments", `{"name": "now"}`, "now", `{}`, true},
		{"parameters spelling", `{"name": "f", "parameters": {"a": 1}}`, "f", `{"a":1}`, true},
		{"arguments as a JSON string", `{"name": "f", "arguments": "{\"a\": 1}"}`, "f", `{"a": 1}`, true},
		{"unicode kept", `{"name": "f", "arguments": {"q": "日本"}}`, "f", `{"q":"日本"}`, true},
		{"not JSON", `get_weather(city="Paris")`, "", "", false},
		{"missing name", `{"arguments": {}}`, "", "", false},
		{"name not a string", `{"name": 3, "arguments": {}}`, "", "", false},
		{"arguments an array", `{"name": "f", "arguments": [1]}`, "", "", false},
		{"arguments string not an object", `{"name": "f", "arguments": "x"}`, "", "", false},
		{"trailing garbage", `{"name": "f", "arguments": {}} extra`, "", "", false},
		{"two objects", `{"name": "f"}{"name": "g"}`, "", "", false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			name, args, ok := parseToolCallBody(tt.body)
			if ok != tt.ok || name != tt.wantName || args != tt.wantArgs {
				t.Errorf("got (%q, %q, %v), want (%q, %q, %v)", name, args, ok, tt.wantName, tt.wantArgs, tt.ok)
			}
		})
	}
}

func TestToolCallPrefix(t *testing.T) {
	if got := toolCallPrefix(ToolCallJSON, toolChoice{Mode: "auto"}); got != "" {
		t.Errorf("auto: got %q, want no prefix", got)
	}
	if got := toolCallPrefix(ToolCallJSON, toolChoice{Mode: "required"}); got != "<tool_call>\n" {
		t.Errorf("required: got %q", got)
	}
	want := "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": "
	if got := toolCallPrefix(ToolCallJSON, toolChoice{Mode: "function", Function: "get_weather"}); got != want {
		t.Errorf("function: got %q, want %q", got, want)
	}
}
