package server

import (
	"net/http"
	"slices"
	"strings"
)

// route is one path the server answers.
type route struct {
	endpoint string   // the canonical path, the "endpoint" label in metrics and logs
	methods  []string // GET routes also answer HEAD
	handle   func(*Server, http.ResponseWriter, *http.Request)
}

func (rt route) allow() string {
	methods := slices.Clone(rt.methods)
	if slices.Contains(methods, http.MethodGet) {
		methods = append(methods, http.MethodHead)
	}
	return strings.Join(append(methods, http.MethodOptions), ", ")
}

func (rt route) accepts(method string) bool {
	return slices.Contains(rt.methods, method) ||
		(method == http.MethodHead && slices.Contains(rt.methods, http.MethodGet))
}

// modelPathPrefix starts /v1/models/{id}; model ids contain slashes
// ("mlx-community/Qwen3-4B-bf16"), so the rest of the path is the id.
const modelPathPrefix = "/v1/models/"

// routes maps exact paths to routes. The paths without /v1 are the ones mlx-lm also
// serves, for clients configured with a bare host as the base URL.
var routes = map[string]route{
	"/v1/chat/completions": {"/v1/chat/completions", []string{http.MethodPost}, (*Server).handleChatCompletions},
	"/chat/completions":    {"/v1/chat/completions", []string{http.MethodPost}, (*Server).handleChatCompletions},
	"/v1/completions":      {"/v1/completions", []string{http.MethodPost}, (*Server).handleCompletions},
	"/completions":         {"/v1/completions", []string{http.MethodPost}, (*Server).handleCompletions},
	"/v1/models":           {"/v1/models", []string{http.MethodGet}, (*Server).handleModels},
	"/models":              {"/v1/models", []string{http.MethodGet}, (*Server).handleModels},
	"/v1/responses":        {"/v1/responses", []string{http.MethodPost}, (*Server).handleResponses},
	"/responses":           {"/v1/responses", []string{http.MethodPost}, (*Server).handleResponses},
	"/v1/responses/input_tokens": {"/v1/responses/input_tokens", []string{http.MethodPost},
		(*Server).handleInputTokens},
	"/v1/messages": {"/v1/messages", []string{http.MethodPost}, (*Server).handleMessages},
	"/v1/messages/count_tokens": {"/v1/messages/count_tokens", []string{http.MethodPost},
		(*Server).handleCountTokens},
	"/health":  {"/health", []string{http.MethodGet}, (*Server).handleHealth},
	"/metrics": {"/metrics", []string{http.MethodGet}, (*Server).handleMetrics},
}

var modelRoute = route{"/v1/models/{id}", []string{http.MethodGet}, (*Server).handleModel}

// responsePathPrefix starts /v1/responses/{id}, a stored response.
const responsePathPrefix = "/v1/responses/"

var responseRoute = route{"/v1/responses/{id}", []string{http.MethodGet, http.MethodDelete}, (*Server).handleStoredResponse}

func lookupRoute(path string) (route, bool) {
	if rt, ok := routes[path]; ok {
		return rt, true
	}
	if strings.HasPrefix(path, modelPathPrefix) && len(path) > len(modelPathPrefix) {
		return modelRoute, true
	}
	if id, ok := strings.CutPrefix(path, responsePathPrefix); ok && id != "" && !strings.Contains(id, "/") {
		return responseRoute, true
	}
	return route{}, false
}

// endpointName is the metrics label of a path; unknown paths share "other" so that
// scanners cannot grow the label set without bound.
func endpointName(path string) string {
	if rt, ok := lookupRoute(path); ok {
		return rt.endpoint
	}
	return "other"
}

func isGenerationEndpoint(endpoint string) bool {
	switch endpoint {
	case "/v1/chat/completions", "/v1/completions", "/v1/responses", "/v1/messages":
		return true
	}
	return false
}

// dispatch answers 404 and 405 in the OpenAI error shape, which http.ServeMux would answer
// in plain text.
func (s *Server) dispatch(w http.ResponseWriter, r *http.Request) {
	writeError := errorWriterFor(r.URL.Path)
	rt, ok := lookupRoute(r.URL.Path)
	if !ok {
		writeError(w, notFound("no route for "+r.URL.Path+
			"; the API lives under /v1 (chat/completions, completions, responses, messages, models)"))
		return
	}
	if !rt.accepts(r.Method) {
		w.Header().Set("Allow", rt.allow())
		writeError(w, &apiError{Status: http.StatusMethodNotAllowed, Type: typeInvalidRequest, Code: "method_not_allowed",
			Message: "method " + r.Method + " is not allowed on " + r.URL.Path + "; use " + strings.Join(rt.methods, " or ")})
		return
	}
	rt.handle(s, w, r)
}
