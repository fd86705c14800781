package grammar

import (
	"fmt"
	"slices"
	"strings"
	"testing"
)

const personSchema = `{"type":"object","properties":{"name":{"type":"string"},"age":{"type":"integer"}},` +
	`"required":["name","age"],"additionalProperties":false}`

var (
	personGrammar = Grammar{JSONSchema, personSchema}
	yesNoGrammar  = Grammar{Lark, "start: \"yes\" | \"no\" | NUM\nNUM: /[0-9]+/"}
	abcGrammar    = Grammar{Regex, `ab+c?`}
)

// describe lists the tokens a mask allows, for failure messages.
func describe(mask []uint32) string {
	toks := testTokenBytes()
	var parts []string
	for v := 0; v < len(mask)*32; v++ {
		if Allowed(mask, int32(v)) {
			if v < len(toks) {
				parts = append(parts, fmt.Sprintf("%q", toks[v]))
			} else {
				parts = append(parts, fmt.Sprintf("<%d>", v))
			}
		}
	}
	return strings.Join(parts, " ")
}

func openMatcher(t testing.TB, tk *Tokenizer, g Grammar) *Matcher {
	t.Helper()
	m, err := tk.NewMatcher(g)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(m.Close)
	return m
}

func mask(t testing.TB, m *Matcher) []uint32 {
	t.Helper()
	dst := make([]uint32, m.t.MaskWords())
	if err := m.MaskInto(dst); err != nil {
		t.Fatal(err)
	}
	return dst
}

func tokens(s string) []int32 { return encode(s) }

func tok(s string) int32 {
	ids := encode(s)
	if len(ids) != 1 {
		panic(fmt.Sprintf("%q is %d tokens", s, len(ids)))
	}
	return ids[0]
}

func TestTokenizerSizes(t *testing.T) {
	for _, c := range []struct{ vocab, words int }{{testVocab, 9}, {288, 9}, {289, 10}, {300, 10}, {1024, 32}} {
		tk := newTestTokenizer(t, c.vocab)
		if tk.VocabSize() != c.vocab || tk.MaskWords() != c.words {
			t.Errorf("vocab %d: VocabSize %d MaskWords %d, want %d and %d", c.vocab, tk.VocabSize(), tk.MaskWords(), c.vocab, c.words)
		}
		m := openMatcher(t, tk, Grammar{Kind: JSONObject})
		if err := m.MaskInto(make([]uint32, c.words+1)); err == nil {
			t.Errorf("vocab %d: MaskInto took a mask of the wrong length", c.vocab)
		}
	}
}

func TestNewTokenizerErrors(t *testing.T) {
	good := loadTestTokenizerJSON(t)
	for _, c := range []struct {
		name  string
		json  []byte
		vocab int
		eos   []int32
		want  string
	}{
		{"bad json", []byte(`{"model": {`), testVocab, []int32{tokEndOfText}, "Invalid JSON"},
		{"not a tokenizer", []byte(`{"decoder": {"type": "WordPiece"}}`), testVocab, []int32{tokEndOfText}, "decoder"},
		{"empty", nil, testVocab, []int32{tokEndOfText}, "empty"},
		{"no eos", good, testVocab, nil, "no end token"},
		{"eos out of range", good, testVocab, []int32{tokEndOfText, testVocab}, "out of range"},
		{"negative eos", good, testVocab, []int32{-1}, "out of range"},
		{"zero vocab", good, 0, []int32{tokEndOfText}, "vocabulary size"},
		{"nul byte", append([]byte(`{"a":"`), 0, '"', '}'), testVocab, []int32{tokEndOfText}, "NUL"},
	} {
		tk, err := NewTokenizer(c.json, c.vocab, c.eos)
		if err == nil {
			tk.Close()
			t.Errorf("%s: no error", c.name)
			continue
		}
		if !strings.HasPrefix(err.Error(), "grammar: ") || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: error %q, want one with %q", c.name, err, c.want)
		}
	}
}

func TestValidate(t *testing.T) {
	tk := newTestTokenizer(t, testVocab)
	for _, c := range []struct {
		name string
		g    Grammar
		want string // "" if valid
	}{
		{"schema", personGrammar, ""},
		{"json object", Grammar{Kind: JSONObject, Source: "ignored"}, ""},
		{"lark", yesNoGrammar, ""},
		{"lark with json", Grammar{Lark, `start: "A:" %json{"type":"integer"}`}, ""},
		{"regex", abcGrammar, ""},
		{"schema not json", Grammar{JSONSchema, `{"type":`}, "invalid json_schema grammar"},
		{"schema bad type", Grammar{JSONSchema, `{"type":"nonsense"}`}, "nonsense"},
		{"schema bad keyword value", Grammar{JSONSchema, `{"type":"string","minLength":"three"}`}, "invalid json_schema grammar"},
		{"lark undefined rule", Grammar{Lark, "start: foo"}, "foo"},
		{"lark syntax", Grammar{Lark, "start: (\"a\""}, "invalid lark grammar"},
		{"regex", Grammar{Regex, `a(b`}, "invalid regex grammar"},
		{"unknown kind", Grammar{Kind: "ebnf", Source: "x"}, "unknown grammar kind"},
		{"nul byte", Grammar{Regex, "a\x00"}, "NUL"},
	} {
		err := tk.Validate(c.g)
		_, merr := tk.NewMatcher(c.g)
		for _, e := range []struct {
			what string
			err  error
		}{{"Validate", err}, {"NewMatcher", merr}} {
			switch {
			case c.want == "" && e.err != nil:
				t.Errorf("%s: %s: %v", c.name, e.what, e.err)
			case c.want != "" && e.err == nil:
				t.Errorf("%s: %s: no error", c.name, e.what)
			case c.want != "" && (!strings.HasPrefix(e.err.Error(), "grammar: ") || !strings.Contains(e.err.Error(), c.want)):
				t.Errorf("%s: %s: error %q, want one with %q", c.name, e.what, e.err, c.want)
			}
		}
	}
}

// TestMatchers feeds each grammar valid text token by token: every token is allowed by the
// mask before it, and chosen tokens are not allowed at chosen steps.
func TestMatchers(t *testing.T) {
	tk := newTestTokenizer(t, testVocab)
	type step struct {
		at         int      // before the at-th token of text (len(tokens) = after all)
		allowed    []string // each one token
		disallowed []string
	}
	for _, c := range []struct {
		name      string
		g         Grammar
		text      string
		steps     []step
		accepting bool // after the text
		stopped   bool
	}{
		{"json schema", personGrammar, `{"name":"Al","age":42}`, []step{
			{at: 0, allowed: []string{`{`, `{"`}, disallowed: []string{`[`, ` `, `"`, `a`, `}`}},
			{at: 1, allowed: []string{`n`, `name`}, disallowed: []string{`a`, `age`, `"`, `}`, `x`}}, // after {": properties in order, no extra ones
			{at: 2, allowed: []string{`":`}, disallowed: []string{`",`, `e`}},
			{at: 3, allowed: []string{`"`, ` "`}, disallowed: []string{`4`, `{`, `true`}}, // a string value
			{at: 7, allowed: []string{`"`}, disallowed: []string{`a`, `age`, `}`}},
			{at: 8, allowed: []string{`a`, `age`}, disallowed: []string{`n`, `"`}},
			{at: 10, allowed: []string{`4`, `-`}, disallowed: []string{`"`, `true`, `}`}}, // an integer
			{at: 12, allowed: []string{`}`, `0`}, disallowed: []string{`.`, `,`, `"`}},
		}, true, true},
		{"json object", Grammar{Kind: JSONObject}, `{"a":[1,true]}`, []step{
			{at: 0, allowed: []string{`{`, `{"`}, disallowed: []string{`[`, `1`, `"`}},
			{at: 4, allowed: []string{`true`, `"`, `{`, `]`}, disallowed: []string{`}`, `:`}},
			{at: 7, allowed: []string{`]`, `,`}, disallowed: []string{`}`, `1`}},
		}, true, true},
		{"lark", yesNoGrammar, `no`, []step{
			{at: 0, allowed: []string{`y`, `n`, `7`}, disallowed: []string{`a`, `na`, `"`, ` `}},
			{at: 1, allowed: []string{`o`}, disallowed: []string{`y`, `n`, `e`}},
		}, true, true},
		{"lark number", yesNoGrammar, `12`, []step{
			{at: 1, allowed: []string{`2`}, disallowed: []string{`y`}},
			{at: 2, allowed: []string{`0`}, disallowed: []string{`a`}}, // more digits may follow
		}, true, false},
		{"lark with json", Grammar{Lark, `start: "A:" %json{"type":"integer"}`}, `A:12`, []step{
			{at: 0, allowed: []string{`A`}, disallowed: []string{`{`, `1`}},
			{at: 2, allowed: []string{`1`, `-`}, disallowed: []string{`"`, `A`, `true`}},
		}, true, false},
		{"regex", abcGrammar, `abbc`, []step{
			{at: 0, allowed: []string{`a`}, disallowed: []string{`b`, `ag`}},
			{at: 1, allowed: []string{`b`}, disallowed: []string{`c`, `a`}},
			{at: 2, allowed: []string{`b`, `c`}, disallowed: []string{`a`}},
		}, true, true},
		{"regex incomplete", abcGrammar, `a`, nil, false, false},
	} {
		m := openMatcher(t, tk, c.g)
		toks := tokens(c.text)
		for i := 0; i <= len(toks); i++ {
			mk := mask(t, m)
			if i < len(toks) && !Allowed(mk, toks[i]) {
				t.Fatalf("%s: token %d (%q) not allowed; mask: %s", c.name, i, testTokenBytes()[toks[i]], describe(mk))
			}
			for _, s := range c.steps {
				if s.at != i {
					continue
				}
				for _, a := range s.allowed {
					if !Allowed(mk, tok(a)) {
						t.Errorf("%s: before token %d: %q not allowed; mask: %s", c.name, i, a, describe(mk))
					}
				}
				for _, d := range s.disallowed {
					if Allowed(mk, tok(d)) {
						t.Errorf("%s: before token %d: %q allowed; mask: %s", c.name, i, d, describe(mk))
					}
				}
			}
			if i < len(toks) {
				if m.Stopped() {
					t.Fatalf("%s: stopped before token %d", c.name, i)
				}
				if err := m.Consume(toks[i]); err != nil {
					t.Fatalf("%s: token %d: %v", c.name, i, err)
				}
			}
		}
		if m.Accepting() != c.accepting || m.Stopped() != c.stopped {
			t.Errorf("%s: after the text Accepting %v Stopped %v, want %v %v", c.name, m.Accepting(), m.Stopped(), c.accepting, c.stopped)
		}
		if err := m.Err(); err != nil {
			t.Errorf("%s: %v", c.name, err)
		}
		if got := m.Consumed(); got != len(toks) {
			t.Errorf("%s: Consumed %d, want %d", c.name, got, len(toks))
		}
		// The end tokens are allowed exactly when the matcher is accepting.
		mk := mask(t, m)
		for _, e := range []int32{tokEndOfText, tokImEnd} {
			if Allowed(mk, e) != c.accepting {
				t.Errorf("%s: end token %d allowed %v, want %v", c.name, e, Allowed(mk, e), c.accepting)
			}
		}
		if c.stopped {
			if want := []int32{tokEndOfText, tokImEnd}; !slices.Equal(allowedIDs(mk), want) {
				t.Errorf("%s: stopped, but the mask allows %v, want only %v", c.name, allowedIDs(mk), want)
			}
		}
	}
}

func allowedIDs(mask []uint32) []int32 {
	var ids []int32
	for v := int32(0); int(v) < len(mask)*32; v++ {
		if Allowed(mask, v) {
			ids = append(ids, v)
		}
	}
	return ids
}

func TestConsumeDisallowed(t *testing.T) {
	tk := newTestTokenizer(t, testVocab)
	for _, c := range []struct {
		name   string
		g      Grammar
		prefix string
		bad    []int32
		want   string
	}{
		{"schema", personGrammar, `{"`, []int32{tok(`a`)}, "not allowed"},
		{"in a run", personGrammar, ``, append(tokens(`{"na`), tok(`x`)), "not allowed"},
		{"regex done", abcGrammar, `abc`, []int32{tok(`b`)}, "not allowed"},
		{"end too early", abcGrammar, `a`, []int32{tokEndOfText}, "end token"},
		{"after the end", abcGrammar, `ab`, []int32{tokImEnd, tok(`b`)}, "after the end"},
		{"out of range", Grammar{Kind: JSONObject}, ``, []int32{testVocab}, "out of range"},
		{"negative", Grammar{Kind: JSONObject}, ``, []int32{-3}, "out of range"},
		{"far out of range", Grammar{Kind: JSONObject}, `{`, []int32{1 << 20}, "out of range"},
	} {
		m := openMatcher(t, tk, c.g)
		if err := m.Consume(tokens(c.prefix)...); err != nil {
			t.Fatalf("%s: prefix: %v", c.name, err)
		}
		err := m.Consume(c.bad...)
		if err == nil || !strings.Contains(err.Error(), c.want) || !strings.Contains(err.Error(), "error state") {
			t.Errorf("%s: Consume error %v, want one with %q that says the matcher is in its error state", c.name, err, c.want)
		}
		if m.Err() == nil || !m.Stopped() || m.Accepting() {
			t.Errorf("%s: after the refused token Err %v Stopped %v Accepting %v", c.name, m.Err(), m.Stopped(), m.Accepting())
		}
		if err := m.MaskInto(make([]uint32, tk.MaskWords())); err == nil {
			t.Errorf("%s: MaskInto in the error state", c.name)
		}
		if err := m.Rollback(1); err == nil {
			t.Errorf("%s: Rollback in the error state", c.name)
		}
		if n := m.ValidPrefix(tokens(`{`)); n != 0 {
			t.Errorf("%s: ValidPrefix %d in the error state", c.name, n)
		}
		if _, err := m.Clone(); err == nil {
			t.Errorf("%s: Clone in the error state", c.name)
		}
	}
}

// TestEnd: end tokens where the grammar is accepting, runs of them after, and rollback
// over them.
func TestEnd(t *testing.T) {
	tk := newTestTokenizer(t, testVocab)
	m := openMatcher(t, tk, abcGrammar)
	if err := m.Consume(tokens(`ab`)...); err != nil {
		t.Fatal(err)
	}
	if !m.Accepting() || m.Stopped() {
		t.Fatalf("after ab: Accepting %v Stopped %v, want true false", m.Accepting(), m.Stopped())
	}
	before := mask(t, m)
	// Either end token ends the sequence; after it only end tokens are allowed.
	for _, e := range []int32{tokEndOfText, tokImEnd} {
		if err := m.Consume(e); err != nil {
			t.Fatalf("end token %d: %v", e, err)
		}
		if !m.Stopped() || !m.Accepting() {
			t.Fatalf("after end token %d: Stopped %v Accepting %v", e, m.Stopped(), m.Accepting())
		}
		if got := allowedIDs(mask(t, m)); !slices.Equal(got, []int32{tokEndOfText, tokImEnd}) {
			t.Fatalf("after end token %d: mask allows %v", e, got)
		}
		if m.Forced() != nil {
			t.Fatalf("forced tokens after the end")
		}
	}
	if err := m.Consume(tokEndOfText, tokEndOfText); err != nil {
		t.Fatalf("a run of end tokens: %v", err)
	}
	if got := m.Consumed(); got != 6 {
		t.Fatalf("Consumed %d, want 6", got)
	}
	if err := m.Rollback(4); err != nil {
		t.Fatal(err)
	}
	if m.Stopped() || !slices.Equal(mask(t, m), before) {
		t.Fatalf("rollback over the end tokens: Stopped %v, mask %s, want %s", m.Stopped(), describe(mask(t, m)), describe(before))
	}
	// A complete grammar: stopped, only end tokens allowed, and an end token is fine.
	if err := m.Consume(tok(`c`)); err != nil {
		t.Fatal(err)
	}
	if !m.Stopped() || !m.Accepting() {
		t.Fatalf("after abc: Stopped %v Accepting %v", m.Stopped(), m.Accepting())
	}
	if err := m.Consume(tokImEnd, tokEndOfText); err != nil {
		t.Fatalf("end tokens once stopped: %v", err)
	}
	if err := m.Rollback(3); err != nil { // c and both ends
		t.Fatal(err)
	}
	if !slices.Equal(mask(t, m), before) {
		t.Fatalf("rollback from stopped: mask %s, want %s", describe(mask(t, m)), describe(before))
	}
	if err := m.Err(); err != nil {
		t.Fatal(err)
	}
}

func TestRollback(t *testing.T) {
	tk := newTestTokenizer(t, testVocab)
	for _, c := range []struct {
		name string
		g    Grammar
		text string
	}{
		{"schema", personGrammar, `{"name":"Al","age":42}`},
		{"json object", Grammar{Kind: JSONObject}, `{"a":[1,true],"name":{}}`},
		{"lark", yesNoGrammar, `123`},
		{"regex", abcGrammar, `abbbc`},
	} {
		toks := tokens(c.text)
		m := openMatcher(t, tk, c.g)
		// Masks at every position, consuming one token at a time.
		var masks [][]uint32
		for i := 0; i <= len(toks); i++ {
			masks = append(masks, mask(t, m))
			if i < len(toks) {
				if err := m.Consume(toks[i]); err != nil {
					t.Fatalf("%s: %v", c.name, err)
				}
			}
		}
		// Roll back to every position and forward again.
		for back := 1; back <= len(toks); back++ {
			if err := m.Rollback(back); err != nil {
				t.Fatalf("%s: Rollback(%d): %v", c.name, back, err)
			}
			at := len(toks) - back
			if got := mask(t, m); !slices.Equal(got, masks[at]) {
				t.Fatalf("%s: after Rollback(%d): mask %s, want %s", c.name, back, describe(got), describe(masks[at]))
			}
			if err := m.Consume(toks[at:]...); err != nil {
				t.Fatalf("%s: replay after Rollback(%d): %v", c.name, back, err)
			}
		}
		// Too far back is an error that changes nothing.
		if err := m.Rollback(len(toks) + 1); err == nil {
			t.Errorf("%s: Rollback past the start", c.name)
		}
		if err := m.Rollback(-1); err == nil {
			t.Errorf("%s: Rollback(-1)", c.name)
		}
		if err := m.Err(); err != nil || m.Consumed() != len(toks) {
			t.Errorf("%s: after the refused rollbacks Err %v Consumed %d", c.name, err, m.Consumed())
		}
		if err := m.Rollback(len(toks)); err != nil || !slices.Equal(mask(t, m), masks[0]) {
			t.Errorf("%s: Rollback to the start: %v", c.name, err)
		}
	}
}

func TestValidPrefix(t *testing.T) {
	tk := newTestTokenizer(t, testVocab)
	for _, c := range []struct {
		name   string
		g      Grammar
		prefix string // consumed first
		toks   []int32
		want   int
	}{
		{"all", personGrammar, ``, tokens(`{"name":"x`), 5},
		{"stops at a bad token", personGrammar, ``, tokens(`{"age":1`), 1},
		{"after a prefix", personGrammar, `{"name":"A",`, tokens(`"age":7}`), 5},
		{"then end", personGrammar, `{"name":"A","age":`, append(tokens(`7}`), tokEndOfText, tokImEnd), 4},
		{"end too early", personGrammar, `{"name":"A","age":`, append(tokens(`7`), tokEndOfText), 1},
		{"nothing after the end", abcGrammar, `a`, []int32{tok(`b`), tokEndOfText, tok(`b`)}, 2},
		{"end now", abcGrammar, `ab`, []int32{tokImEnd, tokEndOfText}, 2},
		{"end not yet", abcGrammar, `a`, []int32{tokImEnd}, 0},
		{"stopped", abcGrammar, `abc`, []int32{tok(`c`)}, 0},
		{"stopped then end", abcGrammar, `abc`, []int32{tokEndOfText, tok(`c`)}, 1},
		{"out of range", abcGrammar, ``, []int32{tok(`a`), testVocab + 5}, 1},
		{"empty", abcGrammar, ``, nil, 0},
	} {
		m := openMatcher(t, tk, c.g)
		if err := m.Consume(tokens(c.prefix)...); err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		before := mask(t, m)
		if got := m.ValidPrefix(c.toks); got != c.want {
			t.Errorf("%s: ValidPrefix %d, want %d", c.name, got, c.want)
		}
		if err := m.Err(); err != nil {
			t.Errorf("%s: %v", c.name, err)
		}
		if !slices.Equal(mask(t, m), before) || m.Consumed() != len(tokens(c.prefix)) {
			t.Errorf("%s: ValidPrefix advanced the matcher", c.name)
		}
		// It agrees with consuming one token at a time on a clone.
		cl, err := m.Clone()
		if err != nil {
			t.Fatal(err)
		}
		n := 0
		for _, x := range c.toks {
			if !Allowed(mask(t, cl), x) {
				break
			}
			if err := cl.Consume(x); err != nil {
				t.Fatalf("%s: %v", c.name, err)
			}
			n++
		}
		cl.Close()
		if n != c.want {
			t.Errorf("%s: consuming allowed tokens took %d, ValidPrefix's case says %d", c.name, n, c.want)
		}
	}
}

// TestChainMasks checks each row against a fresh matcher fed the same prefix, and that the
// matcher is left as it was.
func TestChainMasks(t *testing.T) {
	tk := newTestTokenizer(t, testVocab)
	for _, c := range []struct {
		name   string
		g      Grammar
		prefix string
		drafts []int32
		want   int
	}{
		{"all allowed", personGrammar, `{"name":"`, tokens(`Bo","age":3`), 7},
		{"refused in the middle", personGrammar, `{"name":"Bo"`, tokens(`,"nam`), 2}, // a second name
		{"refused first", personGrammar, ``, tokens(`["x"]`), 0},
		{"to the end and past", personGrammar, `{"name":"Bo","age":`, append(tokens(`12}`), tokEndOfText, tokImEnd, tok(`x`)), 5},
		{"end early", abcGrammar, `a`, []int32{tokEndOfText, tok(`b`)}, 0},
		{"end then more", abcGrammar, `a`, []int32{tok(`b`), tokImEnd, tok(`b`)}, 2},
		{"no drafts", yesNoGrammar, `1`, nil, 0},
		{"lark", yesNoGrammar, ``, tokens(`yes`), 3},
		{"json object", Grammar{Kind: JSONObject}, `{"a":`, tokens(`[true,1]}`), 6},
	} {
		m := openMatcher(t, tk, c.g)
		pre := tokens(c.prefix)
		if err := m.Consume(pre...); err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		before := mask(t, m)
		w := tk.MaskWords()
		dst := make([]uint32, (len(c.drafts)+1)*w)
		for i := range dst {
			dst[i] = 0xdeadbeef
		}
		k, err := m.ChainMasks(c.drafts, dst)
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		if k != c.want {
			t.Errorf("%s: ChainMasks %d, want %d", c.name, k, c.want)
		}
		if err := m.Err(); err != nil || m.Consumed() != len(pre) || !slices.Equal(mask(t, m), before) {
			t.Errorf("%s: the matcher moved: Err %v, Consumed %d (want %d)", c.name, err, m.Consumed(), len(pre))
		}
		for j := 0; j <= len(c.drafts); j++ {
			at := min(j, k)
			fresh := openMatcher(t, tk, c.g)
			if err := fresh.Consume(append(slices.Clone(pre), c.drafts[:at]...)...); err != nil {
				t.Fatalf("%s: replay of %d drafts: %v", c.name, at, err)
			}
			want := mask(t, fresh)
			if got := dst[j*w : (j+1)*w]; !slices.Equal(got, want) {
				t.Errorf("%s: row %d: %s, want %s", c.name, j, describe(got), describe(want))
			}
		}
		// Rows agree with ValidPrefix.
		if n := m.ValidPrefix(c.drafts); n != k {
			t.Errorf("%s: ValidPrefix %d, ChainMasks %d", c.name, n, k)
		}
		if _, err := m.ChainMasks(c.drafts, dst[:len(dst)-1]); err == nil {
			t.Errorf("%s: ChainMasks took a short buffer", c.name)
		}
	}
}

// TestLargerModelVocabulary: a model vocabulary larger than the tokenizer's never allows
// the extra ids (nor the tokenizer's unused ones).
func TestLargerModelVocabulary(t *testing.T) {
	const vocab = 300
	tk := newTestTokenizer(t, vocab)
	if tk.MaskWords() != 10 {
		t.Fatalf("MaskWords %d", tk.MaskWords())
	}
	m := openMatcher(t, tk, Grammar{Lark, `start: /(.|\n)*/`}) // anything at all
	for _, text := range []string{``, `{"a`, `xyz`} {
		if err := m.Consume(tokens(text)...); err != nil {
			t.Fatal(err)
		}
		mk := mask(t, m)
		for v := int32(0); v < 320; v++ {
			if v < 128 || v >= 256 && v < testVocab { // ASCII, merges, end tokens
				if !Allowed(mk, v) {
					t.Fatalf("after %q: token %d not allowed", text, v)
				}
			} else if v >= testVocab && Allowed(mk, v) {
				t.Fatalf("after %q: token %d allowed, past the tokenizer's vocabulary", text, v)
			}
		}
	}
	if err := m.Consume(vocab - 1); err == nil {
		t.Fatal("consumed an id past the tokenizer's")
	}
}

// TestSmallerModelVocabulary: a tokenizer with more tokens than the model has rows (the
// specials past the LM head) gives masks of the model's size.
func TestSmallerModelVocabulary(t *testing.T) {
	const vocab = 257 // bytes and {"; the end token is a byte
	tk, err := NewTokenizer(loadTestTokenizerJSON(t), vocab, []int32{0})
	if err != nil {
		t.Fatal(err)
	}
	defer tk.Close()
	m := openMatcher(t, tk, Grammar{Kind: JSONObject})
	if tk.MaskWords() != 9 {
		t.Fatalf("MaskWords %d", tk.MaskWords())
	}
	got := allowedIDs(mask(t, m))
	if !slices.Equal(got, []int32{'{', 256}) {
		t.Fatalf("mask allows %v", got)
	}
	if err := m.Consume(tok(`{"`)); err != nil {
		t.Fatal(err)
	}
	for _, v := range allowedIDs(mask(t, m)) {
		if v >= vocab {
			t.Fatalf("token %d allowed", v)
		}
	}
	if m.ValidPrefix([]int32{'a', tok(`":`)}) != 1 {
		t.Fatal("ValidPrefix counted a token past the model's vocabulary")
	}
}

func TestClone(t *testing.T) {
	tk := newTestTokenizer(t, testVocab)
	m := openMatcher(t, tk, personGrammar)
	if err := m.Consume(tokens(`{"name":"`)...); err != nil {
		t.Fatal(err)
	}
	c, err := m.Clone()
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if !slices.Equal(mask(t, c), mask(t, m)) || c.Consumed() != m.Consumed() {
		t.Fatal("clone differs")
	}
	before := mask(t, m)
	if err := c.Consume(tokens(`x","age":1}`)...); err != nil {
		t.Fatal(err)
	}
	if !c.Stopped() || m.Stopped() || !slices.Equal(mask(t, m), before) {
		t.Fatal("the clone's consume moved the original")
	}
	if err := c.Rollback(c.Consumed()); err != nil {
		t.Fatal(err)
	}
	if err := m.Consume(tok(`{`)); err != nil { // inside the string
		t.Fatal(err)
	}
}

func TestForced(t *testing.T) {
	tk := newTestTokenizer(t, testVocab)
	m := openMatcher(t, tk, personGrammar)
	if err := m.Consume(tok(`{"`)); err != nil {
		t.Fatal(err)
	}
	// "name" is forced here, but llguidance computes forced tokens only with a canonical
	// tokenize function, which this package does not give it.
	if f := m.Forced(); len(f) != 0 {
		t.Fatalf("Forced %v", f)
	}
	if err := m.Err(); err != nil {
		t.Fatal(err)
	}
}

func TestClose(t *testing.T) {
	tk, err := NewTokenizer(loadTestTokenizerJSON(t), testVocab, []int32{tokEndOfText})
	if err != nil {
		t.Fatal(err)
	}
	m, err := tk.NewMatcher(abcGrammar)
	if err != nil {
		t.Fatal(err)
	}
	tk.Close()
	tk.Close()
	if _, err := tk.NewMatcher(abcGrammar); err == nil {
		t.Fatal("NewMatcher after Close")
	}
	if err := tk.Validate(abcGrammar); err == nil {
		t.Fatal("Validate after Close")
	}
	// A matcher outlives its closed tokenizer, and frees it when closed.
	if err := m.Consume(tok(`a`)); err != nil {
		t.Fatal(err)
	}
	c, err := m.Clone()
	if err != nil {
		t.Fatal(err)
	}
	m.Close()
	m.Close()
	if err := m.Consume(tok(`b`)); err == nil || m.Err() == nil || !m.Stopped() {
		t.Fatal("closed matcher still works")
	}
	if err := c.Consume(tok(`b`)); err != nil {
		t.Fatal(err)
	}
	c.Close()
	if tk.tok != nil || tk.refs != 0 {
		t.Fatalf("tokenizer not freed: refs %d", tk.refs)
	}
}

func TestConcurrentMatchers(t *testing.T) {
	tk := newTestTokenizer(t, testVocab)
	text := tokens(`{"name":"Al","age":42}`)
	errs := make(chan error, 8)
	for range 8 {
		go func() {
			m, err := tk.NewMatcher(personGrammar)
			if err != nil {
				errs <- err
				return
			}
			defer m.Close()
			dst := make([]uint32, tk.MaskWords())
			for _, x := range text {
				if err := m.MaskInto(dst); err != nil {
					errs <- err
					return
				}
				if !Allowed(dst, x) {
					errs <- fmt.Errorf("token %d not allowed", x)
					return
				}
				if err := m.Consume(x); err != nil {
					errs <- err
					return
				}
			}
			errs <- nil
		}()
	}
	for range 8 {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
}

func BenchmarkMaskInto(b *testing.B) {
	tk := newTestTokenizer(b, testVocab)
	text := tokens(`{"name":"Al","age":42`)
	for _, c := range []struct {
		name string
		g    Grammar
	}{{"schema", personGrammar}, {"json_object", Grammar{Kind: JSONObject}}} {
		b.Run(c.name, func(b *testing.B) {
			m := openMatcher(b, tk, c.g)
			dst := make([]uint32, tk.MaskWords())
			for b.Loop() {
				for _, x := range text {
					if err := m.MaskInto(dst); err != nil {
						b.Fatal(err)
					}
					if err := m.Consume(x); err != nil {
						b.Fatal(err)
					}
				}
				if err := m.Rollback(len(text)); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*len(text)), "ns/token")
		})
	}
}

// BenchmarkMaskIntoInString is MaskInto alone, inside a JSON string (most tokens allowed).
func BenchmarkMaskIntoInString(b *testing.B) {
	tk := newTestTokenizer(b, testVocab)
	m := openMatcher(b, tk, personGrammar)
	if err := m.Consume(tokens(`{"name":"`)...); err != nil {
		b.Fatal(err)
	}
	dst := make([]uint32, tk.MaskWords())
	for b.Loop() {
		if err := m.MaskInto(dst); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkChainMasks(b *testing.B) {
	tk := newTestTokenizer(b, testVocab)
	m := openMatcher(b, tk, personGrammar)
	if err := m.Consume(tokens(`{"name":"`)...); err != nil {
		b.Fatal(err)
	}
	drafts := tokens(`Bo","age":3`)
	dst := make([]uint32, (len(drafts)+1)*tk.MaskWords())
	for b.Loop() {
		if _, err := m.ChainMasks(drafts, dst); err != nil {
			b.Fatal(err)
		}
	}
}
