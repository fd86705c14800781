package server

import (
	"net/http"
	"strings"
	"time"
)

// chatCollector builds a non-streaming chat answer from the events.
type chatCollector struct {
	meta         answerMeta
	w            http.ResponseWriter
	writeTimeout time.Duration
	content      strings.Builder
	reasoning    strings.Builder
	calls        []toolCallOut
}

func (c *chatCollector) begin() error { return nil }

func (c *chatCollector) write(events []chatEvent) error {
	for _, ev := range events {
		c.content.WriteString(ev.Content)
		c.reasoning.WriteString(ev.Reasoning)
		if ev.ToolCall != nil {
			c.calls = append(c.calls, *ev.ToolCall)
		}
	}
	return nil
}

func (c *chatCollector) end(o outcome) error {
	msg := assistantMessage{Role: "assistant", ReasoningContent: c.reasoning.String()}
	if c.content.Len() > 0 || len(c.calls) == 0 {
		msg.Content = ptr(c.content.String())
	}
	if len(c.calls) > 0 {
		msg.ToolCalls = toolCallsJSON(c.calls, false)
	}
	writeFinal(c.w, c.writeTimeout, chatCompletion{
		ID: c.meta.id, Object: "chat.completion", Created: c.meta.created, Model: c.meta.model,
		Choices: []chatChoice{{Index: 0, Message: msg, FinishReason: o.finish}},
		Usage:   o.usage,
		DFlash:  o.stats,
	})
	return nil
}

func (c *chatCollector) probe() func() error { return nil }

func (c *chatCollector) abort(e *apiError) { writeError(c.w, e) }

// chatStreamer streams a chat answer as chat.completion.chunk events.
type chatStreamer struct {
	meta   answerMeta
	stream *sseStream
}

func (c *chatStreamer) chunk(delta chatDelta, finish *string) chatChunk {
	return chatChunk{
		ID: c.meta.id, Object: "chat.completion.chunk", Created: c.meta.created, Model: c.meta.model,
		Choices: []chatChunkChoice{{Index: 0, Delta: delta, FinishReason: finish}},
		Usage:   c.meta.chunkUsage(),
	}
}

// begin sends the headers and the role chunk, as OpenAI's streams start.
func (c *chatStreamer) begin() error {
	if err := c.stream.start(); err != nil {
		return err
	}
	return c.stream.send(c.chunk(chatDelta{Role: "assistant", Content: ptr("")}, nil))
}

func (c *chatStreamer) write(events []chatEvent) error {
	for _, ev := range events {
		var delta chatDelta
		switch {
		case ev.ToolCall != nil:
			delta.ToolCalls = toolCallsJSON([]toolCallOut{*ev.ToolCall}, true)
		case ev.Reasoning != "":
			delta.ReasoningContent = ev.Reasoning
		case ev.Content != "":
			delta.Content = ptr(ev.Content)
		default:
			continue
		}
		if err := c.stream.send(c.chunk(delta, nil)); err != nil {
			return err
		}
	}
	return nil
}

func (c *chatStreamer) end(o outcome) error {
	last := c.chunk(chatDelta{}, ptr(o.finish))
	last.DFlash = &o.stats
	if err := c.stream.send(last); err != nil {
		return err
	}
	if c.meta.includeUsage {
		usageChunk := chatChunk{
			ID: c.meta.id, Object: "chat.completion.chunk", Created: c.meta.created, Model: c.meta.model,
			Choices: []chatChunkChoice{}, Usage: usageJSON(o.usage), DFlash: &o.stats,
		}
		if err := c.stream.send(usageChunk); err != nil {
			return err
		}
	}
	return c.stream.done()
}

func (c *chatStreamer) probe() func() error { return c.stream.ping }

func (c *chatStreamer) abort(e *apiError) {
	if c.stream.send(e.body()) == nil {
		_ = c.stream.done()
	}
}
