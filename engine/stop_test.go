package engine

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/dflash-mlx/dflash-mlx/internal/testenv"
	"github.com/dflash-mlx/dflash-mlx/mlxc"
	"github.com/dflash-mlx/dflash-mlx/verify"
)

// letters is a fake detokenizer: token t becomes two letters, so stop strings can start
// inside one token and end inside the next.
type letters struct{}

func (letters) Add(id int32) string { return fmt.Sprintf("%c%c", 'a'+id%26, 'A'+(id/26)%26) }
func (letters) Flush() string       { return "" }

func textOf(toks []int32) string {
	var b strings.Builder
	for _, t := range toks {
		b.WriteString(letters{}.Add(t))
	}
	return b.String()
}

func TestStopRules(t *testing.T) {
	p := loadPair(t, "decisive-bf16", decisiveSpec(11), 2)
	prompt := []int32{9, 8, 7, 6}
	want := plainGreedy(t, p, prompt, 40)
	ref := append(append([]int32(nil), prompt...), want...)
	allRight := func() verify.Proposer {
		return &verify.Scripted{Ref: ref, Vocab: p.spec.Vocab, Block: 16} // accepts every draft
	}
	// An EOS in the middle of a fully accepted block: the token 9 positions in.
	eosAt := 9
	for j := 0; j < eosAt; j++ {
		if want[j] == want[eosAt] {
			eosAt = j // first occurrence decides
			break
		}
	}
	text := textOf(want)
	stop := text[11:15] // starts inside token 5, ends inside token 7
	cases := []struct {
		name       string
		req        Request
		wantTokens []int32
		wantText   string
		finish     string
	}{
		{"eos-inside-block", Request{MaxTokens: 40, StopTokens: []int32{want[eosAt]}}, want[:eosAt], "", FinishStop},
		{"max-tokens-inside-block", Request{MaxTokens: 7, IgnoreEOS: true}, want[:7], "", FinishLength},
		{"max-tokens-one", Request{MaxTokens: 1, IgnoreEOS: true}, want[:1], "", FinishLength},
		{"stop-string-across-tokens", Request{MaxTokens: 40, IgnoreEOS: true, Stop: []string{stop}, Detok: letters{}}, want[:8], text[:11], FinishStop},
		{"stop-string-never-matches", Request{MaxTokens: 12, IgnoreEOS: true, Stop: []string{"~~"}, Detok: letters{}}, want[:12], text[:24], FinishLength},
	}
	for _, tc := range cases {
		for _, mode := range []string{"plain", "dflash"} {
			t.Run(tc.name+"/"+mode, func(t *testing.T) {
				e := &Engine{Target: p.target}
				if mode == "dflash" {
					// The expected tokens are plain decoding's, which a verify block
					// reproduces only where rounding does not depend on the shape.
					testenv.RequireShapeExact(t)
					e.Proposer = allRight()
				}
				req := tc.req
				req.Prompt = prompt
				res, evs := run(t, e, req)
				if _, ok := eqTokens(res.Tokens, tc.wantTokens); !ok {
					t.Errorf("tokens %v, want %v", res.Tokens, tc.wantTokens)
				}
				if res.FinishReason != tc.finish {
					t.Errorf("finish %q, want %q", res.FinishReason, tc.finish)
				}
				if req.Detok != nil {
					var streamed strings.Builder
					for _, ev := range evs {
						streamed.WriteString(ev.Text)
					}
					if res.Text != tc.wantText || streamed.String() != tc.wantText {
						t.Errorf("text %q (streamed %q), want %q", res.Text, streamed.String(), tc.wantText)
					}
				}
			})
		}
	}
}

func TestCancellationMidGeneration(t *testing.T) {
	p := loadPair(t, "decisive-bf16", decisiveSpec(11), 2)
	for _, mode := range []string{"plain", "dflash"} {
		t.Run(mode, func(t *testing.T) {
			e := &Engine{Target: p.target}
			if mode == "dflash" {
				e.Proposer = verify.NewDFlash(p.drft)
			}
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			events := 0
			var res Result
			err := mlxc.Do(func() error {
				var err error
				res, err = e.Generate(ctx, Request{Prompt: []int32{1, 2, 3}, MaxTokens: 500, IgnoreEOS: true}, func(ev Event) error {
					events++
					if events == 3 {
						cancel()
					}
					return nil
				})
				return err
			})
			if err != nil {
				t.Fatal(err)
			}
			if res.FinishReason != FinishCancelled {
				t.Errorf("finish %q, want cancelled", res.FinishReason)
			}
			if events != 3 || len(res.Tokens) >= 500 {
				t.Errorf("kept going after cancel: %d events, %d tokens", events, len(res.Tokens))
			}
		})
	}
}

func TestEmitErrorStops(t *testing.T) {
	p := loadPair(t, "decisive-bf16", decisiveSpec(11), 2)
	e := &Engine{Target: p.target, Proposer: verify.NewDFlash(p.drft)}
	boom := errors.New("client went away")
	err := mlxc.Do(func() error {
		_, err := e.Generate(context.Background(), Request{Prompt: []int32{1}, MaxTokens: 50}, func(Event) error { return boom })
		return err
	})
	if !errors.Is(err, boom) {
		t.Fatalf("err = %v, want the emit error", err)
	}
}

func TestRequestValidation(t *testing.T) {
	p := loadPair(t, "decisive-bf16", decisiveSpec(11), 2)
	e := &Engine{Target: p.target, ContextLength: 16}
	long := make([]int32, 16)
	cases := map[string]Request{
		"empty prompt":       {MaxTokens: 3},
		"prompt too long":    {Prompt: long, MaxTokens: 3},
		"negative max":       {Prompt: []int32{1}, MaxTokens: -1},
		"bad temperature":    {Prompt: []int32{1}, MaxTokens: 1, Sampling: sampleParams(-1)},
		"stop without detok": {Prompt: []int32{1}, MaxTokens: 1, Stop: []string{"x"}},
	}
	for name, req := range cases {
		t.Run(name, func(t *testing.T) {
			err := mlxc.Do(func() error {
				_, err := e.Generate(context.Background(), req, nil)
				return err
			})
			if err == nil {
				t.Fatal("no error")
			}
		})
	}
	// Generation stops at the context limit with "length".
	res, _ := run(t, e, Request{Prompt: long[:10], MaxTokens: 100, IgnoreEOS: true})
	if len(res.Tokens) != 6 || res.FinishReason != FinishLength {
		t.Errorf("context limit: %d tokens, finish %q; want 6, length", len(res.Tokens), res.FinishReason)
	}
}
