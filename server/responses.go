package server

import "encoding/json"

// The response shapes of the OpenAI API, plus the "dflash" extension object. Field order
// follows OpenAI's, so responses read the same as theirs.

type usage struct {
	PromptTokens     int `json:"prompt_tokens"`
	CompletionTokens int `json:"completion_tokens"`
	TotalTokens      int `json:"total_tokens"`
	// PromptTokensDetails carries OpenAI's cached_tokens: the prompt tokens resumed from
	// the prefix cache.
	PromptTokensDetails promptTokensDetails `json:"prompt_tokens_details"`
}

type promptTokensDetails struct {
	CachedTokens int `json:"cached_tokens"`
}

// dflashStats is the speculative-decoding report attached to every answer.
type dflashStats struct {
	Tau    float64 `json:"tau"`
	Cycles int     `json:"cycles"`
	// Drafted and Accepted count the draft tokens proposed and accepted for this request;
	// AcceptanceRate is Accepted/Drafted, absent when nothing was drafted (plain decoding).
	Drafted        int      `json:"drafted"`
	Accepted       int      `json:"accepted"`
	AcceptanceRate *float64 `json:"acceptance_rate,omitempty"`
	// BatchSize is the mean number of sequences that shared this request's forward passes,
	// absent when the backend does not report it.
	BatchSize float64 `json:"batch_size,omitempty"`
	PrefillMS float64 `json:"prefill_ms"`
	DecodeMS  float64 `json:"decode_ms"`
	DraftMS   float64 `json:"draft_ms,omitempty"` // measured only with serve --profile
	VerifyMS  float64 `json:"verify_ms,omitempty"`
	QueueMS   float64 `json:"queue_ms"`
	// CachedPromptTokens are the prompt tokens resumed from the prefix cache (not
	// prefilled again).
	CachedPromptTokens int `json:"cached_prompt_tokens"`
	// TokensPerSecond is the decode speed, null when there is no interval to measure it
	// over (see decodeRate).
	TokensPerSecond *float64 `json:"tokens_per_second"`
}

type toolCallJSON struct {
	Index    *int             `json:"index,omitempty"` // streaming only
	ID       string           `json:"id"`
	Type     string           `json:"type"`
	Function toolFunctionJSON `json:"function"`
}

type toolFunctionJSON struct {
	Name      string `json:"name"`
	Arguments string `json:"arguments"`
}

func toolCallsJSON(calls []toolCallOut, streaming bool) []toolCallJSON {
	out := make([]toolCallJSON, 0, len(calls))
	for _, c := range calls {
		j := toolCallJSON{ID: c.ID, Type: "function", Function: toolFunctionJSON{Name: c.Name, Arguments: c.Arguments}}
		if streaming {
			idx := c.Index
			j.Index = &idx
		}
		out = append(out, j)
	}
	return out
}

// chatCompletion is a non-streaming chat answer (object "chat.completion").
type chatCompletion struct {
	ID      string       `json:"id"`
	Object  string       `json:"object"`
	Created int64        `json:"created"`
	Model   string       `json:"model"`
	Choices []chatChoice `json:"choices"`
	Usage   usage        `json:"usage"`
	DFlash  dflashStats  `json:"dflash"`
}

type chatChoice struct {
	Index        int              `json:"index"`
	Message      assistantMessage `json:"message"`
	Logprobs     *struct{}        `json:"logprobs"` // always null
	FinishReason string           `json:"finish_reason"`
}

type assistantMessage struct {
	Role string `json:"role"`
	// Content is null when the answer is only tool calls, as in OpenAI's responses.
	Content          *string        `json:"content"`
	ReasoningContent string         `json:"reasoning_content,omitempty"`
	ToolCalls        []toolCallJSON `json:"tool_calls,omitempty"`
	Refusal          *string        `json:"refusal"` // always null
}

// chatChunk is one streamed chat event (object "chat.completion.chunk").
type chatChunk struct {
	ID      string            `json:"id"`
	Object  string            `json:"object"`
	Created int64             `json:"created"`
	Model   string            `json:"model"`
	Choices []chatChunkChoice `json:"choices"`
	// Usage is null on every chunk but the last when include_usage is set, and absent
	// otherwise, as OpenAI does.
	Usage  json.RawMessage `json:"usage,omitempty"`
	DFlash *dflashStats    `json:"dflash,omitempty"`
}

type chatChunkChoice struct {
	Index        int       `json:"index"`
	Delta        chatDelta `json:"delta"`
	Logprobs     *struct{} `json:"logprobs"`
	FinishReason *string   `json:"finish_reason"`
}

type chatDelta struct {
	Role             string         `json:"role,omitempty"`
	Content          *string        `json:"content,omitempty"`
	ReasoningContent string         `json:"reasoning_content,omitempty"`
	ToolCalls        []toolCallJSON `json:"tool_calls,omitempty"`
}

// textCompletion is a text completion answer or chunk (object "text_completion" for both,
// as in OpenAI's API).
type textCompletion struct {
	ID      string       `json:"id"`
	Object  string       `json:"object"`
	Created int64        `json:"created"`
	Model   string       `json:"model"`
	Choices []textChoice `json:"choices"`
	// Usage: an object on a non-streaming answer and on the final usage chunk; null on the
	// other chunks when include_usage is set; absent otherwise.
	Usage  json.RawMessage `json:"usage,omitempty"`
	DFlash *dflashStats    `json:"dflash,omitempty"`
}

type textChoice struct {
	Text         string    `json:"text"`
	Index        int       `json:"index"`
	Logprobs     *struct{} `json:"logprobs"`
	FinishReason *string   `json:"finish_reason"`
}

// modelList is the /v1/models answer.
type modelList struct {
	Object string      `json:"object"`
	Data   []modelInfo `json:"data"`
}

type modelInfo struct {
	ID            string `json:"id"`
	Object        string `json:"object"`
	Created       int64  `json:"created"`
	OwnedBy       string `json:"owned_by"`
	ContextLength int    `json:"context_length"`
}

var jsonNull = json.RawMessage("null")

func usageJSON(u usage) json.RawMessage {
	b, _ := json.Marshal(u) // plain ints always encode
	return b
}
