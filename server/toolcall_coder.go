package server

import (
	"bytes"
	"encoding/json"
	"math"
	"net/url"
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

// toolSchemas maps a tool name to what the parser knows of its parameters.
type toolSchemas map[string]toolParams

// toolParams is one tool's parameters schema, decoded (objects as map[string]any, numbers
// as json.Number): root is the whole schema, which $refs resolve against, and props the
// parameters' schemas by name, from the root's "properties" or, when the root is a $ref,
// from the object schema it leads to (as the grammar lays the parameters out).
type toolParams struct {
	root  any
	props map[string]any
}

func newToolSchemas(tools []Tool) toolSchemas {
	out := make(toolSchemas, len(tools))
	for _, t := range tools {
		var p toolParams
		if root, ok := decodeSchema(t.Parameters); ok { // a schema that is not JSON types nothing
			p.root = root
			obj, _ := root.(map[string]any)
			for seen := map[string]bool{}; ; {
				ref, isRef := obj["$ref"].(string)
				if !isRef || seen[ref] { // a cycle: no parameters
					break
				}
				seen[ref] = true
				target, _ := resolveRef(root, ref)
				obj, _ = target.(map[string]any)
			}
			p.props, _ = obj["properties"].(map[string]any) // none: a schema without properties types nothing
		}
		out[t.Name] = p
	}
	return out
}

func decodeSchema(raw json.RawMessage) (any, bool) {
	if len(bytes.TrimSpace(raw)) == 0 {
		return nil, false
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	var v any
	if dec.Decode(&v) != nil {
		return nil, false
	}
	return v, true
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
func coderArguments(inner string, params toolParams) (string, bool) {
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
		schema, declared := params.props[name]
		typ := schemaType(params.root, schema)
		if declared && typ.name == "" {
			typ.name = "untyped"
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

// paramType is how the parser reads a parameter's text (coderValue).
type paramType struct {
	// name is how the text reads:
	//   - a JSON type ("string", "integer", "number", "boolean", "object", "array",
	//     "null") or another type name as the schema writes it;
	//   - "enum": an enum of strings or of mixed kinds (members);
	//   - "text": text that is a string, "null" aside (a schema without a type whose
	//     values are strings, through $ref or the combinators);
	//   - "json": text that is JSON (values of several kinds);
	//   - "untyped": a declared parameter whose schema says nothing of its values' kinds;
	//   - "": an undeclared parameter.
	name string
	// members are the values of an "enum", as decoded.
	members []any
	// nullable: the schema names null among its values (by type, enum, const or branch),
	// so Python's None, which is how Qwen3-Coder's chat template renders a null argument,
	// reads as null.
	nullable bool
}

// schemaType is how the parser reads a parameter of the given schema (nil: undeclared) in
// a tool whose parameters schema is root. It follows the grammar (structured/coder.go,
// coderValueGrammar), so that what the grammar lets a constrained model write reads back
// as a value the schema allows:
//   - the schema's own "type" (the first non-null one of a list), else the type of its
//     first anyOf/oneOf branch typed so, else its enum: the grammar writes raw text for
//     strings and literals for the rest. An enum is read as the JSON type its members
//     share (an enum of numbers: "number"), else member by member ("enum").
//   - else the kinds of values the schema allows, through $ref (into $defs, definitions,
//     anywhere in root), allOf, anyOf/oneOf, enum and const: strings alone are raw text
//     ("text"), numbers or booleans alone their literals, other mixes JSON.
func schemaType(root, schema any) paramType {
	if schema == nil {
		return paramType{}
	}
	k := kindsOf(root, schema, map[string]int{})
	t := directType(schema)
	if t.name == "" {
		t = typeOfKinds(k)
	}
	t.nullable = k&kindNull != 0 && k != allKinds
	return t
}

// directType is the type a schema names itself (mirroring structured's parserType, which
// does not follow $ref): its "type", its first typed anyOf/oneOf branch, its enum.
func directType(schema any) paramType {
	s, ok := schema.(map[string]any)
	if !ok {
		return paramType{}
	}
	switch t := s["type"].(type) {
	case string:
		return paramType{name: strings.ToLower(t)}
	case []any:
		for _, e := range t {
			if name, ok := e.(string); ok && name != "null" {
				return paramType{name: strings.ToLower(name)}
			}
		}
	}
	for _, k := range []string{"anyOf", "oneOf"} {
		branches, _ := s[k].([]any)
		for _, b := range branches {
			if t := directType(b); t.name != "" && t.name != "null" {
				return t
			}
		}
	}
	if e, ok := s["enum"].([]any); ok && len(e) > 0 {
		return enumType(e)
	}
	return paramType{}
}

// enumType is the type of an enum: the JSON type its members share (null aside), or
// "enum" when they are strings or of mixed kinds.
func enumType(members []any) paramType {
	k := 0
	for _, m := range members {
		k |= kindOfValue(m)
	}
	switch k &^ kindNull {
	case kindNumber:
		return paramType{name: "number"}
	case kindBool:
		return paramType{name: "boolean"}
	case kindObject:
		return paramType{name: "object"}
	case kindArray:
		return paramType{name: "array"}
	}
	return paramType{name: "enum", members: members}
}

// typeOfKinds is the type of a schema without one of its own, by the kinds of values it
// allows; "" (untyped) when it allows all or none.
func typeOfKinds(k int) paramType {
	switch {
	case k == 0 || k == allKinds:
		return paramType{}
	case k&^(kindString|kindNull) == 0 && k&kindString != 0:
		return paramType{name: "text"}
	case k&^(kindNumber|kindNull) == 0 && k&kindNumber != 0:
		return paramType{name: "number"}
	case k&^(kindBool|kindNull) == 0 && k&kindBool != 0:
		return paramType{name: "boolean"}
	}
	return paramType{name: "json"}
}

// JSON kinds a schema allows, as a bit set (integers count as numbers).
const (
	kindNull = 1 << iota
	kindBool
	kindNumber
	kindString
	kindArray
	kindObject
	allKinds = kindNull | kindBool | kindNumber | kindString | kindArray | kindObject
)

func kindOfType(t string) int {
	switch t {
	case "null":
		return kindNull
	case "boolean":
		return kindBool
	case "integer", "number":
		return kindNumber
	case "string":
		return kindString
	case "array":
		return kindArray
	case "object":
		return kindObject
	}
	return 0
}

func kindOfValue(v any) int {
	switch v.(type) {
	case nil:
		return kindNull
	case bool:
		return kindBool
	case json.Number, float64:
		return kindNumber
	case string:
		return kindString
	case []any:
		return kindArray
	}
	return kindObject
}

// kindsOf is the set of JSON kinds a schema allows, following $ref (one that does not
// resolve constrains nothing) and the combinators. refs memoizes the kinds of each $ref
// target; a ref met again while its own kinds are being worked out (a cycle) counts as
// allowing everything there, so every walk ends, and in time linear in the schema.
func kindsOf(root, schema any, refs map[string]int) int {
	s, ok := schema.(map[string]any)
	if !ok {
		if b, isBool := schema.(bool); isBool && !b {
			return 0
		}
		return allKinds
	}
	k := allKinds
	switch t := s["type"].(type) {
	case string:
		k = kindOfType(strings.ToLower(t))
	case []any:
		k = 0
		for _, e := range t {
			if name, ok := e.(string); ok {
				k |= kindOfType(strings.ToLower(name))
			}
		}
	}
	if e, ok := s["enum"].([]any); ok {
		lits := 0
		for _, m := range e {
			lits |= kindOfValue(m)
		}
		k &= lits
	}
	if c, ok := s["const"]; ok {
		k &= kindOfValue(c)
	}
	if ref, ok := s["$ref"].(string); ok {
		rk, done := refs[ref]
		if !done {
			refs[ref] = allKinds // while in progress
			rk = allKinds
			if target, ok := resolveRef(root, ref); ok {
				rk = kindsOf(root, target, refs)
			}
			refs[ref] = rk
		}
		k &= rk
	}
	if all, ok := s["allOf"].([]any); ok {
		for _, b := range all {
			k &= kindsOf(root, b, refs)
		}
	}
	for _, comb := range []string{"anyOf", "oneOf"} {
		if branches, ok := s[comb].([]any); ok {
			u := 0
			for _, b := range branches {
				u |= kindsOf(root, b, refs)
			}
			k &= u
		}
	}
	return k
}

// resolveRef resolves a $ref within the parameters schema: "#" (the root), a JSON pointer
// ("#/$defs/x", "#/definitions/x"; percent-encoded, ~0 and ~1 escaped) or a "#name"
// $anchor. Other refs (other documents, $id-relative ones) are not resolved.
func resolveRef(root any, ref string) (any, bool) {
	frag, ok := strings.CutPrefix(ref, "#")
	if !ok {
		return nil, false
	}
	if frag == "" || frag == "/" {
		return root, true
	}
	if !strings.HasPrefix(frag, "/") {
		return findAnchor(root, frag)
	}
	cur := root
	for _, raw := range strings.Split(frag[1:], "/") {
		seg, err := url.PathUnescape(raw)
		if err != nil {
			return nil, false
		}
		seg = strings.ReplaceAll(strings.ReplaceAll(seg, "~1", "/"), "~0", "~")
		switch c := cur.(type) {
		case map[string]any:
			if cur, ok = c[seg]; !ok {
				return nil, false
			}
		case []any:
			i, err := strconv.Atoi(seg)
			if err != nil || i < 0 || i >= len(c) {
				return nil, false
			}
			cur = c[i]
		default:
			return nil, false
		}
	}
	return cur, true
}

// findAnchor is the schema object whose "$anchor" is name.
func findAnchor(v any, name string) (any, bool) {
	switch c := v.(type) {
	case map[string]any:
		if c["$anchor"] == name {
			return c, true
		}
		for _, e := range c {
			if s, ok := findAnchor(e, name); ok {
				return s, true
			}
		}
	case []any:
		for _, e := range c {
			if s, ok := findAnchor(e, name); ok {
				return s, true
			}
		}
	}
	return nil, false
}

// coderValue converts a parameter's text to JSON by the schema type. Text that does not
// read as the declared type stays a string: the call still reaches the client, whose own
// validation then names the bad argument, instead of being lost as plain text. Python's
// literals, which the chat template renders arguments with, read as JSON's: True and False
// (any case) for a boolean, None for null where the schema names null (for a string too:
// the template renders a null argument None, and a string as it is).
func coderValue(text string, typ paramType) json.RawMessage {
	asString := json.RawMessage(quote(text))
	trimmed := strings.TrimSpace(text)
	if strings.EqualFold(trimmed, "null") && typ.name != "string" { // a string's "null" is itself
		return json.RawMessage("null")
	}
	if typ.name == "enum" {
		for _, m := range typ.members {
			if m == text { // an enum string "None" is itself
				return asString
			}
		}
	}
	if trimmed == "None" && typ.nullable {
		return json.RawMessage("null")
	}
	switch typ.name {
	case "", "string", "text":
		return asString
	case "json": // values of several kinds: the grammar writes the schema's JSON
		if v, ok := decodeLiteral(trimmed); ok {
			var buf bytes.Buffer
			if json.Compact(&buf, []byte(trimmed)) == nil {
				return buf.Bytes()
			}
			return json.RawMessage(strconv.FormatBool(v == true)) // True, False
		}
		return asString
	case "enum":
		// Strings are themselves (above); other members are written as their JSON (or as
		// Python's True, False).
		if v, ok := decodeLiteral(trimmed); ok {
			for _, m := range typ.members {
				if _, isString := m.(string); isString || !sameValue(v, m) {
					continue
				}
				var buf bytes.Buffer
				if json.Compact(&buf, []byte(trimmed)) == nil {
					return buf.Bytes()
				}
				if b, err := json.Marshal(m); err == nil {
					return b
				}
			}
		}
		return asString
	case "untyped":
		// A declared parameter without a type: an object or array written as JSON is taken
		// as one, anything else stays text.
		if k := jsonKind(json.RawMessage(trimmed)); (k == "object" || k == "array") && json.Valid([]byte(trimmed)) {
			var buf bytes.Buffer
			if json.Compact(&buf, []byte(trimmed)) == nil {
				return buf.Bytes()
			}
		}
		return asString
	case "integer":
		if v, err := strconv.ParseInt(trimmed, 10, 64); err == nil {
			return json.RawMessage(strconv.FormatInt(v, 10))
		}
		if f, err := strconv.ParseFloat(trimmed, 64); err == nil && f == math.Trunc(f) && math.Abs(f) < 1<<53 {
			return json.RawMessage(strconv.FormatInt(int64(f), 10))
		}
		return asString
	case "number":
		if f, err := strconv.ParseFloat(trimmed, 64); err == nil && !math.IsInf(f, 0) && !math.IsNaN(f) {
			if f == math.Trunc(f) && math.Abs(f) < 1<<53 {
				return json.RawMessage(strconv.FormatInt(int64(f), 10))
			}
			return json.RawMessage(strconv.FormatFloat(f, 'g', -1, 64))
		}
		return asString
	case "boolean":
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

// decodeLiteral reads text as a JSON value, or as Python's True or False.
func decodeLiteral(text string) (any, bool) {
	switch text {
	case "True":
		return true, true
	case "False":
		return false, true
	}
	dec := json.NewDecoder(strings.NewReader(text))
	dec.UseNumber()
	var v any
	if dec.Decode(&v) != nil || dec.More() {
		return nil, false
	}
	return v, true
}

// sameValue reports whether two decoded JSON values are equal, numbers by value.
func sameValue(a, b any) bool {
	switch x := a.(type) {
	case json.Number:
		y, ok := b.(json.Number)
		if !ok {
			return false
		}
		if x == y {
			return true
		}
		fx, errx := x.Float64()
		fy, erry := y.Float64()
		return errx == nil && erry == nil && fx == fy
	case []any:
		y, ok := b.([]any)
		if !ok || len(x) != len(y) {
			return false
		}
		for i := range x {
			if !sameValue(x[i], y[i]) {
				return false
			}
		}
		return true
	case map[string]any:
		y, ok := b.(map[string]any)
		if !ok || len(x) != len(y) {
			return false
		}
		for k, v := range x {
			w, ok := y[k]
			if !ok || !sameValue(v, w) {
				return false
			}
		}
		return true
	}
	return a == b
}
