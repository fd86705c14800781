package server

import (
	"strings"
)

// chatEvent is one piece of a chat answer, in output order: answer text, reasoning text, or
// one complete tool call.
type chatEvent struct {
	Content   string
	Reasoning string
	ToolCall  *toolCallOut
}

// toolCallOut is a tool call parsed from the model's output.
type toolCallOut struct {
	Index     int
	ID        string
	Name      string
	Arguments string // JSON text of the arguments object
}

// Markers of the Qwen chat format, emitted by the backend as text.
const (
	thinkOpen     = "<think>"
	thinkClose    = "</think>"
	toolCallOpen  = "<tool_call>"
	toolCallClose = "</tool_call>"
)

type chatSection int

const (
	sectionAnswer chatSection = iota
	sectionReasoning
	sectionToolCall
)

// chatOutputParser turns streamed answer text into chatEvents:
//
//   - <think>…</think> at the very start of the answer (or from the start when the prompt
//     opened the block) becomes reasoning_content. Later <think> tags are plain text.
//   - With tools enabled, each <tool_call>…</tool_call> block becomes a tool call when its
//     closing tag arrives, read by the model's format (JSON or qwen3_coder XML, see
//     toolCallParser). A block that does not parse in that format, or that the generation
//     never closes, is passed on as answer text, so nothing the model wrote is lost.
//   - Newlines right after <think> and </think> are dropped, as is whitespace-only text
//     before the answer starts and after a tool call, which the Qwen format puts between
//     blocks.
//
// Text that might be the start of a marker is held back until it is decided, so markers
// never leak into content even when split across deltas. Streaming and non-streaming
// answers are built from the same events, so they are equal by construction.
type chatOutputParser struct {
	toolsEnabled bool
	// maxToolCalls limits parsed calls (1 when parallel_tool_calls is false; 0: no limit).
	// Blocks beyond it are dropped.
	maxToolCalls int
	// parseCall reads one block's body; the JSON form unless the handler sets another.
	parseCall func(body string) ([]parsedCall, bool)

	section      chatSection
	pending      string // undecided text: may be the start of a marker
	toolText     strings.Builder
	calls        int
	thinkAllowed bool   // no answer text yet, so <think> still opens reasoning
	holdingSpace bool   // whitespace-only answer text is held, not sent
	heldSpace    string // what holdingSpace holds
	trimNewlines bool   // drop newlines at the start of the current section

	events []chatEvent
}

func newChatOutputParser(toolsEnabled bool, maxToolCalls int, opensInThinking bool) *chatOutputParser {
	p := &chatOutputParser{
		toolsEnabled: toolsEnabled,
		maxToolCalls: maxToolCalls,
		thinkAllowed: true,
		holdingSpace: true,
		parseCall:    toolCallParser(ToolCallJSON, nil),
	}
	if opensInThinking {
		p.section, p.thinkAllowed, p.trimNewlines = sectionReasoning, false, true
	}
	return p
}

// inReasoning reports whether the text parsed so far leaves the answer inside its
// reasoning.
func (p *chatOutputParser) inReasoning() bool { return p.section == sectionReasoning }

// toolCalls reports how many tool calls were parsed so far.
func (p *chatOutputParser) toolCalls() int { return p.calls }

// feed parses the next piece of text and returns the events it completes. The returned
// slice is only valid until the next call.
func (p *chatOutputParser) feed(text string) []chatEvent {
	p.events = p.events[:0]
	p.pending += text
	for {
		markers := p.markers()
		at, marker := earliestMarker(p.pending, markers)
		if at < 0 {
			keep := partialMarkerTail(p.pending, markers)
			p.emit(p.pending[:len(p.pending)-keep])
			p.pending = p.pending[len(p.pending)-keep:]
			return p.events
		}
		if at > 0 {
			// Emit the text first and scan again: it may change which markers count
			// (answer text ends the chance of a <think> block).
			p.emit(p.pending[:at])
			p.pending = p.pending[at:]
			continue
		}
		p.pending = p.pending[len(marker):]
		p.enter(marker)
	}
}

// finish flushes what is still held at the end of the generation and returns the last
// events. The returned slice is only valid until the next call.
func (p *chatOutputParser) finish() []chatEvent {
	p.events = p.events[:0]
	p.emit(p.pending)
	p.pending = ""
	if p.section == sectionToolCall {
		// Never closed (cut by max_tokens): give the raw text back rather than lose it.
		p.section = sectionAnswer
		p.emitAnswer(toolCallOpen + p.toolText.String())
		p.toolText.Reset()
	}
	p.heldSpace = ""
	return p.events
}

// markers lists the markers that change the section from the current one.
func (p *chatOutputParser) markers() []string {
	switch p.section {
	case sectionReasoning:
		return []string{thinkClose}
	case sectionToolCall:
		return []string{toolCallClose}
	}
	var m []string
	if p.toolsEnabled {
		m = append(m, toolCallOpen)
	}
	if p.thinkAllowed {
		m = append(m, thinkOpen)
	}
	return m
}

func (p *chatOutputParser) enter(marker string) {
	switch marker {
	case thinkOpen:
		p.section, p.thinkAllowed, p.trimNewlines, p.heldSpace = sectionReasoning, false, true, ""
	case thinkClose:
		p.section, p.trimNewlines = sectionAnswer, true
	case toolCallOpen:
		p.section, p.thinkAllowed = sectionToolCall, false
		p.toolText.Reset()
	case toolCallClose:
		p.section = sectionAnswer
		p.closeToolCall()
	}
}

func (p *chatOutputParser) closeToolCall() {
	body := p.toolText.String()
	p.toolText.Reset()
	calls, ok := p.parseCall(body)
	if !ok {
		p.emitAnswer(toolCallOpen + body + toolCallClose)
		return
	}
	p.holdingSpace, p.heldSpace = true, ""
	for _, c := range calls {
		if p.maxToolCalls > 0 && p.calls >= p.maxToolCalls {
			return
		}
		p.events = append(p.events, chatEvent{ToolCall: &toolCallOut{
			Index: p.calls, ID: newToolCallID(), Name: c.Name, Arguments: c.Arguments,
		}})
		p.calls++
	}
}

func (p *chatOutputParser) emit(text string) {
	if text == "" {
		return
	}
	switch p.section {
	case sectionToolCall:
		p.toolText.WriteString(text)
	case sectionReasoning:
		if text = p.trimStart(text); text != "" {
			p.events = append(p.events, chatEvent{Reasoning: text})
		}
	default:
		p.emitAnswer(text)
	}
}

func (p *chatOutputParser) emitAnswer(text string) {
	if text = p.trimStart(text); text == "" {
		return
	}
	if p.holdingSpace {
		if strings.TrimSpace(text) == "" {
			p.heldSpace += text
			return
		}
		text, p.heldSpace, p.holdingSpace = p.heldSpace+text, "", false
	}
	p.thinkAllowed = false
	p.events = append(p.events, chatEvent{Content: text})
}

// trimStart drops the newlines that follow <think> or </think>.
func (p *chatOutputParser) trimStart(text string) string {
	if !p.trimNewlines {
		return text
	}
	text = strings.TrimLeft(text, "\n")
	if text != "" {
		p.trimNewlines = false
	}
	return text
}

// earliestMarker finds the first occurrence of any marker in s.
func earliestMarker(s string, markers []string) (int, string) {
	at, found := -1, ""
	for _, m := range markers {
		if i := strings.Index(s, m); i >= 0 && (at < 0 || i < at) {
			at, found = i, m
		}
	}
	return at, found
}

// partialMarkerTail is the length of the longest suffix of s that begins some marker.
func partialMarkerTail(s string, markers []string) int {
	longest := 0
	for _, m := range markers {
		for n := min(len(m)-1, len(s)); n > longest; n-- {
			if strings.HasSuffix(s, m[:n]) {
				longest = n
				break
			}
		}
	}
	return longest
}
