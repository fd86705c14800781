package structured

import (
	"bytes"
	"encoding/json"
	"math"
	"strconv"
	"strings"
)

// The qwen3_coder format writes each argument as bare text, and the parameter's schema
// decides how the text reads as JSON: "3" is the number 3 for an integer parameter and the
// string "3" for a string one. This file makes that decision once, for both sides: the
// grammar (coder.go) lets a constrained model write the texts that read as values the
// schema allows, and the server's parser (server/toolcall_coder.go) reads what a model
// wrote with ValueReading.Read.

// ValueReading is how the text of a qwen3_coder parameter value is read back as JSON.
type ValueReading struct {
	// Kind is how the text reads (a literal with spaces around it too; a string keeps
	// them):
	//   - "string": the text is the string, exactly, "null" included (the schema's own
	//     type is string);
	//   - "text": the text is the string, but "null" in any case is null (a schema without
	//     a type of its own that allows only strings, and maybe null);
	//   - "integer", "number": a number literal (an integer may be written 3.0); "null" is
	//     null;
	//   - "boolean": true or false in any case (Python's True and False, as the chat
	//     template renders them); "null" is null;
	//   - "enum": a member of the schema's own enum (it has no type): a string member as it
	//     is, another as its JSON (or True, False); "null" is null;
	//   - "json": JSON, or Python's True and False; other text is a string (objects,
	//     arrays, null, names that are no JSON type, and values of several kinds);
	//   - "untyped": a declared parameter whose schema says nothing of its values' kinds (or
	//     allows none): a JSON object or array as one, "null" as null, the rest a string;
	//   - "": an undeclared parameter: "null" is null, the rest a string.
	// Text that does not read as its kind says stays a string: the call still reaches the
	// client, whose own validation then names the bad argument.
	Kind string
	// Nullable: the schema allows null besides values of other kinds, so Python's None,
	// which is how the chat template renders a null argument, reads as null (but for an enum
	// with the string member "None").
	Nullable bool

	kinds   int      // the JSON kinds the schema allows (kindsOf)
	members []*value // Kind "enum": the enum's members of those kinds
}

// Reading kinds (ValueReading.Kind).
const (
	readString  = "string"
	readText    = "text"
	readInteger = "integer"
	readNumber  = "number"
	readBoolean = "boolean"
	readEnum    = "enum"
	readJSON    = "json"
	readUntyped = "untyped"
)

// CoderParams is how the qwen3_coder format reads each parameter of a tool whose
// parameters schema is parameters, by name: the parameters its grammar lays out, those the
// schema declares in "properties" (of the root or of the object schema the root's $ref
// leads to) and required ones it does not declare (valued by "additionalProperties"). A
// name not in the map reads as the zero ValueReading (Kind ""). A schema that is not JSON,
// not an object, or whose root $refs do not lead to a schema declares nothing (nil).
//
// Unlike ToolCalls, it does not check the schema: a request without a grammar still has
// its calls read by it. Alternatives at the top (anyOf, oneOf, allOf beside "properties"),
// which the grammar refuses, are passed over.
func CoderParams(parameters json.RawMessage) map[string]ValueReading {
	if len(bytes.TrimSpace(parameters)) == 0 {
		return nil
	}
	root, err := parseJSON(parameters)
	if err != nil {
		return nil
	}
	r := newSchemaRefs(root)
	obj, _, err := r.top()
	if err != nil {
		return nil
	}
	params := r.params(obj)
	if len(params) == 0 {
		return nil
	}
	out := make(map[string]ValueReading, len(params))
	for _, p := range params {
		out[p.name] = p.reading
	}
	return out
}

// coderParameter is one parameter the qwen3_coder grammar lays out.
type coderParameter struct {
	name     string
	schema   *value
	required bool
	reading  ValueReading
}

// schemaRefs is a tool's parameters schema with its $refs resolved once, and the work on
// each $ref target kept: the kinds it allows and its strings.
type schemaRefs struct {
	root  *value
	c     *checker
	kinds map[*value]int
	strs  map[*value]strAlts
}

type strAlts struct {
	alts []strAlt
	err  error
}

func newSchemaRefs(root *value) *schemaRefs {
	return &schemaRefs{root: root, c: newChecker(root), kinds: map[*value]int{}, strs: map[*value]strAlts{}}
}

// resolve is the schema a $ref leads to within the document ("#", a JSON pointer or a
// "#name" $anchor).
func (r *schemaRefs) resolve(ref string) (*value, error) {
	target, _, err := r.c.resolve(ref)
	return target, err
}

// top is the object schema that lists a tool's parameters: the root, or what its $ref
// leads to (an empty object when that is no object: any parameters). alt names an anyOf,
// oneOf or allOf on the way, which the grammar cannot lay out; err says the refs go round
// in a circle or do not resolve.
func (r *schemaRefs) top() (obj *value, alt string, err error) {
	s := r.root
	seen := map[*value]bool{}
	for {
		if !s.isObject() {
			return &value{kind: kObject}, alt, nil
		}
		for _, k := range []string{"anyOf", "oneOf", "allOf"} {
			if alt == "" && s.get(k) != nil {
				alt = k
			}
		}
		ref := s.get("$ref")
		if ref == nil {
			return s, alt, nil
		}
		if seen[s] {
			return nil, alt, errRefCycle
		}
		seen[s] = true
		if s, err = r.resolve(ref.str); err != nil {
			return nil, alt, err
		}
	}
}

var errRefCycle = &SchemaError{Keyword: "$ref", Msg: "the parameters schema's $refs go round in a circle"}

// params lists the parameters of the object schema obj in the order the grammar writes
// them: those "properties" declares, in its order, then required ones it does not declare,
// valued by "additionalProperties".
func (r *schemaRefs) params(obj *value) []coderParameter {
	required := map[string]bool{}
	var reqNames []string
	if req := obj.get("required"); req != nil {
		for _, n := range req.vals {
			if n.kind == kString {
				required[n.str] = true
				reqNames = append(reqNames, n.str)
			}
		}
	}
	var out []coderParameter
	declared := map[string]bool{}
	if props := obj.get("properties"); props.isObject() {
		for j, name := range props.keys {
			out = append(out, coderParameter{name: name, schema: props.vals[j], required: required[name]})
			declared[name] = true
		}
	}
	for _, name := range reqNames {
		if !declared[name] {
			declared[name] = true
			s := obj.get("additionalProperties")
			if s == nil {
				s = &value{kind: kBool, truth: true}
			}
			out = append(out, coderParameter{name: name, schema: s, required: true})
		}
	}
	for i := range out {
		out[i].reading = r.reading(out[i].schema)
	}
	return out
}

// reading is how a parameter of schema s reads: by the schema's own type (ownType) where
// the values it allows are all of that type (null aside), else by its own enum, else by the
// kinds of values it allows, through $ref and the combinators.
func (r *schemaRefs) reading(s *value) ValueReading {
	k := r.kindsOf(s)
	rd := ValueReading{Kind: ownType(s), Nullable: k&kindNull != 0 && k != allKinds, kinds: k}
	switch {
	case rd.Kind == readEnum:
		for _, m := range s.get("enum").vals {
			if kindOfValue(m)&k != 0 {
				rd.members = append(rd.members, m)
			}
		}
	case rd.Kind != "" && k&^kindNull&^kindOfType(rd.Kind) == 0:
		switch rd.Kind {
		case readString, readInteger, readNumber, readBoolean:
		default: // object, array, null and names that are no JSON type
			rd.Kind = readJSON
		}
	default:
		rd.Kind = kindsReading(k)
	}
	return rd
}

// ownType is the type a schema names itself: its "type" (the first non-null one of a
// list), else the type of its first anyOf or oneOf branch with one of its own (a branch's
// enum is not its type), else "enum" when it has an enum; "" when none. $refs are not
// followed: what they lead to counts through the kinds.
func ownType(s *value) string {
	if !s.isObject() {
		return ""
	}
	if t := s.get("type"); t != nil {
		switch t.kind {
		case kString:
			return strings.ToLower(t.str)
		case kArray:
			for _, e := range t.vals {
				if e.kind == kString && e.str != "null" {
					return strings.ToLower(e.str)
				}
			}
		}
	}
	for _, k := range []string{"anyOf", "oneOf"} {
		if branches := s.get(k); branches != nil {
			for _, b := range branches.vals {
				if t := ownType(b); t != "" && t != "null" && t != readEnum {
					return t
				}
			}
		}
	}
	if e := s.get("enum"); e != nil && e.kind == kArray && len(e.vals) > 0 {
		return readEnum
	}
	return ""
}

// kindsReading is the reading of a schema without a type of its own that covers its
// values, by the kinds of values it allows.
func kindsReading(k int) string {
	switch {
	case k == 0 || k == allKinds:
		return readUntyped
	case k&^(kindString|kindNull) == 0 && k&kindString != 0:
		return readText
	case k&^(kindNumber|kindNull) == 0 && k&kindNumber != 0:
		return readNumber
	case k&^(kindBool|kindNull) == 0 && k&kindBool != 0:
		return readBoolean
	}
	return readJSON
}

// JSON kinds a schema allows, as a bit set (integers count as numbers; true and false
// apart, so that a schema allowing only one of them says so).
const (
	kindNull = 1 << iota
	kindTrue
	kindFalse
	kindNumber
	kindString
	kindArray
	kindObject
	kindBool = kindTrue | kindFalse
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

func kindOfValue(v *value) int {
	switch v.kind {
	case kNull:
		return kindNull
	case kBool:
		if v.truth {
			return kindTrue
		}
		return kindFalse
	case kNumber:
		return kindNumber
	case kString:
		return kindString
	case kArray:
		return kindArray
	}
	return kindObject
}

// kindsOf is the set of JSON kinds s allows, by its type, enum and const, following $ref
// (one that does not resolve constrains nothing) and the combinators. The kinds of each
// $ref target are worked out once; a target met again while its own kinds are being worked
// out (a cycle) counts as allowing everything there, so every walk ends, in time linear in
// the schema.
func (r *schemaRefs) kindsOf(s *value) int {
	if !s.isObject() {
		if s != nil && s.kind == kBool && !s.truth {
			return 0
		}
		return allKinds
	}
	k := allKinds
	if t := s.get("type"); t != nil {
		switch t.kind {
		case kString:
			k = kindOfType(strings.ToLower(t.str))
		case kArray:
			k = 0
			for _, e := range t.vals {
				if e.kind == kString {
					k |= kindOfType(strings.ToLower(e.str))
				}
			}
		}
	}
	if e := s.get("enum"); e != nil && e.kind == kArray {
		lits := 0
		for _, m := range e.vals {
			lits |= kindOfValue(m)
		}
		k &= lits
	}
	if c := s.get("const"); c != nil {
		k &= kindOfValue(c)
	}
	if ref := s.get("$ref"); ref != nil && ref.kind == kString {
		if target, err := r.resolve(ref.str); err == nil {
			rk, done := r.kinds[target]
			if !done {
				r.kinds[target] = allKinds // while in progress
				rk = r.kindsOf(target)
				r.kinds[target] = rk
			}
			k &= rk
		}
	}
	if all := s.get("allOf"); all != nil {
		for _, b := range all.vals {
			k &= r.kindsOf(b)
		}
	}
	for _, comb := range []string{"anyOf", "oneOf"} {
		if branches := s.get(comb); branches != nil {
			u := 0
			for _, b := range branches.vals {
				u |= r.kindsOf(b)
			}
			k &= u
		}
	}
	return k
}

// Read is the JSON value of a parameter's text (without the newlines around it that
// belong to the markup), compact.
func (rd ValueReading) Read(text string) json.RawMessage {
	asString := json.RawMessage(quoteJSON(text))
	trimmed := strings.TrimSpace(text)
	if strings.EqualFold(trimmed, "null") && rd.Kind != readString { // a string's "null" is itself
		return json.RawMessage("null")
	}
	if rd.Kind == readEnum {
		for _, m := range rd.members {
			if m.kind == kString && m.str == text { // an enum string "None" is itself
				return asString
			}
		}
	}
	if trimmed == "None" && rd.Nullable {
		return json.RawMessage("null")
	}
	switch rd.Kind {
	case readJSON:
		if v, ok := decodeLiteral(trimmed); ok {
			return compactOr(trimmed, v)
		}
	case readEnum:
		// Strings are themselves (above); other members are written as their JSON (or as
		// Python's True, False).
		if v, ok := decodeLiteral(trimmed); ok {
			for _, m := range rd.members {
				if m.kind != kString && sameValue(v, m) {
					return compactOr(trimmed, m)
				}
			}
		}
	case readUntyped:
		// An object or array written as JSON is taken as one; anything else stays text.
		if strings.HasPrefix(trimmed, "{") || strings.HasPrefix(trimmed, "[") {
			var buf bytes.Buffer
			if json.Compact(&buf, []byte(trimmed)) == nil {
				return buf.Bytes()
			}
		}
	case readInteger:
		if v, err := strconv.ParseInt(trimmed, 10, 64); err == nil {
			return json.RawMessage(strconv.FormatInt(v, 10))
		}
		if f, err := strconv.ParseFloat(trimmed, 64); err == nil && f == math.Trunc(f) && math.Abs(f) < 1<<53 {
			return json.RawMessage(strconv.FormatInt(int64(f), 10))
		}
	case readNumber:
		if f, err := strconv.ParseFloat(trimmed, 64); err == nil && !math.IsInf(f, 0) && !math.IsNaN(f) {
			if f == math.Trunc(f) && math.Abs(f) < 1<<53 {
				return json.RawMessage(strconv.FormatInt(int64(f), 10))
			}
			return json.RawMessage(strconv.FormatFloat(f, 'g', -1, 64))
		}
	case readBoolean:
		switch strings.ToLower(trimmed) {
		case "true":
			return json.RawMessage("true")
		case "false":
			return json.RawMessage("false")
		}
	}
	return asString // "", string, text, and text that does not read as its kind
}

// compactOr is text, JSON, compacted; v (which text reads as) when text is no JSON
// (Python's True, False).
func compactOr(text string, v *value) json.RawMessage {
	var buf bytes.Buffer
	if json.Compact(&buf, []byte(text)) == nil {
		return buf.Bytes()
	}
	return json.RawMessage(v.encode())
}

// decodeLiteral reads text as a JSON value, or as Python's True or False.
func decodeLiteral(text string) (*value, bool) {
	switch text {
	case "True":
		return &value{kind: kBool, truth: true}, true
	case "False":
		return &value{kind: kBool}, true
	}
	v, err := parseJSON([]byte(text))
	return v, err == nil
}

// sameValue reports whether two JSON values are equal, numbers by value.
func sameValue(a, b *value) bool {
	if a.kind != b.kind {
		return false
	}
	switch a.kind {
	case kNumber:
		if a.num == b.num {
			return true
		}
		fa, erra := strconv.ParseFloat(a.num, 64)
		fb, errb := strconv.ParseFloat(b.num, 64)
		return erra == nil && errb == nil && fa == fb
	case kArray:
		if len(a.vals) != len(b.vals) {
			return false
		}
		for i := range a.vals {
			if !sameValue(a.vals[i], b.vals[i]) {
				return false
			}
		}
		return true
	case kObject:
		if len(a.keys) != len(b.keys) {
			return false
		}
		for i, k := range a.keys {
			w := b.get(k)
			if w == nil || !sameValue(a.vals[i], w) {
				return false
			}
		}
		return true
	}
	return a.str == b.str && a.truth == b.truth
}
