// Package structured builds the grammars that make a model's answer follow a request's
// structure: a JSON answer (OpenAI response_format json_object / json_schema, the
// Responses API's text.format, Anthropic's output_config.format) or an answer made only of
// tool calls (tool_choice "required" or a named function, Anthropic any/tool), written in
// the model's own tool-call format. It also checks JSON Schemas for what the grammar engine
// (llguidance) can enforce, so a request with a schema it cannot enforce is refused with
// the keyword and its place instead of being decoded loosely.
//
// The package is pure Go: it writes grammar sources (a JSON schema, or a Lark grammar in
// llguidance's dialect with %json{…} for JSON parts) and leaves compiling and enforcing them
// to the grammar package, whose Grammar has the same fields and kind names.
//
// Where the constraint starts: these grammars describe the answer after any reasoning
// block. A tool-call grammar allows one or two newlines before the first call (what Qwen
// models write after </think>); a JSON grammar starts at the JSON value itself.
//
// Whitespace is bounded everywhere, so that a model cannot fill its token budget with it
// and leave the structure unfinished: a JSON answer is one line, compact or with
// json.dumps' separators (Answer), JSON inside tool calls is written with tojson's
// separators and no other whitespace (ToolCalls).
package structured

import (
	"bytes"
	"encoding/json"
)

// Grammar kinds, the same strings as the grammar package's Kind.
const (
	KindJSONSchema = "json_schema" // Source: a JSON Schema
	KindJSONObject = "json_object" // Source unused: any JSON object (Answer does not use it)
	KindLark       = "lark"        // Source: a Lark grammar (llguidance's dialect)
	KindRegex      = "regex"       // Source: a regular expression the whole output matches
)

// Grammar mirrors grammar.Grammar (same Kind strings), so callers can convert:
// grammar.Grammar{Kind: grammar.Kind(g.Kind), Source: g.Source}.
type Grammar struct {
	Kind   string
	Source string
}

// Lark is a grammar in llguidance's Lark dialect; its start rule is the entry point.
func Lark(source string) Grammar { return Grammar{Kind: KindLark, Source: source} }

// Regex is a grammar the whole output of which matches pattern (Rust regex syntax).
func Regex(pattern string) Grammar { return Grammar{Kind: KindRegex, Source: pattern} }

// Answer is the grammar of an answer that must be JSON: any JSON object when schema is nil
// or empty, else a value of the schema. The schema should have passed CheckSchema; Answer
// drops what CheckSchema lets through as no constraint at all ("format"s llguidance does
// not know, "uniqueItems": false), which llguidance would otherwise refuse, and keeps the
// rest, key order included. The JSON starts at the first character: llguidance's JSON
// grammar allows no whitespace before the value.
//
// The answer is one line of JSON (answerItemSeparator, answerKeySeparator): Answer puts
// that in the root schema's "x-guidance" options, unless the client's schema brings
// options of its own, which are then left as they are. Any object is the same schema
// {"type": "object"}, not llguidance's json_object, whose whitespace is unbounded.
func Answer(schema json.RawMessage) Grammar {
	if len(bytes.TrimSpace(schema)) == 0 {
		return Grammar{Kind: KindJSONSchema, Source: withAnswerOptions(objValue("type", strValue("object"))).encode()}
	}
	root, err := parseJSON(schema)
	switch {
	case err == nil && root.kind == kBool && root.truth:
		return Grammar{Kind: KindJSONSchema, Source: withAnswerOptions(&value{kind: kObject}).encode()}
	case err != nil || !root.isObject():
		return Grammar{Kind: KindJSONSchema, Source: string(schema)}
	}
	normalize(root)
	return Grammar{Kind: KindJSONSchema, Source: withAnswerOptions(root).encode()}
}

// A JSON answer is written on one line: a separator is "," or ":" followed by at most
// one space (compact JSON, and json.dumps' ", " and ": "), and there is no other
// whitespace between tokens. llguidance's default allows any run of whitespace between
// any two tokens, under which a model (a small one, a code model that indents with tabs,
// one sampled hot) can write whitespace until its token budget runs out and never finish
// the JSON; a bounded but flexible pattern still lets such a model spend most of its
// budget on indentation (a Go-code model wrote 32 tabs in every gap). One line is what
// OpenAI's structured outputs return, and what the tool-call grammars' arguments use.
const (
	answerItemSeparator = `, ?`
	answerKeySeparator  = `: ?`
)

// withAnswerOptions adds to a schema object the "x-guidance" options of a JSON answer
// (one line, answerItemSeparator and answerKeySeparator) unless it has options already.
func withAnswerOptions(root *value) *value {
	if root.get("x-guidance") == nil {
		root.set("x-guidance", objValue("whitespace_flexible", &value{kind: kBool, truth: false},
			"item_separator", strValue(answerItemSeparator), "key_separator", strValue(answerKeySeparator)))
	}
	return root
}

// Tool-call formats, the same strings as the server's ToolCallFormat.
const (
	// FormatJSONTools is Qwen3's: <tool_call>\n{"name": …, "arguments": {…}}\n</tool_call>.
	FormatJSONTools = "json_tools"
	// FormatQwen3Coder is Qwen3-Coder's and Qwen3.5's and later:
	// <tool_call>\n<function=NAME>\n<parameter=P>\nVALUE\n</parameter>\n…</function>\n</tool_call>.
	FormatQwen3Coder = "qwen3_coder"
)

// Tool is a function the model may call.
type Tool struct {
	Name string
	// Parameters is the JSON Schema of the arguments object; nil allows any object.
	Parameters json.RawMessage
}
