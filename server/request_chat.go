package server

import (
	"bytes"
	"encoding/json"
	"maps"
	"slices"
	"strings"
)

// chatRequest is a validated /v1/chat/completions request.
type chatRequest struct {
	commonRequest
	Messages []ChatMessage
	// Tools are the declared tools; ToolChoice says how the model may use them.
	Tools      []Tool
	ToolChoice toolChoice
	// ParallelToolCalls false keeps only the first tool call of an answer.
	ParallelToolCalls bool
	Template          TemplateOptions
}

// toolChoice is the decoded tool_choice: Mode is "auto", "none", "required" or "function"
// (then Function names the tool that must be called).
type toolChoice struct {
	Mode     string
	Function string
}

// decodeChatRequest parses and validates a chat completion request body. Every failure is an
// *apiError with status 400 naming the field.
func decodeChatRequest(body []byte) (*chatRequest, error) {
	o, err := parseBody(body)
	if err != nil {
		return nil, err
	}
	common, err := decodeCommon(o)
	if err != nil {
		return nil, err
	}
	req := &chatRequest{commonRequest: common, ParallelToolCalls: true}
	if req.Messages, err = decodeMessages(o); err != nil {
		return nil, err
	}
	if req.Tools, err = decodeTools(o); err != nil {
		return nil, err
	}
	if req.ToolChoice, err = decodeToolChoice(o, req.Tools); err != nil {
		return nil, err
	}
	if v, ok, err := o.boolean("parallel_tool_calls"); err != nil {
		return nil, err
	} else if ok {
		req.ParallelToolCalls = v
	}
	if req.Template, err = decodeTemplateArgs(o); err != nil {
		return nil, err
	}
	if err := refuseChatOnlyUnsupported(o); err != nil {
		return nil, err
	}
	return req, nil
}

func refuseChatOnlyUnsupported(o jsonObject) error {
	if v, _, err := o.boolean("logprobs"); err != nil {
		return err
	} else if v {
		return unsupported("logprobs", "logprobs is not supported by this server")
	}
	if v, _, err := o.integer("top_logprobs"); err != nil {
		return err
	} else if v > 0 {
		return unsupported("top_logprobs", "top_logprobs is not supported by this server")
	}
	for _, name := range []string{"functions", "function_call"} {
		if o.has(name) {
			return unsupported(name, name+" is the deprecated function-calling API; send tools and tool_choice instead")
		}
	}
	return nil
}

func decodeMessages(o jsonObject) ([]ChatMessage, error) {
	items, ok, err := o.array("messages")
	if err != nil {
		return nil, err
	}
	if !ok || len(items) == 0 {
		return nil, invalidField("messages", "messages must be a non-empty array of {role, content} objects")
	}
	msgs := make([]ChatMessage, 0, len(items))
	for i, raw := range items {
		m, err := decodeMessage(index("messages", i), raw)
		if err != nil {
			return nil, err
		}
		msgs = append(msgs, m)
	}
	return msgs, nil
}

func decodeMessage(path string, raw json.RawMessage) (ChatMessage, error) {
	o, err := parseObject(path, raw)
	if err != nil {
		return ChatMessage{}, err
	}
	role, ok, err := o.string("role")
	if err != nil {
		return ChatMessage{}, err
	}
	if !ok {
		return ChatMessage{}, invalidField(o.child("role"), "%s is required", o.child("role"))
	}
	m := ChatMessage{Role: role}
	switch role {
	case "system", "user", "assistant", "tool":
	case "developer":
		m.Role = "system" // OpenAI's newer name for the system role
	default:
		return ChatMessage{}, invalidField(o.child("role"),
			"%s must be one of system, developer, user, assistant, tool; got %s", o.child("role"), quote(role))
	}
	content, hasContent, err := decodeContent(o)
	if err != nil {
		return ChatMessage{}, err
	}
	// An assistant turn that only calls tools has content null; every other role needs it.
	if !hasContent && m.Role != "assistant" {
		return ChatMessage{}, invalidField(o.child("content"), "%s is required for role %s", o.child("content"), role)
	}
	m.Content = content
	if m.Name, _, err = o.string("name"); err != nil {
		return ChatMessage{}, err
	}
	switch m.Role {
	case "assistant":
		if m.ReasoningContent, _, err = o.string("reasoning_content"); err != nil {
			return ChatMessage{}, err
		}
		if m.ToolCalls, err = decodeHistoryToolCalls(o); err != nil {
			return ChatMessage{}, err
		}
	case "tool":
		if m.ToolCallID, _, err = o.string("tool_call_id"); err != nil {
			return ChatMessage{}, err
		}
	}
	return m, nil
}

// decodeContent reads a message content: a string, or an array of text parts joined with
// "\n". Other part types (images, audio, files) are refused: the models are text-only.
func decodeContent(o jsonObject) (string, bool, error) {
	raw, ok := o.lookup("content")
	if !ok {
		return "", false, nil
	}
	path := o.child("content")
	switch jsonKind(raw) {
	case "string":
		s, err := decodeString(path, raw)
		return s, true, err
	case "array":
		items, err := decodeArray(path, raw)
		if err != nil {
			return "", false, err
		}
		texts := make([]string, 0, len(items))
		for i, item := range items {
			text, err := decodeTextPart(index(path, i), item)
			if err != nil {
				return "", false, err
			}
			texts = append(texts, text)
		}
		return strings.Join(texts, "\n"), true, nil
	default:
		return "", false, invalidField(path, "%s must be a string or an array of text parts, got %s", path, jsonKind(raw))
	}
}

func decodeTextPart(path string, raw json.RawMessage) (string, error) {
	part, err := parseObject(path, raw)
	if err != nil {
		return "", err
	}
	typ, ok, err := part.string("type")
	if err != nil {
		return "", err
	}
	if !ok {
		return "", invalidField(part.child("type"), "%s is required", part.child("type"))
	}
	if typ != "text" {
		return "", invalidField(part.child("type"),
			"%s is %s, but this server is text-only: send {\"type\": \"text\", \"text\": ...}", part.child("type"), quote(typ))
	}
	text, ok, err := part.string("text")
	if err != nil {
		return "", err
	}
	if !ok {
		return "", invalidField(part.child("text"), "%s is required", part.child("text"))
	}
	return text, nil
}

// decodeHistoryToolCalls reads the tool_calls of an earlier assistant turn.
func decodeHistoryToolCalls(o jsonObject) ([]ToolCall, error) {
	items, ok, err := o.array("tool_calls")
	if err != nil || !ok {
		return nil, err
	}
	calls := make([]ToolCall, 0, len(items))
	for i, raw := range items {
		path := index(o.child("tool_calls"), i)
		co, err := parseObject(path, raw)
		if err != nil {
			return nil, err
		}
		var call ToolCall
		if call.ID, _, err = co.string("id"); err != nil {
			return nil, err
		}
		if typ, ok, err := co.string("type"); err != nil {
			return nil, err
		} else if ok && typ != "function" {
			return nil, invalidField(co.child("type"), "%s must be \"function\", got %s", co.child("type"), quote(typ))
		}
		fn, ok, err := co.object("function")
		if err != nil {
			return nil, err
		}
		if !ok {
			return nil, invalidField(co.child("function"), "%s is required", co.child("function"))
		}
		if call.Name, ok, err = fn.string("name"); err != nil {
			return nil, err
		} else if !ok || call.Name == "" {
			return nil, invalidField(fn.child("name"), "%s is required", fn.child("name"))
		}
		if call.Arguments, err = decodeHistoryArguments(fn); err != nil {
			return nil, err
		}
		calls = append(calls, call)
	}
	return calls, nil
}

// decodeHistoryArguments returns the arguments as JSON text of an object. OpenAI sends a
// string; an object is accepted too, as several clients send one.
func decodeHistoryArguments(fn jsonObject) (string, error) {
	path := fn.child("arguments")
	raw, ok := fn.lookup("arguments")
	if !ok {
		return "{}", nil
	}
	var text string
	switch jsonKind(raw) {
	case "object":
		var buf bytes.Buffer
		if err := json.Compact(&buf, raw); err != nil {
			return "", invalidField(path, "%s is not valid JSON: %v", path, err)
		}
		return buf.String(), nil
	case "string":
		s, err := decodeString(path, raw)
		if err != nil {
			return "", err
		}
		text = s
	default:
		return "", invalidField(path, "%s must be a JSON string holding an object, got %s", path, jsonKind(raw))
	}
	if strings.TrimSpace(text) == "" {
		return "{}", nil
	}
	if jsonKind(json.RawMessage(text)) != "object" || !json.Valid([]byte(text)) {
		return "", invalidField(path, "%s must be a JSON string holding an object, got %s", path, quote(text))
	}
	return text, nil
}

// decodeTools reads "tools": an array of {"type": "function", "function": {name,
// description, parameters}}.
func decodeTools(o jsonObject) ([]Tool, error) {
	items, ok, err := o.array("tools")
	if err != nil || !ok {
		return nil, err
	}
	tools := make([]Tool, 0, len(items))
	seen := make(map[string]bool, len(items))
	for i, raw := range items {
		path := index("tools", i)
		to, err := parseObject(path, raw)
		if err != nil {
			return nil, err
		}
		typ, _, err := to.string("type")
		if err != nil {
			return nil, err
		}
		if typ != "function" {
			return nil, invalidField(to.child("type"), "%s must be \"function\", got %s", to.child("type"), quote(typ))
		}
		fn, ok, err := to.object("function")
		if err != nil {
			return nil, err
		}
		if !ok {
			return nil, invalidField(to.child("function"), "%s is required", to.child("function"))
		}
		tool := Tool{Raw: append(json.RawMessage(nil), bytes.TrimSpace(raw)...)}
		if tool.Name, ok, err = fn.string("name"); err != nil {
			return nil, err
		} else if !ok || tool.Name == "" {
			return nil, invalidField(fn.child("name"), "%s is required", fn.child("name"))
		}
		if seen[tool.Name] {
			return nil, invalidField(fn.child("name"), "%s: tool %s is declared twice", fn.child("name"), quote(tool.Name))
		}
		seen[tool.Name] = true
		if tool.Description, _, err = fn.string("description"); err != nil {
			return nil, err
		}
		if _, ok, err := fn.object("parameters"); err != nil {
			return nil, err
		} else if ok {
			tool.Parameters = append(json.RawMessage(nil), bytes.TrimSpace(fn.fields["parameters"])...)
			tool.SchemaParam = fn.child("parameters")
		}
		if _, _, err := fn.boolean("strict"); err != nil {
			return nil, err
		}
		tools = append(tools, tool)
	}
	return tools, nil
}

// decodeToolChoice reads "tool_choice": "none", "auto", "required", or
// {"type": "function", "function": {"name": ...}} naming a declared tool.
func decodeToolChoice(o jsonObject, tools []Tool) (toolChoice, error) {
	raw, ok := o.lookup("tool_choice")
	if !ok {
		return toolChoice{Mode: "auto"}, nil
	}
	var choice toolChoice
	switch jsonKind(raw) {
	case "string":
		s, err := decodeString("tool_choice", raw)
		if err != nil {
			return choice, err
		}
		if s != "none" && s != "auto" && s != "required" {
			return choice, invalidField("tool_choice",
				"tool_choice must be \"none\", \"auto\", \"required\" or a function object, got %s", quote(s))
		}
		choice.Mode = s
	case "object":
		co, err := parseObject("tool_choice", raw)
		if err != nil {
			return choice, err
		}
		typ, _, err := co.string("type")
		if err != nil {
			return choice, err
		}
		if typ != "function" {
			return choice, invalidField("tool_choice.type", "tool_choice.type must be \"function\", got %s", quote(typ))
		}
		fn, ok, err := co.object("function")
		if err != nil {
			return choice, err
		}
		name := ""
		if ok {
			if name, _, err = fn.string("name"); err != nil {
				return choice, err
			}
		}
		if name == "" {
			return choice, invalidField("tool_choice.function.name", "tool_choice.function.name is required")
		}
		choice = toolChoice{Mode: "function", Function: name}
	default:
		return choice, invalidField("tool_choice", "tool_choice must be a string or an object, got %s", jsonKind(raw))
	}
	if choice.Mode == "required" && len(tools) == 0 {
		return choice, invalidField("tool_choice", "tool_choice is \"required\" but no tools were given")
	}
	if choice.Mode == "function" {
		found := false
		for _, t := range tools {
			found = found || t.Name == choice.Function
		}
		if !found {
			return choice, invalidField("tool_choice.function.name",
				"tool_choice names function %s, which is not among the tools", quote(choice.Function))
		}
	}
	return choice, nil
}

// reservedTemplateArgs are the template variables that the renderer sets from the request
// itself (as transformers' apply_chat_template does), with the request field to use instead.
// Refusing them here names the field at fault; the template would refuse them later, and its
// error would be reported against the messages.
var reservedTemplateArgs = map[string]string{
	"messages":              "send the conversation in messages",
	"tools":                 "send tools in tools",
	"documents":             "this server takes no documents",
	"add_generation_prompt": "the server always adds the generation prompt",
}

// decodeTemplateArgs reads "chat_template_kwargs" (an extension shared by vLLM and mlx-lm):
// enable_thinking is lifted out, the rest passed to the template as they are.
func decodeTemplateArgs(o jsonObject) (TemplateOptions, error) {
	var opts TemplateOptions
	kwargs, ok, err := o.object("chat_template_kwargs")
	if err != nil || !ok {
		return opts, err
	}
	if v, ok, err := kwargs.boolean("enable_thinking"); err != nil {
		return opts, err
	} else if ok {
		opts.EnableThinking = &v
	}
	// In name order, so that a request with several bad entries always hears of the same one.
	for _, name := range slices.Sorted(maps.Keys(kwargs.fields)) {
		raw := kwargs.fields[name]
		if name == "enable_thinking" {
			continue
		}
		if hint, ok := reservedTemplateArgs[name]; ok {
			return opts, invalidField(kwargs.child(name), "%s is set by the server and cannot be overridden; %s",
				kwargs.child(name), hint)
		}
		var v any
		if err := json.Unmarshal(raw, &v); err != nil {
			return opts, invalidField(kwargs.child(name), "%s is not valid JSON: %v", kwargs.child(name), err)
		}
		if opts.ExtraArgs == nil {
			opts.ExtraArgs = make(map[string]any)
		}
		opts.ExtraArgs[name] = v
	}
	return opts, nil
}
