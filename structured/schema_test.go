package structured

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"
)

// Schemas CheckSchema accepts. schemaSuite (llguidance_test.go) checks what llguidance
// makes of most of them.
var acceptedSchemas = []struct{ name, schema string }{
	{"none", ``},
	{"true", `true`},
	{"required and optional fields", `{"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"}}, "required": ["name"]}`},
	{"enum", `{"type": "string", "enum": ["red", "green"]}`},
	{"nested arrays", `{"type": "array", "items": {"type": "array", "items": {"type": "number"}, "maxItems": 3}, "minItems": 1}`},
	{"numbers with bounds", `{"type": "number", "minimum": 0, "exclusiveMaximum": 10, "multipleOf": 0.5}`},
	{"draft-04 boolean exclusive bound", `{"$schema": "http://json-schema.org/draft-04/schema#", "type": "integer", "maximum": 5, "exclusiveMaximum": true}`},
	{"anyOf", `{"anyOf": [{"type": "string"}, {"type": "integer"}]}`},
	{"string pattern and lengths", `{"type": "string", "pattern": "^[a-z]+$", "minLength": 1, "maxLength": 8}`},
	{"additionalProperties false", `{"type": "object", "properties": {"a": {"type": "boolean"}}, "additionalProperties": false}`},
	{"$defs and $ref", `{"type": "object", "properties": {"home": {"$ref": "#/$defs/addr"}, "work": {"$ref": "#/$defs/addr"}}, "$defs": {"addr": {"type": "object", "properties": {"street": {"type": "string"}}}}}`},
	{"definitions and $ref", `{"$schema": "http://json-schema.org/draft-07/schema#", "properties": {"a": {"$ref": "#/definitions/x"}}, "definitions": {"x": {"type": "integer"}}}`},
	{"recursion through an optional property", `{"$ref": "#/$defs/node", "$defs": {"node": {"type": "object", "properties": {"value": {"type": "integer"}, "next": {"$ref": "#/$defs/node"}}, "required": ["value"]}}}`},
	{"recursion through an array", `{"type": "object", "properties": {"name": {"type": "string"}, "children": {"type": "array", "items": {"$ref": "#"}}}, "required": ["name", "children"]}`},
	{"recursion through a nullable anyOf", `{"type": "object", "properties": {"next": {"anyOf": [{"$ref": "#"}, {"type": "null"}]}}, "required": ["next"]}`},
	{"recursive $ref beside an annotation", `{"type": "object", "properties": {"next": {"$ref": "#", "description": "the rest"}}}`},
	{"non-recursive $ref beside a keyword", `{"$ref": "#/$defs/s", "maxLength": 3, "$defs": {"s": {"type": "string"}}}`},
	{"$anchor ref", `{"properties": {"a": {"$ref": "#item"}}, "$defs": {"i": {"$anchor": "item", "type": "string"}}}`},
	{"escaped pointer", `{"properties": {"a/b": {"type": "string"}, "c": {"$ref": "#/properties/a~1b"}}}`},
	{"patternProperties (llguidance enforces it)", `{"type": "object", "patternProperties": {"^x_": {"type": "integer"}}, "additionalProperties": false}`},
	{"uniqueItems false", `{"type": "array", "uniqueItems": false}`},
	{"unknown format (an annotation)", `{"type": "string", "format": "password"}`},
	{"if before draft-07 is no keyword", `{"$schema": "http://json-schema.org/draft-06/schema#", "if": {"type": "string"}}`},
	{"unsupported keyword in an unused definition", `{"type": "string", "$defs": {"unused": {"not": {"type": "string"}}}}`},
	{"unknown keywords", `{"type": "object", "x-order": 1, "nullable": true, "properties": {"a": {"type": "string", "example": "x"}}}`},
	{"strict-mode violations are fine", `{"type": "object", "properties": {"a": {"type": "string"}, "b": {"type": "string"}}, "required": ["a"]}`},
}

func TestCheckSchemaAccepts(t *testing.T) {
	for _, tt := range acceptedSchemas {
		t.Run(tt.name, func(t *testing.T) {
			if err := CheckSchema(json.RawMessage(tt.schema)); err != nil {
				t.Errorf("refused: %v", err)
			}
		})
	}
}

func TestCheckSchemaRefuses(t *testing.T) {
	tests := []struct {
		name, schema  string
		path, keyword string
		msg           string // part of the message
	}{
		{"not JSON", `{"type": `, "", "", "not valid JSON"},
		{"a string", `"x"`, "", "", "must be a JSON object"},
		{"an array", `[]`, "", "", "must be a JSON object"},
		{"false", `false`, "", "", "allows no value"},
		{"uniqueItems", `{"type": "object", "properties": {"tags": {"type": "array", "items": {"type": "string"}, "uniqueItems": true}}}`,
			"properties.tags", "uniqueItems", "not supported"},
		{"not", `{"not": {"type": "null"}}`, "", "not", "not supported"},
		{"if in an array's items", `{"type": "array", "items": {"if": {"type": "string"}, "then": {"minLength": 1}}}`, "items", "if", "not supported"},
		{"propertyNames", `{"type": "object", "propertyNames": {"pattern": "^a"}}`, "", "propertyNames", "not supported"},
		{"contains in anyOf", `{"anyOf": [{"type": "null"}, {"type": "array", "contains": {"type": "integer"}}]}`, "anyOf.1", "contains", "not supported"},
		{"dependentRequired", `{"type": "object", "dependentRequired": {"a": ["b"]}}`, "", "dependentRequired", "not supported"},
		{"unevaluatedProperties", `{"type": "object", "unevaluatedProperties": false}`, "", "unevaluatedProperties", "not supported"},
		{"unsupported keyword in a used definition", `{"properties": {"a": {"$ref": "#/$defs/d"}}, "$defs": {"d": {"not": {"type": "string"}}}}`,
			"$defs.d", "not", "not supported"},
		{"$ref to a missing definition", `{"type": "object", "properties": {"a": {"$ref": "#/$defs/missing"}}, "$defs": {}}`,
			"properties.a", "$ref", "does not resolve"},
		{"$ref outside the document", `{"$ref": "other.json#/x"}`, "", "$ref", "outside the schema"},
		{"$ref to a missing anchor", `{"properties": {"a": {"$ref": "#nowhere"}}}`, "properties.a", "$ref", "no $anchor"},
		{"$ref to a non-schema", `{"properties": {"a": {"$ref": "#/required/0"}}, "required": ["a"]}`, "properties.a", "$ref", "not a schema"},
		{"required property whose schema is itself", `{"type": "object", "properties": {"self": {"$ref": "#"}}, "required": ["self"]}`,
			"properties.self", "$ref", "no way out"},
		{"refs leading only to each other", `{"$ref": "#/$defs/a", "$defs": {"a": {"$ref": "#/$defs/b"}, "b": {"$ref": "#/$defs/a"}}}`,
			"", "$ref", "no way out"},
		{"optional property whose schema never ends", `{"type": "object", "properties": {"loop": {"$ref": "#/$defs/l"}}, "$defs": {"l": {"type": "object", "properties": {"l": {"$ref": "#/$defs/l"}}, "required": ["l"]}}}`,
			"properties.loop", "$ref", "no way out"},
		{"non-empty array of itself", `{"type": "object", "properties": {"kids": {"type": "array", "items": {"$ref": "#"}, "minItems": 1}}, "required": ["kids"]}`,
			"properties.kids.items", "$ref", "no way out"},
		{"recursive $ref beside a keyword", `{"$defs": {"n": {"type": "object", "properties": {"next": {"$ref": "#/$defs/n", "nullable": true}}}}, "$ref": "#/$defs/n"}`,
			"$defs.n.properties.next", "$ref", "other keywords beside it (nullable)"},
		{"unknown type", `{"type": "object", "properties": {"a": {"type": "String"}}}`, "properties.a", "type", "not a JSON Schema type"},
		{"required not a list", `{"type": "object", "required": "a"}`, "", "required", "list of property names"},
		{"negative minItems", `{"type": "array", "minItems": -1}`, "", "minItems", "non-negative integer"},
		{"fractional maxLength", `{"type": "string", "maxLength": 2.5}`, "", "maxLength", "non-negative integer"},
		{"empty anyOf", `{"anyOf": []}`, "", "anyOf", "non-empty list"},
		{"zero multipleOf", `{"type": "number", "multipleOf": 0}`, "", "multipleOf", "positive number"},
		{"$ref not a string", `{"$ref": 1}`, "", "$ref", "must be a string"},
		{"properties not an object", `{"properties": []}`, "", "properties", "object of schemas"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := CheckSchema(json.RawMessage(tt.schema))
			var se *SchemaError
			if !errors.As(err, &se) {
				t.Fatalf("got %v, want a *SchemaError", err)
			}
			if se.Path != tt.path || se.Keyword != tt.keyword {
				t.Errorf("path %q keyword %q, want %q %q (%v)", se.Path, se.Keyword, tt.path, tt.keyword, err)
			}
			if !strings.Contains(se.Msg, tt.msg) {
				t.Errorf("message %q does not say %q", se.Msg, tt.msg)
			}
		})
	}
}

func TestSchemaErrorMessage(t *testing.T) {
	tests := []struct {
		err  *SchemaError
		want string
	}{
		{&SchemaError{Path: "properties.tags", Keyword: "uniqueItems", Msg: "m"}, `schema keyword "uniqueItems" at properties.tags: m`},
		{&SchemaError{Keyword: "not", Msg: "m"}, `schema keyword "not" at the schema's root: m`},
		{&SchemaError{Msg: "m"}, `schema at the schema's root: m`},
	}
	for _, tt := range tests {
		if got := tt.err.Error(); got != tt.want {
			t.Errorf("got %q, want %q", got, tt.want)
		}
	}
}

func TestAnswerSource(t *testing.T) {
	opts := `"x-guidance":{"whitespace_flexible":false,"item_separator":` + quoteJSON(answerItemSeparator) + `,"key_separator":` + quoteJSON(answerKeySeparator) + `}`
	tests := []struct {
		name, schema string
		want         Grammar
	}{
		{"no schema", ``, Grammar{KindJSONSchema, `{"type":"object",` + opts + `}`}},
		{"whitespace", " \n", Grammar{KindJSONSchema, `{"type":"object",` + opts + `}`}},
		{"key order kept", `{"type": "object", "properties": {"z": {"type": "string"}, "a": {"type": "number"}}, "required": ["z", "a"]}`,
			Grammar{KindJSONSchema, `{"type":"object","properties":{"z":{"type":"string"},"a":{"type":"number"}},"required":["z","a"],` + opts + `}`}},
		{"unknown format and uniqueItems false dropped", `{"type": "array", "uniqueItems": false, "items": {"type": "string", "format": "password", "minLength": 1}}`,
			Grammar{KindJSONSchema, `{"type":"array","items":{"type":"string","minLength":1},` + opts + `}`}},
		{"known format kept", `{"type": "string", "format": "date"}`, Grammar{KindJSONSchema, `{"type":"string","format":"date",` + opts + `}`}},
		{"an unused definition is normalized too", `{"$defs": {"d": {"format": "x"}}}`, Grammar{KindJSONSchema, `{"$defs":{"d":{}},` + opts + `}`}},
		{"data that looks like a schema is left alone", `{"const": {"format": "x"}, "default": {"uniqueItems": false}}`,
			Grammar{KindJSONSchema, `{"const":{"format":"x"},"default":{"uniqueItems":false},` + opts + `}`}},
		{"true", `true`, Grammar{KindJSONSchema, `{` + opts + `}`}},
		{"false left to llguidance", `false`, Grammar{KindJSONSchema, `false`}},
		{"the client's options kept", `{"type": "object", "x-guidance": {"whitespace_flexible": false}}`,
			Grammar{KindJSONSchema, `{"type":"object","x-guidance":{"whitespace_flexible":false}}`}},
		{"x-guidance only at the root", `{"type": "object", "properties": {"a": {"x-guidance": {}}}}`,
			Grammar{KindJSONSchema, `{"type":"object","properties":{"a":{"x-guidance":{}}},` + opts + `}`}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := Answer(json.RawMessage(tt.schema)); got != tt.want {
				t.Errorf("got %+v, want %+v", got, tt.want)
			}
		})
	}
}

func TestEmbedRebasesRefs(t *testing.T) {
	root, err := parseJSON([]byte(`{"$id": "https://example.com/s", "$schema": "https://json-schema.org/draft/2020-12/schema", "type": "object",
		"properties": {"item": {"$ref": "#/$defs/item"}, "self": {"$ref": "#"}, "plain": {"type": "string"}},
		"$defs": {"item": {"type": "object", "properties": {"next": {"$ref": "#/$defs/item"}}}}}`))
	if err != nil {
		t.Fatal(err)
	}
	props := root.get("properties")
	if got, want := embed(root, props.get("plain")).encode(), `{"type":"string"}`; got != want {
		t.Errorf("plain: got %s, want %s", got, want)
	}
	got := embed(root, props.get("item")).encode()
	want := `{"$ref":"#/$defs/dflash_root/$defs/item","$defs":{"dflash_root":{"$schema":"https://json-schema.org/draft/2020-12/schema","type":"object",` +
		`"properties":{"item":{"$ref":"#/$defs/dflash_root/$defs/item"},"self":{"$ref":"#/$defs/dflash_root"},"plain":{"type":"string"}},` +
		`"$defs":{"item":{"type":"object","properties":{"next":{"$ref":"#/$defs/dflash_root/$defs/item"}}}}}},` +
		`"$schema":"https://json-schema.org/draft/2020-12/schema"}`
	if got != want {
		t.Errorf("item:\n got %s\nwant %s", got, want)
	}
	if root.get("properties").get("self").get("$ref").str != "#" {
		t.Error("embed changed the root")
	}
}
