package server

import "strings"

// ToolCallFormat is how a model writes tool calls between <tool_call> and </tool_call>.
type ToolCallFormat string

const (
	// ToolCallJSON is Qwen3's form: a JSON object {"name": ..., "arguments": {...}}.
	ToolCallJSON ToolCallFormat = "json_tools"
	// ToolCallQwen3Coder is the XML form of Qwen3-Coder and Qwen3.5 and later:
	// <function=NAME> then <parameter=P>value</parameter> per argument, then </function>.
	// Values are bare text; their JSON types come from the tool's schema.
	ToolCallQwen3Coder ToolCallFormat = "qwen3_coder"
)

// ToolCallFormatter is an optional Backend method: the tool-call format of the model's chat
// template. A Backend without it is taken to use ToolCallJSON.
type ToolCallFormatter interface {
	ToolCallFormat() ToolCallFormat
}

// DetectToolCallFormat picks the tool-call format a chat template teaches its model, from the
// template's source: a template that shows tool calls as <function=...> inside <tool_call>
// (in its instructions or in how it renders earlier calls) uses the XML form; any other uses
// the JSON form. The test is on the source text, not on a rendering, because the marker
// appears whether or not a conversation has tools, and the newline between the two tags may
// be written as a Jinja escape ("\n") or as a real line break.
func DetectToolCallFormat(template string) ToolCallFormat {
	if strings.Contains(template, toolCallOpen) && strings.Contains(template, "<function=") {
		return ToolCallQwen3Coder
	}
	return ToolCallJSON
}

// toolCallFormat is the backend's format, ToolCallJSON when it does not say.
func (s *Server) toolCallFormat() ToolCallFormat {
	if f, ok := s.backend.(ToolCallFormatter); ok && f.ToolCallFormat() == ToolCallQwen3Coder {
		return ToolCallQwen3Coder
	}
	return ToolCallJSON
}

// toolCallPrefix is the answer prefix that makes the model call a tool: any tool for
// tool_choice "required", the named one for a function choice. Both formats put the name
// first, so writing it into the prefix fixes the function without constrained decoding.
func toolCallPrefix(format ToolCallFormat, choice toolChoice) string {
	switch choice.Mode {
	case "required":
		return toolCallOpen + "\n"
	case "function":
		if format == ToolCallQwen3Coder {
			return toolCallOpen + "\n" + coderFunctionOpen + choice.Function + ">\n"
		}
		return toolCallOpen + "\n{\"name\": " + quote(choice.Function) + ", \"arguments\": "
	}
	return ""
}

// toolCallParser returns the parser of one <tool_call> block's body in format, with the
// request's tools for the XML form's value types.
func toolCallParser(format ToolCallFormat, tools []Tool) func(body string) ([]parsedCall, bool) {
	if format == ToolCallQwen3Coder {
		schemas := newToolSchemas(tools)
		return func(body string) ([]parsedCall, bool) { return parseCoderToolCall(body, schemas) }
	}
	return func(body string) ([]parsedCall, bool) {
		name, args, ok := parseToolCallBody(body)
		if !ok {
			return nil, false
		}
		return []parsedCall{{Name: name, Arguments: args}}, true
	}
}

// parsedCall is one function call read from a <tool_call> block.
type parsedCall struct {
	Name      string
	Arguments string // JSON text of an object
}
