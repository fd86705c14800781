package server

import (
	"bytes"
	"encoding/json"
	"math"
	"strconv"
	"strings"
)

// The qwen3_coder tool-call body:
//
//	<function=get_weather>
//	<parameter=city>
//	Paris
//	</parameter>
//	<parameter=days>
//	3
//	</parameter>
//	</function>
//
// Values are bare text. The model learned to write each one as its JSON value would read
// without quotes, so the tool's JSON Schema decides how the text becomes a JSON value:
// "3" is the number 3 for an integer parameter and the string "3" for a string one.
const (
	coderFunctionOpen   = "<function="
	coderFunctionClose  = "</function>"
	coderParameterOpen  = "<parameter="
	coderParameterClose = "</parameter>"
)

// toolSchemas maps a tool name to its parameters' schemas by parameter name.
type toolSchemas map[string]map[string]json.RawMessage

func newToolSchemas(tools []Tool) toolSchemas {
	out := make(toolSchemas, len(tools))
	for _, t := range tools {
		var params struct {
			Properties map[string]json.RawMessage `json:"properties"`
		}
		if len(t.Parameters) > 0 {
			_ = json.Unmarshal(t.Parameters, &params) // a schema without properties types nothing
		}
		out[t.Name] = params.Properties
	}
	return out
}

// parseCoderToolCall reads the functions of one <tool_call> block. It is lenient where the
// model is sloppy in ways that leave the meaning clear (a missing </parameter> before the
// next parameter, a missing </function> at the end), and refuses a block with no function
// or with text outside the tags, which the caller then keeps as answer text.
func parseCoderToolCall(body string, schemas toolSchemas) ([]parsedCall, bool) {
	rest := strings.TrimSpace(body)
	var calls []parsedCall
	for rest != "" {
		if !strings.HasPrefix(rest, coderFunctionOpen) {
			return nil, false
		}
		rest = rest[len(coderFunctionOpen):]
		end := strings.IndexByte(rest, '>')
		if end < 0 {
			return nil, false
		}
		name := strings.TrimSpace(rest[:end])
		if name == "" {
			return nil, false
		}
		rest = rest[end+1:]
		inner := rest
		if close := strings.Index(rest, coderFunctionClose); close >= 0 {
			inner, rest = rest[:close], rest[close+len(coderFunctionClose):]
		} else {
			rest = ""
		}
		args, ok := coderArguments(inner, schemas[name])
		if !ok {
			return nil, false
		}
		calls = append(calls, parsedCall{Name: name, Arguments: args})
		rest = strings.TrimSpace(rest)
	}
	return calls, len(calls) > 0
}

// coderArguments turns the <parameter=...> elements of one function into the JSON text of
// the arguments object, compact as the JSON form's arguments are, keys in the order written
// (a repeated key keeps its last value).
func coderArguments(inner string, props map[string]json.RawMessage) (string, bool) {
	var names []string
	values := map[string]json.RawMessage{}
	rest := strings.TrimSpace(inner)
	for rest != "" {
		if !strings.HasPrefix(rest, coderParameterOpen) {
			return "", false
		}
		rest = rest[len(coderParameterOpen):]
		end := strings.IndexByte(rest, '>')
		if end < 0 {
			return "", false
		}
		name := strings.TrimSpace(rest[:end])
		if name == "" {
			return "", false
		}
		rest = rest[end+1:]
		value := rest
		switch close, next := strings.Index(rest, coderParameterClose), strings.Index(rest, coderParameterOpen); {
		case close >= 0 && (next < 0 || close < next):
			value, rest = rest[:close], rest[close+len(coderParameterClose):]
		case next >= 0:
			value, rest = rest[:next], rest[next:]
		default:
			rest = ""
		}
		// The format puts the value on its own lines: one newline after the opening tag and
		// one before the closing tag belong to the markup, not to the value.
		value = strings.TrimPrefix(value, "\n")
		value = strings.TrimSuffix(value, "\n")
		if _, seen := values[name]; !seen {
			names = append(names, name)
		}
		typ := schemaType(props[name])
		if _, declared := props[name]; declared && typ == "" {
			typ = "untyped"
		}
		values[name] = coderValue(value, typ)
		rest = strings.TrimSpace(rest)
	}
	var b bytes.Buffer
	b.WriteByte('{')
	for i, name := range names {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(quote(name))
		b.WriteByte(':')
		b.Write(values[name])
	}
	b.WriteByte('}')
	return b.String(), true
}

// schemaType is the JSON type a parameter's schema declares: its "type", the first non-null
// entry of a type list, or the first typed branch of anyOf/oneOf. "" when none is declared.
func schemaType(schema json.RawMessage) string {
	if len(schema) == 0 {
		return ""
	}
	var s struct {
		Type  json.RawMessage   `json:"type"`
		AnyOf []json.RawMessage `json:"anyOf"`
		OneOf []json.RawMessage `json:"oneOf"`
		Enum  []json.RawMessage `json:"enum"`
	}
	if json.Unmarshal(schema, &s) != nil {
		return ""
	}
	switch jsonKind(s.Type) {
	case "string":
		var t string
		_ = json.Unmarshal(s.Type, &t)
		return strings.ToLower(t)
	case "array":
		var ts []string
		_ = json.Unmarshal(s.Type, &ts)
		for _, t := range ts {
			if t != "null" {
				return strings.ToLower(t)
			}
		}
	}
	for _, branch := range append(s.AnyOf, s.OneOf...) {
		if t := schemaType(branch); t != "" && t != "null" {
			return t
		}
	}
	if len(s.Enum) > 0 {
		return "enum"
	}
	return ""
}

// coderValue converts a parameter's text to JSON by the schema type. Text that does not
// read as the declared type stays a string: the call still reaches the client, whose own
// validation then names the bad argument, instead of being lost as plain text.
func coderValue(text, typ string) json.RawMessage {
	asString := json.RawMessage(quote(text))
	trimmed := strings.TrimSpace(text)
	if strings.EqualFold(trimmed, "null") && typ != "string" {
		return json.RawMessage("null")
	}
	switch {
	case typ == "" || typ == "string" || typ == "enum":
		return asString
	case typ == "untyped":
		// A declared parameter without a type: an object or array written as JSON is taken
		// as one, anything else stays text.
		if k := jsonKind(json.RawMessage(trimmed)); (k == "object" || k == "array") && json.Valid([]byte(trimmed)) {
			var buf bytes.Buffer
			if json.Compact(&buf, []byte(trimmed)) == nil {
				return buf.Bytes()
			}
		}
		return asString
	case typ == "integer":
		if v, err := strconv.ParseInt(trimmed, 10, 64); err == nil {
			return json.RawMessage(strconv.FormatInt(v, 10))
		}
		if f, err := strconv.ParseFloat(trimmed, 64); err == nil && f == math.Trunc(f) && math.Abs(f) < 1<<53 {
			return json.RawMessage(strconv.FormatInt(int64(f), 10))
		}
		return asString
	case typ == "number":
		if f, err := strconv.ParseFloat(trimmed, 64); err == nil && !math.IsInf(f, 0) && !math.IsNaN(f) {
			if f == math.Trunc(f) && math.Abs(f) < 1<<53 {
				return json.RawMessage(strconv.FormatInt(int64(f), 10))
			}
			return json.RawMessage(strconv.FormatFloat(f, 'g', -1, 64))
		}
		return asString
	case typ == "boolean":
		switch strings.ToLower(trimmed) {
		case "true":
			return json.RawMessage("true")
		case "false":
			return json.RawMessage("false")
		}
		return asString
	default: // object, array: the model writes them as JSON
		if json.Valid([]byte(trimmed)) {
			var buf bytes.Buffer
			if json.Compact(&buf, []byte(trimmed)) == nil {
				return buf.Bytes()
			}
		}
		return asString
	}
}
