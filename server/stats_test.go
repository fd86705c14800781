package server_test

import (
	"context"
	"encoding/json"
	"math"
	"net/http"
	"testing"
	"time"

	"github.com/dflash-mlx/dflash-mlx/server"
	"github.com/dflash-mlx/dflash-mlx/server/servertest"
)

// reportingBackend emits one word per completion token, pausing between words, and
// reports the result it was given: statistics chosen by the test instead of measured.
type reportingBackend struct {
	*servertest.Fake
	result server.GenerateResult
	pause  time.Duration
}

func (b reportingBackend) Generate(ctx context.Context, req server.GenerateRequest, emit func(server.Delta) error) (server.GenerateResult, error) {
	for i := range b.result.CompletionTokens {
		if i > 0 {
			time.Sleep(b.pause)
		}
		if err := emit(server.Delta{Text: "w ", Tokens: 1}); err != nil {
			return server.GenerateResult{FinishReason: server.FinishCancelled}, err
		}
	}
	res := b.result
	res.FinishReason = server.FinishStop
	return res, nil
}

// tokens_per_second is the completion tokens after the first over the decode time, and null
// when there is no interval worth a rate: fewer than two tokens, or under a millisecond.
func TestTokensPerSecondIsARateOverARealInterval(t *testing.T) {
	tests := []struct {
		name    string
		tokens  int
		decode  time.Duration
		backend float64       // the backend's own TokensPerSecond; 0: none
		pause   time.Duration // between the emitted words, timed by the server's clock
		want    float64       // 0: null
		atMost  bool          // want is an upper bound (the server's clock is not exact)
	}{
		{"one token, as reported", 1, 17 * time.Microsecond, 0, 0, 0, false},
		{"one token with a backend rate", 1, 17 * time.Microsecond, 59259, 0, 0, false},
		{"two tokens", 2, 10 * time.Millisecond, 0, 0, 100, false},
		{"thirty tokens", 30, 58 * time.Millisecond, 0, 0, 500, false},
		{"the backend's rate", 30, 58 * time.Millisecond, 480, 0, 480, false},
		{"an interval too short to time", 5, 200 * time.Microsecond, 0, 0, 0, false},
		{"the server's clock", 3, 0, 0, 2 * time.Millisecond, 2 / 0.004, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			backend := reportingBackend{Fake: &servertest.Fake{}, pause: tt.pause, result: server.GenerateResult{
				CompletionTokens: tt.tokens, DecodeTime: tt.decode, TokensPerSecond: tt.backend}}
			srv := servertest.Start(t, server.Config{}, backend, nil)
			check := func(how string, raw json.RawMessage) {
				t.Helper()
				var st struct {
					TokensPerSecond *float64 `json:"tokens_per_second"`
				}
				decode(t, raw, &st)
				switch got := st.TokensPerSecond; {
				case tt.want == 0 && got != nil:
					t.Fatalf("%s: tokens_per_second %g, want null", how, *got)
				case tt.want == 0:
				case got == nil:
					t.Fatalf("%s: tokens_per_second null, want %g", how, tt.want)
				case tt.atMost && (*got <= 0 || *got > tt.want):
					t.Fatalf("%s: tokens_per_second %g, want in (0, %g]", how, *got, tt.want)
				case !tt.atMost && math.Abs(*got-tt.want) > 1e-9*tt.want:
					t.Fatalf("%s: tokens_per_second %g, want %g", how, *got, tt.want)
				}
			}

			resp, data := do(t, http.MethodPost, srv.URL+"/v1/chat/completions", userChat("x"))
			if resp.StatusCode != http.StatusOK {
				t.Fatalf("status %d: %s", resp.StatusCode, data)
			}
			var full struct {
				DFlash json.RawMessage `json:"dflash"`
			}
			decode(t, data, &full)
			check("full answer", full.DFlash)

			_, events, done := postStream(t, srv.URL+"/v1/completions", map[string]any{"prompt": "x", "stream": true})
			if !done || len(events) == 0 {
				t.Fatal("stream did not end with [DONE]")
			}
			var last struct {
				DFlash json.RawMessage `json:"dflash"`
			}
			decode(t, events[len(events)-1], &last)
			check("stream", last.DFlash)
		})
	}
}
