package server

import (
	"bytes"
	"encoding/json"
	"strings"

	"github.com/dflash-mlx/dflash-mlx/structured"
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

// toolSchemas maps a tool name to how the parser reads each of its parameters' text: the
// one reading the grammar follows too (structured.CoderParams).
type toolSchemas map[string]map[string]structured.ValueReading

func newToolSchemas(tools []Tool) toolSchemas {
	out := make(toolSchemas, len(tools))
	for _, t := range tools {
		out[t.Name] = structured.CoderParams(t.Parameters)
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
func coderArguments(inner string, params map[string]structured.ValueReading) (string, bool) {
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
		values[name] = params[name].Read(value)
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
