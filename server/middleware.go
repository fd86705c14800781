package server

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"fmt"
	"log/slog"
	"net/http"
	"runtime/debug"
	"slices"
	"strings"
	"time"
)

// requestInfo is what one request's log line and metrics report. The outer middleware
// creates it; handlers fill in what they learn.
type requestInfo struct {
	id       string
	endpoint string // the canonical route, or "other"
	// statusOverride replaces the written status in logs and metrics: 499 when the client
	// went away before it could be answered.
	statusOverride int

	generated        bool // a generation ran (the fields below are set)
	promptTokens     int
	completionTokens int
	tau              float64
	tokensPerSecond  *float64 // nil: no rate (see decodeRate)
	finish           string
	queueWait        time.Duration
}

// statusClientClosed is nginx's code for "client closed request", used in logs and metrics.
const statusClientClosed = 499

type requestInfoKey struct{}

func infoFrom(ctx context.Context) *requestInfo {
	if info, ok := ctx.Value(requestInfoKey{}).(*requestInfo); ok {
		return info
	}
	return &requestInfo{} // handlers called without the middleware (never in the server)
}

// statusRecorder remembers the status a handler wrote. Unwrap lets http.ResponseController
// reach the real writer for Flush and deadlines.
type statusRecorder struct {
	http.ResponseWriter
	status int
}

func (r *statusRecorder) WriteHeader(code int) {
	// Informational responses (102 probes a client's liveness) precede the real status.
	if r.status == 0 && code >= 200 {
		r.status = code
	}
	r.ResponseWriter.WriteHeader(code)
}

func (r *statusRecorder) Write(b []byte) (int, error) {
	if r.status == 0 {
		r.status = http.StatusOK
	}
	return r.ResponseWriter.Write(b)
}

func (r *statusRecorder) Unwrap() http.ResponseWriter { return r.ResponseWriter }

// observe is the outermost middleware: it gives the request an id, recovers panics into a
// 500 JSON error, counts the request and writes its one log line.
func (s *Server) observe(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		start := time.Now()
		info := &requestInfo{id: randomID("req_"), endpoint: endpointName(r.URL.Path)}
		rec := &statusRecorder{ResponseWriter: w}
		rec.Header().Set("X-Request-Id", info.id)
		defer func() {
			p := recover()
			if p != nil && p != http.ErrAbortHandler {
				s.log.Error("handler panic", "id", info.id, "path", r.URL.Path, "panic", fmt.Sprint(p), "stack", string(debug.Stack()))
				if rec.status == 0 {
					errorWriterFor(r.URL.Path)(rec, internalError("internal server error; see the server log for request "+info.id))
				}
			}
			s.finishRequest(r, rec, info, time.Since(start))
			if p == http.ErrAbortHandler {
				panic(p) // net/http closes the connection without completing the response
			}
		}()
		next.ServeHTTP(rec, r.WithContext(context.WithValue(r.Context(), requestInfoKey{}, info)))
	})
}

func (s *Server) finishRequest(r *http.Request, rec *statusRecorder, info *requestInfo, elapsed time.Duration) {
	status := rec.status
	if info.statusOverride != 0 {
		status = info.statusOverride
	}
	if status == 0 {
		status = http.StatusOK
	}
	s.metrics.observeRequest(info.endpoint, status, elapsed)
	level := slog.LevelInfo
	if info.endpoint == "/health" || info.endpoint == "/metrics" {
		level = slog.LevelDebug // probes would drown the log
	}
	attrs := []slog.Attr{
		slog.String("id", info.id), slog.String("method", r.Method), slog.String("path", r.URL.Path),
		slog.Int("status", status), slog.Duration("elapsed", elapsed),
	}
	if info.generated {
		attrs = append(attrs,
			slog.Int("prompt_tokens", info.promptTokens), slog.Int("completion_tokens", info.completionTokens),
			slog.Float64("tau", round2(info.tau)), slog.Any("tok_per_s", rateAttr(info.tokensPerSecond)),
			slog.String("finish", info.finish), slog.Duration("queued", info.queueWait))
	}
	s.log.LogAttrs(r.Context(), level, "request", attrs...)
}

func round2(v float64) float64 { return float64(int64(v*100+0.5)) / 100 }

// rateAttr is a speed for the log: rounded, or nil (logged as null) when there is none.
func rateAttr(rate *float64) any {
	if rate == nil {
		return nil
	}
	return round2(*rate)
}

// cors answers preflight requests and adds CORS headers for the configured origins. With no
// origins configured it adds nothing, so browsers on other origins cannot use the API.
func (s *Server) cors(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		origin := r.Header.Get("Origin")
		allowed := origin != "" && s.originAllowed(origin)
		if allowed {
			h := w.Header()
			if slices.Contains(s.cfg.CORSOrigins, "*") {
				h.Set("Access-Control-Allow-Origin", "*")
			} else {
				h.Set("Access-Control-Allow-Origin", origin)
				h.Add("Vary", "Origin")
			}
			h.Set("Access-Control-Expose-Headers", "Retry-After, X-Request-Id")
		}
		if r.Method != http.MethodOptions {
			next.ServeHTTP(w, r)
			return
		}
		route, ok := lookupRoute(r.URL.Path)
		if !ok {
			errorWriterFor(r.URL.Path)(w, notFound("no route for "+r.URL.Path))
			return
		}
		h := w.Header()
		h.Set("Allow", route.allow())
		if allowed {
			h.Set("Access-Control-Allow-Methods", route.allow())
			headers := r.Header.Get("Access-Control-Request-Headers")
			if headers == "" {
				headers = "Authorization, Content-Type"
			}
			h.Set("Access-Control-Allow-Headers", headers)
			h.Set("Access-Control-Max-Age", "600")
		}
		w.WriteHeader(http.StatusNoContent)
	})
}

func (s *Server) originAllowed(origin string) bool {
	for _, o := range s.cfg.CORSOrigins {
		if o == "*" || strings.EqualFold(o, origin) {
			return true
		}
	}
	return false
}

// auth requires the API key on everything but /health, which load balancers probe. The key
// may come as "Authorization: Bearer <key>" (OpenAI's SDKs, and Anthropic's since 2.x) or
// as "x-api-key: <key>" (Anthropic's older SDKs and Claude Code's ANTHROPIC_API_KEY).
func (s *Server) auth(next http.Handler) http.Handler {
	if s.cfg.APIKey == "" {
		return next
	}
	want := sha256.Sum256([]byte(s.cfg.APIKey))
	// Comparing digests keeps the comparison constant-time whatever the lengths.
	matches := func(key string) bool {
		got := sha256.Sum256([]byte(strings.TrimSpace(key)))
		return subtle.ConstantTimeCompare(got[:], want[:]) == 1
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/health" {
			next.ServeHTTP(w, r)
			return
		}
		scheme, token, _ := strings.Cut(r.Header.Get("Authorization"), " ")
		bearerOK := strings.EqualFold(scheme, "Bearer") && matches(token)
		apiKeyOK := r.Header.Get("X-Api-Key") != "" && matches(r.Header.Get("X-Api-Key"))
		if !bearerOK && !apiKeyOK {
			e := &apiError{Status: http.StatusUnauthorized, Type: typeInvalidRequest, Code: "invalid_api_key",
				Message: "a valid API key is required: send \"Authorization: Bearer <key>\""}
			if isAnthropicPath(r.URL.Path) {
				e.Message = "a valid API key is required: send \"x-api-key: <key>\" or \"Authorization: Bearer <key>\""
			}
			errorWriterFor(r.URL.Path)(w, e)
			return
		}
		next.ServeHTTP(w, r)
	})
}
