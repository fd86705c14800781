package cli

import (
	"encoding/json"
	"testing"
)

// bench --concurrency with a drafter: a row per level with a positive aggregate
// throughput for the three ways (batched speculation, serial speculation, plain
// batching), the batched tokens equal to the serial ones, τ for the speculating ones,
// and a mean batch between one row and the level's clients.
func TestBenchConcurrency(t *testing.T) {
	td, dd := tinyPair(t)
	out, errOut, code := runCLI(t, "bench", "--target-model", td, "--draft-model", dd, "--concurrency", "1,2", "--requests-per-client", "1",
		"-n", "8", "--num-prompts", "2", "--warmup", "0", "--json", "-q")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	// Only the fields checked: the settings do not decode back from their JSON.
	var rep struct {
		MaxTokens         int              `json:"max_new_tokens"`
		RequestsPerClient int              `json:"requests_per_client"`
		Rows              []concurrencyRow `json:"rows"`
	}
	if err := json.Unmarshal([]byte(out), &rep); err != nil {
		t.Fatalf("not JSON: %v\n%s", err, out)
	}
	if len(rep.Rows) != 2 || rep.RequestsPerClient != 1 || rep.MaxTokens != 8 {
		t.Fatalf("report %+v", rep)
	}
	for i, x := range rep.Rows {
		if want := []int{1, 2}[i]; x.Concurrency != want || x.Requests != want || x.Tokens != 8*want {
			t.Errorf("row %d: %d clients, %d requests, %d tokens", i, x.Concurrency, x.Requests, x.Tokens)
		}
		if x.Exact == nil || !*x.Exact || x.Mismatches != 0 {
			t.Errorf("%d clients: exact %v, %d mismatches", x.Concurrency, x.Exact, x.Mismatches)
		}
		if x.Batched.TPS <= 0 || x.Serial.TPS <= 0 || x.Speedup <= 0 {
			t.Errorf("%d clients: batched %.1f tok/s, serial %.1f tok/s, speedup %.2f", x.Concurrency, x.Batched.TPS, x.Serial.TPS, x.Speedup)
		}
		if b := x.Batched.BatchSize; b < 1 || b > float64(x.Concurrency) {
			t.Errorf("%d clients: mean batch %.2f", x.Concurrency, b)
		}
		if x.Plain == nil || x.Plain.TPS <= 0 || x.OverBest <= 0 || x.Batched.Tau < 1 || x.Serial.Tau < 1 {
			t.Errorf("%d clients, speculating: plain batched %+v, over best %.2f, τ %.2f and %.2f serial", x.Concurrency, x.Plain, x.OverBest, x.Batched.Tau, x.Serial.Tau)
		}
		if x.Serial.BatchSize != 1 {
			t.Errorf("%d clients: serial mean batch %.2f, want 1", x.Concurrency, x.Serial.BatchSize)
		}
		// What each pass built: no NVRTC on the CPU, and the serial pass's prefills and
		// verify blocks attend with several queries at lengths no earlier pass met
		// (exact key lengths on the CPU).
		passes := []levelStats{x.Batched, x.Serial}
		if x.Plain != nil {
			passes = append(passes, *x.Plain)
		}
		for _, st := range passes {
			if b := st.Builds; b.Compiles != 0 || b.CacheHits != 0 || b.AttentionShapes < 0 {
				t.Errorf("%d clients: builds %+v", x.Concurrency, b)
			}
		}
		if i == 0 && x.Serial.Builds.AttentionShapes == 0 {
			t.Errorf("%d clients: the serial pass attended no new multi-query shape", x.Concurrency)
		}
		for _, st := range []levelStats{x.Batched, x.Serial} {
			if st.TTFTP50MS <= 0 || st.TTFTP95MS < st.TTFTP50MS || st.LatencyP95MS < st.LatencyP50MS || st.LatencyP50MS < st.TTFTP50MS {
				t.Errorf("%d clients: %+v", x.Concurrency, st)
			}
		}
	}
}

// bench --join-gap: the interleaved and the whole prefill each report the running rows'
// gaps and the long prompt's first token; refused lengths exit with a usage error.
func TestBenchJoinGap(t *testing.T) {
	td, _ := tinyPair(t)
	out, errOut, code := runCLI(t, "bench", "--target-model", td, "--no-draft", "--join-gap", "300", "--join-rows", "2", "--json", "-q")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	var rep joinGapReport
	if err := json.Unmarshal([]byte(out), &rep); err != nil {
		t.Fatalf("not JSON: %v\n%s", err, out)
	}
	if rep.Rows != 2 || rep.PromptTokens != 300 || len(rep.Runs) != 2 || rep.Runs[0].SliceMS <= 0 || rep.Runs[1].SliceMS != 0 {
		t.Fatalf("report %+v", rep)
	}
	for _, r := range rep.Runs {
		if r.GapBeforeMS <= 0 || r.GapDuringMS <= 0 || r.TTFTMS <= 0 {
			t.Errorf("run %+v: every gap and the TTFT must be measured", r)
		}
	}
	if _, _, code := runCLI(t, "bench", "--target-model", td, "--no-draft", "--join-gap", "1", "-q"); code != 2 {
		t.Errorf("--join-gap 1: exit %d, want 2", code)
	}
}
