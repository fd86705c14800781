package server

import (
	"encoding/json"
	"strings"
)

// itemDecoder turns Responses input items into chat messages, in order:
//
//   - message items become turns of their role (developer as system);
//   - function_call items become tool calls of an assistant turn (consecutive calls share
//     one turn, as a parallel call does in chat);
//   - function_call_output items become tool turns, and must answer a call made before them
//     in the conversation (this request's items or the chained responses');
//   - reasoning items become the reasoning of the next assistant turn;
//   - item_reference items are replaced by the stored item they name.
type itemDecoder struct {
	msgs      []ChatMessage
	callIDs   map[string]bool
	reasoning string // from a reasoning item, waiting for its assistant turn
	// resolve finds a stored item by id for item_reference; nil when there is no store.
	resolve func(id string) (json.RawMessage, bool)
}

// decodeInput reads input (a string or an array of items) after the messages of earlier
// turns, whose tool calls it may answer.
func decodeInput(raw json.RawMessage, history []ChatMessage, resolve func(string) (json.RawMessage, bool)) ([]ChatMessage, error) {
	d := &itemDecoder{callIDs: map[string]bool{}, resolve: resolve}
	for _, m := range history {
		for _, c := range m.ToolCalls {
			d.callIDs[c.ID] = true
		}
	}
	if jsonKind(raw) == "string" {
		text, err := decodeString("input", raw)
		if err != nil {
			return nil, err
		}
		return []ChatMessage{{Role: "user", Content: text}}, nil
	}
	items, err := decodeArray("input", raw)
	if err != nil {
		return nil, err
	}
	if len(items) == 0 {
		return nil, invalidField("input", "input must not be an empty array")
	}
	for i, item := range items {
		if err := d.item(index("input", i), item, true); err != nil {
			return nil, err
		}
	}
	return d.msgs, nil
}

func (d *itemDecoder) item(path string, raw json.RawMessage, mayReference bool) error {
	o, err := parseObject(path, raw)
	if err != nil {
		return err
	}
	typ, hasType, err := o.string("type")
	if err != nil {
		return err
	}
	if !hasType && o.has("role") {
		typ = "message" // the easy input message: {role, content}
	}
	switch typ {
	case "message":
		return d.message(o)
	case "function_call":
		return d.functionCall(o)
	case "function_call_output":
		return d.functionCallOutput(o)
	case "reasoning":
		return d.reasoningItem(o)
	case "item_reference":
		if !mayReference {
			return invalidField(o.child("type"), "%s: a stored item cannot be a reference", o.child("type"))
		}
		return d.reference(o)
	case "":
		return invalidField(o.child("type"), "%s is required (message, function_call, function_call_output, reasoning or item_reference)",
			o.child("type"))
	default:
		return invalidField(o.child("type"),
			"%s is %s, an item type this server does not take; send message, function_call, function_call_output, reasoning or item_reference items",
			o.child("type"), quote(typ))
	}
}

func (d *itemDecoder) message(o jsonObject) error {
	role, ok, err := o.string("role")
	if err != nil {
		return err
	}
	if !ok {
		return invalidField(o.child("role"), "%s is required", o.child("role"))
	}
	switch role {
	case "user", "assistant", "system":
	case "developer":
		role = "system"
	default:
		return invalidField(o.child("role"), "%s must be one of user, assistant, system, developer; got %s",
			o.child("role"), quote(role))
	}
	text, err := responseContentText(o)
	if err != nil {
		return err
	}
	m := ChatMessage{Role: role, Content: text}
	if role == "assistant" {
		m.ReasoningContent, d.reasoning = d.reasoning, ""
	}
	d.msgs = append(d.msgs, m)
	return nil
}

// responseContentText reads a message's content: a string, or text parts (input_text,
// output_text; a refusal counts as its text) joined with "\n". Images, files and audio are
// refused: the models are text-only.
func responseContentText(o jsonObject) (string, error) {
	raw, ok := o.lookup("content")
	path := o.child("content")
	if !ok {
		return "", invalidField(path, "%s is required", path)
	}
	if jsonKind(raw) == "string" {
		return decodeString(path, raw)
	}
	parts, err := decodeArray(path, raw)
	if err != nil {
		return "", invalidField(path, "%s must be a string or an array of content parts", path)
	}
	texts := make([]string, 0, len(parts))
	for i, rawPart := range parts {
		p, err := parseObject(index(path, i), rawPart)
		if err != nil {
			return "", err
		}
		typ, _, err := p.string("type")
		if err != nil {
			return "", err
		}
		field := "text"
		switch typ {
		case "input_text", "output_text", "text":
		case "refusal":
			field = "refusal"
		case "input_image", "input_file", "input_audio":
			return "", invalidField(p.child("type"), "%s is %s, but this server is text-only: send input_text parts",
				p.child("type"), quote(typ))
		default:
			return "", invalidField(p.child("type"), "%s is %s; a content part must be input_text or output_text",
				p.child("type"), quote(typ))
		}
		text, ok, err := p.string(field)
		if err != nil {
			return "", err
		}
		if !ok {
			return "", invalidField(p.child(field), "%s is required", p.child(field))
		}
		texts = append(texts, text)
	}
	return strings.Join(texts, "\n"), nil
}

func (d *itemDecoder) functionCall(o jsonObject) error {
	var call ToolCall
	var ok bool
	var err error
	if call.ID, ok, err = o.string("call_id"); err != nil {
		return err
	} else if !ok || call.ID == "" {
		return invalidField(o.child("call_id"), "%s is required", o.child("call_id"))
	}
	if call.Name, ok, err = o.string("name"); err != nil {
		return err
	} else if !ok || call.Name == "" {
		return invalidField(o.child("name"), "%s is required", o.child("name"))
	}
	if call.Arguments, err = decodeHistoryArguments(o); err != nil {
		return err
	}
	d.callIDs[call.ID] = true
	if n := len(d.msgs); n > 0 && d.msgs[n-1].Role == "assistant" && d.reasoning == "" {
		d.msgs[n-1].ToolCalls = append(d.msgs[n-1].ToolCalls, call)
		return nil
	}
	d.msgs = append(d.msgs, ChatMessage{Role: "assistant", ReasoningContent: d.reasoning, ToolCalls: []ToolCall{call}})
	d.reasoning = ""
	return nil
}

func (d *itemDecoder) functionCallOutput(o jsonObject) error {
	id, ok, err := o.string("call_id")
	if err != nil {
		return err
	}
	if !ok || id == "" {
		return invalidField(o.child("call_id"), "%s is required", o.child("call_id"))
	}
	if !d.callIDs[id] {
		return invalidField(o.child("call_id"),
			"%s is %s, but no function_call with that call_id comes before it in the conversation", o.child("call_id"), quote(id))
	}
	raw, ok := o.lookup("output")
	if !ok {
		return invalidField(o.child("output"), "%s is required", o.child("output"))
	}
	var text string
	if jsonKind(raw) == "string" {
		if text, err = decodeString(o.child("output"), raw); err != nil {
			return err
		}
	} else {
		// A list of content parts, as for a message.
		if text, err = responseContentText(jsonObject{path: o.path, fields: map[string]json.RawMessage{"content": raw}}); err != nil {
			return err
		}
	}
	d.msgs = append(d.msgs, ChatMessage{Role: "tool", Content: text, ToolCallID: id})
	return nil
}

// reasoningItem keeps the reasoning text (its reasoning_text content, else its summary) for
// the assistant turn that follows it.
func (d *itemDecoder) reasoningItem(o jsonObject) error {
	var texts []string
	for _, field := range []string{"content", "summary"} {
		parts, _, err := o.array(field)
		if err != nil {
			return err
		}
		for i, raw := range parts {
			p, err := parseObject(index(o.child(field), i), raw)
			if err != nil {
				return err
			}
			text, _, err := p.string("text")
			if err != nil {
				return err
			}
			texts = append(texts, text)
		}
		if len(texts) > 0 {
			break
		}
	}
	d.reasoning = strings.Join(texts, "\n")
	return nil
}

func (d *itemDecoder) reference(o jsonObject) error {
	id, ok, err := o.string("id")
	if err != nil {
		return err
	}
	if !ok || id == "" {
		return invalidField(o.child("id"), "%s is required", o.child("id"))
	}
	var stored json.RawMessage
	if d.resolve != nil {
		stored, ok = d.resolve(id)
	}
	if !ok {
		return invalidField(o.child("id"), "%s: no stored item %s (it was never stored, was deleted, or the store evicted it); send the item itself",
			o.child("id"), quote(id))
	}
	return d.item(o.path, stored, false)
}
