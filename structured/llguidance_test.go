//go:build cgo

package structured

// These tests compile the generated grammars with the real llguidance (the grammar
// package) and run answers through a matcher, over the grammar package's test vocabulary:
// a byte-level BPE whose ids 0-255 are the single bytes, so any text is its bytes' ids.

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/dflash-mlx/dflash-mlx/grammar"
)

var (
	testTokOnce sync.Once
	testTok     *grammar.Tokenizer
	testTokErr  error
)

// tokenizer is llguidance's view of grammar/testdata/tokenizer.json, its end tokens read
// from the file's added tokens.
func tokenizer(t *testing.T) *grammar.Tokenizer {
	t.Helper()
	testTokOnce.Do(func() {
		data, err := os.ReadFile(filepath.Join("..", "grammar", "testdata", "tokenizer.json"))
		if err != nil {
			testTokErr = err
			return
		}
		var tj struct {
			AddedTokens []struct {
				ID      int32  `json:"id"`
				Content string `json:"content"`
			} `json:"added_tokens"`
			Model struct {
				Vocab map[string]int32 `json:"vocab"`
			} `json:"model"`
		}
		if testTokErr = json.Unmarshal(data, &tj); testTokErr != nil {
			return
		}
		size := int32(len(tj.Model.Vocab))
		var eos []int32
		for _, a := range tj.AddedTokens {
			eos = append(eos, a.ID)
			size = max(size, a.ID+1)
		}
		// Printable ASCII is itself in a byte-level vocabulary: check that ids are bytes.
		for _, c := range "az{}<>" {
			if tj.Model.Vocab[string(c)] != c {
				testTokErr = &os.PathError{Op: "read", Path: "tokenizer.json", Err: os.ErrInvalid}
				return
			}
		}
		testTok, testTokErr = grammar.NewTokenizer(data, int(size), eos)
	})
	if testTokErr != nil {
		t.Fatalf("test tokenizer: %v", testTokErr)
	}
	return testTok
}

func byteTokens(s string) []int32 {
	ids := make([]int32, len(s))
	for i := 0; i < len(s); i++ {
		ids[i] = int32(s[i])
	}
	return ids
}

func toGrammar(g Grammar) grammar.Grammar {
	return grammar.Grammar{Kind: grammar.Kind(g.Kind), Source: g.Source}
}

// accepts runs text through a fresh matcher: ok when every token is allowed and the
// grammar may end after the last; stopped when it must end there. At reports how much
// was allowed.
func accepts(t *testing.T, g Grammar, text string) (ok, stopped bool, at int) {
	t.Helper()
	m, err := tokenizer(t).NewMatcher(toGrammar(g))
	if err != nil {
		t.Fatalf("matcher: %v\n%s", err, g.Source)
	}
	defer m.Close()
	toks := byteTokens(text)
	n := m.ValidPrefix(toks)
	if n < len(toks) {
		if err := m.Consume(toks...); err == nil {
			t.Fatalf("ValidPrefix %d of %d but Consume took all of %q", n, len(toks), text)
		}
		return false, false, n
	}
	if err := m.Consume(toks...); err != nil {
		t.Fatalf("ValidPrefix took all of %q but Consume: %v", text, err)
	}
	return m.Accepting(), m.Stopped(), n
}

func validate(t *testing.T, g Grammar) {
	t.Helper()
	if err := tokenizer(t).Validate(toGrammar(g)); err != nil {
		t.Fatalf("llguidance refuses the grammar: %v\n%s", err, g.Source)
	}
}

func checkTexts(t *testing.T, g Grammar, good, bad []string, mustStop bool) {
	t.Helper()
	for _, s := range good {
		ok, stopped, at := accepts(t, g, s)
		switch {
		case !ok:
			t.Errorf("refused %q (allowed up to %q)", s, s[:at])
		case mustStop && !stopped:
			t.Errorf("%q accepted, but the grammar does not end there", s)
		}
	}
	for _, s := range bad {
		if ok, _, _ := accepts(t, g, s); ok {
			t.Errorf("accepted %q", s)
		}
	}
}

func TestAnswerWithLLGuidance(t *testing.T) {
	tests := []struct {
		name      string
		schema    string
		good, bad []string
	}{
		{"any object", ``,
			[]string{`{}`, `{"a": [1, {"b": null}], "c": "x"}`},
			[]string{`[]`, `"x"`, `{"a" 1}`, `{} {}`}},
		{"person", `{"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer", "minimum": 0}},
			"required": ["name", "age"], "additionalProperties": false}`,
			[]string{`{"name": "Ann", "age": 30}`, `{"name":"Bo","age":0}`},
			[]string{`{"name": "Ann"}`, `{"name": "Ann", "age": 1.5}`, `{"name": "Ann", "age": "30"}`, `{"name": "Ann", "age": -1}`,
				`{"name": "Ann", "age": 3, "x": 1}`}},
		{"optional field", `{"type": "object", "properties": {"a": {"type": "string"}, "b": {"type": "boolean"}}, "required": ["a"], "additionalProperties": false}`,
			[]string{`{"a": "x"}`, `{"a": "x", "b": true}`},
			[]string{`{"b": true}`, `{"a": "x", "b": 1}`}},
		{"enum", `{"type": "string", "enum": ["red", "green"]}`,
			[]string{`"red"`, `"green"`}, []string{`"blue"`, `"re"`, `red`}},
		{"nested arrays with bounds", `{"type": "array", "items": {"type": "array", "items": {"type": "integer", "minimum": 0, "maximum": 9}, "maxItems": 2}, "minItems": 1}`,
			[]string{`[[1, 2], [3]]`, `[[]]`}, []string{`[]`, `[[1, 2, 3]]`, `[[10]]`, `[[-1]]`}},
		{"number bounds", `{"type": "object", "properties": {"x": {"type": "number", "minimum": 0, "exclusiveMaximum": 10}}, "required": ["x"]}`,
			[]string{`{"x": 0}`, `{"x": 9.5}`}, []string{`{"x": -1}`, `{"x": 10}`, `{"x": 12}`}},
		{"anyOf", `{"type": "object", "properties": {"v": {"anyOf": [{"type": "string"}, {"type": "integer"}]}}, "required": ["v"]}`,
			[]string{`{"v": "x"}`, `{"v": 3}`}, []string{`{"v": 1.5}`, `{"v": true}`}},
		{"pattern", `{"type": "string", "pattern": "^[a-z]{2,4}$"}`,
			[]string{`"abc"`}, []string{`"ABC"`, `"abcde"`, `"a"`}},
		{"recursion through an optional property", `{"$ref": "#/$defs/node", "$defs": {"node": {"type": "object",
			"properties": {"v": {"type": "integer"}, "next": {"$ref": "#/$defs/node"}}, "required": ["v"], "additionalProperties": false}}}`,
			[]string{`{"v": 1, "next": {"v": 2, "next": {"v": 3}}}`, `{"v": 1}`}, []string{`{"v": 1, "next": {}}`}},
		{"recursion through an array", `{"type": "object", "properties": {"name": {"type": "string"}, "kids": {"type": "array", "items": {"$ref": "#"}}},
			"required": ["name", "kids"], "additionalProperties": false}`,
			[]string{`{"name": "a", "kids": [{"name": "b", "kids": []}]}`}, []string{`{"name": "a", "kids": [{"name": "b"}]}`}},
		{"properties in the schema's order", `{"type": "object", "properties": {"z": {"type": "integer"}, "a": {"type": "integer"}}, "required": ["z", "a"], "additionalProperties": false}`,
			[]string{`{"z": 1, "a": 2}`}, []string{`{"a": 2, "z": 1}`}},
		{"patternProperties", `{"type": "object", "patternProperties": {"^x_": {"type": "integer"}}, "additionalProperties": false}`,
			[]string{`{"x_a": 1}`, `{}`}, []string{`{"y": 1}`, `{"x_a": "s"}`}},
		{"unknown format dropped", `{"type": "string", "format": "password", "minLength": 2}`,
			[]string{`"hunter2"`}, []string{`"h"`}},
		{"uniqueItems false dropped", `{"type": "array", "items": {"type": "integer"}, "uniqueItems": false}`,
			[]string{`[1, 1]`}, []string{`["a"]`}},
		{"known format kept", `{"type": "string", "format": "date"}`,
			[]string{`"2024-02-29"`}, []string{`"yesterday"`}},
		{"const", `{"type": "object", "properties": {"kind": {"const": "dog"}}, "required": ["kind"]}`,
			[]string{`{"kind": "dog"}`}, []string{`{"kind": "cat"}`}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if err := CheckSchema(json.RawMessage(tt.schema)); err != nil {
				t.Fatal(err)
			}
			g := Answer(json.RawMessage(tt.schema))
			validate(t, g)
			checkTexts(t, g, tt.good, tt.bad, false)
		})
	}
}

// A JSON answer is one line, compact or json.dumps-style: no whitespace but one space
// after a separator, so a model cannot write whitespace forever; a schema's own options
// win.
func TestAnswerWhitespaceWithLLGuidance(t *testing.T) {
	nested := `{"type": "object", "properties": {"name": {"type": "string"}, "tags": {"type": "array", "items": {"type": "string"}},
		"loc": {"type": "object", "properties": {"lat": {"type": "number"}, "lon": {"type": "number"}, "box": {"type": "array", "items": {"type": "array", "items": {"type": "integer"}}}}}}}`
	type loc struct {
		Lat float64 `json:"lat"`
		Lon float64 `json:"lon"`
		Box [][]int `json:"box"`
	}
	value := struct { // in the schema's order, which llguidance enforces
		Name string   `json:"name"`
		Tags []string `json:"tags"`
		Loc  loc      `json:"loc"`
	}{"Ann", []string{"a", "b"}, loc{1.5, 2, [][]int{{1, 2}, {3, 4}}}}
	indent := func(prefix string) string {
		b, err := json.MarshalIndent(value, "", prefix)
		if err != nil {
			t.Fatal(err)
		}
		return string(b)
	}
	compact := indent("")
	compact = strings.ReplaceAll(strings.ReplaceAll(compact, "\n", ""), " ", "")
	pretty2, pretty4, tabs := indent("  "), indent("    "), indent("\t")
	obj := func(gap string) string { return `{"a":` + gap + `1}` }
	dumps := `{"name": "Ann", "tags": ["a", "b"], "loc": {"lat": 1.5, "lon": 2, "box": [[1, 2], [3, 4]]}}` // json.dumps
	tests := []struct {
		name, schema string
		good, bad    []string
	}{
		{"schema", nested,
			[]string{compact, dumps, `{"name":"Ann", "tags":["a","b"]}`},
			[]string{
				pretty2, pretty4, tabs, // no line breaks
				`{"name":  "Ann"}`, // two spaces
				`{"name" : "Ann"}`, // a space before a separator
				`{ "name": "Ann"}`, // after a brace
				`{"name":` + strings.Repeat(" ", 40) + `"Ann"}`,
				`{"name":` + "\t" + `"Ann"}`,
				`{"name":` + "\n" + `"Ann"}`,
				"\n" + compact, // before the value
				compact + "\n", // after it
				compact + " ",
			}},
		{"any object", ``,
			[]string{`{}`, `{"a": [1, {"b": null}], "c": "x"}`, obj(""), obj(" "), `{"a": [[1, 2], {"b": [true]}]}`},
			[]string{`[]`, `[1, 2]`, `1`, `"x"`, `null`, obj("  "), obj("\n"), pretty2}},
		{"true", `true`,
			[]string{`[1, 2]`, `"x"`, `[1,2]`, dumps},
			[]string{`[` + strings.Repeat(" ", 2) + `1]`, `[` + "\n" + `1]`, pretty2}},
		{"the client's options", `{"type": "object", "x-guidance": {"whitespace_flexible": true}}`,
			[]string{`{"a":1}`, compact, pretty2, obj("\n  ")},
			nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if err := CheckSchema(json.RawMessage(tt.schema)); err != nil {
				t.Fatal(err)
			}
			g := Answer(json.RawMessage(tt.schema))
			if g.Kind != KindJSONSchema {
				t.Errorf("kind %s, want %s", g.Kind, KindJSONSchema)
			}
			validate(t, g)
			checkTexts(t, g, tt.good, tt.bad, true)
		})
	}
}

// Every accepted schema of the CheckSchema table compiles in llguidance once Answer has
// prepared it.
func TestAcceptedSchemasCompile(t *testing.T) {
	for _, tt := range acceptedSchemas {
		t.Run(tt.name, func(t *testing.T) {
			validate(t, Answer(json.RawMessage(tt.schema)))
		})
	}
}

var weatherTool = Tool{Name: "get_weather", Parameters: json.RawMessage(`{"type": "object", "properties": {
	"city": {"type": "string", "description": "City name"},
	"days": {"type": "integer", "minimum": 1, "maximum": 14},
	"unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
	"metric": {"type": "boolean"},
	"tags": {"type": "array", "items": {"type": "string"}},
	"loc": {"type": "object", "properties": {"lat": {"type": "number"}, "lon": {"type": "number"}}, "required": ["lat", "lon"], "additionalProperties": false},
	"note": {"type": ["string", "null"]},
	"code": {"type": "string", "pattern": "^[A-Z]{3}$"},
	"when": {"anyOf": [{"type": "string", "format": "date"}, {"type": "null"}]},
	"ratio": {"type": ["number", "null"], "maximum": 1},
	"level": {"enum": ["low", "high", null]}
}, "required": ["city"], "additionalProperties": false}`)}

var timeTool = Tool{Name: "get_time", Parameters: json.RawMessage(`{"type": "object", "properties": {}}`)}

var treeTool = Tool{Name: "plant", Parameters: json.RawMessage(`{"type": "object", "properties": {
	"item": {"$ref": "#/$defs/item"},
	"tree": {"$ref": "#/$defs/node"},
	"self": {"$ref": "#"}
}, "$defs": {
	"item": {"type": "object", "properties": {"id": {"type": "integer"}}, "required": ["id"], "additionalProperties": false},
	"node": {"type": "object", "properties": {"kids": {"type": "array", "items": {"$ref": "#/$defs/node"}}}, "additionalProperties": false}
}}`)}

var freeTool = Tool{Name: "anything"} // no schema: any arguments

func coderParam(name, text string) string {
	return "<parameter=" + name + ">\n" + text + "\n</parameter>\n"
}

func coderCall(name string, params ...string) string {
	return "<tool_call>\n<function=" + name + ">\n" + strings.Join(params, "") + "</function>\n</tool_call>"
}

func TestQwen3CoderWithLLGuidance(t *testing.T) {
	paris := coderParam("city", "Paris")
	minimal := coderCall("get_weather", paris)
	full := renderCoder("get_weather", []arg{{"city", "Paris"}, {"days", 3}, {"unit", "celsius"}, {"metric", true},
		{"tags", []any{"a", "b"}}, {"loc", []arg{{"lat", 48.85}, {"lon", 2.35}}}, {"note", "null"}, {"code", "CDG"},
		{"when", "2024-02-29"}, {"ratio", 0.5}, {"level", "high"}})
	tests := []struct {
		name      string
		tools     []Tool
		only      string
		maxCalls  int
		good, bad []string
	}{
		{"one call of one of two tools", []Tool{weatherTool, timeTool}, "", 1,
			[]string{
				minimal,
				full,
				renderCoder("get_weather", weatherArgs),
				coderCall("get_time"),
				"\n\n" + minimal,
				coderCall("get_weather", coderParam("city", "São Paulo\nline two <b>bold</b> </div>"), coderParam("days", "14")),
				coderCall("get_weather", coderParam("city", "")),
				coderCall("get_weather", paris, coderParam("metric", "True"), coderParam("level", "null")),
				coderCall("get_weather", paris, coderParam("ratio", "null")),
				coderCall("get_weather", paris, coderParam("tags", `["</div>", "x"]`)),
			},
			[]string{
				coderCall("get_wether", paris),                                          // wrong tool name
				coderCall("get_weather", coderParam("days", "3")),                       // missing required city
				coderCall("get_weather", coderParam("city", "Pa</parameter>ris")),       // string holding the closing tag
				coderCall("get_weather", coderParam("city", "a <parameter=x> b")),       // or an opening one
				coderCall("get_weather", coderParam("city", "a </tool_call> b")),        // or the block's end
				coderCall("get_weather", paris, coderParam("days", "2.5")),              // a number where an integer is required
				coderCall("get_weather", paris, coderParam("days", "15")),               // out of bounds
				coderCall("get_weather", paris, coderParam("days", " 3")),               // not a bare literal
				coderCall("get_weather", paris, coderParam("unit", "kelvin")),           // outside the enum
				coderCall("get_weather", paris, coderParam("metric", "yes")),            // not a boolean
				coderCall("get_weather", paris, coderParam("code", "CD1")),              // against the pattern
				coderCall("get_weather", paris, coderParam("when", "tomorrow")),         // against the format
				coderCall("get_weather", paris, coderParam("level", "medium")),          // outside an untyped enum
				coderCall("get_weather", paris, coderParam("ratio", "2")),               // above the maximum
				coderCall("get_weather", paris, coderParam("loc", `{"lat": 1}`)),        // object missing a property
				coderCall("get_weather", paris, coderParam("loc", `{"lat":1,"lon":2}`)), // not tojson's spacing
				coderCall("get_weather", paris, coderParam("tags", `["</parameter>"]`)), // JSON string holding a marker
				coderCall("get_weather", paris, coderParam("wind", "5")),                // undeclared parameter
				coderCall("get_weather", coderParam("days", "3"), paris),                // out of the schema's order
				coderCall("get_time", coderParam("x", "1")),                             // a tool with no parameters
				minimal + " Done.",                          // text after the call
				minimal + "\n" + minimal,                    // a second call
				"Sure! " + minimal,                          // text before it
				"\n\n\n" + minimal,                          // too many newlines before it
				strings.TrimSuffix(minimal, "</tool_call>"), // unfinished
			}},
		{"named tool", []Tool{weatherTool, timeTool}, "get_time", 1,
			[]string{coderCall("get_time")}, []string{minimal}},
		{"one or more calls", []Tool{weatherTool, timeTool}, "", 0,
			[]string{minimal, minimal + "\n" + coderCall("get_time") + "\n" + minimal},
			[]string{minimal + "\n\n" + minimal, minimal + minimal}},
		{"at most two calls", []Tool{weatherTool}, "", 2,
			[]string{minimal, minimal + "\n" + minimal}, []string{minimal + "\n" + minimal + "\n" + minimal}},
		{"refs into the tool's schema", []Tool{treeTool}, "", 1,
			[]string{
				coderCall("plant", coderParam("item", `{"id": 7}`)),
				coderCall("plant", coderParam("tree", `{"kids": [{"kids": []}, {}]}`)),
				coderCall("plant", coderParam("self", `{"item": {"id": 1}, "self": {"tree": {}}}`)),
			},
			[]string{
				coderCall("plant", coderParam("item", `{"id": "7"}`)),
				coderCall("plant", coderParam("tree", `{"kids": [{"leaf": 1}]}`)),
				coderCall("plant", coderParam("self", `{"self": {"item": {}}}`)),
			}},
		{"an enum in an anyOf branch", []Tool{{Name: "pick", Parameters: json.RawMessage(`{"type": "object", "properties": {
			"mode": {"anyOf": [{"enum": ["a", "b"]}, {"type": "null"}]}}, "required": ["mode"]}`)}}, "", 1,
			[]string{coderCall("pick", coderParam("mode", "a")), coderCall("pick", coderParam("mode", "null"))},
			[]string{coderCall("pick", coderParam("mode", "c")), coderCall("pick")}},
		{"tool without a schema", []Tool{freeTool}, "", 1,
			[]string{coderCall("anything"), coderCall("anything", coderParam("a", "1"), coderParam("b_c", "x\ny"))},
			[]string{coderCall("anything", coderParam("a", "x</parameter>")), coderCall("anything", coderParam("a b", "1"))}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			g, err := ToolCalls(FormatQwen3Coder, tt.tools, tt.only, tt.maxCalls)
			if err != nil {
				t.Fatal(err)
			}
			validate(t, g)
			checkTexts(t, g, tt.good, tt.bad, tt.maxCalls == 1)
		})
	}
}

func TestJSONToolsWithLLGuidance(t *testing.T) {
	minimal := renderJSONTools("get_weather", []arg{{"city", "Paris"}})
	full := renderJSONTools("get_weather", []arg{{"city", "Paris"}, {"days", 3}, {"unit", "celsius"}, {"metric", true},
		{"tags", []any{"a", "b"}}, {"loc", []arg{{"lat", 48.85}, {"lon", 2.35}}}, {"note", nil}, {"code", "CDG"},
		{"when", nil}, {"ratio", 0.5}, {"level", nil}})
	call := func(args string) string {
		return "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": " + args + "}\n</tool_call>"
	}
	tests := []struct {
		name      string
		tools     []Tool
		only      string
		maxCalls  int
		good, bad []string
	}{
		{"one call of one of two tools", []Tool{weatherTool, timeTool}, "", 1,
			[]string{
				minimal, full,
				renderJSONTools("get_weather", weatherArgs),
				renderJSONTools("get_time", nil),
				"\n" + minimal,
				call(`{"city": "a </div> b"}`),
			},
			[]string{
				renderJSONTools("get_wether", []arg{{"city", "Paris"}}), // wrong tool name
				call(`{"days": 3}`),                         // missing required city
				call(`{"city": "Paris", "days": "3"}`),      // a string where an integer is required
				call(`{"city": "Paris", "days": 2.5}`),      // a number where an integer is required
				call(`{"city": "Paris", "unit": "kelvin"}`), // outside the enum
				call(`{"city": "Paris", "wind": 5}`),        // additional property
				call(`{"city":"Paris"}`),                    // not tojson's spacing
				call(`{"city": "a</tool_call>"}`),           // a string holding the block's end
				minimal + " Done.",                          // text after the call
				minimal + "\n" + minimal,                    // a second call
				"<tool_call>\n{\"arguments\": {\"city\": \"Paris\"}, \"name\": \"get_weather\"}\n</tool_call>", // keys swapped
			}},
		{"named tool, several calls", []Tool{weatherTool, timeTool}, "get_weather", 0,
			[]string{minimal, minimal + "\n" + full}, []string{renderJSONTools("get_time", nil)}},
		{"tool without a schema", []Tool{freeTool}, "", 1,
			[]string{renderJSONTools("anything", nil), renderJSONTools("anything", []arg{{"x", []any{1, "y"}}})},
			[]string{"<tool_call>\n{\"name\": \"anything\", \"arguments\": [1]}\n</tool_call>"}},
		{"refs into the tool's schema", []Tool{treeTool}, "", 1,
			[]string{renderJSONTools("plant", []arg{{"item", []arg{{"id", 7}}}, {"tree", []arg{{"kids", []any{[]arg{}}}}}})},
			[]string{renderJSONTools("plant", []arg{{"item", []arg{{"id", "7"}}}})}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			g, err := ToolCalls(FormatJSONTools, tt.tools, tt.only, tt.maxCalls)
			if err != nil {
				t.Fatal(err)
			}
			validate(t, g)
			checkTexts(t, g, tt.good, tt.bad, tt.maxCalls == 1)
		})
	}
}

// An answer that is either JSON valid for the schema or calls of the tools, in either
// format: each alone is accepted, a mix or a call of an unknown tool is not.
func TestAnswerOrToolCallsWithLLGuidance(t *testing.T) {
	schema := json.RawMessage(`{"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"], "additionalProperties": false}`)
	minimalJSON := renderJSONTools("get_weather", []arg{{"city", "Paris"}})
	minimalCoder := coderCall("get_weather", coderParam("city", "Paris"))
	for _, c := range []struct {
		format, call string
	}{{FormatJSONTools, minimalJSON}, {FormatQwen3Coder, minimalCoder}} {
		t.Run(c.format, func(t *testing.T) {
			g, err := AnswerOrToolCalls(schema, c.format, []Tool{weatherTool, timeTool}, 1)
			if err != nil {
				t.Fatal(err)
			}
			validate(t, g)
			checkTexts(t, g,
				[]string{`{"ok": true}`, `{"ok":false}`, c.call, "\n" + c.call},
				[]string{`{"ok": 1}`, `{}`, `{"ok": true}` + c.call, c.call + `{"ok": true}`, "Sure.", `{"ok": true}` + "\n"},
				true)
		})
	}
	if _, err := AnswerOrToolCalls(schema, "xml", []Tool{weatherTool}, 1); err == nil {
		t.Error("an unknown format was accepted")
	}
}
