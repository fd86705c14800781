package server

// renderedChat is a chat request after its tool policy was applied and the template ran.
type renderedChat struct {
	prompt  Prompt
	opts    TemplateOptions
	toolsOn bool
	format  ToolCallFormat
	// calls is the grammar of a forced tool call (nil: none, or the backend cannot
	// enforce one and the answer prefix starts the call).
	calls *Constraint
}

// renderChat applies the request's tool policy and renders the conversation through the
// model's chat template. Chat completions, responses and messages all come through here, so
// the three APIs build the same prompt for the same conversation. promptParam names the
// request field the conversation came from, for errors.
func (s *Server) renderChat(req *chatRequest, promptParam string) (renderedChat, error) {
	rc := renderedChat{opts: req.Template, format: s.toolCallFormat()}
	rc.toolsOn = len(req.Tools) > 0 && req.ToolChoice.Mode != "none"
	var tools []Tool
	if rc.toolsOn {
		tools = req.Tools
		forced := req.ToolChoice.Mode == "required" || req.ToolChoice.Mode == "function"
		var err error
		switch {
		case forced:
			rc.calls, err = s.toolConstraint(rc.format, req.Tools, req.ToolChoice.Function, !req.ParallelToolCalls, "tool_choice", nil)
		case req.Format != nil:
			// Tools the model may call, or a JSON answer: the grammar allows either.
			rc.calls, err = s.toolConstraint(rc.format, req.Tools, "", !req.ParallelToolCalls, "tools", req.Format)
		}
		if err != nil {
			return rc, err
		}
		if prefix := toolCallPrefix(rc.format, req.ToolChoice); prefix != "" && rc.calls == nil {
			// Forcing a tool call: the answer starts with the call, not with reasoning.
			rc.opts.ResponsePrefix, rc.opts.EnableThinking = prefix, ptr(false)
		}
		if rc.calls != nil {
			// The grammar makes the answer the call, with arguments valid for the tool's
			// schema (or, offered beside a JSON format, that JSON); it starts at once,
			// without reasoning.
			rc.opts.EnableThinking = ptr(false)
		}
	}
	if req.Format != nil && rc.calls == nil {
		// A structured answer is the JSON itself, without reasoning before it.
		rc.opts.EnableThinking = ptr(false)
	}
	if err := s.checkPromptBytes(chatTextBytes(req.Messages), promptParam); err != nil {
		return rc, err
	}
	prompt, err := s.backend.ChatPrompt(req.Messages, tools, rc.opts)
	if err != nil {
		return rc, s.promptError(err, promptParam, "the chat template could not render the conversation")
	}
	rc.prompt = prompt
	return rc, nil
}

// planChat renders a chat request and plans its generation: the output goes through the
// think splitter and the tool-call parser of the model's format.
func (s *Server) planChat(id string, req *chatRequest, promptParam string) (*generation, error) {
	rc, err := s.renderChat(req, promptParam)
	if err != nil {
		return nil, err
	}
	common := req.commonRequest
	if rc.calls != nil {
		common.Format = nil // a forced call's grammar replaces the answer's format
	}
	genReq, err := s.planGeneration(id, common, rc.prompt, promptParam)
	if err != nil {
		return nil, err
	}
	if rc.calls != nil {
		genReq.Constraint = rc.calls
	}
	maxCalls := 0
	if !req.ParallelToolCalls {
		maxCalls = 1
	}
	parser := newChatOutputParser(rc.toolsOn, maxCalls, rc.prompt.OpensInThinking && rc.opts.ResponsePrefix == "")
	parser.parseCall = toolCallParser(rc.format, req.Tools)
	g := &generation{req: genReq, parse: parser.feed, finish: parser.finish, toolCalls: parser.toolCalls,
		reasoning: parser.inReasoning, writeError: writeError, contextBound: req.MaxTokens != nil && genReq.MaxTokens < *req.MaxTokens &&
			genReq.MaxTokens == s.backend.ContextLength()-len(genReq.Prompt)}
	if rc.opts.ResponsePrefix != "" {
		g.initial = append([]chatEvent(nil), parser.feed(rc.opts.ResponsePrefix)...)
	}
	return g, nil
}
