package server

import (
	"bytes"
	"encoding/json"
	"strings"
)

// commonRequest holds the fields chat and text completions share, validated but before
// defaults: a nil pointer means the client did not send the field.
type commonRequest struct {
	Model string
	// MaxTokens comes from max_completion_tokens, else max_tokens; MaxTokensParam says which,
	// so that limit errors name the field the client used.
	MaxTokens      *int
	MaxTokensParam string
	// MaxTokensIsCap makes an explicit max tokens an upper bound, shortened to what the
	// context and the server's limit leave, instead of a 400 when it does not fit. Agents
	// (Claude Code, Codex) send one large value whatever the model; chat completions keeps
	// OpenAI's refusal.
	MaxTokensIsCap bool
	Temperature    *float64
	TopP           *float64
	TopK           *int
	MinP           *float64
	Seed           *int64
	Stop           []string
	Stream         bool
	IncludeUsage   bool
	// Format is the structured output asked for (response_format, text.format,
	// output_config.format); nil: free text.
	Format *answerFormat
}

// maxStopStrings is OpenAI's limit on "stop" entries.
const maxStopStrings = 4

// parseBody decodes the request body into its top-level object.
func parseBody(body []byte) (jsonObject, error) {
	if len(body) == 0 {
		return jsonObject{}, badRequest("invalid_json", "the request body is empty; send a JSON object")
	}
	if !json.Valid(body) {
		// Unmarshal again only to get the position of the syntax error for the message.
		var v any
		err := json.Unmarshal(body, &v)
		return jsonObject{}, badRequest("invalid_json", "the request body is not valid JSON: %v", err)
	}
	return parseObject("", body)
}

// decodeCommon reads and checks the shared fields. Fields that OpenAI defines but this
// server cannot honour are refused when their value would change the answer (n > 1,
// logprobs, structured output), and tolerated when it is harmless to ignore them
// (presence/frequency penalties, logit_bias, user, metadata, store, service_tier).
func decodeCommon(o jsonObject) (commonRequest, error) {
	var req commonRequest
	var err error
	if req.Model, _, err = o.string("model"); err != nil {
		return req, err
	}
	if err := decodeMaxTokens(o, &req); err != nil {
		return req, err
	}
	if err := decodeSampling(o, &req); err != nil {
		return req, err
	}
	if req.Stop, err = decodeStop(o); err != nil {
		return req, err
	}
	if req.Stream, _, err = o.boolean("stream"); err != nil {
		return req, err
	}
	if opts, ok, err := o.object("stream_options"); err != nil {
		return req, err
	} else if ok {
		if req.IncludeUsage, _, err = opts.boolean("include_usage"); err != nil {
			return req, err
		}
	}
	if format, ok, err := o.object("response_format"); err != nil {
		return req, err
	} else if ok {
		if req.Format, err = decodeFormat(format, true); err != nil {
			return req, err
		}
	}
	if n, ok, err := o.integer("n"); err != nil {
		return req, err
	} else if ok && n != 1 {
		return req, invalidField("n", "n must be 1: this server returns one choice per request, got %d", n)
	}
	return req, decodeTolerated(o)
}

func decodeMaxTokens(o jsonObject, req *commonRequest) error {
	for _, name := range []string{"max_completion_tokens", "max_tokens"} {
		v, ok, err := o.integer(name)
		if err != nil {
			return err
		}
		if !ok {
			continue
		}
		if v < 1 {
			return invalidField(name, "%s must be at least 1, got %d", name, v)
		}
		if v > 1<<31-1 {
			return invalidField(name, "%s is too large: %d", name, v)
		}
		n := int(v)
		req.MaxTokens, req.MaxTokensParam = &n, name
		return nil
	}
	return nil
}

func decodeSampling(o jsonObject, req *commonRequest) error {
	type bound struct {
		name     string
		min, max float64
		dst      **float64
	}
	for _, b := range []bound{
		{"temperature", 0, 2, &req.Temperature},
		{"top_p", 0, 1, &req.TopP},
		{"min_p", 0, 1, &req.MinP},
	} {
		v, ok, err := o.number(b.name)
		if err != nil {
			return err
		}
		if !ok {
			continue
		}
		if v < b.min || v > b.max {
			return invalidField(b.name, "%s must be between %g and %g, got %g", b.name, b.min, b.max, v)
		}
		*b.dst = &v
	}
	if v, ok, err := o.integer("top_k"); err != nil {
		return err
	} else if ok {
		// -1 is how vLLM and others spell "disabled"; 0 is ours.
		if v < -1 || v > 1<<31-1 {
			return invalidField("top_k", "top_k must be 0 (disabled) or a positive integer, got %d", v)
		}
		k := max(int(v), 0)
		req.TopK = &k
	}
	if v, ok, err := o.integer("seed"); err != nil {
		return err
	} else if ok {
		req.Seed = &v
	}
	return nil
}

// decodeStop reads "stop": a string or an array of at most four non-empty strings.
func decodeStop(o jsonObject) ([]string, error) {
	raw, ok := o.lookup("stop")
	if !ok {
		return nil, nil
	}
	var stops []string
	switch jsonKind(raw) {
	case "string":
		s, err := decodeString("stop", raw)
		if err != nil {
			return nil, err
		}
		stops = []string{s}
	case "array":
		items, err := decodeArray("stop", raw)
		if err != nil {
			return nil, err
		}
		if len(items) > maxStopStrings {
			return nil, invalidField("stop", "stop may hold at most %d strings, got %d", maxStopStrings, len(items))
		}
		for i, item := range items {
			s, err := decodeString(index("stop", i), item)
			if err != nil {
				return nil, err
			}
			stops = append(stops, s)
		}
	default:
		return nil, invalidField("stop", "stop must be a string or an array of strings, got %s", jsonKind(raw))
	}
	for i, s := range stops {
		if s == "" {
			return nil, invalidField("stop", "stop[%d] is empty; an empty stop string would end every answer at once", i)
		}
	}
	return stops, nil
}

// decodeTolerated type-checks fields that are accepted but not acted on, and refuses the
// ones whose meaning the server would silently break.
func decodeTolerated(o jsonObject) error {
	for _, name := range []string{"presence_penalty", "frequency_penalty"} {
		if v, ok, err := o.number(name); err != nil {
			return err
		} else if ok && (v < -2 || v > 2) {
			return invalidField(name, "%s must be between -2 and 2, got %g", name, v)
		}
	}
	for _, name := range []string{"user", "service_tier"} {
		if _, _, err := o.string(name); err != nil {
			return err
		}
	}
	for _, name := range []string{"logit_bias", "metadata"} {
		if _, _, err := o.object(name); err != nil {
			return err
		}
	}
	if _, _, err := o.boolean("store"); err != nil {
		return err
	}
	return nil
}

// quote writes s as a JSON string literal, leaving <, > and & as they are (tool names and
// markers are shown to people and to the model, not embedded in HTML).
func quote(s string) string {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	_ = enc.Encode(s) // a string always encodes
	return strings.TrimSuffix(buf.String(), "\n")
}
