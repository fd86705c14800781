package structured

import (
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"testing"
)

// arg is one argument of a rendered call; args keep their order.
type arg struct {
	name  string
	value any // string, int, float64, bool, nil, []any or []arg (an object)
}

// renderJSONTools writes a call as Qwen3's chat template renders it: the arguments through
// tojson (Python's json.dumps: ", " and ": ").
func renderJSONTools(name string, args []arg) string {
	return "<tool_call>\n{\"name\": \"" + name + "\", \"arguments\": " + pyJSON(args) + "}\n</tool_call>"
}

// renderCoder writes a call as the qwen3_coder templates render it: strings as they are,
// other values as JSON.
func renderCoder(name string, args []arg) string {
	var b strings.Builder
	b.WriteString("<tool_call>\n<function=" + name + ">\n")
	for _, a := range args {
		text, ok := a.value.(string)
		if !ok {
			text = pyJSON(a.value)
		}
		b.WriteString("<parameter=" + a.name + ">\n" + text + "\n</parameter>\n")
	}
	b.WriteString("</function>\n</tool_call>")
	return b.String()
}

func pyJSON(v any) string {
	switch v := v.(type) {
	case nil:
		return "null"
	case bool:
		return strconv.FormatBool(v)
	case int:
		return strconv.Itoa(v)
	case float64:
		return strconv.FormatFloat(v, 'g', -1, 64)
	case string:
		b, _ := json.Marshal(v)
		return string(b)
	case []any:
		parts := make([]string, len(v))
		for i, e := range v {
			parts[i] = pyJSON(e)
		}
		return "[" + strings.Join(parts, ", ") + "]"
	case []arg:
		parts := make([]string, len(v))
		for i, a := range v {
			parts[i] = pyJSON(a.name) + ": " + pyJSON(a.value)
		}
		return "{" + strings.Join(parts, ", ") + "}"
	}
	panic(fmt.Sprintf("pyJSON: %T", v))
}

var weatherArgs = []arg{{"city", "Paris"}, {"days", 3}}

// The canonical renderings have the shape the server's parsers read: these literals are
// copied from server/templatetest/templates_test.go, where the chat templates render
// them and the parsers read them back as get_weather(city="Paris", days=3).
func TestRenderedCallsMatchTheServer(t *testing.T) {
	tests := []struct{ got, want string }{
		{renderCoder("get_weather", weatherArgs),
			"<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n<parameter=days>\n3\n</parameter>\n</function>\n</tool_call>"},
		{renderJSONTools("get_weather", weatherArgs),
			"<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"days\": 3}}\n</tool_call>"},
	}
	for _, tt := range tests {
		if tt.got != tt.want {
			t.Errorf("rendered %q\n     want %q", tt.got, tt.want)
		}
	}
}

func TestToolCallsErrors(t *testing.T) {
	weather := Tool{Name: "get_weather", Parameters: json.RawMessage(`{"type": "object", "properties": {"city": {"type": "string"}}}`)}
	tests := []struct {
		name     string
		format   string
		tools    []Tool
		only     string
		maxCalls int
		want     string // part of the error
	}{
		{"unknown format", "xml", []Tool{weather}, "", 0, "unknown tool-call format"},
		{"no tools", FormatJSONTools, nil, "", 0, "no tools"},
		{"negative maxCalls", FormatJSONTools, []Tool{weather}, "", -1, "negative"},
		{"unnamed tool", FormatJSONTools, []Tool{{}}, "", 0, "no name"},
		{"two tools with one name", FormatQwen3Coder, []Tool{weather, weather}, "", 0, `two tools are named "get_weather"`},
		{"only an unknown tool", FormatQwen3Coder, []Tool{weather}, "get_time", 1, `"get_time" is not among`},
		{"coder name with >", FormatQwen3Coder, []Tool{{Name: "a>b"}}, "", 0, "cannot be written in the qwen3_coder format"},
		{"coder parameter name with a newline", FormatQwen3Coder,
			[]Tool{{Name: "f", Parameters: json.RawMessage(`{"properties": {"a\nb": {"type": "string"}}}`)}}, "", 0, "cannot be written"},
		{"coder parameters as alternatives", FormatQwen3Coder,
			[]Tool{{Name: "f", Parameters: json.RawMessage(`{"anyOf": [{"properties": {"a": {}}}, {"properties": {"b": {}}}]}`)}}, "", 0, "anyOf at the top"},
		{"coder required parameter that is false", FormatQwen3Coder,
			[]Tool{{Name: "f", Parameters: json.RawMessage(`{"properties": {"a": false}, "required": ["a"]}`)}}, "", 0, `"a" is required but its schema is false`},
		{"coder string parameter with no possible value", FormatQwen3Coder,
			[]Tool{{Name: "f", Parameters: json.RawMessage(`{"properties": {"a": {"type": "string", "enum": ["x</parameter>"]}}}`)}}, "", 0, `parameter "a": no string value`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := ToolCalls(tt.format, tt.tools, tt.only, tt.maxCalls)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("got %v, want an error saying %q", err, tt.want)
			}
		})
	}
}

// A tool whose schema CheckSchema refuses is refused with the *SchemaError, named.
func TestToolCallsSchemaError(t *testing.T) {
	for _, format := range []string{FormatJSONTools, FormatQwen3Coder} {
		_, err := ToolCalls(format, []Tool{{Name: "f", Parameters: json.RawMessage(`{"properties": {"tags": {"uniqueItems": true}}}`)}}, "", 0)
		var se *SchemaError
		if !errors.As(err, &se) || se.Path != "properties.tags" || se.Keyword != "uniqueItems" {
			t.Fatalf("%s: got %v, want the uniqueItems SchemaError", format, err)
		}
		if !strings.Contains(err.Error(), `tool "f"`) {
			t.Errorf("%s: %v does not name the tool", format, err)
		}
	}
}

// The grammar's text for a small tool, so a change in the format shows in review.
func TestToolCallsSource(t *testing.T) {
	tools := []Tool{{Name: "get_weather", Parameters: json.RawMessage(
		`{"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}}, "required": ["city"]}`)}}
	g, err := ToolCalls(FormatQwen3Coder, tools, "get_weather", 1)
	if err != nil {
		t.Fatal(err)
	}
	want := `start: LEAD? call
LEAD: /\n{1,2}/
call: "<tool_call>\n<function=" body "</function>\n</tool_call>"
body: tool0
TEXT1: (/(?s:.*)/ & ~/(?s:.*)(?:<\x2Fparameter>|<parameter=|<\x2Ffunction>|<\x2Ftool_call>)(?s:.*)/) "\n</parameter>\n"
param2: "<parameter=city>\n" TEXT1
json3: %json {"x-guidance":{"whitespace_flexible":false,"item_separator":", ","key_separator":": "},"type":"integer"}
param4: "<parameter=days>\n" json3 "\n</parameter>\n"
tool0: "get_weather>\n" param2 param4?
`
	if g.Kind != KindLark || g.Source != want {
		t.Errorf("got %s grammar\n%s\nwant\n%s", g.Kind, g.Source, want)
	}
	g, err = ToolCalls(FormatJSONTools, tools, "", 0)
	if err != nil {
		t.Fatal(err)
	}
	want = `start: LEAD? call ("\n" call)*
LEAD: /\n{1,2}/
call: "<tool_call>\n" body "\n</tool_call>"
body: tool0
json1: %json {"x-guidance":{"whitespace_flexible":false,"item_separator":", ","key_separator":": "},"type":"object",` +
		`"properties":{"city":{"type":"string","pattern":` + quoteJSON(withoutWords([]string{"</tool_call>"})) + `},"days":{"type":"integer"}},"required":["city"]}
tool0: "{\"name\": \"get_weather\", \"arguments\": " json1 "}"
`
	if g.Source != want {
		t.Errorf("got\n%s\nwant\n%s", g.Source, want)
	}
}
