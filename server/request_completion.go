package server

// completionRequest is a validated /v1/completions request.
type completionRequest struct {
	commonRequest
	Prompt string
}

// decodeCompletionRequest parses and validates a text completion request body.
func decodeCompletionRequest(body []byte) (*completionRequest, error) {
	o, err := parseBody(body)
	if err != nil {
		return nil, err
	}
	common, err := decodeCommon(o)
	if err != nil {
		return nil, err
	}
	req := &completionRequest{commonRequest: common}
	if req.Prompt, err = decodePrompt(o); err != nil {
		return nil, err
	}
	return req, refuseCompletionOnlyUnsupported(o)
}

// decodePrompt reads "prompt": a string, or an array holding exactly one string. Several
// prompts would need several choices, and token-id prompts would bypass the tokenizer's
// checks, so both are refused with a message saying so.
func decodePrompt(o jsonObject) (string, error) {
	raw, ok := o.lookup("prompt")
	if !ok {
		return "", invalidField("prompt", "prompt is required")
	}
	switch jsonKind(raw) {
	case "string":
		return decodeString("prompt", raw)
	case "array":
		items, err := decodeArray("prompt", raw)
		if err != nil {
			return "", err
		}
		if len(items) != 1 {
			return "", invalidField("prompt", "prompt must be a string or an array of exactly one string, got %d items", len(items))
		}
		if kind := jsonKind(items[0]); kind != "string" {
			return "", invalidField("prompt[0]",
				"prompt[0] must be a string, got %s (token-id prompts are not supported)", kind)
		}
		return decodeString("prompt[0]", items[0])
	default:
		return "", invalidField("prompt", "prompt must be a string, got %s", jsonKind(raw))
	}
}

func refuseCompletionOnlyUnsupported(o jsonObject) error {
	if v, _, err := o.boolean("echo"); err != nil {
		return err
	} else if v {
		return unsupported("echo", "echo is not supported by this server")
	}
	if s, _, err := o.string("suffix"); err != nil {
		return err
	} else if s != "" {
		return unsupported("suffix", "suffix (fill-in-the-middle) is not supported by this server")
	}
	if v, ok, err := o.integer("best_of"); err != nil {
		return err
	} else if ok && v != 1 {
		return invalidField("best_of", "best_of must be 1, got %d", v)
	}
	if v, _, err := o.integer("logprobs"); err != nil {
		return err
	} else if v > 0 {
		return unsupported("logprobs", "logprobs is not supported by this server")
	}
	return nil
}

func unsupported(param, message string) *apiError {
	return &apiError{Status: 400, Type: typeInvalidRequest, Param: param, Code: "unsupported_parameter", Message: message}
}
