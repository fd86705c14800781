package server

// messagesRequest is a validated Anthropic Messages request (POST /v1/messages, or
// /v1/messages/count_tokens, which has no max_tokens).
type messagesRequest struct {
	chat chatRequest
	// StopSequences are applied by the server, which reports the one that matched.
	StopSequences []string
}

// decodeMessagesRequest parses and validates a Messages request body; counting is true for
// count_tokens, which takes the same conversation without max_tokens. Every failure is an
// *apiError with status 400 naming the field.
func decodeMessagesRequest(body []byte, counting bool) (*messagesRequest, error) {
	o, err := parseBody(body)
	if err != nil {
		return nil, err
	}
	req := &messagesRequest{chat: chatRequest{ParallelToolCalls: true}}
	c := &req.chat
	if c.Model, _, err = o.string("model"); err != nil {
		return nil, err
	}
	if !counting {
		if err := decodeMessagesGeneration(o, req); err != nil {
			return nil, err
		}
	}
	if c.Template, err = decodeTemplateArgs(o); err != nil {
		return nil, err
	}
	if err := decodeThinking(o, req, counting); err != nil {
		return nil, err
	}
	if err := refuseMessagesUnsupported(o); err != nil {
		return nil, err
	}
	if err := decodeOutputFormat(o, c); err != nil {
		return nil, err
	}
	if c.Tools, err = decodeAnthropicTools(o); err != nil {
		return nil, err
	}
	if err := decodeAnthropicToolChoice(o, c); err != nil {
		return nil, err
	}
	system, err := decodeSystem(o)
	if err != nil {
		return nil, err
	}
	if c.Messages, err = decodeAnthropicMessages(o, system); err != nil {
		return nil, err
	}
	return req, nil
}

// decodeMessagesGeneration reads the fields only a generation has: max_tokens (required, as
// Anthropic requires it), sampling, stop sequences and stream.
func decodeMessagesGeneration(o jsonObject, req *messagesRequest) error {
	c := &req.chat
	v, ok, err := o.integer("max_tokens")
	if err != nil {
		return err
	}
	if !ok {
		return invalidField("max_tokens", "max_tokens is required: the most tokens the answer may have")
	}
	if v < 1 || v > 1<<31-1 {
		return invalidField("max_tokens", "max_tokens must be between 1 and %d, got %d", 1<<31-1, v)
	}
	n := int(v)
	c.MaxTokens, c.MaxTokensParam, c.MaxTokensIsCap = &n, "max_tokens", true
	// Anthropic's ranges: temperature and top_p in [0, 1], top_k a positive count.
	for _, f := range []struct {
		name string
		dst  **float64
	}{{"temperature", &c.Temperature}, {"top_p", &c.TopP}} {
		x, ok, err := o.number(f.name)
		if err != nil {
			return err
		}
		if ok {
			if x < 0 || x > 1 {
				return invalidField(f.name, "%s must be between 0 and 1, got %g", f.name, x)
			}
			*f.dst = &x
		}
	}
	if k, ok, err := o.integer("top_k"); err != nil {
		return err
	} else if ok {
		if k < 0 || k > 1<<31-1 {
			return invalidField("top_k", "top_k must be a positive integer, got %d", k)
		}
		kk := int(k)
		c.TopK = &kk
	}
	if c.Stream, _, err = o.boolean("stream"); err != nil {
		return err
	}
	stops, _, err := o.array("stop_sequences")
	if err != nil {
		return err
	}
	for i, raw := range stops {
		s, err := decodeString(index("stop_sequences", i), raw)
		if err != nil {
			return err
		}
		if s == "" {
			return invalidField(index("stop_sequences", i), "%s is empty; an empty stop sequence would end every answer at once",
				index("stop_sequences", i))
		}
		req.StopSequences = append(req.StopSequences, s)
	}
	return nil
}

// decodeThinking maps thinking onto the template's thinking switch: "enabled" turns it on,
// "disabled" off, "adaptive" leaves the template's default. chat_template_kwargs, when it
// also sets enable_thinking, wins.
func decodeThinking(o jsonObject, req *messagesRequest, counting bool) error {
	th, ok, err := o.object("thinking")
	if err != nil || !ok {
		return err
	}
	typ, _, err := th.string("type")
	if err != nil {
		return err
	}
	var on *bool
	switch typ {
	case "enabled":
		on = ptr(true)
	case "disabled":
		on = ptr(false)
	case "adaptive":
	default:
		return invalidField(th.child("type"), "%s must be \"enabled\", \"disabled\" or \"adaptive\", got %s", th.child("type"), quote(typ))
	}
	budget, hasBudget, err := th.integer("budget_tokens")
	if err != nil {
		return err
	}
	// As Anthropic requires: thinking counts against max_tokens, so its budget must be lower.
	if hasBudget && !counting && req.chat.MaxTokens != nil && budget >= int64(*req.chat.MaxTokens) {
		return invalidField(th.child("budget_tokens"), "%s (%d) must be less than max_tokens (%d)", th.child("budget_tokens"),
			budget, *req.chat.MaxTokens)
	}
	if on != nil && req.chat.Template.EnableThinking == nil {
		req.chat.Template.EnableThinking = on
	}
	return nil
}

func refuseMessagesUnsupported(o jsonObject) error {
	cfg, ok, err := o.object("output_config")
	if err != nil || !ok {
		return err
	}
	if _, _, err := cfg.string("effort"); err != nil {
		return err
	}
	return nil
}

// decodeOutputFormat reads output_config.format: {"type": "json_schema", "schema": …}.
func decodeOutputFormat(o jsonObject, c *chatRequest) error {
	cfg, ok, err := o.object("output_config")
	if err != nil || !ok {
		return err
	}
	format, ok, err := cfg.object("format")
	if err != nil || !ok {
		return err
	}
	if typ, _, err := format.string("type"); err != nil {
		return err
	} else if typ != "json_schema" {
		return invalidField(format.child("type"), "%s must be \"json_schema\", got %s", format.child("type"), quote(typ))
	}
	c.Format, err = decodeFormat(format, false)
	return err
}

// decodeAnthropicTools reads custom tools: {name, description?, input_schema}. Anthropic's
// server tools (bash, text editor, web search, computer, ...) have a versioned type and run
// on Anthropic's side; they are refused.
func decodeAnthropicTools(o jsonObject) ([]Tool, error) {
	items, ok, err := o.array("tools")
	if err != nil || !ok {
		return nil, err
	}
	tools := make([]Tool, 0, len(items))
	for i, raw := range items {
		to, err := parseObject(index("tools", i), raw)
		if err != nil {
			return nil, err
		}
		if typ, ok, err := to.string("type"); err != nil {
			return nil, err
		} else if ok && typ != "custom" {
			return nil, invalidField(to.child("type"),
				"%s is %s, a server tool this server does not run; declare custom tools with name, description and input_schema",
				to.child("type"), quote(typ))
		}
		name, ok, err := to.string("name")
		if err != nil {
			return nil, err
		}
		if !ok || name == "" {
			return nil, invalidField(to.child("name"), "%s is required", to.child("name"))
		}
		for _, t := range tools {
			if t.Name == name {
				return nil, invalidField(to.child("name"), "%s: tool %s is declared twice", to.child("name"), quote(name))
			}
		}
		var desc *string
		if d, ok, err := to.string("description"); err != nil {
			return nil, err
		} else if ok {
			desc = &d
		}
		if !to.has("input_schema") {
			return nil, invalidField(to.child("input_schema"), "%s is required: a JSON Schema object of the tool's input",
				to.child("input_schema"))
		}
		schema, err := decodeToolSchema(to, "input_schema")
		if err != nil {
			return nil, err
		}
		tool, err := newFunctionTool(name, desc, schema)
		if err != nil {
			return nil, err
		}
		tool.SchemaParam = to.child("input_schema")
		tools = append(tools, tool)
	}
	return tools, nil
}

// decodeAnthropicToolChoice reads {type: auto|any|tool|none, name?, disable_parallel_tool_use?}.
func decodeAnthropicToolChoice(o jsonObject, c *chatRequest) error {
	c.ToolChoice = toolChoice{Mode: "auto"}
	co, ok, err := o.object("tool_choice")
	if err != nil || !ok {
		return err
	}
	typ, _, err := co.string("type")
	if err != nil {
		return err
	}
	switch typ {
	case "auto":
	case "none":
		c.ToolChoice.Mode = "none"
	case "any":
		c.ToolChoice.Mode = "required"
	case "tool":
		name, _, err := co.string("name")
		if err != nil {
			return err
		}
		if name == "" {
			return invalidField("tool_choice.name", "tool_choice.name is required with type \"tool\"")
		}
		c.ToolChoice = toolChoice{Mode: "function", Function: name}
	default:
		return invalidField("tool_choice.type", "tool_choice.type must be auto, any, tool or none; got %s", quote(typ))
	}
	if v, _, err := co.boolean("disable_parallel_tool_use"); err != nil {
		return err
	} else if v {
		c.ParallelToolCalls = false
	}
	return checkToolChoice(c.ToolChoice, c.Tools, "tool_choice", "tool_choice.name")
}
