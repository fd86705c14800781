package structured

import (
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
)

// Markup of the tool-call formats, as Qwen's chat templates render calls and the server's
// parsers (server/toolcall.go, server/toolcall_coder.go, server/chat_output.go) read them.
const (
	callOpen       = "<tool_call>\n"
	callClose      = "\n</tool_call>"
	callSeparator  = "\n" // between two calls, as the templates join an answer's calls
	functionOpen   = "<function="
	functionClose  = "</function>"
	parameterOpen  = "<parameter="
	parameterClose = "</parameter>"
	// valueClose ends a qwen3_coder parameter: the value sits on lines of its own.
	valueClose = "\n" + parameterClose + "\n"
)

// coderMarkers cannot appear in a qwen3_coder parameter value written as raw text: the
// parser ends the value at the first </parameter> (or at a <parameter= before it), the
// function at the first </function> and the block at the first </tool_call>.
var coderMarkers = []string{parameterClose, parameterOpen, functionClose, "</tool_call>"}

// ToolCalls is the grammar of an answer made only of tool calls, in the model's format:
//
//	json_tools (Qwen3), each call:
//	  <tool_call>\n{"name": "NAME", "arguments": ARGS}\n</tool_call>
//	  ARGS: JSON of the tool's parameters schema (any object when it has none), written
//	  with ", " and ": " and no other whitespace, as the chat template's tojson renders it.
//	qwen3_coder (Qwen3-Coder, Qwen3.5 and later), each call:
//	  <tool_call>\n<function=NAME>\n
//	  <parameter=P>\nVALUE\n</parameter>\n   (per parameter)
//	  </function>\n</tool_call>
//	  Parameters come in the order the schema's "properties" lists them (the order the
//	  template renders arguments in); required ones must appear, optional ones may be left
//	  out, and only declared ones are allowed (any, with raw text values, when the schema
//	  declares no properties and does not forbid additional ones). VALUE follows the
//	  parameter's schema as the server's parser reads it (see ValueReading).
//
// Calls are separated by "\n"; before the first, one or two newlines may come (the
// answer may start right after </think>). After the last call the grammar ends, so the
// engine stops the generation. only = "" allows any of the tools, else exactly that one
// (an error if it is not among them). maxCalls = 1 allows exactly one call, 0 one or more,
// n > 1 one to n.
//
// Each tool's parameters must pass CheckSchema; its *SchemaError is returned wrapped with
// the tool's name.
func ToolCalls(format string, tools []Tool, only string, maxCalls int) (Grammar, error) {
	return toolCalls(format, tools, only, maxCalls, "")
}

// AnswerOrToolCalls is the grammar of an answer that is either JSON valid for schema (as
// Answer's: one line) or calls of the tools (as ToolCalls' with only empty): a request
// that offers tools with tool_choice "auto" and also asks for a JSON answer, where the
// model chooses which to give.
func AnswerOrToolCalls(schema json.RawMessage, format string, tools []Tool, maxCalls int) (Grammar, error) {
	return toolCalls(format, tools, "", maxCalls, Answer(schema).Source)
}

// toolCalls is ToolCalls, or with answer (a JSON schema document) AnswerOrToolCalls.
func toolCalls(format string, tools []Tool, only string, maxCalls int, answer string) (Grammar, error) {
	if format != FormatJSONTools && format != FormatQwen3Coder {
		return Grammar{}, fmt.Errorf("unknown tool-call format %q (want %q or %q)", format, FormatJSONTools, FormatQwen3Coder)
	}
	if maxCalls < 0 {
		return Grammar{}, fmt.Errorf("maxCalls %d is negative", maxCalls)
	}
	if len(tools) == 0 {
		return Grammar{}, errors.New("no tools to call")
	}
	seen := map[string]bool{}
	for _, t := range tools {
		if t.Name == "" {
			return Grammar{}, errors.New("a tool has no name")
		}
		if seen[t.Name] {
			return Grammar{}, fmt.Errorf("two tools are named %q", t.Name)
		}
		seen[t.Name] = true
	}
	if only != "" {
		if !seen[only] {
			return Grammar{}, fmt.Errorf("tool %q is not among the request's tools", only)
		}
		for _, t := range tools {
			if t.Name == only {
				tools = []Tool{t}
				break
			}
		}
	}

	g := &larkWriter{}
	bodies := make([]string, len(tools))
	for i, t := range tools {
		root, err := toolSchema(t)
		if err != nil {
			return Grammar{}, err
		}
		if format == FormatJSONTools {
			bodies[i], err = g.jsonToolsCall(i, t.Name, root)
		} else {
			bodies[i], err = g.coderCall(i, t.Name, root)
		}
		if err != nil {
			return Grammar{}, fmt.Errorf("tool %q: %w", t.Name, err)
		}
	}

	var call string
	if format == FormatJSONTools {
		call = larkString(callOpen) + " body " + larkString(callClose)
	} else {
		call = larkString(callOpen+functionOpen) + " body " + larkString(functionClose+callClose)
	}
	calls := "call"
	switch {
	case maxCalls == 0:
		calls += " (" + larkString(callSeparator) + " call)*"
	case maxCalls > 1:
		calls += " (" + larkString(callSeparator) + " call){0," + strconv.Itoa(maxCalls-1) + "}"
	}
	var src strings.Builder
	if answer != "" {
		src.WriteString("start: answer | LEAD? " + calls + "\n")
		src.WriteString("answer: %json " + answer + "\n")
	} else {
		src.WriteString("start: LEAD? " + calls + "\n")
	}
	src.WriteString("LEAD: /\\n{1,2}/\n")
	src.WriteString("call: " + call + "\n")
	src.WriteString("body: " + strings.Join(bodies, " | ") + "\n")
	src.WriteString(g.String())
	return Lark(src.String()), nil
}

// toolSchema reads and checks a tool's parameters schema; nil for none.
func toolSchema(t Tool) (*value, error) {
	if len(strings.TrimSpace(string(t.Parameters))) == 0 {
		return nil, nil
	}
	if err := CheckSchema(t.Parameters); err != nil {
		return nil, fmt.Errorf("tool %q parameters: %w", t.Name, err)
	}
	root, err := parseJSON(t.Parameters)
	if err != nil {
		return nil, fmt.Errorf("tool %q parameters: %w", t.Name, err)
	}
	normalize(root)
	return root, nil
}

// larkWriter collects the rules and tokens of a generated grammar under fresh names.
type larkWriter struct {
	lines       []string
	n           int
	hasFreeName bool // the FREE_NAME token is written
}

func (w *larkWriter) name(prefix string) string {
	w.n++
	return prefix + strconv.Itoa(w.n)
}

// rule adds "name: body" (lower-case name: a rule; upper-case: a token).
func (w *larkWriter) rule(name, body string) { w.lines = append(w.lines, name+": "+body) }

func (w *larkWriter) String() string { return strings.Join(w.lines, "\n") + "\n" }

// jsonDoc adds a rule holding a %json document whose strings cannot contain the words,
// and returns its name.
func (w *larkWriter) jsonDoc(doc *value, words []string) string {
	doc = withOptions(doc, toolJSONOptions())
	protectStrings(doc, words)
	r := w.name("json")
	w.rule(r, "%json "+doc.encode())
	return r
}

// jsonToolsCall adds a json_tools call of one tool and returns its body's rule name:
// {"name": "NAME", "arguments": ARGS}.
func (w *larkWriter) jsonToolsCall(i int, name string, root *value) (string, error) {
	args := root
	switch {
	case args == nil:
		args = objValue("type", strValue("object"))
	case args.isObject() && args.get("type") == nil:
		// The arguments must be an object for the parser (server/toolcall.go) to take them.
		args = args.clone()
		args.set("type", strValue("object"))
	case !args.isObject(): // true
		args = objValue("type", strValue("object"))
	}
	body := "tool" + strconv.Itoa(i)
	w.rule(body, larkString(`{"name": `+quoteJSON(name)+`, "arguments": `)+" "+w.jsonDoc(args, []string{"</tool_call>"})+" "+larkString("}"))
	return body, nil
}
