package server

import (
	"net/http"
	"strconv"
	"strings"
)

// Anthropic's error shape: {"type": "error", "error": {"type": ..., "message": ...}}, with
// its own error types per status. The server's errors are apiErrors in OpenAI's terms; on
// the Messages routes they are sent in this shape instead.

type anthropicErrorBody struct {
	Type  string               `json:"type"`
	Error anthropicErrorDetail `json:"error"`
}

type anthropicErrorDetail struct {
	Type    string `json:"type"`
	Message string `json:"message"`
}

// anthropicErrorType maps an HTTP status to the error type Anthropic sends with it.
func anthropicErrorType(status int) string {
	switch status {
	case http.StatusUnauthorized:
		return "authentication_error"
	case http.StatusForbidden:
		return "permission_error"
	case http.StatusNotFound:
		return "not_found_error"
	case http.StatusRequestEntityTooLarge:
		return "request_too_large"
	case http.StatusTooManyRequests:
		return "rate_limit_error"
	case http.StatusServiceUnavailable, 529:
		return "overloaded_error"
	case http.StatusGatewayTimeout:
		return "timeout_error"
	}
	if status >= 500 {
		return "api_error"
	}
	return "invalid_request_error"
}

func (e *apiError) anthropicBody() anthropicErrorBody {
	msg := e.Message
	if e.Param != "" && !strings.Contains(msg, e.Param) {
		msg = e.Param + ": " + msg
	}
	return anthropicErrorBody{Type: "error", Error: anthropicErrorDetail{Type: anthropicErrorType(e.Status), Message: msg}}
}

// writeAnthropicError sends e as a complete JSON response in Anthropic's shape.
func writeAnthropicError(w http.ResponseWriter, e *apiError) {
	if e.RetryAfter > 0 {
		w.Header().Set("Retry-After", strconv.Itoa(e.RetryAfter))
	}
	writeJSON(w, e.Status, e.anthropicBody())
}

// isAnthropicPath reports whether path is one of the Messages API's routes, whose errors
// (also those of the middleware: auth, 404, 405, panics) take Anthropic's shape.
func isAnthropicPath(path string) bool {
	return path == "/v1/messages" || strings.HasPrefix(path, "/v1/messages/") ||
		path == "/messages" || strings.HasPrefix(path, "/messages/")
}

// errorWriterFor is the error writer of the API that path belongs to.
func errorWriterFor(path string) func(http.ResponseWriter, *apiError) {
	if isAnthropicPath(path) {
		return writeAnthropicError
	}
	return writeError
}
