package server

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"
)

// apiError is an error the client sees, in the OpenAI shape
// {"error":{"message","type","param","code"}}, with its HTTP status.
type apiError struct {
	Status  int
	Type    string // invalid_request_error, rate_limit_error, server_error, ...
	Message string
	Param   string // the request field at fault, "" when none
	Code    string // a stable machine-readable code, "" when none
	// RetryAfter, when > 0, is sent as the Retry-After header (seconds).
	RetryAfter int
}

func (e *apiError) Error() string {
	if e.Param != "" {
		return fmt.Sprintf("%d %s (param %s): %s", e.Status, e.Type, e.Param, e.Message)
	}
	return fmt.Sprintf("%d %s: %s", e.Status, e.Type, e.Message)
}

const (
	typeInvalidRequest = "invalid_request_error"
	typeRateLimit      = "rate_limit_error"
	typeServer         = "server_error"
)

// invalidField is the 400 for a request field with a wrong type or value.
func invalidField(param, format string, args ...any) *apiError {
	return &apiError{
		Status:  http.StatusBadRequest,
		Type:    typeInvalidRequest,
		Message: fmt.Sprintf(format, args...),
		Param:   param,
	}
}

func badRequest(code, format string, args ...any) *apiError {
	return &apiError{Status: http.StatusBadRequest, Type: typeInvalidRequest, Code: code, Message: fmt.Sprintf(format, args...)}
}

func notFound(message string) *apiError {
	return &apiError{Status: http.StatusNotFound, Type: typeInvalidRequest, Code: "not_found", Message: message}
}

func internalError(message string) *apiError {
	return &apiError{Status: http.StatusInternalServerError, Type: typeServer, Code: "internal_error", Message: message}
}

func unavailable(message string) *apiError {
	return &apiError{Status: http.StatusServiceUnavailable, Type: typeServer, Code: "shutting_down", Message: message, RetryAfter: 5}
}

// errorBody is the JSON shape of an error response and of an in-stream error event.
type errorBody struct {
	Error errorDetail `json:"error"`
}

type errorDetail struct {
	Message string  `json:"message"`
	Type    string  `json:"type"`
	Param   *string `json:"param"`
	Code    *string `json:"code"`
}

func (e *apiError) body() errorBody {
	d := errorDetail{Message: e.Message, Type: e.Type}
	if e.Param != "" {
		d.Param = &e.Param
	}
	if e.Code != "" {
		d.Code = &e.Code
	}
	return errorBody{Error: d}
}

// writeError sends e as a complete JSON response.
func writeError(w http.ResponseWriter, e *apiError) {
	if e.RetryAfter > 0 {
		w.Header().Set("Retry-After", strconv.Itoa(e.RetryAfter))
	}
	if e.Status == http.StatusUnauthorized {
		w.Header().Set("WWW-Authenticate", `Bearer realm="dflash-mlx"`)
	}
	writeJSON(w, e.Status, e.body())
}

// writeAPIErrorAs answers with err through the API's error writer; anything but an
// *apiError is a server bug and becomes a 500.
func writeAPIErrorAs(w http.ResponseWriter, err error, write func(http.ResponseWriter, *apiError)) {
	var apiErr *apiError
	if errors.As(err, &apiErr) {
		write(w, apiErr)
		return
	}
	write(w, internalError(err.Error()))
}

// marshalJSON encodes v without HTML escaping, so that answers holding "<think>" or "&"
// read the same on the wire as in the client.
func marshalJSON(v any) ([]byte, error) {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		return nil, err
	}
	return bytes.TrimSuffix(buf.Bytes(), []byte("\n")), nil
}

// writeJSON sends v as the whole response body.
func writeJSON(w http.ResponseWriter, status int, v any) {
	body, err := marshalJSON(v)
	if err != nil {
		// Only our own response types reach here; a marshal failure is a server bug.
		status = http.StatusInternalServerError
		body, _ = json.Marshal(internalError("encoding the response failed: " + err.Error()).body())
	}
	h := w.Header()
	h.Set("Content-Type", "application/json")
	h.Set("Content-Length", strconv.Itoa(len(body)+1))
	w.WriteHeader(status)
	_, _ = w.Write(append(body, '\n'))
}
