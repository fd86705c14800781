package server

import (
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"unicode"
)

// checkModel accepts an absent model, the backend's id and the configured aliases.
func (s *Server) checkModel(model string) error {
	if model == "" || model == s.backend.ModelID() || slices.Contains(s.cfg.ModelAliases, model) {
		return nil
	}
	return &apiError{Status: http.StatusNotFound, Type: typeInvalidRequest, Param: "model", Code: "model_not_found",
		Message: "the model " + quote(model) + " does not exist; this server serves " + quote(s.backend.ModelID())}
}

// checkPromptBytes refuses, before tokenization, prompt text that cannot fit: a token covers
// at most maxTokenBytes bytes, so text of more than (context-1)*maxTokenBytes bytes makes at
// least as many tokens as the context holds, and leaves no room for the answer. Whatever a
// tokenizer makes of shorter text, it is tokenized and measured, so no prompt that would fit
// is refused.
func (s *Server) checkPromptBytes(textBytes int, promptParam string) error {
	contextLen := s.backend.ContextLength()
	perToken := DefaultMaxTokenBytes
	if b, ok := s.backend.(TokenBounder); ok && b.MaxTokenBytes() > 0 {
		perToken = b.MaxTokenBytes()
	}
	if textBytes <= (contextLen-1)*perToken {
		return nil
	}
	atLeast := (textBytes + perToken - 1) / perToken
	return &apiError{Status: http.StatusBadRequest, Type: typeInvalidRequest, Param: promptParam,
		Code: "context_length_exceeded",
		Message: fmt.Sprintf("%s: %d bytes of text, so at least %d tokens (a token covers at most %d bytes), "+
			"but the model's context is %d tokens and the answer needs at least one", promptParam, textBytes, atLeast,
			perToken, contextLen)}
}

// promptError is the client error for a prompt the backend could not make: a prompt too
// long for the context is context_length_exceeded, anything else a 400 naming the field.
func (s *Server) promptError(err error, param, what string) error {
	var long *PromptTooLongError
	if errors.As(err, &long) {
		return &apiError{Status: http.StatusBadRequest, Type: typeInvalidRequest, Param: param,
			Code: "context_length_exceeded",
			Message: fmt.Sprintf("%s: at least %d tokens, but the model's context is %d tokens and the answer needs at least one",
				param, long.AtLeast, s.backend.ContextLength())}
	}
	return invalidField(param, "%s: %v", what, err)
}

// chatTextBytes is the part of a conversation's text that any chat template renders: the
// contents of system, user and tool messages, less the whitespace around them (a template
// may trim it). Assistant turns are left out, as templates drop earlier reasoning from them.
func chatTextBytes(msgs []ChatMessage) int {
	n := 0
	for _, m := range msgs {
		if m.Role != "assistant" {
			n += len(strings.TrimFunc(m.Content, isTemplateSpace))
		}
	}
	return n
}

// isTemplateSpace is whitespace as Jinja's trim (Python's str.strip) sees it: Unicode
// White_Space and the ASCII separators U+001C..U+001F.
func isTemplateSpace(r rune) bool { return unicode.IsSpace(r) || r >= 0x1c && r <= 0x1f }

// planGeneration applies defaults and limits to the request's fields and the prompt.
//
// Context policy: the prompt must leave at least one token of the context free. An
// explicit max_tokens must fit in what is left (otherwise 400 context_length_exceeded, as
// OpenAI answers); without one, the answer gets DefaultMaxTokens shortened to what is left,
// and ends with finish_reason "length" when it runs out. max_tokens above MaxTokensLimit
// is a 400 whatever the prompt.
func (s *Server) planGeneration(id string, c commonRequest, prompt Prompt, promptParam string) (GenerateRequest, error) {
	contextLen := s.backend.ContextLength()
	n := len(prompt.Tokens)
	if n == 0 {
		return GenerateRequest{}, invalidField(promptParam, "%s is empty after tokenization; send some text", promptParam)
	}
	if n >= contextLen {
		return GenerateRequest{}, &apiError{Status: http.StatusBadRequest, Type: typeInvalidRequest, Param: promptParam,
			Code: "context_length_exceeded",
			Message: fmt.Sprintf("%s: %d tokens, but the model's context is %d tokens and the answer needs at least one",
				promptParam, n, contextLen)}
	}
	room := contextLen - n
	limit := s.cfg.MaxTokensLimit
	if limit == 0 {
		limit = contextLen
	}
	var maxTokens int
	switch {
	case c.MaxTokens != nil && c.MaxTokensIsCap:
		maxTokens = min(*c.MaxTokens, limit, room)
	case c.MaxTokens != nil:
		maxTokens = *c.MaxTokens
		if maxTokens > limit {
			return GenerateRequest{}, invalidField(c.MaxTokensParam, "%s is %d, more than this server's limit of %d",
				c.MaxTokensParam, maxTokens, limit)
		}
		if maxTokens > room {
			return GenerateRequest{}, &apiError{Status: http.StatusBadRequest, Type: typeInvalidRequest,
				Param: c.MaxTokensParam, Code: "context_length_exceeded",
				Message: fmt.Sprintf("the model's context is %d tokens, but %d were requested (%d in the %s, %d in %s); "+
					"shorten the %s or lower %s to at most %d", contextLen, n+maxTokens, n, promptParam, maxTokens,
					c.MaxTokensParam, promptParam, c.MaxTokensParam, room)}
		}
	default:
		maxTokens = min(s.cfg.DefaultMaxTokens, limit, room)
	}

	req := GenerateRequest{
		ID: id, Prompt: prompt.Tokens, MaxTokens: maxTokens,
		Temperature: s.cfg.DefaultTemperature, TopP: s.cfg.DefaultTopP,
		Seed: c.Seed, Stop: c.Stop,
	}
	if c.Temperature != nil {
		req.Temperature = *c.Temperature
	}
	if c.TopP != nil {
		req.TopP = *c.TopP
	}
	if c.TopK != nil {
		req.TopK = *c.TopK
	}
	if c.MinP != nil {
		req.MinP = *c.MinP
	}
	if req.TopP == 0 {
		// top_p 0 keeps only the most likely token: that is greedy decoding, which the
		// backend does exactly with temperature 0.
		req.Temperature, req.TopP = 0, 1
	}
	var err error
	if req.Constraint, err = s.answerConstraint(c.Format); err != nil {
		return GenerateRequest{}, err
	}
	return req, nil
}
