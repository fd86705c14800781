package tokenizer

import (
	"errors"
	"fmt"
	"time"

	"github.com/nikolalohinski/gonja/v2/builtins"
	"github.com/nikolalohinski/gonja/v2/config"
	"github.com/nikolalohinski/gonja/v2/exec"
	"github.com/nikolalohinski/gonja/v2/parser"
)

// The chat-template environment mirrors the one transformers builds for
// apply_chat_template: trim_blocks and lstrip_blocks on, a tojson that is
// json.dumps (ordered keys, ", " and ": " separators, no HTML escaping),
// raise_exception and strftime_now globals. On top of the engine's builtins
// it replaces the string and dict methods whose behaviour differs from
// Python's (default whitespace stripping and splitting, ordered items()),
// and adds transformers' {% generation %} tag.
//
// Known differences from jinja2 that remain in the engine (none of them
// reached by the Qwen3 template; template_conformance_test.go checks what
// does work): None prints as "" instead of "None" (also through ~ and the
// string filter); lists print Go-quoted strings and tuples as lists; None is
// treated as undefined by "is defined"; x[-len(x)] is out of range; 2 ** 10
// is a float; "%" string formatting and tuple unpacking in {% set %} are not
// supported; "" is not a sequence; 0 == false is false.
//
// Templates are trusted like the weights they ship with: a template whose
// macros recurse without end overflows the Go stack, which is fatal, where
// jinja2 raises RecursionError. Message text cannot cause this.

// errTemplateRaised marks an error raised by the template itself through
// raise_exception.
var errTemplateRaised = errors.New("template raised an exception")

// newTemplateConfig returns the lexer settings transformers uses.
func newTemplateConfig() *config.Config {
	cfg := config.New()
	cfg.TrimBlocks = true
	cfg.LeftStripBlocks = true
	cfg.KeepTrailingNewline = false
	return cfg
}

// newTemplateEnvironment builds a fresh environment; nothing in it is shared
// with the engine's global defaults, so our overrides stay local.
func newTemplateEnvironment() *exec.Environment {
	filters := exec.NewFilterSet(map[string]exec.FilterFunction{})
	filters.Update(builtins.Filters)
	_ = filters.Replace("tojson", filterToJSON)
	_ = filters.Replace("items", filterItems)
	_ = filters.Replace("length", filterLength)
	_ = filters.Replace("count", filterLength)
	_ = filters.Replace("trim", filterTrim)
	_ = filters.Replace("dictsort", filterDictSort)

	tests := exec.NewTestSet(map[string]exec.TestFunction{})
	tests.Update(builtins.Tests)

	structures := exec.NewControlStructureSet(map[string]parser.ControlStructureParser{})
	structures.Update(builtins.ControlStructures)
	_ = structures.Register("generation", parseGenerationBlock)

	ctx := exec.EmptyContext().Update(builtins.GlobalFunctions).Update(builtins.GlobalVariables)
	ctx.Set("raise_exception", globalRaiseException)
	ctx.Set("strftime_now", globalStrftimeNow)

	return &exec.Environment{
		Context:           ctx,
		Filters:           filters,
		Tests:             tests,
		ControlStructures: structures,
		Methods: exec.Methods{
			Bool:  builtins.Methods.Bool,
			Int:   builtins.Methods.Int,
			Float: builtins.Methods.Float,
			Str:   strMethodSet(),
			Dict:  dictMethodSet(),
			List:  builtins.Methods.List,
		},
	}
}

// globalRaiseException is the template's way to reject its input, e.g.
// "Conversation roles must alternate".
func globalRaiseException(message string) (string, error) {
	return "", fmt.Errorf("%w: %s", errTemplateRaised, message)
}

// globalStrftimeNow formats the current local time with a C strftime format,
// as transformers' strftime_now (used by Llama-style date headers).
func globalStrftimeNow(format string) string {
	return strftime(time.Now(), format)
}
