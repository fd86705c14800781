package server

import (
	"errors"
	"fmt"
	"io"
	"net/http"
)

// readBody reads the whole request body, refusing bodies over Config.MaxBodyBytes with 413.
// Reading it all matters: net/http watches for a client hang-up (and cancels the request
// context, and so the generation) only once the body is consumed.
func (s *Server) readBody(w http.ResponseWriter, r *http.Request) ([]byte, error) {
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, s.cfg.MaxBodyBytes))
	if err != nil {
		var tooLarge *http.MaxBytesError
		if errors.As(err, &tooLarge) {
			return nil, &apiError{Status: http.StatusRequestEntityTooLarge, Type: typeInvalidRequest, Code: "request_too_large",
				Message: fmt.Sprintf("the request body is larger than this server's limit of %d bytes", tooLarge.Limit)}
		}
		return nil, badRequest("invalid_body", "reading the request body failed: %v", err)
	}
	return body, nil
}

// writeAPIError answers with err, which should be an *apiError; anything else is a server
// bug and becomes a 500.
func writeAPIError(w http.ResponseWriter, err error) {
	writeAPIErrorAs(w, err, writeError)
}

func (s *Server) handleChatCompletions(w http.ResponseWriter, r *http.Request) {
	body, err := s.readBody(w, r)
	if err != nil {
		writeAPIError(w, err)
		return
	}
	req, err := decodeChatRequest(body)
	if err != nil {
		writeAPIError(w, err)
		return
	}
	if err := s.checkModel(req.Model); err != nil {
		writeAPIError(w, err)
		return
	}
	g, err := s.planChat(infoFrom(r.Context()).id, req, "messages")
	if err != nil {
		writeAPIError(w, err)
		return
	}
	meta := newAnswerMeta("chatcmpl-", s.backend.ModelID(), req.Stream && req.IncludeUsage)
	var out answerWriter = &chatCollector{meta: meta, w: w, writeTimeout: s.cfg.WriteTimeout}
	if req.Stream {
		out = &chatStreamer{meta: meta, stream: newSSEStream(w, s.cfg.WriteTimeout)}
	}
	s.runGeneration(w, r, g, out)
}

func (s *Server) handleCompletions(w http.ResponseWriter, r *http.Request) {
	body, err := s.readBody(w, r)
	if err != nil {
		writeAPIError(w, err)
		return
	}
	req, err := decodeCompletionRequest(body)
	if err != nil {
		writeAPIError(w, err)
		return
	}
	if err := s.checkModel(req.Model); err != nil {
		writeAPIError(w, err)
		return
	}
	if err := s.checkPromptBytes(len(req.Prompt), "prompt"); err != nil {
		writeAPIError(w, err)
		return
	}
	prompt, err := s.backend.TextPrompt(req.Prompt)
	if err != nil {
		writeAPIError(w, s.promptError(err, "prompt", "the prompt could not be tokenized"))
		return
	}
	info := infoFrom(r.Context())
	genReq, err := s.planGeneration(info.id, req.commonRequest, prompt, "prompt")
	if err != nil {
		writeAPIError(w, err)
		return
	}
	meta := newAnswerMeta("cmpl-", s.backend.ModelID(), req.Stream && req.IncludeUsage)
	var out answerWriter = &textCollector{meta: meta, w: w, writeTimeout: s.cfg.WriteTimeout}
	if req.Stream {
		out = &textStreamer{meta: meta, stream: newSSEStream(w, s.cfg.WriteTimeout)}
	}
	s.runGeneration(w, r, plainTextGeneration(genReq), out)
}
