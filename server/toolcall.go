package server

import (
	"bytes"
	"encoding/json"
	"strings"
)

// parseToolCallBody reads the JSON between <tool_call> and </tool_call> in the Qwen format,
// {"name": "f", "arguments": {...}}, and returns the name and the arguments as JSON text of
// an object, the form OpenAI's tool_calls[].function.arguments carries. "parameters" is
// accepted for "arguments", and arguments already given as a JSON string are unwrapped. ok
// is false for anything else, and the caller keeps the block as text.
func parseToolCallBody(body string) (name, arguments string, ok bool) {
	body = strings.TrimSpace(body)
	dec := json.NewDecoder(strings.NewReader(body))
	var call struct {
		Name       string          `json:"name"`
		Arguments  json.RawMessage `json:"arguments"`
		Parameters json.RawMessage `json:"parameters"`
	}
	if err := dec.Decode(&call); err != nil || dec.InputOffset() != int64(len(body)) {
		return "", "", false
	}
	if strings.TrimSpace(call.Name) == "" {
		return "", "", false
	}
	raw := call.Arguments
	if len(raw) == 0 {
		raw = call.Parameters
	}
	args, ok := argumentsText(raw)
	if !ok {
		return "", "", false
	}
	return call.Name, args, true
}

func argumentsText(raw json.RawMessage) (string, bool) {
	switch jsonKind(raw) {
	case "nothing", "null":
		return "{}", true
	case "object":
		var buf bytes.Buffer
		if err := json.Compact(&buf, raw); err != nil {
			return "", false
		}
		return buf.String(), true
	case "string":
		var s string
		if err := json.Unmarshal(raw, &s); err != nil {
			return "", false
		}
		if jsonKind(json.RawMessage(s)) != "object" || !json.Valid([]byte(s)) {
			return "", false
		}
		return s, true
	default:
		return "", false
	}
}
