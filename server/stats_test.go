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

// dflashReports gathers the dflash object of every answer shape, streaming and not, for one
// request of each API: chat completions, completions, Responses (and its stored copy) and
// Messages. Each is decoded as a client sees it, so a missing or extra field shows.
func dflashReports(t *testing.T, baseURL string) map[string]map[string]any {
	t.Helper()
	reports := map[string]map[string]any{}
	put := func(name string, v any) {
		t.Helper()
		m, ok := v.(map[string]any)
		if !ok {
			t.Fatalf("%s: no dflash object (%v)", name, v)
		}
		reports[name] = m
	}
	rawObject := func(name string, raw []byte) map[string]any {
		t.Helper()
		var m map[string]any
		decode(t, raw, &m)
		return m
	}

	put("chat", postJSONOK(t, baseURL+"/v1/chat/completions", userChat("x"))["dflash"])
	_, events, done := postStream(t, baseURL+"/v1/chat/completions", map[string]any{"messages": userChat("x")["messages"],
		"stream": true, "stream_options": map[string]any{"include_usage": true}})
	if !done || len(events) < 2 {
		t.Fatalf("chat stream: %d events, [DONE] %v", len(events), done)
	}
	for _, raw := range events {
		ev := rawObject("chat stream", raw)
		if fr := jsonPath(ev, "choices", 0, "finish_reason"); fr != nil {
			put("chat stream finish chunk", ev["dflash"])
		}
	}
	put("chat stream usage chunk", rawObject("chat stream", events[len(events)-1])["dflash"])

	put("completions", postJSONOK(t, baseURL+"/v1/completions", map[string]any{"prompt": "x"})["dflash"])
	_, events, done = postStream(t, baseURL+"/v1/completions", map[string]any{"prompt": "x", "stream": true})
	if !done || len(events) == 0 {
		t.Fatal("completions stream did not end with [DONE]")
	}
	put("completions stream", rawObject("completions stream", events[len(events)-1])["dflash"])

	full := postJSONOK(t, baseURL+"/v1/responses", map[string]any{"input": "x"})
	put("responses", full["dflash"])
	put("stored response", do200(t, http.MethodGet, baseURL+"/v1/responses/"+str(full["id"]))["dflash"])
	named := postNamedStream(t, baseURL+"/v1/responses", map[string]any{"input": "x", "stream": true})
	if last := named[len(named)-1]; last.Name != "response.completed" {
		t.Fatalf("responses stream ends with %s", last.Name)
	} else {
		put("responses stream", jsonPath(last.Data, "response", "dflash"))
	}

	msg := map[string]any{"model": "dflash-fake", "max_tokens": 100,
		"messages": []any{map[string]any{"role": "user", "content": "x"}}}
	put("messages", postJSONOK(t, baseURL+"/v1/messages", msg, anthropicHeaders...)["dflash"])
	msg["stream"] = true
	for _, ev := range postNamedStream(t, baseURL+"/v1/messages", msg, anthropicHeaders...) {
		if ev.Name == "message_delta" {
			put("messages stream", ev.Data["dflash"])
		}
	}
	if len(reports) != 10 {
		t.Fatalf("%d dflash objects, want 10: %v", len(reports), reports)
	}
	return reports
}

// Each answer reports its own request's speculation: draft tokens proposed and accepted,
// their ratio and the batch it shared, in every API and in /metrics.
func TestSpeculationStatsInEveryAnswer(t *testing.T) {
	backend := reportingBackend{Fake: &servertest.Fake{}, result: server.GenerateResult{
		CompletionTokens: 13, Cycles: 4, Drafted: 12, Accepted: 9, BatchSize: 2.5}}
	srv := servertest.Start(t, server.Config{}, backend, nil)
	for name, st := range dflashReports(t, srv.URL) {
		want := map[string]float64{"drafted": 12, "accepted": 9, "acceptance_rate": 0.75, "batch_size": 2.5,
			"cycles": 4, "tau": 3.25}
		for k, v := range want {
			if got, ok := st[k].(float64); !ok || got != v {
				t.Errorf("%s: dflash.%s = %v, want %g (%v)", name, k, st[k], v, st)
			}
		}
	}

	resp, data := do(t, http.MethodGet, srv.URL+"/metrics", nil)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("/metrics: %d", resp.StatusCode)
	}
	families, err := parsePromText(string(data))
	if err != nil {
		t.Fatalf("/metrics is not valid Prometheus text: %v\n%s", err, data)
	}
	// Two generations per endpoint: one full answer, one stream (the stored response is a copy).
	for _, endpoint := range []string{"/v1/chat/completions", "/v1/completions", "/v1/responses", "/v1/messages"} {
		l := map[string]string{"endpoint": endpoint}
		if v := promValue(families, "dflash_draft_tokens_total", "dflash_draft_tokens_total", l); v != 24 {
			t.Errorf("dflash_draft_tokens_total%v = %g, want 24", l, v)
		}
		if v := promValue(families, "dflash_accepted_draft_tokens_total", "dflash_accepted_draft_tokens_total", l); v != 18 {
			t.Errorf("dflash_accepted_draft_tokens_total%v = %g, want 18", l, v)
		}
	}
	for _, c := range []struct {
		name   string
		labels map[string]string
		want   float64
	}{
		{"dflash_acceptance_rate_count", nil, 8},
		{"dflash_acceptance_rate_sum", nil, 6},
		{"dflash_acceptance_rate_bucket", map[string]string{"le": "0.7"}, 0},
		{"dflash_acceptance_rate_bucket", map[string]string{"le": "0.8"}, 8},
	} {
		if v := promValue(families, "dflash_acceptance_rate", c.name, c.labels); v != c.want {
			t.Errorf("%s%v = %g, want %g", c.name, c.labels, v, c.want)
		}
	}
	for name, typ := range map[string]string{"dflash_draft_tokens_total": "counter",
		"dflash_accepted_draft_tokens_total": "counter", "dflash_acceptance_rate": "histogram"} {
		if f := families[name]; f == nil || f.typ != typ || f.help == "" {
			t.Errorf("family %s: want TYPE %s with HELP", name, typ)
		}
	}
}

// Plain decoding drafts nothing: drafted and accepted are 0, acceptance_rate and batch_size
// are absent, and /metrics counts no draft tokens and no acceptance rate.
func TestPlainDecodingHasNoAcceptanceRate(t *testing.T) {
	srv := newFakeServer(t, server.Config{}, &servertest.Fake{})
	for name, st := range dflashReports(t, srv.URL) {
		if st["drafted"] != 0.0 || st["accepted"] != 0.0 {
			t.Errorf("%s: drafted %v, accepted %v, want 0 and 0", name, st["drafted"], st["accepted"])
		}
		for _, k := range []string{"acceptance_rate", "batch_size"} {
			if v, ok := st[k]; ok {
				t.Errorf("%s: dflash.%s = %v, want it absent", name, k, v)
			}
		}
	}
	_, data := do(t, http.MethodGet, srv.URL+"/metrics", nil)
	families, err := parsePromText(string(data))
	if err != nil {
		t.Fatalf("/metrics is not valid Prometheus text: %v\n%s", err, data)
	}
	if f := families["dflash_draft_tokens_total"]; f == nil || len(f.samples) != 0 {
		t.Errorf("dflash_draft_tokens_total: %+v, want the family without samples", f)
	}
	if v := promValue(families, "dflash_acceptance_rate", "dflash_acceptance_rate_count", nil); v != 0 {
		t.Errorf("dflash_acceptance_rate_count = %g, want 0", v)
	}
}
