package server

import (
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
	"unicode/utf8"
)

// parsedAnswer is a parser's output merged: what a non-streaming answer would hold.
type parsedAnswer struct {
	content, reasoning string
	calls              []string // "name args"
}

func (a parsedAnswer) String() string {
	return fmt.Sprintf("content=%q reasoning=%q calls=%q", a.content, a.reasoning, a.calls)
}

func (a parsedAnswer) equal(b parsedAnswer) bool {
	return a.String() == b.String()
}

// parseInPieces feeds text to a new parser cut into the given pieces.
func parseInPieces(pieces []string, tools bool, maxCalls int, opensInThinking bool) parsedAnswer {
	p := newChatOutputParser(tools, maxCalls, opensInThinking)
	var a parsedAnswer
	collect := func(events []chatEvent) {
		for _, ev := range events {
			a.content += ev.Content
			a.reasoning += ev.Reasoning
			if ev.ToolCall != nil {
				a.calls = append(a.calls, ev.ToolCall.Name+" "+ev.ToolCall.Arguments)
			}
		}
	}
	for _, piece := range pieces {
		collect(p.feed(piece))
	}
	collect(p.finish())
	return a
}

func TestChatOutputParser(t *testing.T) {
	call := func(name, args string) string {
		return "<tool_call>\n{\"name\": \"" + name + "\", \"arguments\": " + args + "}\n</tool_call>"
	}
	tests := []struct {
		name     string
		text     string
		tools    bool
		maxCalls int
		opens    bool
		want     parsedAnswer
	}{
		{name: "plain answer", text: "Hello there.", want: parsedAnswer{content: "Hello there."}},
		{name: "reasoning then answer", text: "<think>\nLet me see.\n</think>\n\nIt is 4.",
			want: parsedAnswer{reasoning: "Let me see.\n", content: "It is 4."}},
		{name: "prompt opened the think block", opens: true, text: "\nhmm\n</think>\n\nyes",
			want: parsedAnswer{reasoning: "hmm\n", content: "yes"}},
		{name: "think after answer text is plain text", text: "A <think> B </think>",
			want: parsedAnswer{content: "A <think> B </think>"}},
		{name: "tool call after text", tools: true, text: "Let me check.\n\n" + call("get_weather", `{"city": "Paris"}`),
			want: parsedAnswer{content: "Let me check.\n\n", calls: []string{`get_weather {"city":"Paris"}`}}},
		{name: "two tool calls, whitespace between dropped", tools: true,
			text: call("a", `{}`) + "\n" + call("b", `{"x": [1, 2]}`) + "\n",
			want: parsedAnswer{calls: []string{"a {}", `b {"x":[1,2]}`}}},
		{name: "parallel calls off keeps the first", tools: true, maxCalls: 1,
			text: call("a", `{}`) + "\n" + call("b", `{}`),
			want: parsedAnswer{calls: []string{"a {}"}}},
		{name: "tools off leaves markers as text", text: call("a", `{}`),
			want: parsedAnswer{content: call("a", `{}`)}},
		{name: "invalid block stays as content", tools: true, text: "<tool_call>\nnot json\n</tool_call>",
			want: parsedAnswer{content: "<tool_call>\nnot json\n</tool_call>"}},
		{name: "unclosed block is returned as content", tools: true, text: "x <tool_call>\n{\"name\": \"a\"",
			want: parsedAnswer{content: "x <tool_call>\n{\"name\": \"a\""}},
		{name: "reasoning then tool call", tools: true, text: "<think>\nneed weather\n</think>\n\n" + call("w", `{}`),
			want: parsedAnswer{reasoning: "need weather\n", calls: []string{"w {}"}}},
		{name: "tool markers inside reasoning are reasoning", tools: true, text: "<think>use <tool_call> maybe</think>ok",
			want: parsedAnswer{reasoning: "use <tool_call> maybe", content: "ok"}},
		{name: "text after a tool call is kept", tools: true, text: call("a", `{}`) + "\nDone.",
			want: parsedAnswer{content: "\nDone.", calls: []string{"a {}"}}},
		{name: "partial marker at the end is text", text: "a <thi", want: parsedAnswer{content: "a <thi"}},
		{name: "whitespace-only answer is dropped", text: "\n\n", want: parsedAnswer{}},
		{name: "unclosed reasoning stays reasoning", text: "<think>\nstill thinking",
			want: parsedAnswer{reasoning: "still thinking"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			whole := parseInPieces([]string{tt.text}, tt.tools, tt.maxCalls, tt.opens)
			if !whole.equal(tt.want) {
				t.Fatalf("whole text:\n got %v\nwant %v", whole, tt.want)
			}
			// Streaming must give the same answer however the text is cut into deltas.
			rng := rand.New(rand.NewPCG(1, uint64(len(tt.text))))
			for trial := 0; trial < 200; trial++ {
				pieces := randomSplit(rng, tt.text)
				if got := parseInPieces(pieces, tt.tools, tt.maxCalls, tt.opens); !got.equal(tt.want) {
					t.Fatalf("pieces %q:\n got %v\nwant %v", pieces, got, tt.want)
				}
			}
		})
	}
}

// randomSplit cuts s into pieces at random byte offsets that are rune boundaries.
func randomSplit(rng *rand.Rand, s string) []string {
	var pieces []string
	for len(s) > 0 {
		n := 1 + rng.IntN(min(len(s), 8))
		for n < len(s) && !utf8.RuneStart(s[n]) {
			n++
		}
		pieces = append(pieces, s[:n])
		s = s[n:]
	}
	return pieces
}

func TestChatOutputParserGivesToolCallsDistinctIDsAndIndexes(t *testing.T) {
	p := newChatOutputParser(true, 0, false)
	var calls []*toolCallOut
	for _, ev := range p.feed(`<tool_call>{"name": "a"}</tool_call><tool_call>{"name": "b"}</tool_call>`) {
		if ev.ToolCall != nil {
			c := *ev.ToolCall
			calls = append(calls, &c)
		}
	}
	if len(calls) != 2 {
		t.Fatalf("got %d calls, want 2", len(calls))
	}
	if calls[0].ID == calls[1].ID || !strings.HasPrefix(calls[0].ID, "call_") {
		t.Errorf("ids %q and %q: want distinct call_ ids", calls[0].ID, calls[1].ID)
	}
	if calls[0].Index != 0 || calls[1].Index != 1 {
		t.Errorf("indexes %d, %d: want 0, 1", calls[0].Index, calls[1].Index)
	}
}
