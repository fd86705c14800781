package server

import (
	"net/http"
)

// handleMessages answers POST /v1/messages (Anthropic): the request becomes a chat
// conversation and runs on the same generation path as chat completions; errors take
// Anthropic's shape.
func (s *Server) handleMessages(w http.ResponseWriter, r *http.Request) {
	req, ok := s.readMessagesRequest(w, r, false)
	if !ok {
		return
	}
	info := infoFrom(r.Context())
	g, err := s.planChat(info.id, &req.chat, "messages")
	if err != nil {
		writeAPIErrorAs(w, err, writeAnthropicError)
		return
	}
	// The server applies the stop sequences itself, so that it knows which one matched.
	g.serverStops, g.writeError = req.StopSequences, writeAnthropicError
	base := anthropicMessage{ID: randomID("msg_"), Type: "message", Role: "assistant", Model: s.backend.ModelID(),
		Content: []any{}, Usage: anthropicUsage{InputTokens: len(g.req.Prompt)}}
	if req.chat.Model != "" {
		base.Model = req.chat.Model
	}
	var out answerWriter = &messagesCollector{base: base, w: w, writeTimeout: s.cfg.WriteTimeout}
	if req.chat.Stream {
		out = newMessagesStreamer(base, newSSEStream(w, s.cfg.WriteTimeout))
	}
	s.runGeneration(w, r, g, out)
}

// handleCountTokens answers POST /v1/messages/count_tokens with the prompt's length as a
// generation would render it.
func (s *Server) handleCountTokens(w http.ResponseWriter, r *http.Request) {
	req, ok := s.readMessagesRequest(w, r, true)
	if !ok {
		return
	}
	rc, err := s.renderChat(&req.chat, "messages")
	if err != nil {
		writeAPIErrorAs(w, err, writeAnthropicError)
		return
	}
	writeJSON(w, http.StatusOK, map[string]int{"input_tokens": len(rc.prompt.Tokens)})
}

// readMessagesRequest reads and decodes a Messages request (countOnly: the
// count_tokens subset) and checks its model; on a problem it answers with Anthropic's
// error shape and reports false.
func (s *Server) readMessagesRequest(w http.ResponseWriter, r *http.Request, countOnly bool) (*messagesRequest, bool) {
	body, err := s.readBody(w, r)
	if err == nil {
		var req *messagesRequest
		if req, err = decodeMessagesRequest(body, countOnly); err == nil {
			if err = s.checkModel(req.chat.Model); err == nil {
				return req, true
			}
		}
	}
	writeAPIErrorAs(w, err, writeAnthropicError)
	return nil, false
}
