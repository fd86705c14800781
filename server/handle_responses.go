package server

import (
	"bytes"
	"encoding/json"
	"net/http"
	"slices"
	"strings"
	"time"
)

// handleResponses answers POST /v1/responses: the request becomes a chat conversation
// (instructions, the chained responses' turns, the input items) and runs on the same
// generation path as chat completions.
func (s *Server) handleResponses(w http.ResponseWriter, r *http.Request) {
	req, history, chat, err := s.decodeResponses(w, r)
	if err != nil {
		writeAPIError(w, err)
		return
	}
	info := infoFrom(r.Context())
	g, err := s.planChat(info.id, chat, "input")
	if err != nil {
		writeAPIError(w, err)
		return
	}
	meta := s.responseMeta(req, g.req)
	meta.finished = func(obj *responseObject, items []*outputItem) {
		if req.Store {
			s.storeResponse(obj, slices.Concat(history, req.Input, outputMessages(items)), items)
		}
	}
	var out answerWriter = &responsesCollector{meta: meta, w: w, writeTimeout: s.cfg.WriteTimeout}
	if req.Stream {
		out = newResponsesStreamer(meta, newSSEStream(w, s.cfg.WriteTimeout))
	}
	s.runGeneration(w, r, g, out)
}

// handleInputTokens answers POST /v1/responses/input_tokens: the tokens the same request
// to /v1/responses would put in the prompt.
func (s *Server) handleInputTokens(w http.ResponseWriter, r *http.Request) {
	_, _, chat, err := s.decodeResponses(w, r)
	if err != nil {
		writeAPIError(w, err)
		return
	}
	rc, err := s.renderChat(chat, "input")
	if err != nil {
		writeAPIError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"object": "response.input_tokens", "input_tokens": len(rc.prompt.Tokens)})
}

// decodeResponses reads a Responses request and builds its conversation: the instructions,
// the turns of the response it continues, and its input. history is those earlier turns.
func (s *Server) decodeResponses(w http.ResponseWriter, r *http.Request) (*responsesRequest, []ChatMessage, *chatRequest, error) {
	body, err := s.readBody(w, r)
	if err != nil {
		return nil, nil, nil, err
	}
	req, err := decodeResponsesRequest(body)
	if err != nil {
		return nil, nil, nil, err
	}
	if err := s.checkModel(req.Model); err != nil {
		return nil, nil, nil, err
	}
	var history []ChatMessage
	if req.PreviousResponseID != "" {
		prev, ok := s.responses.get(req.PreviousResponseID)
		if !ok {
			return nil, nil, nil, &apiError{Status: http.StatusNotFound, Type: typeInvalidRequest, Param: "previous_response_id",
				Code: "previous_response_not_found",
				Message: "previous response " + quote(req.PreviousResponseID) +
					" is not stored here: it was never stored (store: false), was deleted, or the store evicted it"}
		}
		history = prev.history
	}
	if req.Input, err = decodeInput(req.rawInput, history, s.responses.item); err != nil {
		return nil, nil, nil, err
	}
	var msgs []ChatMessage
	if req.Instructions != nil && strings.TrimSpace(*req.Instructions) != "" {
		msgs = append(msgs, ChatMessage{Role: "system", Content: *req.Instructions})
	}
	msgs = foldSystemTurns(append(append(msgs, history...), req.Input...))
	chat := &chatRequest{commonRequest: req.commonRequest, Messages: msgs, Tools: req.Tools, ToolChoice: req.ToolChoice,
		ParallelToolCalls: req.ParallelToolCalls, Template: req.Template}
	return req, history, chat, nil
}

// responseMeta is the response object's fields known before generation.
func (s *Server) responseMeta(req *responsesRequest, gen GenerateRequest) *responseMeta {
	obj := responseObject{
		ID: randomID("resp_"), Object: "response", CreatedAt: time.Now().Unix(), Status: "in_progress",
		Instructions: req.Instructions, MaxOutputTokens: req.MaxTokens, Model: s.backend.ModelID(),
		Output: []any{}, ParallelToolCalls: req.ParallelToolCalls, Reasoning: reasoningConfigJSON{Effort: req.Effort},
		Store: req.Store, Temperature: &gen.Temperature, ToolChoice: req.ToolChoiceEcho, Tools: req.ToolsEcho,
		TopP: &gen.TopP, Truncation: "disabled", Metadata: req.Metadata,
	}
	if obj.Tools == nil {
		obj.Tools = []json.RawMessage{}
	}
	if obj.Metadata == nil {
		obj.Metadata = json.RawMessage("{}")
	}
	if req.PreviousResponseID != "" {
		obj.PreviousResponseID = &req.PreviousResponseID
	}
	obj.Text.Format = req.FormatEcho
	if obj.Text.Format == nil {
		obj.Text.Format = json.RawMessage(`{"type":"text"}`)
	}
	return &responseMeta{object: obj}
}

// storeResponse keeps a finished response for GET, chaining and item_reference.
func (s *Server) storeResponse(obj *responseObject, history []ChatMessage, items []*outputItem) {
	raw, err := marshalJSON(obj)
	if err != nil {
		s.log.Error("encoding a response to store it", "id", obj.ID, "err", err)
		return
	}
	// Cloned to their length: an encoder's buffer has up to twice the capacity, which the
	// store would keep and not account.
	e := &storedResponse{id: obj.ID, object: bytes.Clone(raw), history: history,
		items: make(map[string]json.RawMessage, len(items))}
	for _, it := range items {
		if b, err := marshalJSON(it.wire(true)); err == nil {
			e.items[it.id] = bytes.Clone(b)
		}
	}
	if !s.responses.put(e) {
		s.log.Warn("response not stored: larger than the whole response store", "id", obj.ID, "bytes", e.size)
	}
}

// handleStoredResponse answers GET and DELETE /v1/responses/{id}.
func (s *Server) handleStoredResponse(w http.ResponseWriter, r *http.Request) {
	id := strings.TrimPrefix(r.URL.Path, responsePathPrefix)
	missing := &apiError{Status: http.StatusNotFound, Type: typeInvalidRequest, Code: "not_found",
		Message: "no stored response " + quote(id) + " (never stored, deleted, or evicted from the store)"}
	if r.Method == http.MethodDelete {
		if !s.responses.delete(id) {
			writeError(w, missing)
			return
		}
		writeJSON(w, http.StatusOK, map[string]any{"id": id, "object": "response.deleted", "deleted": true})
		return
	}
	e, ok := s.responses.get(id)
	if !ok {
		writeError(w, missing)
		return
	}
	writeJSON(w, http.StatusOK, json.RawMessage(e.object))
}
