package server

import (
	"encoding/json"
	"strings"
)

// The Responses API's objects: the response, its output items and its usage. Field order
// follows OpenAI's.

type responseObject struct {
	ID                 string                 `json:"id"`
	Object             string                 `json:"object"`
	CreatedAt          int64                  `json:"created_at"`
	Status             string                 `json:"status"`
	Error              *responseErrorJSON     `json:"error"`
	IncompleteDetails  *incompleteDetailsJSON `json:"incomplete_details"`
	Instructions       *string                `json:"instructions"`
	MaxOutputTokens    *int                   `json:"max_output_tokens"`
	Model              string                 `json:"model"`
	Output             []any                  `json:"output"`
	ParallelToolCalls  bool                   `json:"parallel_tool_calls"`
	PreviousResponseID *string                `json:"previous_response_id"`
	Reasoning          reasoningConfigJSON    `json:"reasoning"`
	Store              bool                   `json:"store"`
	Temperature        *float64               `json:"temperature"`
	Text               textConfigJSON         `json:"text"`
	ToolChoice         json.RawMessage        `json:"tool_choice"`
	Tools              []json.RawMessage      `json:"tools"`
	TopP               *float64               `json:"top_p"`
	Truncation         string                 `json:"truncation"`
	Usage              *responseUsageJSON     `json:"usage"`
	Metadata           json.RawMessage        `json:"metadata"`
	// DFlash is the speculative-decoding report, on finished responses.
	DFlash *dflashStats `json:"dflash,omitempty"`
}

type responseErrorJSON struct {
	Code    string `json:"code"`
	Message string `json:"message"`
}

type incompleteDetailsJSON struct {
	Reason string `json:"reason"`
}

type reasoningConfigJSON struct {
	Effort  *string `json:"effort"`
	Summary *string `json:"summary"`
}

type textConfigJSON struct {
	Format json.RawMessage `json:"format"`
}

type responseUsageJSON struct {
	InputTokens        int `json:"input_tokens"`
	InputTokensDetails struct {
		CachedTokens int `json:"cached_tokens"`
	} `json:"input_tokens_details"`
	OutputTokens        int `json:"output_tokens"`
	OutputTokensDetails struct {
		ReasoningTokens int `json:"reasoning_tokens"`
	} `json:"output_tokens_details"`
	TotalTokens int `json:"total_tokens"`
}

func responseUsage(u usage) *responseUsageJSON {
	out := &responseUsageJSON{InputTokens: u.PromptTokens, OutputTokens: u.CompletionTokens, TotalTokens: u.TotalTokens}
	out.InputTokensDetails.CachedTokens = u.PromptTokensDetails.CachedTokens
	return out
}

// Output items on the wire.

type messageItemJSON struct {
	Type    string           `json:"type"`
	ID      string           `json:"id"`
	Status  string           `json:"status"`
	Role    string           `json:"role"`
	Content []outputTextJSON `json:"content"`
}

type outputTextJSON struct {
	Type        string `json:"type"`
	Text        string `json:"text"`
	Annotations []any  `json:"annotations"`
	Logprobs    []any  `json:"logprobs"`
}

type reasoningItemJSON struct {
	Type    string              `json:"type"`
	ID      string              `json:"id"`
	Summary []any               `json:"summary"`
	Content []reasoningTextJSON `json:"content"`
	Status  string              `json:"status"`
}

type reasoningTextJSON struct {
	Type string `json:"type"`
	Text string `json:"text"`
}

type functionCallItemJSON struct {
	Type      string `json:"type"`
	ID        string `json:"id"`
	CallID    string `json:"call_id"`
	Name      string `json:"name"`
	Arguments string `json:"arguments"`
	Status    string `json:"status"`
}

// Kinds of output item.
const (
	itemMessage      = "message"
	itemReasoning    = "reasoning"
	itemFunctionCall = "function_call"
)

// outputItem is one output item being built.
type outputItem struct {
	kind string
	id   string
	text strings.Builder // message text or reasoning text
	call toolCallOut
	done bool
}

func newOutputItem(kind string) *outputItem {
	prefix := map[string]string{itemMessage: "msg_", itemReasoning: "rs_", itemFunctionCall: "fc_"}[kind]
	return &outputItem{kind: kind, id: randomID(prefix)}
}

func (it *outputItem) status() string {
	if it.done {
		return "completed"
	}
	return "in_progress"
}

func (it *outputItem) textPart() outputTextJSON {
	return outputTextJSON{Type: "output_text", Text: it.text.String(), Annotations: []any{}, Logprobs: []any{}}
}

// wire is the item as sent; full is false for the "added" event, which carries no content
// yet.
func (it *outputItem) wire(full bool) any {
	switch it.kind {
	case itemMessage:
		m := messageItemJSON{Type: itemMessage, ID: it.id, Status: it.status(), Role: "assistant", Content: []outputTextJSON{}}
		if full {
			m.Content = append(m.Content, it.textPart())
		}
		return m
	case itemReasoning:
		r := reasoningItemJSON{Type: itemReasoning, ID: it.id, Summary: []any{}, Content: []reasoningTextJSON{}, Status: it.status()}
		if full {
			r.Content = append(r.Content, reasoningTextJSON{Type: "reasoning_text", Text: it.text.String()})
		}
		return r
	default:
		args := ""
		if full {
			args = it.call.Arguments
		}
		return functionCallItemJSON{Type: itemFunctionCall, ID: it.id, CallID: it.call.ID, Name: it.call.Name,
			Arguments: args, Status: it.status()}
	}
}

// message is the item as a turn of the conversation, for chaining.
func (it *outputItem) message() ChatMessage {
	switch it.kind {
	case itemMessage:
		return ChatMessage{Role: "assistant", Content: it.text.String()}
	case itemReasoning:
		return ChatMessage{Role: "assistant", ReasoningContent: it.text.String()}
	default:
		return ChatMessage{Role: "assistant", ToolCalls: []ToolCall{{ID: it.call.ID, Name: it.call.Name, Arguments: it.call.Arguments}}}
	}
}

// outputMessages folds the output items into assistant turns: reasoning, text and the tool
// calls of one answer make one turn, as a chat template renders them.
func outputMessages(items []*outputItem) []ChatMessage {
	if len(items) == 0 {
		return nil
	}
	turn := ChatMessage{Role: "assistant"}
	for _, it := range items {
		m := it.message()
		switch {
		case m.ReasoningContent != "":
			turn.ReasoningContent += m.ReasoningContent
		case len(m.ToolCalls) > 0:
			turn.ToolCalls = append(turn.ToolCalls, m.ToolCalls...)
		default:
			turn.Content += m.Content
		}
	}
	return []ChatMessage{turn}
}
