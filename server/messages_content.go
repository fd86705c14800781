package server

import (
	"bytes"
	"encoding/json"
	"strings"
)

// The Messages API's conversation: the system prompt and the messages' content blocks,
// turned into the chat turns every API renders through the chat template.

// decodeSystem reads the top-level system prompt: a string or text blocks.
func decodeSystem(o jsonObject) (string, error) {
	raw, ok := o.lookup("system")
	if !ok {
		return "", nil
	}
	if jsonKind(raw) == "string" {
		return decodeString("system", raw)
	}
	blocks, err := decodeArray("system", raw)
	if err != nil {
		return "", invalidField("system", "system must be a string or an array of text blocks")
	}
	texts := make([]string, 0, len(blocks))
	for i, b := range blocks {
		bo, err := parseObject(index("system", i), b)
		if err != nil {
			return "", err
		}
		if typ, _, err := bo.string("type"); err != nil {
			return "", err
		} else if typ != "text" {
			return "", invalidField(bo.child("type"), "%s must be \"text\", got %s", bo.child("type"), quote(typ))
		}
		text, _, err := bo.string("text")
		if err != nil {
			return "", err
		}
		texts = append(texts, text)
	}
	return strings.Join(texts, "\n"), nil
}

// decodeAnthropicMessages turns the messages into chat turns:
//
//   - the system prompt and system messages are folded into one system turn at the start
//     as foldSystemTurns does (a later system message becomes a user turn);
//   - a user message's tool_result blocks become tool turns, before the user's own text,
//     and each must answer a tool_use of an earlier assistant message;
//   - an assistant message's text, thinking and tool_use blocks make one assistant turn;
//     redacted_thinking is dropped (it has no text to render).
func decodeAnthropicMessages(o jsonObject, system string) ([]ChatMessage, error) {
	items, ok, err := o.array("messages")
	if err != nil {
		return nil, err
	}
	if !ok || len(items) == 0 {
		return nil, invalidField("messages", "messages must be a non-empty array of {role, content} objects")
	}
	var turns []ChatMessage
	if system != "" {
		turns = append(turns, ChatMessage{Role: "system", Content: system})
	}
	toolUses := map[string]bool{}
	for i, raw := range items {
		mo, err := parseObject(index("messages", i), raw)
		if err != nil {
			return nil, err
		}
		role, _, err := mo.string("role")
		if err != nil {
			return nil, err
		}
		blocks, err := anthropicBlocks(mo)
		if err != nil {
			return nil, err
		}
		switch role {
		case "system":
			text, err := blocksText(blocks)
			if err != nil {
				return nil, err
			}
			turns = append(turns, ChatMessage{Role: "system", Content: text})
		case "user":
			msgs, err := userTurns(blocks, toolUses)
			if err != nil {
				return nil, err
			}
			turns = append(turns, msgs...)
		case "assistant":
			m, err := assistantTurn(blocks, toolUses)
			if err != nil {
				return nil, err
			}
			turns = append(turns, m)
		default:
			return nil, invalidField(mo.child("role"), "%s must be user, assistant or system; got %s", mo.child("role"), quote(role))
		}
	}
	return foldSystemTurns(turns), nil
}

// anthropicBlock is one content block with its path.
type anthropicBlock struct {
	jsonObject
	typ string
}

// anthropicBlocks reads a message's content: a string (one text block) or blocks.
func anthropicBlocks(mo jsonObject) ([]anthropicBlock, error) {
	path := mo.child("content")
	raw, ok := mo.lookup("content")
	if !ok {
		return nil, invalidField(path, "%s is required", path)
	}
	if jsonKind(raw) == "string" {
		s, err := decodeString(path, raw)
		if err != nil {
			return nil, err
		}
		text, _ := json.Marshal(s)
		return []anthropicBlock{{jsonObject{path: path, fields: map[string]json.RawMessage{"text": text}}, "text"}}, nil
	}
	items, err := decodeArray(path, raw)
	if err != nil {
		return nil, invalidField(path, "%s must be a string or an array of content blocks", path)
	}
	blocks := make([]anthropicBlock, 0, len(items))
	for i, item := range items {
		bo, err := parseObject(index(path, i), item)
		if err != nil {
			return nil, err
		}
		typ, ok, err := bo.string("type")
		if err != nil {
			return nil, err
		}
		if !ok {
			return nil, invalidField(bo.child("type"), "%s is required", bo.child("type"))
		}
		switch typ {
		case "text", "tool_use", "tool_result", "thinking", "redacted_thinking":
		case "image", "document":
			return nil, invalidField(bo.child("type"), "%s is %s, but this server is text-only: send text blocks",
				bo.child("type"), quote(typ))
		default:
			return nil, invalidField(bo.child("type"),
				"%s is %s, a block type this server does not take (text, tool_use, tool_result, thinking)", bo.child("type"), quote(typ))
		}
		blocks = append(blocks, anthropicBlock{bo, typ})
	}
	return blocks, nil
}

func blockText(b anthropicBlock) (string, error) {
	text, ok, err := b.string("text")
	if err != nil {
		return "", err
	}
	if !ok {
		return "", invalidField(b.child("text"), "%s is required", b.child("text"))
	}
	return text, nil
}

// blocksText joins text blocks; any other block is refused where only text may stand.
func blocksText(blocks []anthropicBlock) (string, error) {
	texts := make([]string, 0, len(blocks))
	for _, b := range blocks {
		if b.typ != "text" {
			return "", invalidField(b.child("type"), "%s: only text blocks may stand here, got %s", b.child("type"), quote(b.typ))
		}
		text, err := blockText(b)
		if err != nil {
			return "", err
		}
		texts = append(texts, text)
	}
	return strings.Join(texts, "\n"), nil
}

func userTurns(blocks []anthropicBlock, toolUses map[string]bool) ([]ChatMessage, error) {
	var turns []ChatMessage
	var texts []string
	for _, b := range blocks {
		switch b.typ {
		case "text":
			text, err := blockText(b)
			if err != nil {
				return nil, err
			}
			texts = append(texts, text)
		case "tool_result":
			m, err := toolResultTurn(b, toolUses)
			if err != nil {
				return nil, err
			}
			turns = append(turns, m)
		default:
			return nil, invalidField(b.child("type"), "%s: a user message cannot hold a %s block", b.child("type"), quote(b.typ))
		}
	}
	if len(texts) > 0 || len(turns) == 0 {
		turns = append(turns, ChatMessage{Role: "user", Content: strings.Join(texts, "\n")})
	}
	return turns, nil
}

func toolResultTurn(b anthropicBlock, toolUses map[string]bool) (ChatMessage, error) {
	id, ok, err := b.string("tool_use_id")
	if err != nil {
		return ChatMessage{}, err
	}
	if !ok || id == "" {
		return ChatMessage{}, invalidField(b.child("tool_use_id"), "%s is required", b.child("tool_use_id"))
	}
	if !toolUses[id] {
		return ChatMessage{}, invalidField(b.child("tool_use_id"),
			"%s is %s, but no earlier assistant message has a tool_use with that id", b.child("tool_use_id"), quote(id))
	}
	var text string
	if raw, ok := b.lookup("content"); ok {
		if jsonKind(raw) == "string" {
			if text, err = decodeString(b.child("content"), raw); err != nil {
				return ChatMessage{}, err
			}
		} else {
			inner, err := anthropicBlocks(b.jsonObject)
			if err != nil {
				return ChatMessage{}, err
			}
			if text, err = blocksText(inner); err != nil {
				return ChatMessage{}, err
			}
		}
	}
	if isErr, _, err := b.boolean("is_error"); err != nil {
		return ChatMessage{}, err
	} else if isErr {
		// The template has no error flag: the model learns of the failure from the text.
		text = "Error: " + text
	}
	return ChatMessage{Role: "tool", Content: text, ToolCallID: id}, nil
}

func assistantTurn(blocks []anthropicBlock, toolUses map[string]bool) (ChatMessage, error) {
	m := ChatMessage{Role: "assistant"}
	var texts, thoughts []string
	for _, b := range blocks {
		switch b.typ {
		case "text":
			text, err := blockText(b)
			if err != nil {
				return m, err
			}
			texts = append(texts, text)
		case "thinking":
			text, _, err := b.string("thinking")
			if err != nil {
				return m, err
			}
			thoughts = append(thoughts, text)
		case "redacted_thinking":
		case "tool_use":
			call, err := toolUseCall(b)
			if err != nil {
				return m, err
			}
			toolUses[call.ID] = true
			m.ToolCalls = append(m.ToolCalls, call)
		default:
			return m, invalidField(b.child("type"), "%s: an assistant message cannot hold a %s block", b.child("type"), quote(b.typ))
		}
	}
	m.Content = strings.Join(texts, "\n")
	m.ReasoningContent = strings.Join(thoughts, "\n")
	return m, nil
}

func toolUseCall(b anthropicBlock) (ToolCall, error) {
	var call ToolCall
	var ok bool
	var err error
	if call.ID, ok, err = b.string("id"); err != nil {
		return call, err
	} else if !ok || call.ID == "" {
		return call, invalidField(b.child("id"), "%s is required", b.child("id"))
	}
	if call.Name, ok, err = b.string("name"); err != nil {
		return call, err
	} else if !ok || call.Name == "" {
		return call, invalidField(b.child("name"), "%s is required", b.child("name"))
	}
	raw, ok := b.lookup("input")
	if !ok {
		call.Arguments = "{}"
		return call, nil
	}
	if jsonKind(raw) != "object" {
		return call, invalidField(b.child("input"), "%s must be an object, got %s", b.child("input"), jsonKind(raw))
	}
	var buf bytes.Buffer
	if err := json.Compact(&buf, raw); err != nil {
		return call, invalidField(b.child("input"), "%s is not valid JSON: %v", b.child("input"), err)
	}
	call.Arguments = buf.String()
	return call, nil
}

// anthropicToolUseID is the tool_use id of a parsed call: Anthropic's clients expect
// "toolu_" ids, and the id only has to round-trip through the client.
func anthropicToolUseID(callID string) string {
	return "toolu_" + strings.TrimPrefix(callID, "call_")
}
