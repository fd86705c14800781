package server

import (
	"net/http"
	"time"
)

// responseMeta is what a response object says about its request; the writers fill in
// status, output and usage.
type responseMeta struct {
	object responseObject
	// finished is called with the final response (completed or incomplete) and its output
	// items: the handler stores it there when the request asked for that.
	finished func(obj *responseObject, items []*outputItem)
}

// responseBuilder turns chat events into output items, in the order the model wrote them:
// reasoning, message text and function calls each get their own item, and a change of kind
// closes the open item. send, when set, receives the streaming events as they happen.
type responseBuilder struct {
	items []*outputItem
	open  *outputItem
	send  func(typ string, fields map[string]any) error
}

func (b *responseBuilder) add(events []chatEvent) error {
	for _, ev := range events {
		var err error
		switch {
		case ev.ToolCall != nil:
			err = b.functionCall(*ev.ToolCall)
		case ev.Reasoning != "":
			err = b.text(itemReasoning, ev.Reasoning)
		case ev.Content != "":
			err = b.text(itemMessage, ev.Content)
		}
		if err != nil {
			return err
		}
	}
	return nil
}

func (b *responseBuilder) emit(typ string, fields map[string]any) error {
	if b.send == nil {
		return nil
	}
	return b.send(typ, fields)
}

func (b *responseBuilder) index(it *outputItem) int {
	for i, x := range b.items {
		if x == it {
			return i
		}
	}
	return -1
}

// start opens it, closing the open item; it is complete but for its streamed content (a
// function call has its call_id and name), as output_item.added carries them.
func (b *responseBuilder) start(it *outputItem) error {
	if err := b.closeOpen(); err != nil {
		return err
	}
	kind := it.kind
	b.items = append(b.items, it)
	if err := b.emit("response.output_item.added", map[string]any{"output_index": len(b.items) - 1, "item": it.wire(false)}); err != nil {
		return err
	}
	if kind == itemMessage {
		part := outputTextJSON{Type: "output_text", Text: "", Annotations: []any{}, Logprobs: []any{}}
		return b.emit("response.content_part.added", map[string]any{"item_id": it.id, "output_index": len(b.items) - 1,
			"content_index": 0, "part": part})
	}
	return nil
}

func (b *responseBuilder) text(kind, text string) error {
	if b.open == nil || b.open.kind != kind {
		it := newOutputItem(kind)
		if err := b.start(it); err != nil {
			return err
		}
		b.open = it
	}
	b.open.text.WriteString(text)
	typ := "response.output_text.delta"
	fields := map[string]any{"item_id": b.open.id, "output_index": b.index(b.open), "content_index": 0, "delta": text}
	if kind == itemReasoning {
		typ = "response.reasoning_text.delta"
	} else {
		fields["logprobs"] = []any{}
	}
	return b.emit(typ, fields)
}

func (b *responseBuilder) functionCall(call toolCallOut) error {
	it := newOutputItem(itemFunctionCall)
	it.call = call
	if err := b.start(it); err != nil {
		return err
	}
	at := len(b.items) - 1
	// The arguments are complete when the call is parsed (the XML form has no JSON until
	// then), so they go out as one delta.
	if err := b.emit("response.function_call_arguments.delta", map[string]any{"item_id": it.id, "output_index": at,
		"delta": call.Arguments}); err != nil {
		return err
	}
	if err := b.emit("response.function_call_arguments.done", map[string]any{"item_id": it.id, "output_index": at,
		"name": call.Name, "arguments": call.Arguments}); err != nil {
		return err
	}
	it.done = true
	return b.emit("response.output_item.done", map[string]any{"output_index": at, "item": it.wire(true)})
}

// closeOpen finishes the open text item, with its done events.
func (b *responseBuilder) closeOpen() error {
	it := b.open
	if it == nil {
		return nil
	}
	b.open = nil
	at := b.index(it)
	it.done = true
	switch it.kind {
	case itemMessage:
		if err := b.emit("response.output_text.done", map[string]any{"item_id": it.id, "output_index": at, "content_index": 0,
			"text": it.text.String(), "logprobs": []any{}}); err != nil {
			return err
		}
		if err := b.emit("response.content_part.done", map[string]any{"item_id": it.id, "output_index": at, "content_index": 0,
			"part": it.textPart()}); err != nil {
			return err
		}
	case itemReasoning:
		if err := b.emit("response.reasoning_text.done", map[string]any{"item_id": it.id, "output_index": at, "content_index": 0,
			"text": it.text.String()}); err != nil {
			return err
		}
	}
	return b.emit("response.output_item.done", map[string]any{"output_index": at, "item": it.wire(true)})
}

// final fills the response object for a generation that ended.
func (b *responseBuilder) final(meta *responseMeta, o outcome) *responseObject {
	obj := meta.object
	obj.Status = "completed"
	if o.finish == string(FinishLength) {
		obj.Status = "incomplete"
		obj.IncompleteDetails = &incompleteDetailsJSON{Reason: "max_output_tokens"}
	}
	obj.Output = make([]any, 0, len(b.items))
	for _, it := range b.items {
		obj.Output = append(obj.Output, it.wire(true))
	}
	obj.Usage = responseUsage(o.usage)
	obj.Usage.OutputTokensDetails.ReasoningTokens = o.reasoningTokens
	obj.DFlash = &o.stats
	return &obj
}

// responsesCollector builds a non-streaming Responses answer.
type responsesCollector struct {
	meta         *responseMeta
	w            http.ResponseWriter
	writeTimeout time.Duration
	b            responseBuilder
}

func (c *responsesCollector) begin() error                   { return nil }
func (c *responsesCollector) write(events []chatEvent) error { return c.b.add(events) }
func (c *responsesCollector) probe() func() error            { return nil }
func (c *responsesCollector) abort(e *apiError)              { writeError(c.w, e) }

func (c *responsesCollector) end(o outcome) error {
	_ = c.b.closeOpen() // without send it cannot fail
	obj := c.b.final(c.meta, o)
	c.meta.finished(obj, c.b.items)
	writeFinal(c.w, c.writeTimeout, obj)
	return nil
}

// responsesStreamer streams a Responses answer as named events with sequence numbers.
type responsesStreamer struct {
	meta   *responseMeta
	stream *sseStream
	seq    int
	b      responseBuilder
}

func newResponsesStreamer(meta *responseMeta, stream *sseStream) *responsesStreamer {
	s := &responsesStreamer{meta: meta, stream: stream}
	s.b.send = s.send
	return s
}

// send writes one event; sequence numbers count every event of the response from 0.
func (s *responsesStreamer) send(typ string, fields map[string]any) error {
	fields["type"] = typ
	fields["sequence_number"] = s.seq
	s.seq++
	return s.stream.sendNamed(typ, fields)
}

func (s *responsesStreamer) begin() error {
	if err := s.stream.start(); err != nil {
		return err
	}
	obj := s.meta.object
	obj.Status, obj.Output = "in_progress", []any{}
	if err := s.send("response.created", map[string]any{"response": obj}); err != nil {
		return err
	}
	return s.send("response.in_progress", map[string]any{"response": obj})
}

func (s *responsesStreamer) write(events []chatEvent) error { return s.b.add(events) }

func (s *responsesStreamer) end(o outcome) error {
	if err := s.b.closeOpen(); err != nil {
		return err
	}
	obj := s.b.final(s.meta, o)
	s.meta.finished(obj, s.b.items)
	typ := "response.completed"
	if obj.Status == "incomplete" {
		typ = "response.incomplete"
	}
	return s.send(typ, map[string]any{"response": obj})
}

func (s *responsesStreamer) probe() func() error { return s.stream.ping }

// keepAlive sends SSE comments while the stream is quiet; the SDKs skip them, and they
// carry no sequence number.
func (s *responsesStreamer) keepAlive(interval time.Duration) func() {
	return s.stream.keepAlive(interval, s.stream.ping)
}

// abort ends the stream with an error event and then response.failed, the terminal event
// clients wait for (a stream that closes without one is reported as a disconnect).
func (s *responsesStreamer) abort(e *apiError) {
	code := e.Code
	if code == "" {
		code = "server_error"
	}
	fields := map[string]any{"code": code, "message": e.Message, "param": nil}
	if e.Param != "" {
		fields["param"] = e.Param
	}
	if s.send("error", fields) != nil {
		return
	}
	obj := s.meta.object
	obj.Status, obj.Output = "failed", []any{}
	for _, it := range s.b.items {
		obj.Output = append(obj.Output, it.wire(true))
	}
	obj.Error = &responseErrorJSON{Code: code, Message: e.Message}
	_ = s.send("response.failed", map[string]any{"response": obj})
}
