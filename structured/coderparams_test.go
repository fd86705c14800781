package structured

import (
	"encoding/json"
	"reflect"
	"testing"
)

// CoderParams names the parameters the grammar lays out, each with how its text reads.
func TestCoderParams(t *testing.T) {
	type reading struct {
		kind     string
		nullable bool
	}
	tests := []struct {
		name, schema string
		want         map[string]reading
	}{
		{"by type", `{"type": "object", "properties": {
			"s": {"type": "string"}, "n": {"type": ["string", "null"]}, "i": {"type": "integer"}, "f": {"type": "number"},
			"b": {"type": "boolean"}, "o": {"type": "object"}, "a": {"type": "array"}, "z": {"type": "null"}, "w": {"type": "str"}}}`,
			map[string]reading{"s": {"string", false}, "n": {"string", true}, "i": {"integer", false}, "f": {"number", false},
				"b": {"boolean", false}, "o": {"json", false}, "a": {"json", false}, "z": {"json", true}, "w": {"json", false}}},
		{"by the kinds allowed", `{"properties": {
			"name": {"$ref": "#/$defs/name"}, "opt": {"anyOf": [{"$ref": "#/$defs/name"}, {"type": "null"}]},
			"count": {"allOf": [{"$ref": "#/$defs/count"}]}, "yes": {"const": true}, "mixed": {"anyOf": [{"type": "string"}, {"type": "integer"}]},
			"many": {"type": ["integer", "string"]}, "free": {}, "none": false, "loop": {"$ref": "#/$defs/loop"}},
			"$defs": {"name": {"type": "string", "enum": ["a", "b"]}, "count": {"type": "integer"}, "loop": {"$ref": "#/$defs/loop"}}}`,
			map[string]reading{"name": {"text", false}, "opt": {"text", true}, "count": {"number", false}, "yes": {"boolean", false},
				"mixed": {"json", false}, "many": {"json", false}, "free": {"untyped", false}, "none": {"untyped", false}, "loop": {"untyped", false}}},
		{"enums", `{"properties": {"e": {"enum": ["x", 1, null]}, "branch": {"anyOf": [{"enum": ["x"]}, {"type": "integer"}]}}}`,
			map[string]reading{"e": {"enum", true}, "branch": {"json", false}}},
		{"a root $ref, and a required parameter it does not declare", `{"$ref": "#/$defs/args", "$defs": {"args": {
			"properties": {"p": {"type": "integer"}}, "required": ["p", "q"], "additionalProperties": {"type": "boolean"}}}}`,
			map[string]reading{"p": {"integer", false}, "q": {"boolean", false}},
		},
		{"alternatives at the top are passed over", `{"properties": {"p": {"type": "integer"}}, "anyOf": [{"required": ["p"]}]}`,
			map[string]reading{"p": {"integer", false}}},
		{"root $refs in a circle", `{"$ref": "#/$defs/a", "$defs": {"a": {"$ref": "#"}}}`, nil},
		{"not JSON", `{"type": `, nil},
		{"not an object", `true`, nil},
		{"no schema", ``, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var got map[string]reading
			for name, rd := range CoderParams(json.RawMessage(tt.schema)) {
				if got == nil {
					got = map[string]reading{}
				}
				got[name] = reading{rd.Kind, rd.Nullable}
			}
			if !reflect.DeepEqual(got, tt.want) {
				t.Errorf("got %v\nwant %v", got, tt.want)
			}
		})
	}
}

// Read turns a parameter's text into JSON by its reading.
func TestValueReadingRead(t *testing.T) {
	params := CoderParams(json.RawMessage(`{"properties": {"n": {"type": ["number", "null"]}, "e": {"enum": ["None", 1, true, null]},
		"j": {"type": ["string", "integer"]}, "u": {}}}`))
	tests := []struct{ param, text, want string }{
		{"n", "2.50", `2.5`}, {"n", "1e3", `1000`}, {"n", "None", `null`}, {"n", "NULL", `null`}, {"n", "x", `"x"`},
		{"e", "None", `"None"`}, {"e", "True", `true`}, {"e", "1.0", `1.0`}, {"e", "null", `null`}, {"e", "2", `"2"`},
		{"j", "3", `3`}, {"j", `"3"`, `"3"`}, {"j", "three", `"three"`}, {"j", "False", `false`}, {"j", "1]", `"1]"`},
		{"u", `[1, {"a": 2}]`, `[1,{"a":2}]`}, {"u", "3", `"3"`}, {"u", "null", `null`}, {"u", "None", `"None"`},
		{"undeclared", "null", `null`}, {"undeclared", "<b>&", `"<b>&"`},
	}
	for _, tt := range tests {
		if got := string(params[tt.param].Read(tt.text)); got != tt.want {
			t.Errorf("%s %q: got %s, want %s", tt.param, tt.text, got, tt.want)
		}
	}
}
