package tokenizer

import (
	"fmt"

	"github.com/nikolalohinski/gonja/v2/exec"
	"github.com/nikolalohinski/gonja/v2/nodes"
	"github.com/nikolalohinski/gonja/v2/parser"
	"github.com/nikolalohinski/gonja/v2/tokens"
)

// transformers registers a {% generation %} ... {% endgeneration %} tag that
// marks the assistant's tokens for training masks. Rendering only outputs
// its body, in its own scope (it is a call block in Jinja), and templates
// written for training use it, so it must parse here too.

type generationBlock struct {
	location *tokens.Token
	wrapper  *nodes.Wrapper
}

func (g *generationBlock) Position() *tokens.Token { return g.location }

func (g *generationBlock) String() string {
	return fmt.Sprintf("GenerationBlock(Line=%d Col=%d)", g.location.Line, g.location.Col)
}

func (g *generationBlock) Execute(r *exec.Renderer, _ *nodes.ControlStructureBlock) error {
	return r.Inherit().ExecuteWrapper(g.wrapper)
}

func parseGenerationBlock(p *parser.Parser, args *parser.Parser) (nodes.ControlStructure, error) {
	block := &generationBlock{location: p.Current()}
	if !args.End() {
		return nil, args.Error("generation takes no arguments", args.Current())
	}
	wrapper, endArgs, err := p.WrapUntil("endgeneration")
	if err != nil {
		return nil, err
	}
	if !endArgs.End() {
		return nil, endArgs.Error("endgeneration takes no arguments", nil)
	}
	block.wrapper = wrapper
	return block, nil
}
