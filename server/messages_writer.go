package server

import (
	"encoding/json"
	"net/http"
	"strings"
	"time"
)

// The Anthropic Messages answer: a message of content blocks, streamed as
// message_start, content_block_start/delta/stop per block, message_delta, message_stop.

type anthropicMessage struct {
	ID           string         `json:"id"`
	Type         string         `json:"type"`
	Role         string         `json:"role"`
	Model        string         `json:"model"`
	Content      []any          `json:"content"`
	StopReason   *string        `json:"stop_reason"`
	StopSequence *string        `json:"stop_sequence"`
	Usage        anthropicUsage `json:"usage"`
	DFlash       *dflashStats   `json:"dflash,omitempty"`
}

// anthropicUsage follows Anthropic's accounting: input_tokens are the prompt tokens that
// were processed, not counting those read from the prefix cache, which are
// cache_read_input_tokens; the prompt is the sum of the two (clients add them up to track
// the context they fill).
type anthropicUsage struct {
	InputTokens              int `json:"input_tokens"`
	CacheCreationInputTokens int `json:"cache_creation_input_tokens"`
	CacheReadInputTokens     int `json:"cache_read_input_tokens"`
	OutputTokens             int `json:"output_tokens"`
}

func anthropicUsageOf(u usage) anthropicUsage {
	cached := u.PromptTokensDetails.CachedTokens
	return anthropicUsage{InputTokens: u.PromptTokens - cached, CacheReadInputTokens: cached, OutputTokens: u.CompletionTokens}
}

type textBlockJSON struct {
	Type string `json:"type"`
	Text string `json:"text"`
}

type thinkingBlockJSON struct {
	Type      string `json:"type"`
	Thinking  string `json:"thinking"`
	Signature string `json:"signature"`
}

type toolUseBlockJSON struct {
	Type  string          `json:"type"`
	ID    string          `json:"id"`
	Name  string          `json:"name"`
	Input json.RawMessage `json:"input"`
}

// Kinds of content block.
const (
	blockKindText     = "text"
	blockKindThinking = "thinking"
	blockKindToolUse  = "tool_use"
)

type contentBlock struct {
	kind string
	text strings.Builder
	call toolCallOut
}

// wire is the block as sent; empty is true for content_block_start, which carries none of
// the content yet.
func (b *contentBlock) wire(empty bool) any {
	switch b.kind {
	case blockKindThinking:
		t := thinkingBlockJSON{Type: blockKindThinking}
		if !empty {
			t.Thinking = b.text.String()
		}
		return t
	case blockKindToolUse:
		input := json.RawMessage(b.call.Arguments)
		if empty {
			input = json.RawMessage("{}")
		}
		return toolUseBlockJSON{Type: blockKindToolUse, ID: anthropicToolUseID(b.call.ID), Name: b.call.Name, Input: input}
	}
	t := textBlockJSON{Type: blockKindText}
	if !empty {
		t.Text = b.text.String()
	}
	return t
}

// messageBuilder turns chat events into content blocks in output order; send, when set,
// receives the streaming events.
type messageBuilder struct {
	blocks []*contentBlock
	open   *contentBlock
	send   func(typ string, fields map[string]any) error
}

func (b *messageBuilder) emit(typ string, fields map[string]any) error {
	if b.send == nil {
		return nil
	}
	return b.send(typ, fields)
}

func (b *messageBuilder) add(events []chatEvent) error {
	for _, ev := range events {
		var err error
		switch {
		case ev.ToolCall != nil:
			err = b.toolUse(*ev.ToolCall)
		case ev.Reasoning != "":
			err = b.text(blockKindThinking, ev.Reasoning)
		case ev.Content != "":
			err = b.text(blockKindText, ev.Content)
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// start opens blk, closing the open block; blk is complete but for its streamed content
// (a tool_use block has its id and name), as content_block_start carries them.
func (b *messageBuilder) start(blk *contentBlock) error {
	if err := b.closeOpen(); err != nil {
		return err
	}
	b.blocks = append(b.blocks, blk)
	return b.emit("content_block_start", map[string]any{"index": len(b.blocks) - 1, "content_block": blk.wire(true)})
}

func (b *messageBuilder) text(kind, text string) error {
	if b.open == nil || b.open.kind != kind {
		blk := &contentBlock{kind: kind}
		if err := b.start(blk); err != nil {
			return err
		}
		b.open = blk
	}
	b.open.text.WriteString(text)
	delta := map[string]any{"type": "text_delta", "text": text}
	if kind == blockKindThinking {
		delta = map[string]any{"type": "thinking_delta", "thinking": text}
	}
	return b.emit("content_block_delta", map[string]any{"index": len(b.blocks) - 1, "delta": delta})
}

func (b *messageBuilder) toolUse(call toolCallOut) error {
	if err := b.start(&contentBlock{kind: blockKindToolUse, call: call}); err != nil {
		return err
	}
	at := len(b.blocks) - 1
	// The input is complete when the call is parsed, so it goes out as one fragment.
	if err := b.emit("content_block_delta", map[string]any{"index": at,
		"delta": map[string]any{"type": "input_json_delta", "partial_json": call.Arguments}}); err != nil {
		return err
	}
	return b.emit("content_block_stop", map[string]any{"index": at})
}

func (b *messageBuilder) closeOpen() error {
	if b.open == nil {
		return nil
	}
	b.open = nil
	return b.emit("content_block_stop", map[string]any{"index": len(b.blocks) - 1})
}

// stopReason maps a finish to Anthropic's stop_reason and stop_sequence.
func stopReason(o outcome) (string, *string) {
	switch {
	case o.finish == "tool_calls":
		return "tool_use", nil
	case o.finish == string(FinishLength) && o.contextBound:
		return "model_context_window_exceeded", nil
	case o.finish == string(FinishLength):
		return "max_tokens", nil
	case o.stopSequence != "":
		return "stop_sequence", &o.stopSequence
	}
	return "end_turn", nil
}

func (b *messageBuilder) final(base anthropicMessage, o outcome) anthropicMessage {
	msg := base
	msg.Content = make([]any, 0, len(b.blocks))
	for _, blk := range b.blocks {
		msg.Content = append(msg.Content, blk.wire(false))
	}
	reason, seq := stopReason(o)
	msg.StopReason, msg.StopSequence = &reason, seq
	msg.Usage = anthropicUsageOf(o.usage)
	msg.DFlash = &o.stats
	return msg
}

// messagesCollector builds a non-streaming Messages answer.
type messagesCollector struct {
	base         anthropicMessage
	w            http.ResponseWriter
	writeTimeout time.Duration
	b            messageBuilder
}

func (c *messagesCollector) begin() error                   { return nil }
func (c *messagesCollector) write(events []chatEvent) error { return c.b.add(events) }
func (c *messagesCollector) probe() func() error            { return nil }
func (c *messagesCollector) abort(e *apiError)              { writeAnthropicError(c.w, e) }

func (c *messagesCollector) end(o outcome) error {
	if c.writeTimeout > 0 {
		_ = http.NewResponseController(c.w).SetWriteDeadline(time.Now().Add(c.writeTimeout))
	}
	writeJSON(c.w, http.StatusOK, c.b.final(c.base, o))
	return nil
}

// messagesStreamer streams a Messages answer as named events.
type messagesStreamer struct {
	base   anthropicMessage
	stream *sseStream
	b      messageBuilder
}

func newMessagesStreamer(base anthropicMessage, stream *sseStream) *messagesStreamer {
	s := &messagesStreamer{base: base, stream: stream}
	s.b.send = s.send
	return s
}

func (s *messagesStreamer) send(typ string, fields map[string]any) error {
	fields["type"] = typ
	return s.stream.sendNamed(typ, fields)
}

// begin sends message_start, whose usage counts the whole prompt as input (how much of it
// the prefix cache holds is known only at the end, and message_delta reports it), and a
// ping, as Anthropic's streams begin.
func (s *messagesStreamer) begin() error {
	if err := s.stream.start(); err != nil {
		return err
	}
	start := s.base
	start.Content = []any{}
	if err := s.send("message_start", map[string]any{"message": start}); err != nil {
		return err
	}
	return s.ping()
}

func (s *messagesStreamer) ping() error {
	return s.send("ping", map[string]any{})
}

func (s *messagesStreamer) write(events []chatEvent) error { return s.b.add(events) }

func (s *messagesStreamer) end(o outcome) error {
	if err := s.b.closeOpen(); err != nil {
		return err
	}
	msg := s.b.final(s.base, o)
	if err := s.send("message_delta", map[string]any{
		"delta": map[string]any{"stop_reason": msg.StopReason, "stop_sequence": msg.StopSequence},
		"usage": msg.Usage, "dflash": msg.DFlash,
	}); err != nil {
		return err
	}
	return s.send("message_stop", map[string]any{})
}

// probe is a ping event, which Anthropic's clients skip.
func (s *messagesStreamer) probe() func() error { return s.ping }

// keepAlive sends ping events while the stream is quiet, as Anthropic's API does.
func (s *messagesStreamer) keepAlive(interval time.Duration) func() {
	return s.stream.keepAlive(interval, s.ping)
}

func (s *messagesStreamer) abort(e *apiError) {
	body := e.anthropicBody()
	_ = s.stream.sendNamed("error", body)
}
