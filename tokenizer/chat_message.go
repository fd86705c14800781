package tokenizer

import (
	"bytes"
	"encoding/json"
	"fmt"
)

// Message is one chat message in the OpenAI shape. It marshals to and from
// that JSON, so a server can decode request messages straight into it.
type Message struct {
	Role string
	// Content is the message text. Nil means no content (OpenAI's
	// "content": null, as on an assistant turn that only calls tools); the
	// template then sees no content key at all, as in transformers, which
	// drops None-valued keys. Qwen3's template rejects such a message.
	Content *string
	// ContentParts, when non-nil, is passed as content instead of Content:
	// OpenAI's list form, each part a JSON object such as
	// {"type": "text", "text": "..."}.
	ContentParts []json.RawMessage
	// ReasoningContent is the model's earlier reasoning (the text between
	// <think> and </think>); nil when absent.
	ReasoningContent *string
	ToolCalls        []ToolCall
	ToolCallID       string // on role "tool": the call this result answers
	Name             string // optional participant or tool name
}

// ToolCall is an assistant's call of a function tool.
type ToolCall struct {
	ID       string       `json:"id,omitempty"`
	Type     string       `json:"type,omitempty"` // "function"
	Function FunctionCall `json:"function"`
}

// FunctionCall names the function and its arguments.
type FunctionCall struct {
	Name string `json:"name"`
	// Arguments is either a JSON string holding the arguments as text (the
	// OpenAI wire form) or a JSON object. Templates see a string or a dict
	// accordingly; Qwen3's prints a string as it is and a dict with tojson.
	Arguments json.RawMessage `json:"arguments,omitempty"`
}

// NewMessage returns a message with text content.
func NewMessage(role, content string) Message {
	return Message{Role: role, Content: &content}
}

// messageJSON is Message's wire form. Field order is the key order
// templates see (and tojson prints).
type messageJSON struct {
	Role             string          `json:"role"`
	Content          json.RawMessage `json:"content,omitempty"`
	ReasoningContent *string         `json:"reasoning_content,omitempty"`
	ToolCalls        []ToolCall      `json:"tool_calls,omitempty"`
	ToolCallID       string          `json:"tool_call_id,omitempty"`
	Name             string          `json:"name,omitempty"`
}

// MarshalJSON writes the OpenAI shape; absent fields are left out.
func (m Message) MarshalJSON() ([]byte, error) {
	w := messageJSON{
		Role:             m.Role,
		ReasoningContent: m.ReasoningContent,
		ToolCalls:        m.ToolCalls,
		ToolCallID:       m.ToolCallID,
		Name:             m.Name,
	}
	switch {
	case m.ContentParts != nil:
		parts, err := json.Marshal(m.ContentParts)
		if err != nil {
			return nil, fmt.Errorf("message content parts: %w", err)
		}
		w.Content = parts
	case m.Content != nil:
		text, err := json.Marshal(*m.Content)
		if err != nil {
			return nil, err
		}
		w.Content = text
	}
	return json.Marshal(w)
}

// UnmarshalJSON reads the OpenAI shape: content may be a string, null, or a
// list of parts.
func (m *Message) UnmarshalJSON(data []byte) error {
	var w messageJSON
	if err := json.Unmarshal(data, &w); err != nil {
		return err
	}
	*m = Message{
		Role:             w.Role,
		ReasoningContent: w.ReasoningContent,
		ToolCalls:        w.ToolCalls,
		ToolCallID:       w.ToolCallID,
		Name:             w.Name,
	}
	content := bytes.TrimSpace(w.Content)
	switch {
	case len(content) == 0 || bytes.Equal(content, []byte("null")):
	case content[0] == '"':
		var s string
		if err := json.Unmarshal(content, &s); err != nil {
			return fmt.Errorf("message content: %w", err)
		}
		m.Content = &s
	case content[0] == '[':
		if err := json.Unmarshal(content, &m.ContentParts); err != nil {
			return fmt.Errorf("message content: %w", err)
		}
	default:
		return fmt.Errorf("message content must be a string, null or a list of parts")
	}
	return nil
}
