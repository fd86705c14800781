package server

import (
	"bytes"
	"encoding/json"
	"slices"
)

// responsesRequest is a validated POST /v1/responses request.
type responsesRequest struct {
	commonRequest
	// Input is the conversation this request adds (its input items as messages), without
	// instructions or earlier turns: what a stored response replays to a later request.
	Input              []ChatMessage
	Instructions       *string
	PreviousResponseID string
	Store              bool
	Tools              []Tool
	ToolChoice         toolChoice
	ParallelToolCalls  bool
	Template           TemplateOptions
	// ToolsEcho, ToolChoiceEcho and Metadata are sent back in the response object as the
	// client gave them.
	ToolsEcho      []json.RawMessage
	ToolChoiceEcho json.RawMessage
	Metadata       json.RawMessage
	// FormatEcho is text.format as the client gave it (nil: text).
	FormatEcho json.RawMessage
	Effort     *string
	// rawInput holds the input items, decoded once the previous response is known (a
	// function_call_output may answer a call made in an earlier turn).
	rawInput json.RawMessage
}

// responseToolJSON is a function tool in the Responses shape, as echoed in responses.
type responseToolJSON struct {
	Type        string          `json:"type"`
	Name        string          `json:"name"`
	Description *string         `json:"description,omitempty"`
	Parameters  json.RawMessage `json:"parameters,omitempty"`
	Strict      *bool           `json:"strict,omitempty"`
}

// chatToolJSON is the same tool in the chat-completions shape, which chat templates render.
type chatToolJSON struct {
	Type     string         `json:"type"`
	Function chatToolFnJSON `json:"function"`
}

type chatToolFnJSON struct {
	Name        string          `json:"name"`
	Description string          `json:"description,omitempty"`
	Parameters  json.RawMessage `json:"parameters,omitempty"`
}

// decodeResponsesRequest parses and validates a Responses request body. Every failure is an
// *apiError with status 400 naming the field.
func decodeResponsesRequest(body []byte) (*responsesRequest, error) {
	o, err := parseBody(body)
	if err != nil {
		return nil, err
	}
	req := &responsesRequest{Store: true, ParallelToolCalls: true}
	if req.Model, _, err = o.string("model"); err != nil {
		return nil, err
	}
	if err := decodeResponsesScalars(o, req); err != nil {
		return nil, err
	}
	if err := refuseResponsesUnsupported(o); err != nil {
		return nil, err
	}
	if err := decodeResponseFormat(o, req); err != nil {
		return nil, err
	}
	if req.Tools, req.ToolsEcho, err = decodeResponseTools(o); err != nil {
		return nil, err
	}
	if err := decodeResponseToolChoice(o, req); err != nil {
		return nil, err
	}
	if req.Template, err = decodeTemplateArgs(o); err != nil {
		return nil, err
	}
	if err := decodeReasoning(o, req); err != nil {
		return nil, err
	}
	raw, ok := o.lookup("input")
	if !ok {
		return nil, invalidField("input", "input is required: a string or an array of input items")
	}
	if k := jsonKind(raw); k != "string" && k != "array" {
		return nil, invalidField("input", "input must be a string or an array of input items, got %s", k)
	}
	req.rawInput = raw
	return req, nil
}

func decodeResponsesScalars(o jsonObject, req *responsesRequest) error {
	var err error
	if v, ok, err := o.integer("max_output_tokens"); err != nil {
		return err
	} else if ok {
		if v < 1 || v > 1<<31-1 {
			return invalidField("max_output_tokens", "max_output_tokens must be between 1 and %d, got %d", 1<<31-1, v)
		}
		n := int(v)
		req.MaxTokens, req.MaxTokensParam, req.MaxTokensIsCap = &n, "max_output_tokens", true
	}
	if err := decodeSampling(o, &req.commonRequest); err != nil {
		return err
	}
	// "stop" is not in the Responses API; it is taken as an extension, as in chat.
	if req.Stop, err = decodeStop(o); err != nil {
		return err
	}
	if req.Stream, _, err = o.boolean("stream"); err != nil {
		return err
	}
	if v, ok, err := o.boolean("store"); err != nil {
		return err
	} else if ok {
		req.Store = v
	}
	if v, ok, err := o.boolean("parallel_tool_calls"); err != nil {
		return err
	} else if ok {
		req.ParallelToolCalls = v
	}
	if s, ok, err := o.string("instructions"); err != nil {
		return err
	} else if ok {
		req.Instructions = &s
	}
	if req.PreviousResponseID, _, err = o.string("previous_response_id"); err != nil {
		return err
	}
	if _, ok, err := o.object("metadata"); err != nil {
		return err
	} else if ok {
		req.Metadata = o.fields["metadata"]
	}
	for _, name := range []string{"user", "safety_identifier", "prompt_cache_key", "service_tier", "truncation"} {
		if _, _, err := o.string(name); err != nil {
			return err
		}
	}
	if _, _, err := o.array("include"); err != nil {
		return err
	}
	return nil
}

// refuseResponsesUnsupported refuses the fields whose meaning this server cannot honour, so
// that a client never gets an answer that silently ignored them.
func refuseResponsesUnsupported(o jsonObject) error {
	if v, _, err := o.boolean("background"); err != nil {
		return err
	} else if v {
		return unsupported("background", "background responses are not supported by this server; send the request without background")
	}
	if o.has("conversation") {
		return unsupported("conversation", "conversations are not supported by this server; chain responses with previous_response_id")
	}
	if v, _, err := o.integer("top_logprobs"); err != nil {
		return err
	} else if v > 0 {
		return unsupported("top_logprobs", "top_logprobs is not supported by this server")
	}
	return nil
}

// decodeResponseFormat reads text.format: {"type": "text"}, {"type": "json_object"} or
// {"type": "json_schema", name, schema, strict?, description?}, kept to echo.
func decodeResponseFormat(o jsonObject, req *responsesRequest) error {
	text, ok, err := o.object("text")
	if err != nil || !ok {
		return err
	}
	format, ok, err := text.object("format")
	if err != nil || !ok {
		return err
	}
	if req.Format, err = decodeFormat(format, false); err != nil {
		return err
	}
	req.FormatEcho = append(json.RawMessage(nil), bytes.TrimSpace(text.fields["format"])...)
	return nil
}

// decodeResponseTools reads the Responses tools. Function tools, {type: "function", name,
// description?, parameters?, strict?}, are offered to the model. Every other type is left
// out of the prompt: hosted tools (web_search, file_search, code_interpreter, ...) run on
// OpenAI's side, and client structures this server cannot render (namespace groups, custom
// grammar tools) have no form in the chat template. Agents send them whatever the provider
// (Codex sends a web_search tool and a namespace of sub-agent tools with every turn), so
// refusing them would refuse the agent; the model simply is not offered them, and a
// tool_choice naming one is refused.
func decodeResponseTools(o jsonObject) ([]Tool, []json.RawMessage, error) {
	items, ok, err := o.array("tools")
	if err != nil || !ok {
		return nil, nil, err
	}
	tools := make([]Tool, 0, len(items))
	echo := make([]json.RawMessage, 0, len(items))
	for i, raw := range items {
		to, err := parseObject(index("tools", i), raw)
		if err != nil {
			return nil, nil, err
		}
		typ, _, err := to.string("type")
		if err != nil {
			return nil, nil, err
		}
		if typ == "" {
			return nil, nil, invalidField(to.child("type"), "%s is required", to.child("type"))
		}
		if typ != "function" {
			continue
		}
		var wire responseToolJSON
		wire.Type = "function"
		var ok bool
		if wire.Name, ok, err = to.string("name"); err != nil {
			return nil, nil, err
		} else if !ok || wire.Name == "" {
			return nil, nil, invalidField(to.child("name"), "%s is required", to.child("name"))
		}
		if slices.ContainsFunc(tools, func(t Tool) bool { return t.Name == wire.Name }) {
			return nil, nil, invalidField(to.child("name"), "%s: tool %s is declared twice", to.child("name"), quote(wire.Name))
		}
		if d, ok, err := to.string("description"); err != nil {
			return nil, nil, err
		} else if ok {
			wire.Description = &d
		}
		if wire.Parameters, err = decodeToolSchema(to, "parameters"); err != nil {
			return nil, nil, err
		}
		if v, ok, err := to.boolean("strict"); err != nil {
			return nil, nil, err
		} else if ok {
			wire.Strict = &v
		}
		tool, err := newFunctionTool(wire.Name, wire.Description, wire.Parameters)
		if err != nil {
			return nil, nil, err
		}
		tool.SchemaParam = to.child("parameters")
		echoed, err := marshalJSON(wire)
		if err != nil {
			return nil, nil, err
		}
		tools, echo = append(tools, tool), append(echo, echoed)
	}
	return tools, echo, nil
}

// decodeToolSchema reads a tool's JSON Schema field: an object whose type, when given, is
// "object" (arguments are always an object). Absent, it is nil.
func decodeToolSchema(o jsonObject, name string) (json.RawMessage, error) {
	schema, ok, err := o.object(name)
	if err != nil || !ok {
		return nil, err
	}
	if typ, ok := schema.lookup("type"); ok && string(bytes.TrimSpace(typ)) != `"object"` {
		return nil, invalidField(schema.child("type"), "%s must be \"object\": a tool's arguments are a JSON object, got %s",
			schema.child("type"), bytes.TrimSpace(typ))
	}
	var buf bytes.Buffer
	if err := json.Compact(&buf, o.fields[name]); err != nil {
		return nil, invalidField(o.child(name), "%s is not valid JSON: %v", o.child(name), err)
	}
	return buf.Bytes(), nil
}

// newFunctionTool builds a Tool with its chat-completions form as Raw, which is what chat
// templates render, whichever API declared it.
func newFunctionTool(name string, description *string, parameters json.RawMessage) (Tool, error) {
	fn := chatToolFnJSON{Name: name, Parameters: parameters}
	if description != nil {
		fn.Description = *description
	}
	raw, err := marshalJSON(chatToolJSON{Type: "function", Function: fn})
	if err != nil {
		return Tool{}, err
	}
	return Tool{Name: name, Description: fn.Description, Parameters: parameters, Raw: raw}, nil
}

// decodeResponseToolChoice reads tool_choice: "none", "auto", "required",
// {"type": "function", "name": ...}, or {"type": "allowed_tools", "mode": "auto"|"required",
// "tools": [{"type": "function", "name": ...}]}, which narrows the tools offered.
func decodeResponseToolChoice(o jsonObject, req *responsesRequest) error {
	raw, ok := o.lookup("tool_choice")
	if !ok {
		req.ToolChoice, req.ToolChoiceEcho = toolChoice{Mode: "auto"}, json.RawMessage(`"auto"`)
		return nil
	}
	req.ToolChoiceEcho = append(json.RawMessage(nil), bytes.TrimSpace(raw)...)
	switch jsonKind(raw) {
	case "string":
		s, err := decodeString("tool_choice", raw)
		if err != nil {
			return err
		}
		if s != "none" && s != "auto" && s != "required" {
			return invalidField("tool_choice", "tool_choice must be \"none\", \"auto\", \"required\" or an object, got %s", quote(s))
		}
		req.ToolChoice = toolChoice{Mode: s}
	case "object":
		co, err := parseObject("tool_choice", raw)
		if err != nil {
			return err
		}
		typ, _, err := co.string("type")
		if err != nil {
			return err
		}
		switch typ {
		case "function":
			name, _, err := co.string("name")
			if err != nil {
				return err
			}
			if name == "" {
				return invalidField("tool_choice.name", "tool_choice.name is required")
			}
			req.ToolChoice = toolChoice{Mode: "function", Function: name}
		case "allowed_tools":
			if err := decodeAllowedTools(co, req); err != nil {
				return err
			}
		default:
			return invalidField("tool_choice.type", "tool_choice.type must be \"function\" or \"allowed_tools\", got %s", quote(typ))
		}
	default:
		return invalidField("tool_choice", "tool_choice must be a string or an object, got %s", jsonKind(raw))
	}
	return checkToolChoice(req.ToolChoice, req.Tools, "tool_choice", "tool_choice.name")
}

func decodeAllowedTools(co jsonObject, req *responsesRequest) error {
	mode, _, err := co.string("mode")
	if err != nil {
		return err
	}
	if mode != "auto" && mode != "required" {
		return invalidField(co.child("mode"), "%s must be \"auto\" or \"required\", got %s", co.child("mode"), quote(mode))
	}
	items, _, err := co.array("tools")
	if err != nil {
		return err
	}
	allowed := map[string]bool{}
	for i, raw := range items {
		to, err := parseObject(index(co.child("tools"), i), raw)
		if err != nil {
			return err
		}
		name, _, err := to.string("name")
		if err != nil {
			return err
		}
		if !slices.ContainsFunc(req.Tools, func(t Tool) bool { return t.Name == name }) {
			return invalidField(to.child("name"), "%s names %s, which is not among the tools", to.child("name"), quote(name))
		}
		allowed[name] = true
	}
	req.Tools = slices.DeleteFunc(req.Tools, func(t Tool) bool { return !allowed[t.Name] })
	req.ToolChoice = toolChoice{Mode: mode}
	return nil
}

// checkToolChoice refuses a choice that cannot be met by the tools given.
func checkToolChoice(choice toolChoice, tools []Tool, modeParam, nameParam string) error {
	if choice.Mode == "required" && len(tools) == 0 {
		return invalidField(modeParam, "%s requires a tool call but no tools were given", modeParam)
	}
	if choice.Mode == "function" && !slices.ContainsFunc(tools, func(t Tool) bool { return t.Name == choice.Function }) {
		return invalidField(nameParam, "%s names function %s, which is not among the tools", modeParam, quote(choice.Function))
	}
	return nil
}

// decodeReasoning maps reasoning.effort onto the template's thinking switch: "none" turns
// thinking off, any other effort on; without it the template's default holds.
// chat_template_kwargs.enable_thinking, when also given, wins.
func decodeReasoning(o jsonObject, req *responsesRequest) error {
	r, ok, err := o.object("reasoning")
	if err != nil || !ok {
		return err
	}
	effort, ok, err := r.string("effort")
	if err != nil || !ok {
		return err
	}
	switch effort {
	case "none", "minimal", "low", "medium", "high", "xhigh":
	default:
		return invalidField(r.child("effort"), "%s must be one of none, minimal, low, medium, high, xhigh; got %s",
			r.child("effort"), quote(effort))
	}
	req.Effort = &effort
	if req.Template.EnableThinking == nil {
		req.Template.EnableThinking = ptr(effort != "none")
	}
	return nil
}
