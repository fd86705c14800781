package server

import (
	"encoding/json"
	"testing"
)

func TestDetectToolCallFormat(t *testing.T) {
	tests := []struct {
		name, template string
		want           ToolCallFormat
	}{
		{"qwen3 JSON instructions", `{{- "<tool_call>\n{\"name\": <function-name>, \"arguments\": <args-json-object>}\n</tool_call>" }}`, ToolCallJSON},
		{"coder, escaped newline", `{{- '<tool_call>\n<function=' + tool_call.name + '>\n' }}`, ToolCallQwen3Coder},
		{"coder, real newline", "<tool_call>\n<function=example_function_name>", ToolCallQwen3Coder},
		{"no tools at all", `{% for m in messages %}{{ m.content }}{% endfor %}`, ToolCallJSON},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := DetectToolCallFormat(tt.template); got != tt.want {
				t.Errorf("got %s, want %s", got, tt.want)
			}
		})
	}
}

func TestParseCoderToolCall(t *testing.T) {
	tools := []Tool{{Name: "f", Parameters: json.RawMessage(`{"type": "object", "properties": {
		"city": {"type": "string"}, "days": {"type": "integer"}, "temp": {"type": "number"},
		"metric": {"type": "boolean"}, "tags": {"type": "array"}, "opts": {"type": "object"},
		"maybe": {"type": ["null", "integer"]}, "either": {"anyOf": [{"type": "null"}, {"type": "number"}]},
		"free": {"description": "no type"}, "zip": {"type": "string"}}}`)}}
	schemas := newToolSchemas(tools)
	tests := []struct {
		name, body string
		want       []parsedCall
		ok         bool
	}{
		{"typed values", "\n<function=f>\n<parameter=city>\nParis\n</parameter>\n<parameter=days>\n3\n</parameter>\n" +
			"<parameter=temp>\n21.5\n</parameter>\n<parameter=metric>\nTrue\n</parameter>\n</function>\n",
			[]parsedCall{{"f", `{"city":"Paris","days":3,"temp":21.5,"metric":true}`}}, true},
		{"a string that looks like a number stays a string", "<function=f>\n<parameter=zip>\n01234\n</parameter>\n</function>",
			[]parsedCall{{"f", `{"zip":"01234"}`}}, true},
		{"JSON values for array and object", "<function=f>\n<parameter=tags>\n[\"a\", \"b\"]\n</parameter>\n" +
			"<parameter=opts>\n{\"x\": 1}\n</parameter>\n</function>", []parsedCall{{"f", `{"tags":["a","b"],"opts":{"x":1}}`}}, true},
		{"type lists and anyOf", "<function=f>\n<parameter=maybe>\n7\n</parameter>\n<parameter=either>\n2.0\n</parameter>\n</function>",
			[]parsedCall{{"f", `{"maybe":7,"either":2}`}}, true},
		{"null", "<function=f>\n<parameter=days>\nnull\n</parameter>\n</function>", []parsedCall{{"f", `{"days":null}`}}, true},
		{"bad integer stays text", "<function=f>\n<parameter=days>\nthree\n</parameter>\n</function>",
			[]parsedCall{{"f", `{"days":"three"}`}}, true},
		{"untyped JSON object", "<function=f>\n<parameter=free>\n{\"a\": [1]}\n</parameter>\n</function>",
			[]parsedCall{{"f", `{"free":{"a":[1]}}`}}, true},
		{"unknown parameter is text", "<function=f>\n<parameter=other>\n42\n</parameter>\n</function>",
			[]parsedCall{{"f", `{"other":"42"}`}}, true},
		{"multi-line string keeps inner newlines", "<function=f>\n<parameter=city>\nline 1\nline 2\n</parameter>\n</function>",
			[]parsedCall{{"f", `{"city":"line 1\nline 2"}`}}, true},
		{"missing </parameter> and </function>", "<function=f>\n<parameter=city>\nRome\n<parameter=days>\n2\n",
			[]parsedCall{{"f", `{"city":"Rome","days":2}`}}, true},
		{"no parameters", "<function=now>\n</function>", []parsedCall{{"now", `{}`}}, true},
		{"two functions", "<function=now>\n</function>\n<function=f>\n<parameter=days>\n1\n</parameter>\n</function>",
			[]parsedCall{{"now", `{}`}, {"f", `{"days":1}`}}, true},
		{"JSON body is not this format", `{"name": "f", "arguments": {}}`, nil, false},
		{"text outside the tags", "<function=f>\n</function> and more", nil, false},
		{"no name", "<function=>\n</function>", nil, false},
		{"empty", "  \n", nil, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, ok := parseCoderToolCall(tt.body, schemas)
			if ok != tt.ok || len(got) != len(tt.want) {
				t.Fatalf("got %v, %v; want %v, %v", got, ok, tt.want, tt.ok)
			}
			for i := range got {
				if got[i] != tt.want[i] {
					t.Errorf("call %d: got %+v, want %+v", i, got[i], tt.want[i])
				}
				if !json.Valid([]byte(got[i].Arguments)) {
					t.Errorf("call %d: arguments %s are not JSON", i, got[i].Arguments)
				}
			}
		})
	}
}

// A forced call's prefix opens the function in the model's own format, and the parser reads
// the completed block back.
func TestCoderToolCallPrefixParses(t *testing.T) {
	prefix := toolCallPrefix(ToolCallQwen3Coder, toolChoice{Mode: "function", Function: "get_weather"})
	if prefix != "<tool_call>\n<function=get_weather>\n" {
		t.Fatalf("prefix %q", prefix)
	}
	p := newChatOutputParser(true, 0, false)
	p.parseCall = toolCallParser(ToolCallQwen3Coder, []Tool{{Name: "get_weather",
		Parameters: json.RawMessage(`{"properties": {"days": {"type": "integer"}}}`)}})
	events := append([]chatEvent(nil), p.feed(prefix)...)
	for _, piece := range []string{"<parameter=days>\n", "4\n</param", "eter>\n</function>\n</tool", "_call>"} {
		events = append(events, p.feed(piece)...)
	}
	events = append(events, p.finish()...)
	if len(events) != 1 || events[0].ToolCall == nil {
		t.Fatalf("events %+v, want one tool call", events)
	}
	if c := events[0].ToolCall; c.Name != "get_weather" || c.Arguments != `{"days":4}` {
		t.Errorf("call %+v", c)
	}
}

// Values are read by the parameter's schema wherever its type comes from: $ref (into
// $defs, definitions, through chains and cycles), enum and const values without a type,
// and the Python literals the chat template renders (None, True, False).
func TestParseCoderToolCallSchemaTypes(t *testing.T) {
	tools := []Tool{{Name: "f", Parameters: json.RawMessage(`{"type": "object", "properties": {
		"count": {"$ref": "#/$defs/count"},
		"ratio": {"$ref": "#/definitions/ratio"},
		"flag": {"$ref": "#/$defs/flag"},
		"opts": {"$ref": "#/$defs/opts"},
		"chain": {"$ref": "#/$defs/a"},
		"cycle": {"$ref": "#/$defs/loop1"},
		"fork": {"$ref": "#/$defs/fork1"},
		"self": {"$ref": "#"},
		"escaped": {"$ref": "#/$defs/a~1b%20c"},
		"anchored": {"$ref": "#num"},
		"dangling": {"$ref": "#/$defs/missing"},
		"outside": {"$ref": "https://example.com/s.json"},
		"name": {"$ref": "#/$defs/name"},
		"optName": {"anyOf": [{"$ref": "#/$defs/name"}, {"type": "null"}]},
		"optCount": {"anyOf": [{"$ref": "#/$defs/count"}, {"type": "null"}]},
		"wrapped": {"allOf": [{"$ref": "#/$defs/count"}], "description": "pydantic v1 style"},
		"either": {"anyOf": [{"$ref": "#/$defs/name"}, {"type": "integer"}]},
		"mixed": {"anyOf": [{"$ref": "#/$defs/name"}, {"$ref": "#/$defs/count"}]},
		"sizes": {"enum": [1, 2, 3]},
		"onoff": {"enum": [true, false]},
		"levels": {"enum": ["low", 1, null]},
		"unit": {"enum": ["celsius", "None", null]},
		"fixed": {"const": 5},
		"kind": {"const": "dog"},
		"refEnum": {"$ref": "#/$defs/levels"},
		"note": {"type": ["string", "null"]},
		"days": {"type": ["integer", "null"]},
		"days2": {"type": "integer"},
		"metric": {"type": "boolean"},
		"city": {"type": "string"},
		"free": {"description": "no type"},
		"weird": {"type": "str"}
	}, "$defs": {
		"count": {"type": "integer", "minimum": 0},
		"flag": {"type": "boolean"},
		"opts": {"type": "object"},
		"a": {"$ref": "#/$defs/b"},
		"b": {"$ref": "#/definitions/c"},
		"loop1": {"$ref": "#/$defs/loop2"},
		"loop2": {"$ref": "#/$defs/loop1"},
		"fork1": {"anyOf": [{"$ref": "#/$defs/fork2"}, {"$ref": "#/$defs/fork2"}, {"type": "integer"}]},
		"fork2": {"anyOf": [{"$ref": "#/$defs/fork1"}, {"$ref": "#/$defs/fork1"}]},
		"a/b c": {"type": "number"},
		"name": {"type": "string", "enum": ["ann", "bo"]},
		"levels": {"enum": ["low", 1, true]},
		"n": {"$anchor": "num", "type": "number"}
	}, "definitions": {
		"ratio": {"type": "number"},
		"c": {"type": "integer"}
	}}`)}}
	tests := []struct {
		name, param, text, want string
	}{
		{"$ref into $defs", "count", "3", `3`},
		{"$ref into definitions", "ratio", "0.5", `0.5`},
		{"$ref to a boolean", "flag", "True", `true`},
		{"$ref to an object", "opts", `{"x": [1, 2]}`, `{"x":[1,2]}`},
		{"nested $ref chain", "chain", "7", `7`},
		{"$ref cycle types nothing", "cycle", "3", `"3"`},
		{"$ref cycle through branches types nothing", "fork", "4", `"4"`},
		{"$ref to the root", "self", `{"count": 1}`, `{"count":1}`},
		{"escaped pointer", "escaped", "2.5", `2.5`},
		{"anchor", "anchored", "1e3", `1000`},
		{"unresolved $ref types nothing", "dangling", "3", `"3"`},
		{"$ref outside the schema types nothing", "outside", "3", `"3"`},
		{"$ref to a string", "name", "ann", `"ann"`},
		{"$ref to a string, null", "optName", "null", `null`},
		{"$ref to a string, None", "optName", "None", `null`},
		{"$ref to an integer, None", "optCount", "None", `null`},
		{"$ref to an integer, value", "optCount", "12", `12`},
		{"allOf around a $ref", "wrapped", "9", `9`},
		{"first directly typed branch", "either", "42", `42`},
		{"strings or numbers as JSON", "mixed", "42", `42`},
		{"strings or numbers as JSON, a string", "mixed", `"bo"`, `"bo"`},
		{"strings or numbers, not JSON", "mixed", `bo`, `"bo"`},
		{"enum of numbers", "sizes", "3", `3`},
		{"enum of booleans", "onoff", "False", `false`},
		{"mixed enum, string", "levels", "low", `"low"`},
		{"mixed enum, number", "levels", "1", `1`},
		{"mixed enum, null", "levels", "null", `null`},
		{"mixed enum, None", "levels", "None", `null`},
		{"string enum member None", "unit", "None", `"None"`},
		{"string enum null", "unit", "null", `null`},
		{"const number", "fixed", "5", `5`},
		{"const string", "kind", "dog", `"dog"`},
		{"$ref to a mixed enum, JSON", "refEnum", `"low"`, `"low"`},
		{"$ref to a mixed enum, Python boolean", "refEnum", "True", `true`},
		{"nullable string, None", "note", "None", `null`},
		{"nullable string, null is a string", "note", "null", `"null"`},
		{"nullable integer, None", "days", "None", `null`},
		{"integer, None is not null", "days2", "None", `"None"`},
		{"boolean True", "metric", "True", `true`},
		{"boolean False", "metric", "False", `false`},
		{"boolean lower case", "metric", "false", `false`},
		{"string None", "city", "None", `"None"`},
		{"string True", "city", "True", `"True"`},
		{"untyped None stays text", "free", "None", `"None"`},
		{"untyped True stays text", "free", "True", `"True"`},
		{"unknown type stays as it was", "weird", "x", `"x"`},
		{"undeclared None stays text", "other", "None", `"None"`},
	}
	schemas := newToolSchemas(tools)
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			body := "<function=f>\n<parameter=" + tt.param + ">\n" + tt.text + "\n</parameter>\n</function>"
			got, ok := parseCoderToolCall(body, schemas)
			if !ok || len(got) != 1 {
				t.Fatalf("got %v, %v", got, ok)
			}
			if want := `{"` + tt.param + `":` + tt.want + `}`; got[0].Arguments != want {
				t.Errorf("got %s, want %s", got[0].Arguments, want)
			}
		})
	}
}

// A parameters schema that is a $ref declares the parameters of the object it leads to,
// as the grammar lays them out; a cycle of refs at the top declares none.
func TestCoderToolSchemasRootRef(t *testing.T) {
	tools := []Tool{
		{Name: "ref", Parameters: json.RawMessage(`{"$ref": "#/$defs/args", "$defs": {"args": {"$ref": "#/definitions/args"}, "n": {"type": "integer"}},
			"definitions": {"args": {"type": "object", "properties": {"n": {"$ref": "#/$defs/n"}, "obj": {}}}}}`)},
		{Name: "loop", Parameters: json.RawMessage(`{"$ref": "#/$defs/a", "$defs": {"a": {"$ref": "#/$defs/b"}, "b": {"$ref": "#/$defs/a"}}}`)},
		{Name: "bad", Parameters: json.RawMessage(`{"type": `)},
	}
	schemas := newToolSchemas(tools)
	tests := []struct{ tool, body, want string }{
		{"ref", "<parameter=n>\n4\n</parameter>\n<parameter=obj>\n[1]\n</parameter>", `{"n":4,"obj":[1]}`},
		{"loop", "<parameter=n>\n4\n</parameter>", `{"n":"4"}`},
		{"bad", "<parameter=n>\n4\n</parameter>", `{"n":"4"}`},
	}
	for _, tt := range tests {
		got, ok := parseCoderToolCall("<function="+tt.tool+">\n"+tt.body+"\n</function>", schemas)
		if !ok || len(got) != 1 || got[0].Arguments != tt.want {
			t.Errorf("%s: got %v, %v; want %s", tt.tool, got, ok, tt.want)
		}
	}
}
