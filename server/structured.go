package server

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/dflash-mlx/dflash-mlx/structured"
)

// Constraint is a grammar the answer must follow (GenerateRequest.Constraint), of one of
// llguidance's kinds: "json_schema" (Source a JSON Schema), "json_object" (any JSON
// object), "lark" (a Lark grammar, which may inline schemas), "regex".
type Constraint struct {
	Kind, Source string
}

// ConstraintBackend is an optional Backend method: a backend with it enforces constraints
// token by token. Without it, structured outputs are refused and a forced tool call is
// only started by the answer prefix (toolCallPrefix).
type ConstraintBackend interface {
	// CheckConstraint reports why c cannot constrain this model's answers (a grammar the
	// engine refuses or one that allows no answer: the client's mistake), nil when it can.
	CheckConstraint(c Constraint) error
}

// answerFormat is a structured output a client asked for: the answer is JSON, any object
// when Schema is nil, else valid for Schema.
type answerFormat struct {
	// Param is the request field the format came from, for errors; Type its type.
	Param, Type string
	Name        string
	Schema      json.RawMessage
	// Strict is the client's strict flag. The schema is enforced either way (an answer
	// valid for it is never wrong); strict only says the client relies on it.
	Strict bool
}

// unsupported is the 400 for f from a backend that cannot constrain its answers.
func (f *answerFormat) unsupported() *apiError {
	return unsupported(f.Param, f.Param+" type "+quote(f.Type)+" is not supported by this backend: it cannot constrain its answers; send {\"type\": \"text\"}")
}

// decodeFormat reads an output format object: {"type": "text"} (nil), {"type":
// "json_object"}, or {"type": "json_schema", …} with the schema's fields inside a
// "json_schema" object (chat completions) or beside the type (nested false: the
// Responses API's text.format, Anthropic's output_config.format).
func decodeFormat(format jsonObject, nested bool) (*answerFormat, error) {
	field := format.path
	typ, ok, err := format.string("type")
	if err != nil {
		return nil, err
	}
	if !ok {
		return nil, invalidField(format.child("type"), "%s is required: \"text\", \"json_object\" or \"json_schema\"", format.child("type"))
	}
	switch typ {
	case "text":
		return nil, nil
	case "json_object":
		return &answerFormat{Param: field, Type: typ}, nil
	case "json_schema":
	default:
		return nil, invalidField(format.child("type"), "%s must be \"text\", \"json_object\" or \"json_schema\", got %s", format.child("type"), quote(typ))
	}
	spec := format
	if nested {
		if spec, ok, err = format.object("json_schema"); err != nil {
			return nil, err
		} else if !ok {
			return nil, invalidField(format.child("json_schema"), "%s is required when the type is \"json_schema\"", format.child("json_schema"))
		}
	}
	f := &answerFormat{Param: field, Type: typ}
	if f.Name, _, err = spec.string("name"); err != nil {
		return nil, err
	}
	if _, _, err = spec.string("description"); err != nil {
		return nil, err
	}
	if f.Strict, _, err = spec.boolean("strict"); err != nil {
		return nil, err
	}
	raw, ok := spec.lookup("schema")
	if !ok || bytes.Equal(bytes.TrimSpace(raw), []byte("null")) {
		return nil, invalidField(spec.child("schema"), "%s is required when the type is \"json_schema\": the JSON Schema the answer must follow", spec.child("schema"))
	}
	f.Schema = append(json.RawMessage(nil), bytes.TrimSpace(raw)...)
	if err := checkSchema(f.Schema, spec.child("schema")); err != nil {
		return nil, err
	}
	return f, nil
}

// checkSchema refuses a schema the engine cannot enforce with a 400 that names the
// keyword and where it is (param: the field holding the schema).
func checkSchema(schema json.RawMessage, param string) error {
	err := structured.CheckSchema(schema)
	var se *structured.SchemaError
	switch {
	case err == nil:
		return nil
	case errors.As(err, &se):
		at := param
		if se.Path != "" {
			at = param + "." + se.Path
		}
		if se.Keyword != "" && se.Keyword != "$ref" {
			return unsupported(at, fmt.Sprintf("%s: %s", at, se.Msg))
		}
		return invalidField(at, "%s: %s", at, se.Msg)
	default:
		return invalidField(param, "%s: %v", param, err)
	}
}

// constrains reports whether the backend enforces constraints.
func (s *Server) constrains() bool {
	_, ok := s.backend.(ConstraintBackend)
	return ok
}

// answerConstraint is the constraint of a JSON answer format, checked by the backend; nil
// format: none. A backend that cannot enforce one refuses the format.
func (s *Server) answerConstraint(f *answerFormat) (*Constraint, error) {
	if f == nil {
		return nil, nil
	}
	if !s.constrains() {
		return nil, f.unsupported()
	}
	g := structured.Answer(f.Schema)
	return s.checkConstraint(Constraint{Kind: g.Kind, Source: g.Source}, f.Param)
}

// toolConstraint is the constraint of an answer made only of calls of the tools (of the
// named one when only is set; at most one call when single), in the model's own format;
// with answer set, of an answer that is either JSON in that format or such calls (tools
// offered with tool_choice "auto" and a JSON format asked for). Nil when the backend
// cannot enforce constraints (the answer prefix then starts a forced call).
func (s *Server) toolConstraint(format ToolCallFormat, tools []Tool, only string, single bool, param string, answer *answerFormat) (*Constraint, error) {
	if !s.constrains() {
		if answer != nil {
			return nil, answer.unsupported()
		}
		return nil, nil
	}
	st := make([]structured.Tool, 0, len(tools))
	for _, t := range tools {
		if only != "" && t.Name != only {
			continue
		}
		if t.Parameters != nil {
			if err := checkSchema(t.Parameters, t.SchemaParam); err != nil {
				return nil, err
			}
		}
		st = append(st, structured.Tool{Name: t.Name, Parameters: t.Parameters})
	}
	maxCalls := 0
	if single {
		maxCalls = 1
	}
	var g structured.Grammar
	var err error
	if answer != nil {
		param = answer.Param
		g, err = structured.AnswerOrToolCalls(answer.Schema, string(format), st, maxCalls)
	} else {
		g, err = structured.ToolCalls(string(format), st, only, maxCalls)
	}
	if err != nil {
		return nil, invalidField(param, "%s: %v", param, err)
	}
	return s.checkConstraint(Constraint{Kind: g.Kind, Source: g.Source}, param)
}

// checkConstraint asks the backend whether it can enforce c; its refusal is the client's
// 400 on param.
func (s *Server) checkConstraint(c Constraint, param string) (*Constraint, error) {
	if err := s.backend.(ConstraintBackend).CheckConstraint(c); err != nil {
		return nil, invalidField(param, "%s: %v", param, err)
	}
	return &c, nil
}
