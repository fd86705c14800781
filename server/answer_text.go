package server

import (
	"net/http"
	"strings"
	"time"
)

// textCollector builds a non-streaming text completion answer.
type textCollector struct {
	meta         answerMeta
	w            http.ResponseWriter
	writeTimeout time.Duration
	text         strings.Builder
}

func (c *textCollector) begin() error { return nil }

func (c *textCollector) write(events []chatEvent) error {
	for _, ev := range events {
		c.text.WriteString(ev.Content)
	}
	return nil
}

func (c *textCollector) end(o outcome) error {
	writeFinal(c.w, c.writeTimeout, textCompletion{
		ID: c.meta.id, Object: "text_completion", Created: c.meta.created, Model: c.meta.model,
		Choices: []textChoice{{Text: c.text.String(), Index: 0, FinishReason: ptr(o.finish)}},
		Usage:   usageJSON(o.usage),
		DFlash:  &o.stats,
	})
	return nil
}

func (c *textCollector) probe() func() error { return nil }

func (c *textCollector) abort(e *apiError) { writeError(c.w, e) }

// textStreamer streams a text completion; every chunk is a text_completion object.
type textStreamer struct {
	meta   answerMeta
	stream *sseStream
}

func (c *textStreamer) chunk(text string, finish *string) textCompletion {
	return textCompletion{
		ID: c.meta.id, Object: "text_completion", Created: c.meta.created, Model: c.meta.model,
		Choices: []textChoice{{Text: text, Index: 0, FinishReason: finish}},
		Usage:   c.meta.chunkUsage(),
	}
}

func (c *textStreamer) begin() error { return c.stream.start() }

func (c *textStreamer) write(events []chatEvent) error {
	for _, ev := range events {
		if ev.Content == "" {
			continue
		}
		if err := c.stream.send(c.chunk(ev.Content, nil)); err != nil {
			return err
		}
	}
	return nil
}

func (c *textStreamer) end(o outcome) error {
	last := c.chunk("", ptr(o.finish))
	last.DFlash = &o.stats
	if err := c.stream.send(last); err != nil {
		return err
	}
	if c.meta.includeUsage {
		usageChunk := textCompletion{
			ID: c.meta.id, Object: "text_completion", Created: c.meta.created, Model: c.meta.model,
			Choices: []textChoice{}, Usage: usageJSON(o.usage), DFlash: &o.stats,
		}
		if err := c.stream.send(usageChunk); err != nil {
			return err
		}
	}
	return c.stream.done()
}

func (c *textStreamer) probe() func() error { return c.stream.ping }

func (c *textStreamer) abort(e *apiError) {
	if c.stream.send(e.body()) == nil {
		_ = c.stream.done()
	}
}
