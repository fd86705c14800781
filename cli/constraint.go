package cli

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sync"

	"github.com/dflash-mlx/dflash-mlx/grammar"
	"github.com/dflash-mlx/dflash-mlx/server"
)

// grammars makes the matchers of a session's constrained requests: llguidance's view of
// the target's vocabulary is built from the model's own tokenizer.json at the first
// constrained request (a large vocabulary takes a moment) and shared by all of them.
type grammars struct {
	dir   string  // the directory of tokenizer.json
	vocab int     // the model's vocabulary: the rows of its head
	ends  []int32 // the tokens that end an answer
	once  sync.Once
	tok   *grammar.Tokenizer
	err   error
}

// newGrammars prepares the grammars of s's model. llguidance's vocabulary is the longer
// of the model's and the tokenizer's: ids past the tokenizer's are never allowed, and
// the engine never chooses ids past the model's.
func newGrammars(s *Session) *grammars {
	return &grammars{dir: s.Tok.Dir(), vocab: max(s.Engine.Target.Arch().VocabSize, s.Tok.VocabSize()), ends: s.StopTokens()}
}

// tokenizer is the shared llguidance tokenizer, built at first use.
func (g *grammars) tokenizer() (*grammar.Tokenizer, error) {
	g.once.Do(func() {
		path := filepath.Join(g.dir, "tokenizer.json")
		data, err := os.ReadFile(path)
		if err != nil {
			g.err = fmt.Errorf("constrained decoding: %w", err)
			return
		}
		if g.tok, err = grammar.NewTokenizer(data, g.vocab, g.ends); err != nil {
			g.err = fmt.Errorf("constrained decoding: %s: %w", path, err)
		}
	})
	return g.tok, g.err
}

// matcher is a fresh matcher of c for one request, as the engine takes it; the caller
// closes it.
func (g *grammars) matcher(c grammar.Grammar) (*requestMatcher, error) {
	tok, err := g.tokenizer()
	if err != nil {
		return nil, err
	}
	m, err := tok.NewMatcher(c)
	if err != nil {
		return nil, err
	}
	return &requestMatcher{Matcher: m, words: tok.MaskWords()}, nil
}

// requestMatcher is a matcher with its masks' length: an engine.Constraint.
type requestMatcher struct {
	*grammar.Matcher
	words int
}

func (m *requestMatcher) MaskWords() int { return m.words }

// startable reports why m cannot start an answer: its grammar allows no first token.
func (m *requestMatcher) startable() error {
	mask := make([]uint32, m.words)
	if err := m.MaskInto(mask); err != nil {
		return fmt.Errorf("the grammar allows no answer: %w", err)
	}
	if !slices.ContainsFunc(mask, func(w uint32) bool { return w != 0 }) {
		return fmt.Errorf("the grammar allows no answer: no token of the model's vocabulary can start one")
	}
	return nil
}

// check reports why c cannot constrain the model's answers: the engine refuses the
// grammar (making its matcher validates it), or it allows no first token.
func (g *grammars) check(c grammar.Grammar) error {
	m, err := g.matcher(c)
	if err != nil {
		return err
	}
	defer m.Close()
	return m.startable()
}

// close releases the tokenizer.
func (g *grammars) close() {
	if g.tok != nil {
		g.tok.Close()
	}
}

// serverGrammar is a server constraint in the grammar package's terms.
func serverGrammar(c server.Constraint) grammar.Grammar {
	return grammar.Grammar{Kind: grammar.Kind(c.Kind), Source: c.Source}
}
