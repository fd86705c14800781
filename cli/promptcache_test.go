package cli

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/dflash-mlx/dflash-mlx/engine"
)

func TestParseBytes(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want int64
		ok   bool
	}{
		{"0", 0, true}, {"123", 123, true}, {"2G", 2 << 30, true}, {"512M", 512 << 20, true},
		{"1.5GiB", 3 << 29, true}, {"64k", 64 << 10, true}, {"1TB", 1 << 40, true},
		{"", 0, false}, {"-1", 0, false}, {"lots", 0, false}, {"2X", 0, false}, {"1e30", 0, false},
	} {
		got, err := parseBytes(tc.in)
		if (err == nil) != tc.ok || (tc.ok && got != tc.want) {
			t.Errorf("parseBytes(%q) = %d, %v; want %d, ok %v", tc.in, got, err, tc.want, tc.ok)
		}
	}
}

// commonPrefix is the length of the longest common prefix of a and b.
func commonPrefix(a, b []int32) int {
	n := 0
	for n < len(a) && n < len(b) && a[n] == b[n] {
		n++
	}
	return n
}

// A three-turn chat with the prompt cache prefills only what the previous turn did not
// compute: each turn resumes at the longest common prefix of its prompt and the previous
// turn's prompt and answer (the template re-renders the answer, so that is where they part
// or the answer's end), and answers what the chat without a cache answers.
func TestChatPromptCacheResumesEachTurn(t *testing.T) {
	td, dd := tinyPair(t)
	ctx := context.Background()
	open := func(bytes int64) (*Session, *chatSession) {
		s, err := Open(ctx, LoadConfig{Target: td, Draft: dd, Quiet: true, Log: io.Discard, PromptCache: PromptCacheConfig{Bytes: bytes}})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(s.Close)
		cs := &chatSession{s: s, out: io.Discard, system: "You are terse.", sp: func() engine.Request {
			return engine.Request{MaxTokens: 12, StopTokens: s.StopTokens(), BlockSize: 4}
		}}
		return s, cs
	}
	_, plain := open(0)
	s, cached := open(1 << 30)
	var computed []int32 // what the previous turn put through the target
	for turn, q := range []string{"Name a colour.", "And another one?", "Which is warmer?"} {
		if err := plain.turn(ctx, q); err != nil {
			t.Fatal(err)
		}
		if err := cached.turn(ctx, q); err != nil {
			t.Fatal(err)
		}
		if fmt.Sprint(plain.last.Tokens) != fmt.Sprint(cached.last.Tokens) {
			t.Fatalf("turn %d: cached answer %v, uncached %v", turn+1, cached.last.Tokens, plain.last.Tokens)
		}
		ids, st := cached.lastPrompt, cached.last.Stats
		want := min(commonPrefix(computed, ids), len(ids)-1)
		if st.PromptCacheTokens != want || st.PrefillTokens != len(ids)-want {
			t.Errorf("turn %d: %d prompt tokens, %d reused and %d prefilled; want %d reused", turn+1, len(ids), st.PromptCacheTokens, st.PrefillTokens, want)
		}
		if turn > 0 && want < len(computed)/2 {
			t.Errorf("turn %d reuses %d of the %d tokens the turn before computed", turn+1, want, len(computed))
		}
		t.Logf("turn %d: %d prompt tokens, %d resumed, %d prefilled", turn+1, len(ids), st.PromptCacheTokens, st.PrefillTokens)
		// The serial loop's caches end holding the prompt and every answer token but the
		// last (and a stop token the answer ends with).
		computed = append(append([]int32(nil), ids...), cached.last.Tokens...)
		if cached.last.FinishReason == engine.FinishLength {
			computed = computed[:len(computed)-1]
		}
	}
	if st := s.PromptCacheStats(); st == nil || st.Hits != 2 || st.Bytes > st.Budget {
		t.Errorf("prompt cache stats %+v", st)
	}
}

// `bench --multi-turn` reports each turn's time to first token with and without the cache,
// the cached turns resuming what the earlier turns computed, with the same tokens.
func TestBenchMultiTurn(t *testing.T) {
	tinyPair(t)
	out, errOut, code := runCLI(t, "bench", "--demo", "--multi-turn", "3", "-n", "8", "--repeats", "1", "--json")
	if code != 0 {
		t.Fatalf("bench: %s", errOut)
	}
	var rep turnsReport
	if err := json.Unmarshal([]byte(out), &rep); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	if len(rep.Turns) != 3 || !rep.Template {
		t.Fatalf("report %+v", rep)
	}
	for i, tp := range rep.Turns {
		if !tp.SameTokens || tp.PrefillTokens+tp.ReusedTokens != tp.PromptTokens || tp.TTFTMSCached <= 0 || tp.TTFTMSUncached <= 0 {
			t.Errorf("turn %d: %+v", i+1, tp)
		}
		if i > 0 && tp.ReusedTokens < rep.Turns[i-1].PromptTokens/2 {
			t.Errorf("turn %d reuses %d tokens, the turn before had %d", i+1, tp.ReusedTokens, rep.Turns[i-1].PromptTokens)
		}
	}
}

// metric reads one unlabelled metric from a /metrics page.
func metric(t *testing.T, base, name string) float64 {
	t.Helper()
	resp, err := http.Get(base + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, name+" "); ok {
			f, err := strconv.ParseFloat(v, 64)
			if err != nil {
				t.Fatal(err)
			}
			return f
		}
	}
	t.Fatalf("no %s in /metrics", name)
	return 0
}

// Two clients at once, each a conversation sharing a long system prompt with the other,
// against a server with a small prompt-cache budget: every answer is the one a server
// without the cache gives, later requests report cached tokens, and the cache's bytes
// never went past its budget.
func TestServePromptCacheConcurrentClients(t *testing.T) {
	system := strings.Repeat("You answer questions about the weather in short sentences. ", 6)
	const budget = 400 << 10
	cachedBase, _, logs := startServe(t, "--prompt-cache-bytes", fmt.Sprint(budget))
	plainBase, _, _ := startServe(t, "--prompt-cache-bytes", "0")
	type answer struct {
		content string
		cached  int
	}
	ask := func(base string, msgs []map[string]any) (answer, error) {
		b, _ := json.Marshal(map[string]any{"model": "tiny-qwen3", "messages": msgs, "max_tokens": 8, "temperature": 0,
			"chat_template_kwargs": map[string]any{"enable_thinking": false}})
		resp, err := http.Post(base+"/v1/chat/completions", "application/json", strings.NewReader(string(b)))
		if err != nil {
			return answer{}, err
		}
		defer resp.Body.Close()
		var out struct {
			Choices []struct {
				Message struct{ Content string } `json:"message"`
			} `json:"choices"`
			Usage struct {
				Details struct {
					Cached int `json:"cached_tokens"`
				} `json:"prompt_tokens_details"`
			} `json:"usage"`
			DFlash struct {
				Cached int `json:"cached_prompt_tokens"`
			} `json:"dflash"`
		}
		if err := json.NewDecoder(resp.Body).Decode(&out); err != nil || resp.StatusCode != 200 || len(out.Choices) != 1 {
			return answer{}, fmt.Errorf("status %d, %v", resp.StatusCode, err)
		}
		if out.Usage.Details.Cached != out.DFlash.Cached {
			return answer{}, fmt.Errorf("usage cached_tokens %d, dflash cached_prompt_tokens %d", out.Usage.Details.Cached, out.DFlash.Cached)
		}
		return answer{out.Choices[0].Message.Content, out.Usage.Details.Cached}, nil
	}
	conversation := func(base string, client int) ([]answer, error) {
		msgs := []map[string]any{{"role": "system", "content": system}}
		var out []answer
		for turn := range 3 {
			msgs = append(msgs, map[string]any{"role": "user", "content": fmt.Sprintf("Client %d, question %d: is it raining?", client, turn)})
			a, err := ask(base, msgs)
			if err != nil {
				return nil, err
			}
			out = append(out, a)
			msgs = append(msgs, map[string]any{"role": "assistant", "content": a.content})
		}
		return out, nil
	}
	var wg sync.WaitGroup
	got := make([][]answer, 2)
	errs := make([]error, 2)
	for c := range 2 {
		wg.Add(1)
		go func() { defer wg.Done(); got[c], errs[c] = conversation(cachedBase, c) }()
	}
	wg.Wait()
	for c := range 2 {
		if errs[c] != nil {
			t.Fatalf("client %d: %v\n%s", c, errs[c], logs.String())
		}
		want, err := conversation(plainBase, c)
		if err != nil {
			t.Fatal(err)
		}
		for turn := range want {
			if got[c][turn].content != want[turn].content {
				t.Errorf("client %d turn %d: %q with the cache, %q without", c, turn, got[c][turn].content, want[turn].content)
			}
			if want[turn].cached != 0 {
				t.Errorf("the server without a cache reported %d cached tokens", want[turn].cached)
			}
			if turn > 0 && got[c][turn].cached == 0 {
				t.Errorf("client %d turn %d resumed nothing", c, turn)
			}
		}
	}
	if peak, b := metric(t, cachedBase, "dflash_prompt_cache_peak_bytes"), metric(t, cachedBase, "dflash_prompt_cache_budget_bytes"); peak > b || b != budget || peak == 0 {
		t.Errorf("peak %v bytes against a budget of %v", peak, b)
	}
	if hits := metric(t, cachedBase, "dflash_prompt_cache_hits_total"); hits < 4 {
		t.Errorf("%v hits", hits)
	}
}

// `bench --context` runs both modes after a prompt of each length and reports them side by
// side, the first length as the reference of the context's share and the kept speed.
func TestBenchContext(t *testing.T) {
	tinyPair(t)
	out, errOut, code := runCLI(t, "bench", "--demo", "--context", "32,96", "-n", "8", "--repeats", "1", "--warmup", "0", "--replay-drafts", "0.2", "--json")
	if code != 0 {
		t.Fatalf("bench: %s", errOut)
	}
	var rep contextReport
	if err := json.Unmarshal([]byte(out), &rep); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	if len(rep.Points) != 2 || rep.Replay == nil || rep.Points[0].Tokens != 32 || rep.Points[1].Tokens != 96 || rep.Points[0].KeepsSpeed != 1 {
		t.Fatalf("report %+v", rep)
	}
	for _, p := range rep.Points {
		if p.PlainTPS <= 0 || p.DFlash <= 0 || p.Tau < 1 || p.CycleMS <= 0 || p.TTFTMS <= 0 || p.PeakBytes == 0 || p.Speedup <= 0 {
			t.Errorf("point %+v", p)
		}
	}
}
