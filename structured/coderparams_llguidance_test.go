//go:build cgo

package structured

import (
	"encoding/json"
	"reflect"
	"strconv"
	"strings"
	"testing"
)

// templateRendering is a value as the qwen3_coder chat templates render an argument: a string
// as it is, an object or array through tojson, anything else as Python's str (None, True,
// 2.0).
func templateRendering(v any) string {
	switch v := v.(type) {
	case string:
		return v
	case nil:
		return "None"
	case bool:
		if v {
			return "True"
		}
		return "False"
	case float64:
		s := strconv.FormatFloat(v, 'g', -1, 64)
		if !strings.ContainsAny(s, ".e") {
			s += ".0"
		}
		return s
	}
	return pyJSON(v)
}

// jsonRendering is a value as renderCoder writes it: a string as it is, anything else as JSON.
func jsonRendering(v any) string {
	if s, ok := v.(string); ok {
		return s
	}
	return pyJSON(v)
}

func decodeAny(t *testing.T, text string) any {
	t.Helper()
	var v any
	if err := json.Unmarshal([]byte(text), &v); err != nil {
		t.Fatalf("%s: %v", text, err)
	}
	return v
}

// The grammar and the server's parser read a parameter's text by one ValueReading. For a
// table of parameter schemas and values, each value rendered as the chat template renders
// it (and with JSON's literals, as renderCoder does): the grammar accepts the text exactly
// when the parser reads it back as a value the schema allows (llguidance, with the schema
// as an answer's, says which values it allows). The values in "back" are the schema's and
// read back as themselves; those in "other" are not the schema's, or are written as the
// text of another of its values (the string "None" where None is null).
func TestCoderValuesRoundTrip(t *testing.T) {
	defs := `"$defs": {
		"name": {"type": "string", "enum": ["ann", "bo"]},
		"count": {"type": "integer", "minimum": 0},
		"obj": {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"], "additionalProperties": false},
		"tree": {"anyOf": [{"type": "integer"}, {"type": "array", "items": {"$ref": "#/$defs/tree"}}]}}`
	tests := []struct {
		name, schema string
		back, other  []any
	}{
		{"string", `{"type": "string"}`,
			[]any{"Paris", "3", "None", "null", "true", "", " spaced ", "[1]", `{"a": 1}`, "line 1\nline 2"},
			[]any{3, nil, true, []any{1}}},
		{"nullable string", `{"type": ["string", "null"]}`,
			[]any{"Paris", nil, "null", "3"}, []any{"None", 3}},
		{"string pattern", `{"type": "string", "pattern": "^[A-Z]{3}$"}`,
			[]any{"CDG"}, []any{"cdg", "CDGX", nil}},
		{"string format, or null", `{"anyOf": [{"type": "string", "format": "date"}, {"type": "null"}]}`,
			[]any{"2024-02-29", nil}, []any{"tomorrow", "null", 3}},
		{"string enum", `{"type": "string", "enum": ["celsius", "fahrenheit"]}`,
			[]any{"celsius", "fahrenheit"}, []any{"kelvin", nil}},
		{"integer", `{"type": "integer", "minimum": 1, "maximum": 14}`,
			[]any{3, 14}, []any{0, 15, 2.5, "3", "three", nil, true}},
		{"nullable integer", `{"type": ["integer", "null"]}`,
			[]any{3, -7, nil}, []any{"x", 1.5}},
		{"number", `{"type": "number", "maximum": 1}`,
			[]any{0.5, -0.25, 1}, []any{2, "x", nil}},
		{"boolean", `{"type": "boolean"}`,
			[]any{true, false}, []any{"yes", nil, 1}},
		{"nullable boolean", `{"anyOf": [{"type": "boolean"}, {"type": "null"}]}`,
			[]any{true, false, nil}, []any{"x"}},
		{"const true", `{"const": true}`,
			[]any{true}, []any{false, nil}},
		{"enum without a type", `{"enum": ["low", "high", null]}`,
			[]any{"low", "high", nil}, []any{"medium", "null", 1}},
		{"enum of mixed kinds", `{"enum": ["None", 1, true, null]}`,
			[]any{"None", 1, true}, []any{nil, false, 2, "x"}},
		{"enum of objects and arrays", `{"enum": [{"a": 1}, [1, 2]]}`,
			[]any{[]arg{{"a", 1}}, []any{1, 2}}, []any{[]any{1}, []arg{{"a", 2}}, "x"}},
		{"$ref to a string enum", `{"$ref": "#/$defs/name"}`,
			[]any{"ann", "bo"}, []any{"cy", nil, "null"}},
		{"$ref to a string enum, or null", `{"anyOf": [{"$ref": "#/$defs/name"}, {"type": "null"}]}`,
			[]any{"ann", nil}, []any{"cy", "None"}},
		{"$ref to an integer", `{"$ref": "#/$defs/count"}`,
			[]any{3, 0}, []any{-1, "x", nil}},
		{"$ref to an integer, or null", `{"anyOf": [{"$ref": "#/$defs/count"}, {"type": "null"}]}`,
			[]any{3, nil}, []any{-1, "x"}},
		{"strings or integers through $refs", `{"anyOf": [{"$ref": "#/$defs/name"}, {"$ref": "#/$defs/count"}]}`,
			[]any{"ann", 7}, []any{"cy", -1, nil, true}},
		{"first branch a string, the other an integer", `{"anyOf": [{"type": "string"}, {"type": "integer"}]}`,
			[]any{"Paris", "three", 3, -2, " x "}, []any{"3", "true", true, nil, 1.5, []any{1}}},
		{"several types and null", `{"type": ["string", "integer", "null"]}`,
			[]any{"x", 3, nil}, []any{"None", "4", false}},
		{"object through $ref", `{"$ref": "#/$defs/obj"}`,
			[]any{[]arg{{"a", 1}}}, []any{[]arg{}, []arg{{"a", "1"}}, "x", nil}},
		{"nullable object", `{"type": ["object", "null"]}`,
			[]any{[]arg{{"a", []any{1, "b"}}}, nil}, []any{"x", 1}},
		{"recursion through $ref", `{"$ref": "#/$defs/tree"}`,
			[]any{3, []any{1, []any{2, []any{}}}}, []any{"x", nil, []any{"x"}}},
		{"array", `{"type": "array", "items": {"type": "integer"}}`,
			[]any{[]any{1, 2}, []any{}}, []any{[]any{"a"}, "x", 3}},
		{"null", `{"type": "null"}`,
			[]any{nil}, []any{"x", 0}},
		{"no type", `{"description": "anything"}`,
			[]any{"anything", "None", []any{1}, []arg{{"a", 1}}}, []any{nil, 3, true}},
		{"no type, a string bound", `{"minLength": 2}`,
			[]any{"ab", "None", "nullable", []any{1}}, []any{nil, "a", 3, 33, true}},
		{"no type, string bounds no string meets", `{"minLength": 2, "maxLength": 1}`,
			[]any{[]any{1}, []arg{}}, []any{nil, "ab", "", 3}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			params := json.RawMessage(`{"type": "object", "properties": {"p": ` + tt.schema + `}, "required": ["p"], ` + defs + `}`)
			g, err := ToolCalls(FormatQwen3Coder, []Tool{{Name: "f", Parameters: params}}, "", 1)
			if err != nil {
				t.Fatal(err)
			}
			validate(t, g)
			schema := Answer(params)
			allowed := func(v string) bool {
				ok, _, _ := accepts(t, schema, `{"p": `+v+`}`)
				return ok
			}
			reading, ok := CoderParams(params)["p"]
			if !ok {
				t.Fatal("no reading of p")
			}
			check := func(v any, back bool) {
				for i, text := range []string{templateRendering(v), jsonRendering(v)} {
					read := string(reading.Read(text))
					written, _, _ := accepts(t, g, coderCall("f", coderParam("p", text)))
					if valid := allowed(read); written != valid {
						t.Errorf("%q reads as %s (the schema's: %v), but the grammar accepts it: %v", text, read, valid, written)
					}
					if i > 0 || !back {
						continue
					}
					if !reflect.DeepEqual(decodeAny(t, read), decodeAny(t, pyJSON(v))) {
						t.Errorf("%q reads as %s, not as %s", text, read, pyJSON(v))
					}
					if !allowed(pyJSON(v)) {
						t.Errorf("%s is not the schema's", pyJSON(v))
					}
				}
			}
			for _, v := range tt.back {
				check(v, true)
			}
			for _, v := range tt.other {
				if read := string(reading.Read(templateRendering(v))); allowed(pyJSON(v)) &&
					reflect.DeepEqual(decodeAny(t, read), decodeAny(t, pyJSON(v))) {
					t.Errorf("%s is the schema's and reads back as itself: it belongs in back", pyJSON(v))
				}
				check(v, false)
			}
		})
	}
}
